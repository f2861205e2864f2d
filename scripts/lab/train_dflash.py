"""Train the engine lab's DFlash draft for the lab's target, on the CPU, deterministically from a seed.

    python scripts/lab/train_dflash.py OUT_DIR [--seed 0] [--steps 1000] [--shared-head]

The draft is vLLM's `qwen3_dflash` layout (`fc`, `hidden_norm`, `layers.N.*` with per-head q/k
norms, `norm`, `lm_head`; no `embed_tokens`: the engine shares the target's), trained on the same
taps as the lab's EAGLE-3 draft (h1, h2, h3: DFlash ids [0, 1, 2], "the output of layer k",
which vLLM reads as its ids [1, 2, 3]) and computed as vLLM 0.32 serves it: the target's taps at
every verified position pass `fc` and `hidden_norm`, and each layer's own k/v projections (with
its k norm and RoPE) make the context's keys and values; a block of the last verified token and
`num_speculative_tokens` mask tokens (`mask_token_id`, embedded with the target's table) at the
next positions attends to the context before it and, non-causally, to the whole block; the mask
slots predict the tokens at their positions.

With --shared-head the draft scores with the target's `lm_head`, frozen, and its checkpoint has
none (as z-lab's DFlash drafts ship: the engine shares the target's head and embedding).

Written: OUT/config.json and OUT/model.safetensors, and the draft's offline acceptance (the share
of drafted tokens a greedy verifier accepts, three drafts a step) printed as JSON. Needs the lab
target (tests/engine_lab/target, built by scripts/lab/train.py) and torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train import (
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    LAYERS,
    PROMPT,
    SPECIALS,
    VOCAB,
    RMSNorm,
    continuations,
    make_language,
    rotate,
)

LAB = Path(__file__).resolve().parents[2] / "tests" / "engine_lab"
DFLASH_IDS = (0, 1, 2)  # "the output of layer k": the taps h1, h2, h3 the lab's EAGLE-3 draft is trained on
DRAFT_LAYERS, BLOCK = 1, 4  # one layer; a block of the last verified token and three mask slots
# A token the language never produces, with a row of its own: the pad row is all zeros, which
# normalizes to zero and gives the mask slots no query to attend with.
MASK = SPECIALS.index("<unk>")


class DFlashDraft(nn.Module):
    """A DFlash draft computed as vLLM's DFlashQwen3ForCausalLM computes it."""

    def __init__(self) -> None:
        super().__init__()
        head_dim = HIDDEN // HEADS
        self.fc = nn.Linear(len(DFLASH_IDS) * HIDDEN, HIDDEN, bias=False)
        self.hidden_norm = RMSNorm(HIDDEN)
        self.layers = nn.ModuleList()
        for _ in range(DRAFT_LAYERS):
            layer = nn.ModuleDict({"input_layernorm": RMSNorm(HIDDEN), "post_attention_layernorm": RMSNorm(HIDDEN)})
            attention = nn.ModuleDict(
                {name: nn.Linear(HIDDEN, HEADS * head_dim, bias=False) for name in ("q_proj", "k_proj", "v_proj")}
            )
            attention["o_proj"] = nn.Linear(HEADS * head_dim, HIDDEN, bias=False)
            attention["q_norm"], attention["k_norm"] = RMSNorm(head_dim, 1e-5), RMSNorm(head_dim, 1e-5)
            layer["self_attn"] = attention
            layer["mlp"] = nn.ModuleDict(
                {
                    "gate_proj": nn.Linear(HIDDEN, INTERMEDIATE, bias=False),
                    "up_proj": nn.Linear(HIDDEN, INTERMEDIATE, bias=False),
                    "down_proj": nn.Linear(INTERMEDIATE, HIDDEN, bias=False),
                }
            )
            self.layers.append(layer)
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    @staticmethod
    def _heads(x: torch.Tensor, projection: nn.Module, norm: nn.Module | None) -> torch.Tensor:
        """[..., T, H] -> [..., heads, T, d], each head normalized where the layer norms it."""
        out = projection(x).unflatten(-1, (HEADS, -1))
        return (norm(out) if norm is not None else out).transpose(-2, -3)

    def forward(self, features: torch.Tensor, blocks: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """Logits of every block slot. features [B, T, 3H]: the taps at each position; blocks [B, A,
        BLOCK]: embeddings' token ids, the verified token at anchor n then the mask tokens, at
        positions n..n+BLOCK-1; anchors [A]: each block's n (the context is positions 0..n-1)."""
        length = features.shape[1]
        context = self.hidden_norm(self.fc(features))  # [B, T, H]
        context_positions = torch.arange(length)
        positions = anchors[:, None] + torch.arange(BLOCK)  # [A, BLOCK]
        visible = context_positions[None, :] < anchors[:, None]  # [A, T]
        scale = (HIDDEN // HEADS) ** -0.5
        hidden = blocks  # [B, A, BLOCK, H]
        residual = hidden
        for number, layer in enumerate(self.layers):
            attention = layer["self_attn"]
            normed = layer["input_layernorm"](hidden if number == 0 else hidden + residual)
            residual = hidden if number == 0 else hidden + residual
            k_context = rotate(self._heads(context, attention["k_proj"], attention["k_norm"]), context_positions)
            v_context = self._heads(context, attention["v_proj"], None)  # [B, heads, T, d]
            q = self._heads(normed, attention["q_proj"], attention["q_norm"])  # [B, A, heads, BLOCK, d]
            k = self._heads(normed, attention["k_proj"], attention["k_norm"])
            v = self._heads(normed, attention["v_proj"], None)
            q, k = rotate(q, positions[None, :, None]), rotate(k, positions[None, :, None])
            to_context = torch.einsum("bahqd,bhtd->bahqt", q, k_context) * scale
            to_context = to_context.masked_fill(~visible[None, :, None, None, :], float("-inf"))
            to_block = torch.einsum("bahqd,bahkd->bahqk", q, k) * scale  # non-causal within the block
            weights = torch.softmax(torch.cat([to_context, to_block], -1), -1)
            attended = torch.einsum("bahqt,bhtd->bahqd", weights[..., :length], v_context) + torch.einsum(
                "bahqk,bahkd->bahqd", weights[..., length:], v
            )
            out = attention["o_proj"](attended.transpose(-2, -3).flatten(-2))
            residual = out + residual
            normed = layer["post_attention_layernorm"](residual)
            mlp = layer["mlp"]
            hidden = mlp["down_proj"](F.silu(mlp["gate_proj"](normed)) * mlp["up_proj"](normed))
        return self.lm_head(self.norm(hidden + residual))

    def state_for_vllm(self) -> dict[str, torch.Tensor]:
        """The trained tensors, as vLLM loads them: a frozen head (the target's) is not exported."""
        return {
            name: tensor.detach().contiguous()
            for name, tensor in self.named_parameters()
            if tensor.requires_grad or not name.startswith("lm_head.")
        }


def dflash_config() -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": DRAFT_LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * DRAFT_LAYERS,
        "block_size": BLOCK,
        "num_target_layers": LAYERS,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": list(DFLASH_IDS)},
        "torch_dtype": "float32",
    }


def batch(data: dict, embedding: torch.Tensor, index: torch.Tensor, anchors: torch.Tensor):
    """The draft's inputs for sequences `index` and blocks at `anchors`, and the labels of the mask
    slots: the target's greedy tokens at their positions."""
    tokens, teacher = data["tokens"][index], data["teacher"][index]
    taps = [k + 1 for k in DFLASH_IDS]  # the output of layer k is h(k+1)
    features = data["taps"][index][:, :, taps].float().flatten(2)
    ids = torch.full((len(index), len(anchors), BLOCK), MASK, dtype=torch.long)
    ids[:, :, 0] = tokens[:, anchors]
    labels = torch.stack([teacher[:, anchors + s - 1] for s in range(1, BLOCK)], -1)  # [B, A, BLOCK-1]
    return features, F.embedding(ids, embedding), labels


def train(draft: DFlashDraft, data: dict, embedding: torch.Tensor, steps: int, seed: int, log) -> None:
    held_out = len(data["tokens"]) // 8
    anchors = torch.arange(1, data["tokens"].shape[1] - BLOCK + 1)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed + 3)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 2e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        index = torch.randint(held_out, len(data["tokens"]), (16,), generator=generator)
        features, blocks, labels = batch(data, embedding, index, anchors)
        logits = draft(features, blocks, anchors)[:, :, 1:]
        weight = torch.where(anchors < PROMPT - 1, 0.1, 1.0)[None, :, None].expand(labels.shape)
        decay = 0.8 ** torch.arange(BLOCK - 1, dtype=torch.float32)
        losses = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(labels.shape)
        loss = (losses * weight * decay).sum() / (weight * decay).sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log({"step": step + 1, "loss": round(float(loss), 3), "acceptance": offline(draft, data, embedding)})


@torch.no_grad()
def offline(draft: DFlashDraft, data: dict, embedding: torch.Tensor, shift: int = 0) -> dict:
    """Greedy block acceptance on held-out sequences from the generated region: P(the first j
    drafts are all right), per j, and the share of drafted tokens accepted. `shift` feeds the
    taps that many layers later (a layer offset)."""
    draft.eval()
    index = torch.arange(len(data["tokens"]) // 8)
    anchors = torch.arange(PROMPT, data["tokens"].shape[1] - BLOCK + 1)
    features, blocks, labels = batch(data, embedding, index, anchors)
    if shift:
        taps = [k + 1 + shift for k in DFLASH_IDS]
        features = data["taps"][index][:, :, taps].float().flatten(2)
    right = draft(features, blocks, anchors)[:, :, 1:].argmax(-1) == labels
    alive = right.cumprod(-1).float().mean((0, 1))
    draft.train()
    return {"by_position": [round(x, 4) for x in alive.tolist()], "per_drafted_token": round(alive.mean().item(), 4)}


def main() -> None:
    from transformers import LlamaForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--sequences", type=int, default=1024)
    parser.add_argument("--shared-head", action="store_true", help="score with the target's lm_head, frozen")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    started = time.time()

    def log(item: dict) -> None:
        print(json.dumps({"s": round(time.time() - started), **item}), flush=True)

    target = LlamaForCausalLM.from_pretrained(LAB / "target").eval()
    with torch.no_grad():
        data = continuations(target, make_language(args.seed), args.sequences, args.seed + 4)
    embedding = target.model.embed_tokens.weight.detach()
    draft = DFlashDraft()
    with torch.no_grad():  # trainers start the draft's head from the target's
        draft.lm_head.weight.copy_(target.lm_head.weight)
    draft.lm_head.weight.requires_grad_(not args.shared_head)
    train(draft, data, embedding, args.steps, args.seed, log)
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(draft.state_for_vllm(), str(args.out / "model.safetensors"), metadata={"format": "pt"})
    (args.out / "config.json").write_text(json.dumps(dflash_config(), indent=2) + "\n")
    print(
        json.dumps(
            {"as_trained": offline(draft, data, embedding), "one_layer_later": offline(draft, data, embedding, 1)}
        )
    )


if __name__ == "__main__":
    main()
