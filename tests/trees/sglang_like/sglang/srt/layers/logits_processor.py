"""The aux concatenation in the shape of sglang/srt/layers/logits_processor.py."""

import torch
from torch import nn


class LogitsProcessor(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states=None):
        hidden_states_to_store = None
        if logits_metadata.capture_hidden_mode.is_full():
            if aux_hidden_states is not None:
                aux_hidden_states = torch.cat(aux_hidden_states, dim=-1)
                hidden_states_to_store = aux_hidden_states
            else:
                hidden_states_to_store = hidden_states
        return hidden_states_to_store
