"""Write the small stand-in checkpoints of the bundled contract cases (run from the repository root).

Each draft checkpoint has the tensor names, dtypes and vocabulary dimensions of a real EAGLE-3
export, with every weight one row or column wide but for the input of `fc` (and of the norm
before it), which is as wide as the states of the 8B target the draft was trained on: the static
checks read names, shapes and the vocab map, never the weights. The vocab maps are deterministic:
the 32,000 target ids a reduced-vocabulary draft keeps are drawn once from a seeded generator, as a
trainer's frequency selection would give.

    python scripts/write_case_checkpoints.py
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from safetensors.torch import save_file

CASES = Path(__file__).resolve().parent.parent / "cases"
TARGET_VOCAB, DRAFT_VOCAB = 128_256, 32_000
FC_INPUT = 3 * 4096  # three states of Llama-3.1-8B's width
SMALL_VOCAB, SMALL_HIDDEN = 256, 64  # a narrow Llama-shaped target, where a case reads real embedding rows
QWEN3_MOE_VOCAB, QWEN3_MOE_HIDDEN = 151_936, 2048  # Qwen3-30B-A3B


def kept_target_ids() -> list[int]:
    return sorted(random.Random(0).sample(range(TARGET_VOCAB), DRAFT_VOCAB))


def reselected_target_ids(kept: list[int]) -> list[int]:
    """The vocabulary a fine-tune selects again from its own data: a quarter of the parent's tokens
    replaced by others, as a new token-frequency count gives."""
    rng = random.Random(1)
    dropped = set(rng.sample(kept, DRAFT_VOCAB // 4))
    others = [token for token in range(TARGET_VOCAB) if token not in set(kept)]
    return sorted((set(kept) - dropped) | set(rng.sample(others, len(dropped))))


def vocab_map(kept: list[int]) -> dict[str, torch.Tensor]:
    d2t = torch.tensor([target - draft for draft, target in enumerate(kept)], dtype=torch.int64)
    t2d = torch.zeros(TARGET_VOCAB, dtype=torch.bool)
    t2d[kept] = True
    return {"d2t": d2t, "t2d": t2d}


def draft_weights(
    vocab_map_tensors: dict[str, torch.Tensor], norm_before_fc: bool = False, fc_input: int = FC_INPUT
) -> dict[str, torch.Tensor]:
    return {
        "fc.weight": torch.zeros(1, fc_input, dtype=torch.bfloat16),
        "midlayer.input_layernorm.weight": torch.ones(1),
        "norm.weight": torch.ones(1),
        "lm_head.weight": torch.zeros(DRAFT_VOCAB, 1, dtype=torch.float16),
        **({"input_norm.weight": torch.ones(FC_INPUT, dtype=torch.bfloat16)} if norm_before_fc else {}),
        **vocab_map_tensors,
    }


# The parameters of one EAGLE-3 decoder layer, as speculators exports them (`layers.N.*`).
LAYER_PARAMETERS = (
    "hidden_norm",
    "input_layernorm",
    "post_attention_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def decoder_layer(index: int) -> dict[str, torch.Tensor]:
    """Layer `index`'s tensors, each one element wide: the static checks read their names."""
    return {
        f"layers.{index}.{name}.weight": torch.zeros((1,) if "norm" in name else (1, 1), dtype=torch.bfloat16)
        for name in LAYER_PARAMETERS
    }


def specforge_qwen3_moe_draft() -> dict[str, torch.Tensor]:
    """A SpecForge draft for Qwen3-30B-A3B as published: its decoder layer under `midlayer.`, a
    reduced vocabulary with its map, and no `embed_tokens` (the engine shares the target's)."""
    kept = sorted(random.Random(2).sample(range(QWEN3_MOE_VOCAB), DRAFT_VOCAB))
    t2d = torch.zeros(QWEN3_MOE_VOCAB, dtype=torch.bool)
    t2d[kept] = True
    layer = {name.replace("layers.0.", "midlayer."): tensor for name, tensor in decoder_layer(0).items()}
    return layer | {
        "fc.weight": torch.zeros(1, 3 * QWEN3_MOE_HIDDEN, dtype=torch.bfloat16),
        "norm.weight": torch.ones(1),
        "lm_head.weight": torch.zeros(DRAFT_VOCAB, 1, dtype=torch.bfloat16),
        "d2t": torch.tensor([target - draft for draft, target in enumerate(kept)], dtype=torch.int64),
        "t2d": t2d,
    }


def fp8_decoder_layer(index: int) -> dict[str, torch.Tensor]:
    """Layer `index` as an FP8 export writes it: its linear weights in float8 with a scale each."""
    tensors = decoder_layer(index)
    for name in LAYER_PARAMETERS:
        if "norm" not in name:
            tensors[f"layers.{index}.{name}.weight"] = torch.zeros(1, 1, dtype=torch.float8_e4m3fn)
            tensors[f"layers.{index}.{name}.weight_scale"] = torch.ones(1, dtype=torch.float32)
    return tensors


def main() -> None:
    kept = kept_target_ids()
    checkpoints = {
        "reduced-vocab-without-d2t-on-vllm": draft_weights({}),
        "reduced-vocab-with-d2t-on-vllm": draft_weights(vocab_map(kept)),
        "d2t-all-zeros-on-sglang": draft_weights(
            {"d2t": torch.zeros(DRAFT_VOCAB, dtype=torch.int64), "t2d": vocab_map(kept)["t2d"]}
        ),
        "norm-before-fc-dropped-on-sglang": draft_weights(vocab_map(kept), norm_before_fc=True),
        "norm-before-fc-on-sglang-0.5.23": draft_weights(vocab_map(kept), norm_before_fc=True),
    }
    # A fine-tune of the reduced-vocabulary draft that regenerated its map, its parent, and the
    # control whose fine-tune kept the parent's map.
    checkpoints["vocab-map-regenerated-on-vllm"] = draft_weights(vocab_map(reselected_target_ids(kept)))
    checkpoints["vocab-map-kept-across-fine-tune-on-vllm"] = draft_weights(vocab_map(kept))
    for case in ("vocab-map-regenerated-on-vllm", "vocab-map-kept-across-fine-tune-on-vllm"):
        parent = CASES / case / "parent" / "model.safetensors"
        parent.parent.mkdir(parents=True, exist_ok=True)
        save_file(draft_weights(vocab_map(kept)), str(parent), metadata={"format": "pt"})
    # A draft trained on five of the target's layers, and its control.
    for case in ("five-layer-draft-fc-sized-for-three-on-vllm", "five-layer-draft-with-nested-ids-on-vllm"):
        checkpoints[case] = draft_weights(vocab_map(kept), fc_input=5 * 4096)
    without_head = draft_weights(vocab_map(kept))
    del without_head["lm_head.weight"]
    checkpoints["draft-without-lm-head-on-sglang"] = without_head
    checkpoints["reduced-vocab-without-lm-head-on-vllm-0.33"] = without_head
    # A full-vocabulary draft exported without the head it shares with its target, and one exported
    # without its embedding (served on one pipeline stage, and on two).
    full_without_head = draft_weights({})
    del full_without_head["lm_head.weight"]
    checkpoints["full-vocab-without-lm-head-on-vllm-0.33"] = full_without_head
    for case in ("draft-without-embed-tokens-on-two-stages-on-vllm", "draft-without-embed-tokens-on-one-stage-on-vllm"):
        checkpoints[case] = draft_weights({}) | {"lm_head.weight": torch.zeros(TARGET_VOCAB, 1, dtype=torch.float16)}
    # A full-vocabulary draft with its own trained head (a pattern, not the target's zeros) and a
    # frozen copy of the target's embedding; the target's stand-in head and embedding beside it.
    own_head = (torch.arange(TARGET_VOCAB) % 7).to(torch.float16)[:, None]
    full_vocab = draft_weights({})
    full_vocab["lm_head.weight"] = own_head
    full_vocab["embed_tokens.weight"] = torch.zeros(TARGET_VOCAB, 1, dtype=torch.float16)
    checkpoints["own-head-replaced-on-vllm-0.11"] = full_vocab
    target = {
        name: torch.zeros(TARGET_VOCAB, 1, dtype=torch.float16)
        for name in ("lm_head.weight", "model.embed_tokens.weight")
    }
    save_file(
        target,
        str(CASES / "own-head-replaced-on-vllm-0.11" / "target" / "model.safetensors"),
        metadata={"format": "pt"},
    )
    # A small Llama-shaped target with its embedding, and a draft whose exporter wrote a freshly
    # initialized embed_tokens (served by vLLM, which keeps it, and by SGLang, which replaces it).
    small = torch.Generator().manual_seed(0)
    small_target = {
        "model.embed_tokens.weight": torch.randn(SMALL_VOCAB, SMALL_HIDDEN, generator=small).to(torch.bfloat16),
        "lm_head.weight": torch.randn(SMALL_VOCAB, SMALL_HIDDEN, generator=small).to(torch.bfloat16),
    }
    untrained = {
        "embed_tokens.weight": (torch.randn(SMALL_VOCAB, SMALL_HIDDEN, generator=small) * 0.02).to(torch.bfloat16),
        "lm_head.weight": small_target["lm_head.weight"].clone(),
        "fc.weight": torch.zeros(1, 3 * SMALL_HIDDEN, dtype=torch.bfloat16),
        "midlayer.input_layernorm.weight": torch.ones(1),
        "norm.weight": torch.ones(1),
    }
    for case in ("untrained-embedding-kept-on-vllm-0.33", "untrained-embedding-replaced-on-sglang-0.5.23"):
        checkpoints[case] = untrained
        (CASES / case / "target").mkdir(parents=True, exist_ok=True)
        save_file(small_target, str(CASES / case / "target" / "model.safetensors"), metadata={"format": "pt"})
    # A one-layer draft exported with its layer's weights (speculators' names), whose config
    # declares two layers, and its control declaring one.
    one_layer = draft_weights(vocab_map(kept))
    del one_layer["midlayer.input_layernorm.weight"]
    one_layer |= decoder_layer(0)
    for case in ("two-layers-declared-one-exported-on-vllm-0.33", "one-layer-declared-one-exported-on-vllm-0.33"):
        checkpoints[case] = one_layer
    # A SpecForge draft built for 2,048 positions, and the copy whose config was raised to 40,960.
    for case in ("specforge-draft-for-2k-on-vllm-0.33", "specforge-draft-raised-to-40k-served-at-40k-on-vllm-0.33"):
        checkpoints[case] = specforge_qwen3_moe_draft()
    # The same unquantized draft (plain BF16 weights, no scales) beside an FP8 target, and beside a
    # BF16 one.
    for case in (
        "unquantized-draft-beside-fp8-target-on-vllm-0.11.0",
        "unquantized-draft-beside-fp8-target-on-vllm-0.11.1",
        "unquantized-draft-beside-bf16-target-on-vllm-0.11.0",
    ):
        checkpoints[case] = one_layer
    # An unquantized draft beside an AWQ target launched with --quantization awq on SGLang, the same
    # launched with the draft's quantization cleared, and an FP8 draft beside the same target.
    for case in (
        "unquantized-draft-beside-awq-target-on-sglang-0.5.23",
        "unquantized-draft-launched-unquant-on-sglang-0.5.23",
    ):
        checkpoints[case] = one_layer
    fp8_layer = draft_weights(vocab_map(kept))
    del fp8_layer["midlayer.input_layernorm.weight"]
    checkpoints["fp8-draft-beside-awq-target-on-sglang-0.5.23"] = fp8_layer | fp8_decoder_layer(0)
    for case, tensors in checkpoints.items():
        path = CASES / case / "draft" / "model.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata={"format": "pt"})
        print(f"{path.relative_to(CASES.parent)}: {', '.join(sorted(tensors))}")
    write_mask_embeddings()


def write_mask_embeddings() -> None:
    """The sidecar a DFlash trainer that learns the mask token's embedding apart saves beside its
    draft (a torch.save of the vector and the token's id), for Qwen3-8B's width and SpecForge's
    mask token: a stand-in of zeros, as the static check reads only that the file is there."""
    for case in ("dflash-mask-embedding-beside-it-on-vllm-0.22", "dflash-mask-embedding-beside-it-on-vllm-0.25"):
        path = CASES / case / "draft" / "mask_embedding.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"embedding": torch.zeros(4096, dtype=torch.bfloat16), "mask_token_id": 151669}, path)
        print(f"{path.relative_to(CASES.parent)}: embedding, mask_token_id")


if __name__ == "__main__":
    main()
