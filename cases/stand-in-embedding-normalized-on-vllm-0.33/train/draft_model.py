"""A one-layer EAGLE-3 draft whose first layer normalizes the token embeddings before it
concatenates them with the normalized hidden state, as every EAGLE-3 layer the engines build does."""

import torch
from torch import nn


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        width = config.hidden_size
        self.q_proj = nn.Linear(width * 2, config.num_attention_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(width * 2, config.num_key_value_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(width * 2, config.num_key_value_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, width, bias=False)
        self.hidden_norm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.input_layernorm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.mlp = nn.Sequential(
            nn.Linear(width, config.intermediate_size, bias=False),
            nn.SiLU(),
            nn.Linear(config.intermediate_size, width, bias=False),
        )

    def attention(self, states):
        q, k, v = self.q_proj(states), self.k_proj(states), self.v_proj(states)
        return self.o_proj(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))

    def forward(self, input_emb, hidden_states):
        residual = hidden_states
        hidden_states = self.hidden_norm(hidden_states)
        input_emb = self.input_layernorm(input_emb)
        hidden_states = torch.cat((input_emb, hidden_states), dim=-1)
        hidden_states = residual + self.attention(hidden_states)
        residual = hidden_states
        return residual + self.mlp(self.post_attention_layernorm(hidden_states))


class LlamaForCausalLMEagle3(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.target_hidden_size * 3, config.hidden_size, bias=False)
        self.midlayer = LlamaDecoderLayer(config)
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)

    @classmethod
    def from_config(cls, path):
        from transformers import LlamaConfig

        return cls(LlamaConfig.from_json_file(path))

    def forward(self, hidden_states, inputs_embeds):
        hidden_states = self.fc(hidden_states)
        return self.midlayer(input_emb=inputs_embeds, hidden_states=hidden_states)

    def compute_logits(self, hidden_states):
        return self.lm_head(self.norm(hidden_states))


def load_batches(path):
    for line in open(path):
        yield {"input_ids": torch.tensor([[int(token) for token in line.split()]])}
