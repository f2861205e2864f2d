"""Build the engine lab's tiny target and EAGLE-3 draft on the CPU, deterministically from a seed.

    python scripts/lab/train.py OUT_DIR [--seed 0] [--target-steps 1500] [--draft-steps 1200]

The target is a 4-layer Llama (hidden 128, vocabulary 1,024, a word-level tokenizer) trained on a
language with a hidden topic: every sequence draws one of 16 topics, each a permutation of 256
words, and each next word is the topic's image of the current one (with some noise). Predicting it
takes the topic, which only the context reveals. Two things make the failures `rca` diagnoses
cost acceptance as they do on real models, where taps far apart differ in scale and direction:
the target learns to state the topic linearly at its later taps (an auxiliary probe loss), and
adjacent taps are pushed apart (a penalty on their cosine), so a draft fed a shifted tap reads
another representation, not a near copy. Its residual stream is then scaled up (embedding,
`o_proj` and `down_proj` times a constant; RMSNorm makes that exact), as real targets' states are
large: a draft that normalizes its input before `fc` then depends on that norm.

The draft is vLLM's `llama_eagle3` layout (`fc`, `input_norm` for `norm_before_fc`, `midlayer.*`,
`norm`, `lm_head`, `d2t`/`t2d` for its reduced vocabulary, no `embed_tokens`: the engine shares
the target's), trained by distillation on the target's greedy continuations with a three-step
training-time test that unrolls the draft as vLLM runs it: step 1 at position i takes the
embedding of token i+1 and `fc` of the target's taps at i; step s takes the embedding of token
i+s and step s-1's pre-norm output, attending to the step-1 keys up to i and its own chain's.

Written: OUT/target (config.json, model.safetensors, tokenizer files), OUT/draft (config.json,
model.safetensors), OUT/dumps (16 of the draft's training samples as the trainer saw them:
`hidden_states` [S, 3, H] of its taps, `input_ids`, `verifier_last` hL), OUT/prompts.json (serving
prompts as token ids) and OUT/lab.json (what was built, the training figures, the offline
acceptance under each wiring). Needs torch,
transformers and tokenizers (the project's `probes` extra).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
LAYERS, HIDDEN, HEADS, INTERMEDIATE, VOCAB = 4, 128, 4, 512, 1024
WORDS, TOPICS, NOISE = 256, 16, 0.1
PROMPT, CONTINUATION = 16, 48  # the draft's training sequences: a prompt and the target's greedy continuation
TRAINED_IDS = (1, 2, 3)  # vLLM's id k captures hk: the draft is trained on [h1, h2, h3]
DRAFT_VOCAB = 512
STREAM_SCALE = 16.0


# -- the language -----------------------------------------------------------------------------------


def make_language(seed: int) -> dict:
    rng = random.Random(seed)
    words = rng.sample(range(len(SPECIALS), VOCAB), WORDS)
    perms = []
    for _ in range(TOPICS):
        perm = list(range(WORDS))
        rng.shuffle(perm)
        perms.append(perm)
    return {"words": words, "perms": perms, "noise": NOISE, "bos": SPECIALS.index("<s>")}


def sample(language: dict, generator: torch.Generator, count: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` sequences of `length` tokens (BOS first) and their topics."""
    words, perms = torch.tensor(language["words"]), torch.tensor(language["perms"])
    topics = torch.randint(0, TOPICS, (count,), generator=generator)
    current = torch.randint(0, WORDS, (count,), generator=generator)
    out = torch.empty(count, length, dtype=torch.long)
    out[:, 0] = language["bos"]
    for t in range(1, length):
        out[:, t] = words[current]
        follow = perms[topics, current]
        noise = torch.rand(count, generator=generator) < language["noise"]
        current = torch.where(noise, torch.randint(0, WORDS, (count,), generator=generator), follow)
    return out, topics


# -- the target -------------------------------------------------------------------------------------


def build_tokenizer(out: Path, seed: int) -> None:
    """A word-level tokenizer over made-up words, one token each, in transformers' file layout."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    rng = random.Random(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    names: list[str] = []
    while len(names) < VOCAB - len(SPECIALS):
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 3)))
        if word not in names:
            names.append(word)
    vocab = {token: index for index, token in enumerate([*SPECIALS, *names])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(out / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, **special}, indent=1)
    )
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=1))


def new_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        rope_theta=10000.0,
    )
    return LlamaForCausalLM(config)


def taps(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and every tap h0..hL [B, T, L+1, H] (hL before the final norm, as vLLM's id L)."""
    seen = {}
    handle = model.model.norm.register_forward_pre_hook(lambda module, args: seen.__setitem__("last", args[0]))
    try:
        output = model(ids, output_hidden_states=True)
    finally:
        handle.remove()
    states = [*output.hidden_states[:LAYERS], seen["last"]]
    return output.logits, torch.stack(states, dim=2)


def train_target(model, language: dict, steps: int, seed: int, log) -> dict:
    """Next-token loss, plus a topic probe at the later taps and a penalty on adjacent taps' cosine."""
    generator = torch.Generator().manual_seed(seed + 1)
    probe = nn.Linear(HIDDEN, TOPICS)
    parameters = [*model.parameters(), *probe.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    figures = {}
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        ids, topics = sample(language, generator, 64, 64)
        logits, states = taps(model, ids)
        next_token = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        late = states[:, 8:, 2:]  # topic stated at h2..hL once the context shows it
        topic = F.cross_entropy(
            probe(late / late.norm(dim=-1, keepdim=True).clamp_min(1e-6) * math.sqrt(HIDDEN)).reshape(-1, TOPICS),
            topics[:, None, None].expand(-1, late.shape[1], late.shape[2]).reshape(-1),
        )
        adjacent = F.cosine_similarity(states[:, :, 1:], states[:, :, :-1], dim=-1).pow(2).mean()
        loss = next_token + 0.3 * topic + 1.0 * adjacent
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        if (step + 1) % 100 == 0 or step + 1 == steps:
            figures = {
                "step": step + 1,
                "next_token_loss": round(next_token.item(), 3),
                "topic_loss": round(topic.item(), 3),
                "adjacent_cosine_sq": round(adjacent.item(), 3),
                "follows_language": round(follows_language(model, language), 3),
            }
            log(figures)
            model.train()
    model.eval()
    return figures


@torch.no_grad()
def follows_language(model, language: dict) -> float:
    """How often the target's greedy next word is the topic's image of the current word (after 16 tokens)."""
    model.eval()
    words, perms = torch.tensor(language["words"]), torch.tensor(language["perms"])
    index = torch.full((VOCAB,), -1, dtype=torch.long)
    index[words] = torch.arange(WORDS)
    ids, topics = sample(language, torch.Generator().manual_seed(7), 128, 48)
    predicted = model(ids).logits.argmax(-1)[:, 16:-1]
    wanted = words[perms[topics[:, None], index[ids[:, 16:-1]].clamp_min(0)]]
    return (predicted == wanted).float().mean().item()


@torch.no_grad()
def scale_stream(model, factor: float) -> None:
    """Multiply the residual stream by `factor`: what writes to it is scaled, every read is an RMSNorm."""
    model.model.embed_tokens.weight.mul_(factor)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.mul_(factor)
        layer.mlp.down_proj.weight.mul_(factor)


# -- the draft --------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Neox-style RoPE (theta 10,000) of x [B, heads, T, d] at positions [T] or [B, T]."""
    d = x.shape[-1]
    inverse = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = positions.float()[..., None] * inverse
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = d // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Draft(nn.Module):
    """An EAGLE-3 draft of one layer, computed as vLLM's Eagle3LlamaForCausalLM computes it."""

    def __init__(self, slots: int, norm_before_fc: bool, vocab: int):
        super().__init__()
        head_dim = HIDDEN // HEADS
        self.input_norm = RMSNorm(slots * HIDDEN) if norm_before_fc else None
        self.fc = nn.Linear(slots * HIDDEN, HIDDEN, bias=False)
        self.midlayer = nn.ModuleDict(
            {
                "input_layernorm": RMSNorm(HIDDEN),
                "hidden_norm": RMSNorm(HIDDEN),
                "post_attention_layernorm": RMSNorm(HIDDEN),
            }
        )
        attention = nn.ModuleDict(
            {name: nn.Linear(2 * HIDDEN, HEADS * head_dim, bias=False) for name in ("q_proj", "k_proj", "v_proj")}
        )
        attention["o_proj"] = nn.Linear(HEADS * head_dim, HIDDEN, bias=False)
        self.midlayer["self_attn"] = attention
        self.midlayer["mlp"] = nn.ModuleDict(
            {
                "gate_proj": nn.Linear(HIDDEN, INTERMEDIATE, bias=False),
                "up_proj": nn.Linear(HIDDEN, INTERMEDIATE, bias=False),
                "down_proj": nn.Linear(INTERMEDIATE, HIDDEN, bias=False),
            }
        )
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, vocab, bias=False)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(self.input_norm(features) if self.input_norm is not None else features)

    def _qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        layer, attention = self.midlayer, self.midlayer["self_attn"]
        z = torch.cat([layer["input_layernorm"](embeds), layer["hidden_norm"](hidden)], -1)
        batch, length, _ = z.shape

        def heads(projection):
            return projection(z).view(batch, length, HEADS, -1).transpose(1, 2)

        q, k, v = heads(attention["q_proj"]), heads(attention["k_proj"]), heads(attention["v_proj"])
        return rotate(q, positions), rotate(k, positions), v

    def _finish(self, attended: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.midlayer
        batch, _, length, _ = attended.shape
        residual = layer["self_attn"]["o_proj"](attended.transpose(1, 2).reshape(batch, length, -1)) + hidden
        mlp = layer["mlp"]
        normed = layer["post_attention_layernorm"](residual)
        out = mlp["down_proj"](F.silu(mlp["gate_proj"](normed)) * mlp["up_proj"](normed)) + residual
        return self.lm_head(self.norm(out)), out  # logits, and the pre-norm state the next step takes

    def unroll(self, embeds: list[torch.Tensor], features: torch.Tensor) -> list[torch.Tensor]:
        """Logits of each step s (embeds[s-1]: the embedding of token i+s) for chains anchored at every i."""
        length = features.shape[1]
        base = torch.arange(length)
        scale = (HIDDEN // HEADS) ** -0.5
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        hidden = self.project(features)
        q, k1, v1 = self._qkv(embeds[0], hidden, base)
        scores = (q @ k1.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
        logits, hidden = self._finish(torch.softmax(scores, -1) @ v1, hidden)
        steps, chain_k, chain_v = [logits], [], []
        for s in range(1, len(embeds)):
            q, k, v = self._qkv(embeds[s], hidden, base + s)
            chain_k.append(k)
            chain_v.append(v)
            prefix = (q @ k1.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
            own = torch.stack([(q * key).sum(-1) for key in chain_k], -1) * scale
            weights = torch.softmax(torch.cat([prefix, own], -1), -1)
            attended = weights[..., :length] @ v1 + sum(
                weights[..., length + j, None] * value for j, value in enumerate(chain_v)
            )
            logits, hidden = self._finish(attended, hidden)
            steps.append(logits)
        return steps

    def state_for_vllm(self, d2t: torch.Tensor | None, t2d: torch.Tensor | None) -> dict[str, torch.Tensor]:
        state = {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()}
        if d2t is not None:
            state["d2t"], state["t2d"] = d2t.contiguous(), t2d.contiguous()
        return state


def draft_config(ids: tuple[int, ...], norm_before_fc: bool, vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "draft_vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "target_hidden_size": HIDDEN,
        "torch_dtype": "float32",
        **({"norm_before_fc": True} if norm_before_fc else {}),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True},
    }


@torch.no_grad()
def continuations(model, language: dict, count: int, seed: int) -> dict[str, torch.Tensor]:
    """Prompts from the language, the target's greedy continuations, every tap, the teacher's tokens."""
    generator = torch.Generator().manual_seed(seed)
    tokens, states, teacher = [], [], []
    for _ in range(0, count, 64):
        prompt, _ = sample(language, generator, 64, PROMPT)
        ids = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=CONTINUATION,
            min_new_tokens=CONTINUATION,
            do_sample=False,
            pad_token_id=3,
            eos_token_id=None,
        )
        logits, hidden = taps(model, ids)
        tokens.append(ids)
        states.append(hidden.half())
        teacher.append(logits.argmax(-1))
    return {"tokens": torch.cat(tokens), "taps": torch.cat(states), "teacher": torch.cat(teacher)}


def draft_vocabulary(teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DRAFT_VOCAB tokens the target produces most (ascending ids), with d2t and t2d."""
    counts = torch.bincount(teacher.flatten(), minlength=VOCAB).float()
    counts[: len(SPECIALS)] += 1e6  # keep the special tokens
    kept = counts.argsort(descending=True)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[kept] = True
    return kept, kept - torch.arange(DRAFT_VOCAB), t2d


def chain_inputs(data, embedding, index, ids, steps, kept=None):
    tokens, teacher, states = data["tokens"][index], data["teacher"][index], data["taps"][index]
    length = tokens.shape[1] - steps
    features = states[:, :length, list(ids)].float().flatten(2)
    embeds = [F.embedding(tokens[:, s : s + length], embedding) for s in range(1, steps + 1)]
    labels = [teacher[:, s : s + length] for s in range(1, steps + 1)]
    if kept is not None:  # target ids -> draft ids, -100 outside the draft vocabulary
        to_draft = torch.full((VOCAB,), -100, dtype=torch.long)
        to_draft[kept] = torch.arange(len(kept))
        labels = [to_draft[label] for label in labels]
    return features, embeds, labels


def train_draft(draft, data, embedding, ids, steps, kept, seed, log) -> None:
    torch.manual_seed(seed + 2)
    held_out = len(data["tokens"]) // 8
    optimizer = torch.optim.AdamW(draft.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed + 3)
    draft.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 2e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        index = torch.randint(held_out, len(data["tokens"]), (32,), generator=generator)
        features, embeds, labels = chain_inputs(data, embedding, index, ids, 3, kept)
        loss = 0.0
        for s, logits in enumerate(draft.unroll(embeds, features)):
            weight = torch.ones(labels[s].shape)
            weight[:, : PROMPT - 1] = 0.1  # chains anchored inside the prompt matter less
            losses = F.cross_entropy(
                logits.flatten(0, 1), labels[s].flatten(), reduction="none", ignore_index=-100
            ).view(labels[s].shape)
            loss = loss + 0.8**s * (losses * weight).sum() / weight.sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log(
                {
                    "draft_step": step + 1,
                    "loss": round(float(loss), 3),
                    "acceptance": offline(draft, data, embedding, ids, kept),
                }
            )
            draft.train()
    draft.eval()


@torch.no_grad()
def offline(draft, data, embedding, ids, kept=None, d2t=True) -> dict:
    """Greedy chain acceptance from the generated region: P(the first j drafts are all right), per j,
    and the share of drafted tokens accepted (vLLM's figure for three drafts a step)."""
    draft.eval()
    index = torch.arange(len(data["tokens"]) // 8)
    features, embeds, labels = chain_inputs(data, embedding, index, ids, 3)
    chained, alive = [], None
    for s, logits in enumerate(draft.unroll(embeds, features)):
        guess = logits.argmax(-1)
        if kept is not None:
            guess = kept[guess] if d2t else guess
        right = (guess == labels[s])[:, PROMPT - 1 :]
        alive = right if alive is None else alive & right
        chained.append(round(alive.float().mean().item(), 4))
    return {"by_position": chained, "per_drafted_token": round(sum(chained) / len(chained), 4)}


def write_dumps(directory: Path, data: dict[str, torch.Tensor], count: int) -> None:
    """Training samples as rca reads plain safetensors dumps: the draft's taps, the tokens, hL."""
    directory.mkdir(parents=True, exist_ok=True)
    first = len(data["tokens"]) // 8  # the first training sample (the held-out ones come before)
    for number, index in enumerate(range(first, first + count)):
        states = data["taps"][index].float()
        tensors = {
            "hidden_states": states[:, list(TRAINED_IDS)].contiguous(),
            "input_ids": data["tokens"][index].contiguous(),
            "verifier_last": states[:, LAYERS].contiguous(),
        }
        save_file(tensors, str(directory / f"sample_{number}.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-steps", type=int, default=1500)
    parser.add_argument("--draft-steps", type=int, default=1200)
    parser.add_argument("--sequences", type=int, default=2048)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    started = time.time()
    report: dict = {"seed": args.seed, "log": []}

    def log(item: dict) -> None:
        item = {"s": round(time.time() - started), **item}
        report["log"].append(item)
        print(json.dumps(item), flush=True)

    target_dir, draft_dir = args.out / "target", args.out / "draft"
    target_dir.mkdir(parents=True, exist_ok=True)
    draft_dir.mkdir(parents=True, exist_ok=True)
    language = make_language(args.seed)
    build_tokenizer(target_dir, args.seed)
    target = new_target()
    report["target"] = train_target(target, language, args.target_steps, args.seed, log)
    scale_stream(target, STREAM_SCALE)
    report["target"]["follows_language_scaled"] = round(follows_language(target, language), 3)
    target.save_pretrained(target_dir, safe_serialization=True)
    (target_dir / "generation_config.json").unlink(missing_ok=True)

    data = continuations(target, language, args.sequences, args.seed + 4)
    rms = data["taps"].float().pow(2).mean(-1).sqrt().mean((0, 1))
    report["tap_rms"] = [round(x, 2) for x in rms.tolist()]
    flat = data["taps"][:256].float()
    report["adjacent_tap_cosine"] = [
        round(F.cosine_similarity(flat[:, :, k], flat[:, :, k + 1], dim=-1).mean().item(), 3) for k in range(LAYERS)
    ]
    log({"tap_rms": report["tap_rms"], "adjacent_tap_cosine": report["adjacent_tap_cosine"]})
    embedding = target.model.embed_tokens.weight.detach()
    kept, d2t, t2d = draft_vocabulary(data["teacher"])
    draft = Draft(len(TRAINED_IDS), True, DRAFT_VOCAB)
    with torch.no_grad():  # trainers start the draft's head from the target's rows of its tokens
        draft.lm_head.weight.copy_(target.lm_head.weight[kept])
    train_draft(draft, data, embedding, TRAINED_IDS, args.draft_steps, kept, args.seed, log)
    save_file(draft.state_for_vllm(d2t, t2d), str(draft_dir / "model.safetensors"), metadata={"format": "pt"})
    (draft_dir / "config.json").write_text(json.dumps(draft_config(TRAINED_IDS, True, DRAFT_VOCAB), indent=2) + "\n")
    report["offline_acceptance"] = {
        str(list(ids)): offline(draft, data, embedding, ids, kept) for ids in [TRAINED_IDS, (0, 1, 2), (2, 3, 4)]
    }
    norm = draft.input_norm
    draft.input_norm = None
    report["offline_acceptance"]["without input_norm"] = offline(draft, data, embedding, TRAINED_IDS, kept)
    draft.input_norm = norm
    report["offline_acceptance"]["without d2t"] = offline(draft, data, embedding, TRAINED_IDS, kept, d2t=False)
    write_dumps(args.out / "dumps", data, 16)
    prompts, _ = sample(language, torch.Generator().manual_seed(args.seed + 5), 64, PROMPT)
    (args.out / "prompts.json").write_text(json.dumps({"prompts": prompts.tolist()}) + "\n")
    report["seconds"] = round(time.time() - started)
    (args.out / "lab.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["offline_acceptance"], indent=1))


if __name__ == "__main__":
    main()
