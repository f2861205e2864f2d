"""Tiny target models built from configs (seeded random weights, no downloads) and their taps,
computed the way transformers documents them, independently of rca's own hooks."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

VOCAB = 256

CONFIGS = {
    "llama": (
        "LlamaConfig",
        {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2},
    ),
    "qwen3": (
        "Qwen3Config",
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
        },
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
        },
    ),
}


def tiny_model(architecture: str, layers: int = 8, seed: int = 0, initializer_range: float = 0.02):
    import transformers

    name, options = CONFIGS[architecture]
    config = getattr(transformers, name)(
        vocab_size=VOCAB,
        num_hidden_layers=layers,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
        **options,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # trained norms scale channels unevenly; all-ones would make hN and hN+norm cosine-identical
        for name, parameter in model.named_parameters():
            if "norm" in name and parameter.dim() == 1:
                parameter.uniform_(0.5, 1.5)
    return model.eval()


def save_model(model, directory: Path) -> Path:
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def reference_taps(model, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """h0..h(N-1) and hN+norm from `output_hidden_states`; hN from a copy without the final norm."""
    with torch.inference_mode():
        states = model(token_ids.reshape(1, -1), output_hidden_states=True).hidden_states
        bare = copy.deepcopy(model)
        bare.get_decoder().norm = torch.nn.Identity()
        last = bare(token_ids.reshape(1, -1), output_hidden_states=True).hidden_states[-1]
    layers = len(states) - 1
    taps = {f"h{index}": state[0].clone() for index, state in enumerate(states[:-1])}
    taps[f"h{layers}"] = last[0].clone()
    taps[f"h{layers}+norm"] = states[-1][0].clone()
    return taps
