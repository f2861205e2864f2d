"""A worker extension in the shape of speculators 0.4.0 data_generation/custom_worker.py."""

import types
from itertools import islice

from vllm.distributed import get_pp_group, get_tp_group


def _patched_forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **_kwargs):
    if get_pp_group().is_first_rank:
        hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
    else:
        hidden_states = intermediate_tensors["hidden_states"]
        residual = intermediate_tensors["residual"]

    aux_hidden_states = []
    extension = self._extension
    should_capture = get_tp_group().rank_in_group == 0
    target_layers = extension._layer_ids if should_capture else frozenset()

    for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer)):
        hidden_states, residual = layer(hidden_states=hidden_states, positions=positions, residual=residual)
        absolute_layer_idx = self.start_layer + idx

        # Capture intermediate layers (not the last) before norm
        if absolute_layer_idx in target_layers:
            aux_hidden_states.append((hidden_states + residual).clone())

    hidden_states, _ = self.norm(hidden_states, residual)
    if should_capture and aux_hidden_states:
        extension._store_captured_states(aux_hidden_states)
    return hidden_states


class HiddenStatesWorkerExtension:
    def _setup_hidden_states_capture(self, layer_ids):
        self._layer_ids = frozenset(layer_ids)
        self._captured_states = None
        model = self.model_runner.model
        if hasattr(model, "get_language_model"):
            base_model = model.get_language_model().model
        elif hasattr(model, "model") and hasattr(model.model, "layers"):
            base_model = model.model
        else:
            raise AttributeError("Could not find base model with 'layers' attribute.")
        base_model._extension = self
        base_model.forward = types.MethodType(_patched_forward, base_model)
