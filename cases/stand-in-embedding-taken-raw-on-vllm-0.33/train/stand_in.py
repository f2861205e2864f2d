"""A stand-in for the target in the shape of NVIDIA ModelOpt's FakeBaseModel: it keeps only the
target's embedding and head, read from its checkpoint, rebuilt as plain modules. Gemma's
embedding multiplies its output by sqrt(hidden_size) in its forward; a plain nn.Embedding does not."""

import torch
from safetensors import safe_open
from torch import nn


class FakeBaseModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=torch.bfloat16)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=torch.bfloat16)

    @classmethod
    def from_source(cls, config, checkpoint):
        model = cls(config)
        with safe_open(checkpoint, framework="pt") as weights:
            model.embed_tokens.weight.data.copy_(weights.get_tensor("model.embed_tokens.weight"))
            model.lm_head.weight.data.copy_(weights.get_tensor("model.embed_tokens.weight"))
        return model

    def forward(self, *args, **kwargs):
        raise NotImplementedError("FakeBaseModel forward is not implemented.")
