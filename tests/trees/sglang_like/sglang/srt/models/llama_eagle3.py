"""The EAGLE-3 draft in the shape of sglang/srt/models/llama_eagle3.py (0.5.12)."""

import torch
from torch import nn


class LlamaModel(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__()
        self.config = config
        if hasattr(config, "target_hidden_size"):
            self.hidden_size_in = config.target_hidden_size
        else:
            self.hidden_size_in = config.hidden_size
        self.num_aux_hidden_states = getattr(config, "num_aux_hidden_states", None)
        if self.num_aux_hidden_states is None:
            eagle_config = getattr(config, "eagle_config", None) or {}
            layer_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
            self.num_aux_hidden_states = len(layer_ids) if layer_ids else 3
        self.fc = torch.nn.Linear(
            self.hidden_size_in * self.num_aux_hidden_states,
            config.hidden_size,
            bias=getattr(config, "bias", False),
        )


class LlamaForCausalLMEagle3(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        nn.Module.__init__(self)
        self.config = config
        self.model = LlamaModel(config, quant_config=quant_config)


EntryClass = [LlamaForCausalLMEagle3]
