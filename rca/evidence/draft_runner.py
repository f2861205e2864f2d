"""An EAGLE-3 draft checkpoint, run as its trainer defines it, for its first draft token.

The layout is speculators' `Eagle3` (also what SGLang and vLLM load): `fc` projects the k
concatenated target states to the hidden size (optionally after `input_norm` or per-slot
`fc_norm`); the first decoder layer normalizes the next token's embedding (`input_layernorm`) and
the projected state (`hidden_norm`), concatenates them (2H wide into q, k, v), and adds the
attention output to the projected state (or to its normalized form with `norm_before_residual`);
further layers are plain decoder layers; `norm` and `lm_head` give logits over the draft's
vocabulary, which `d2t` maps to target ids (`target = draft + d2t[draft]`). The decoder pieces
are transformers' own (Llama or Qwen3), so the arithmetic is the trainer's. Weights are read from
safetensors only; names from EAGLE's and SpecForge's exports (`midlayer.*`, a `model.` prefix)
are accepted too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rca.errors import RcaError, brief
from rca.evidence.reference import ProbeUnavailable, require_torch
from rca.inputs.configs import display_path
from rca.inputs.files import readable

REQUIRED = (
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "layers.0.hidden_norm.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
)
_FAMILIES = {"llama": ("LlamaConfig", "llama"), "qwen3": ("Qwen3Config", "qwen3")}


def _canonical(name: str) -> str:
    for prefix in ("model.", "draft_model."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return "layers.0." + name[len("midlayer.") :] if name.startswith("midlayer.") else name


def layer_config(config: dict[str, Any]) -> Any:
    """The transformers config of the draft's decoder layers (speculators nests it under
    `transformer_layer_config`; SGLang-style exports are a flat Llama config)."""
    import transformers

    nested = config.get("transformer_layer_config")
    values = dict(nested if isinstance(nested, dict) else config)
    family = str(values.get("model_type", "llama"))
    if family not in _FAMILIES:
        raise ProbeUnavailable(
            f"draft decoder layers of type {family!r} are not supported",
            fix="use a draft whose layers are Llama or Qwen3 (transformer_layer_config.model_type)",
        )
    for key in ("architectures", "auto_map", "transformer_layer_config", "model_type"):
        values.pop(key, None)
    built = getattr(transformers, _FAMILIES[family][0])(**values)
    built._attn_implementation = "sdpa"
    return built


def build_draft(config: dict[str, Any], width: int, vocab: int) -> Any:
    """An EAGLE-3 draft module for `config` (speculators' or a flat export) taking `width` inputs,
    with `vocab` draft tokens; its weights are those of a fresh module until loaded."""
    torch = require_torch()
    import importlib

    layers_config = layer_config(config)
    family = _FAMILIES[str((config.get("transformer_layer_config") or config).get("model_type", "llama"))][1]
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    names = {
        "llama": ("LlamaDecoderLayer", "LlamaRMSNorm", "LlamaRotaryEmbedding"),
        "qwen3": ("Qwen3DecoderLayer", "Qwen3RMSNorm", "Qwen3RotaryEmbedding"),
    }[family]
    decoder_layer, rms_norm, rotary = (getattr(modeling, name) for name in names)
    hidden, eps = layers_config.hidden_size, layers_config.rms_norm_eps
    slots = width // hidden
    norm_before_residual = bool(config.get("norm_before_residual", False))

    class Eagle3Draft(torch.nn.Module):  # type: ignore[name-defined]  # torch, imported as the probe runs
        def __init__(self) -> None:
            super().__init__()
            self.input_norm = rms_norm(width, eps=eps) if config.get("norm_before_fc") else None
            self.fc_norm = (
                torch.nn.ModuleList(rms_norm(hidden, eps=eps) for _ in range(slots)) if config.get("fc_norm") else None
            )
            self.fc = torch.nn.Linear(width, hidden, bias=False)
            self.embed_tokens = torch.nn.Embedding(layers_config.vocab_size, hidden)
            self.layers = torch.nn.ModuleList(
                decoder_layer(layers_config, index) for index in range(layers_config.num_hidden_layers)
            )
            first = self.layers[0]
            first.hidden_norm = rms_norm(hidden, eps=eps)
            attention = first.self_attn
            bias = bool(getattr(layers_config, "attention_bias", False))
            heads, kv_heads, head_dim = (
                layers_config.num_attention_heads,
                layers_config.num_key_value_heads,
                attention.head_dim,
            )
            attention.q_proj = torch.nn.Linear(2 * hidden, heads * head_dim, bias=bias)
            attention.k_proj = torch.nn.Linear(2 * hidden, kv_heads * head_dim, bias=bias)
            attention.v_proj = torch.nn.Linear(2 * hidden, kv_heads * head_dim, bias=bias)
            self.rotary = rotary(layers_config)
            self.norm = rms_norm(hidden, eps=eps)
            self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(vocab, dtype=torch.long))

        def forward(self, features: Any, next_ids: Any) -> Any:
            """Logits over the draft vocabulary at each position ([S, vocab]) for the first draft
            token: `features` [S, width] are the target's states at t, `next_ids` [S] the tokens at t+1."""
            states = features[None].to(self.fc.weight.dtype)
            if self.input_norm is not None:
                states = self.input_norm(states)
            if self.fc_norm is not None:
                states = torch.cat(
                    [
                        norm(chunk)
                        for norm, chunk in zip(self.fc_norm, states.chunk(len(self.fc_norm), dim=-1), strict=False)
                    ],
                    dim=-1,
                )
            projected = self.fc(states)
            length = projected.shape[1]
            positions = torch.arange(length, device=projected.device)[None]
            mask = torch.full((length, length), float("-inf"), device=projected.device, dtype=projected.dtype).triu(1)[
                None, None
            ]
            embeds = self.embed_tokens(next_ids[None].to(projected.device))
            position_embeddings = self.rotary(projected, positions)
            first = self.layers[0]
            normed = first.hidden_norm(projected)
            residual = normed if norm_before_residual else projected
            attended, _ = first.self_attn(
                torch.cat([first.input_layernorm(embeds), normed], dim=-1),
                position_embeddings=position_embeddings,
                attention_mask=mask,
            )
            hidden_states = residual + attended
            hidden_states = hidden_states + first.mlp(first.post_attention_layernorm(hidden_states))
            for layer in self.layers[1:]:
                output = layer(
                    hidden_states, attention_mask=mask, position_ids=positions, position_embeddings=position_embeddings
                )
                hidden_states = output[0] if isinstance(output, tuple) else output
            return self.lm_head(self.norm(hidden_states))[0]

        def target_tokens(self, logits: Any) -> Any:
            """The target ids of the draft's greedy tokens."""
            draft = logits.argmax(-1)
            return draft + self.d2t[draft]

    return Eagle3Draft()


def load_draft(directory: Path, target_embedding: Any, base: Path | None = None) -> Any:
    """The draft in `directory` (config.json and *.safetensors), ready to run on the CPU in float32,
    loaded as the serving engines load it: a checkpoint without `embed_tokens` (speculators keeps
    the target's frozen) uses `target_embedding`, one without `d2t` reads draft ids as target ids.
    What was filled is listed in the model's `filled`, for the report to say."""
    torch = require_torch()
    from safetensors import safe_open

    shown = display_path(directory, base)
    config_path = directory / "config.json"
    files = sorted(directory.glob("*.safetensors"))
    if not config_path.is_file() or not files:
        raise ProbeUnavailable(
            "the draft needs its config.json and *.safetensors weights",
            where=shown,
            fix="pass --draft DIR with the draft checkpoint as exported",
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ProbeUnavailable(
            "the draft's config.json is not JSON",
            where=display_path(config_path, base),
            fix="pass the draft checkpoint as exported",
        ) from None
    weights: dict[str, Any] = {}
    for file in files:
        try:
            with safe_open(str(readable(file, "a draft shard", "re-download the draft checkpoint")), "pt") as handle:
                for name in handle.keys():
                    weights[_canonical(name)] = handle.get_tensor(name)
        except RcaError:
            raise
        except Exception as error:
            raise ProbeUnavailable(
                f"unreadable safetensors ({brief(error)})",
                where=display_path(file, base),
                fix="re-download the draft checkpoint",
            ) from None
    missing = [name for name in REQUIRED if name not in weights]
    if missing:
        raise ProbeUnavailable(
            f"the draft checkpoint lacks {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}",
            where=shown,
            fix="pass an EAGLE-3 draft (speculators, SpecForge or EAGLE export)",
        )
    width, vocab = weights["fc.weight"].shape[1], weights["lm_head.weight"].shape[0]
    draft = build_draft(config, width, vocab)
    filled = []
    if "embed_tokens.weight" not in weights:
        weights["embed_tokens.weight"] = target_embedding.detach().float().cpu()
        filled.append(
            "embed_tokens: the checkpoint has none, so the target's input embedding is used, as SGLang and vLLM "
            "share the target's with a draft that lacks it"
        )
    if "d2t" not in weights:
        weights["d2t"] = torch.zeros(vocab, dtype=torch.long)
        if vocab < target_embedding.shape[0]:
            filled.append(
                f"d2t: the checkpoint has none for its {vocab:,}-token vocabulary, so draft token i is read as "
                "target token i, as the engines serve it (see vocab-map-missing)"
            )
    draft.filled = tuple(filled)  # what the checkpoint lacked and how it was filled, for the report
    state = {name: tensor for name, tensor in weights.items() if name in draft.state_dict()}
    result = draft.load_state_dict(
        {name: tensor.float() if tensor.is_floating_point() else tensor.long() for name, tensor in state.items()},
        strict=False,
    )
    absent = [name for name in result.missing_keys if not name.startswith("rotary.")]
    if absent:
        raise ProbeUnavailable(
            f"the draft checkpoint lacks {', '.join(absent[:4])}{' …' if len(absent) > 4 else ''}",
            where=shown,
            fix="pass an EAGLE-3 draft of this layout (speculators Eagle3)",
        )
    return draft.float().eval()
