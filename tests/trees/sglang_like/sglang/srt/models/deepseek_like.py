"""A DeepSeek-V3-shaped target in the shape of sglang/srt/models/deepseek_v2.py (0.5.12)."""

from typing import List, Optional

import torch
from torch import nn

from sglang.srt.distributed import get_pp_group
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
from sglang.srt.utils import make_layers


class DeepseekLikeModel(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__()
        self.config = config
        self.pp_group = get_pp_group()
        self.first_k_dense_replace = config.first_k_dense_replace
        if self.pp_group.is_first_rank:
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers, self.start_layer, self.end_layer = make_layers(
            config.num_hidden_layers,
            lambda idx, prefix: DeepseekLikeDecoderLayer(config, idx),
            pp_rank=self.pp_group.rank_in_group,
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers_to_capture = []
        self.enable_a2a_moe = False

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
        if self.pp_group.is_first_rank:
            if input_embeds is None:
                hidden_states = self.embed_tokens(input_ids)
            else:
                hidden_states = input_embeds
            residual = None
        else:
            hidden_states = pp_proxy_tensors["hidden_states"]
            residual = pp_proxy_tensors["residual"]
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                if self.enable_a2a_moe and i > self.first_k_dense_replace:
                    aux_hidden_states.append(all_gather(hidden_states + residual, dim=0))
                else:
                    aux_hidden_states.append(hidden_states + residual)
            layer = self.layers[i]
            hidden_states, residual, topk_indices = layer(positions, hidden_states, forward_batch, residual)
        if not forward_batch.forward_mode.is_idle():
            hidden_states, _ = self.norm(hidden_states, residual)
        if len(aux_hidden_states) == 0:
            return hidden_states
        return hidden_states, aux_hidden_states


class DeepseekLikeForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__()
        self.config = config
        self.pp_group = get_pp_group()
        self.model = DeepseekLikeModel(config, quant_config, prefix=prefix)
        self.logits_processor = LogitsProcessor(config)
        self.capture_aux_hidden_states = False

    def forward(self, input_ids, positions, forward_batch, input_embeds=None):
        hidden_states = self.model(input_ids, positions, forward_batch, input_embeds)
        aux_hidden_states = None
        if self.capture_aux_hidden_states:
            hidden_states, aux_hidden_states = hidden_states
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch, aux_hidden_states)

    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        if not self.pp_group.is_last_rank:
            return

        if layer_ids is None:
            self.capture_aux_hidden_states = True
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.capture_aux_hidden_states = True
            # we plus 1 here because in sglang, for the ith layer, it takes the output
            # of the (i-1)th layer as aux hidden state
            self.model.layers_to_capture = [val + 1 for val in layer_ids]


class KimiLikeForConditionalGeneration(nn.Module):
    def __init__(self, config, quant_config=None, prefix="", **kwargs):
        super().__init__()
        self.config = config
        self.language_model = None
        if not config.encoder_only:
            self.language_model = DeepseekLikeForCausalLM(config.text_config, quant_config)

    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None) -> None:
        if self.language_model is None or not hasattr(self.language_model, "set_eagle3_layers_to_capture"):
            raise AttributeError("language_model does not support EAGLE3 speculative decoding.")
        self.language_model.set_eagle3_layers_to_capture(layer_ids)


EntryClass = [DeepseekLikeForCausalLM, KimiLikeForConditionalGeneration]
