"""Acceptance under a wiring: how much a mismatch costs, measured on the user's own dumps.

With the user's draft checkpoint (`rca/evidence/draft_runner.py`), its first draft token is compared with the
target's greedy token on the dump's prompts, the draft fed the target's taps under each wiring in
question. Without one, a small EAGLE-3-shaped draft head (fc over the concatenated slots, the next token's embedding,
one block, an lm_head over a draft vocabulary) is trained on the training dumps, exactly as they were
dumped, to predict the target's greedy token one step ahead. Like EAGLE-3's, its vocabulary is the
tokens the target produces most often in the training data (at most DRAFT_VOCAB), its lm_head
starting from the target's rows for them: a token outside it is never proposed, and training costs
a few thousand logits per position instead of the target's whole vocabulary. It is then fed the target's own taps under
each wiring in question (what serving feeds, what training fed, a candidate fix) on held-out
samples; the share of positions where its guess is the target's token is the first draft token's
acceptance under that wiring. That head is a surrogate for the user's draft (same inputs, same
task, far smaller), so the figures compare wirings; they do not predict the served draft's rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rca.errors import InputError
from rca.evidence.draft_runner import load_draft
from rca.evidence.probes import cosine_table, open_target_dumps
from rca.evidence.reference import ReferenceModel, require_torch

HELD_OUT = 8  # one sample in this many is held out for measuring
DRAFT_VOCAB = 32000  # EAGLE-3's default draft vocabulary size


@dataclass(frozen=True)
class AcceptanceReport:
    trained_on: tuple[str, ...]  # the dumps' slots, as the target's taps
    results: tuple[tuple[tuple[str, ...], float], ...]  # (wiring, acceptance) in the order asked
    train_tokens: int
    test_tokens: int
    steps: int
    draft: str = ""  # the user's draft measured, or "" for the surrogate head
    filled: tuple[str, ...] = ()  # what the draft's checkpoint lacked and how it was filled to run it

    @property
    def summary(self) -> str:
        baseline = dict(self.results).get(self.trained_on)
        parts = []
        for wiring, rate in self.results:
            relative = (
                f", {rate / baseline:.0%} of the trained wiring" if baseline and wiring != self.trained_on else ""
            )
            parts.append(f"[{', '.join(wiring)}] {rate:.3f}{relative}")
        measured = (
            f"the draft's first-token acceptance ({self.draft}; the dumps hold [{', '.join(self.trained_on)}])"
            if self.draft
            else f"surrogate first-token acceptance (head trained on the dumps' [{', '.join(self.trained_on)}])"
        )
        filled = f" (the checkpoint lacked {'; '.join(self.filled)})" if self.filled else ""
        return f"{measured}: " + "; ".join(parts) + filled

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "rca.acceptance/1",
            "draft": self.draft or None,
            "filled": list(self.filled),
            "trained_on": list(self.trained_on),
            "train_tokens": self.train_tokens,
            "test_tokens": self.test_tokens,
            "steps": self.steps,
            "results": [{"wiring": list(wiring), "acceptance": round(rate, 4)} for wiring, rate in self.results],
            "summary": self.summary,
        }


def measure_acceptance(
    dumps: Path,
    target: Path,
    wirings: list[tuple[str, ...]],
    device: str = "auto",
    max_tokens: int = 32768,
    steps: int = 600,
    seed: int = 0,
    base: Path | None = None,
    progress: Callable[[str], None] | None = None,
    draft: Path | None = None,
) -> AcceptanceReport:
    """Acceptance under each wiring: of the user's `draft` checkpoint when one is given (every
    dump sample measures it), else of a surrogate head trained on most of the dumps and measured
    on the rest."""
    torch = require_torch()
    dumpset = open_target_dumps(dumps, target, base)
    reference = ReferenceModel.load(target, device, base)
    count, layers = len(next(dumpset.samples(max_tokens)).slots), reference.num_layers
    known = {f"h{layer}" for layer in range(layers + 1)} | {f"h{layers}+norm"}
    for wiring in wirings:
        unknown = [tap for tap in wiring if tap not in known]
        if unknown or len(wiring) != count:
            raise InputError(
                f"wiring [{', '.join(wiring)}] "
                + (
                    f"names taps the target lacks: {unknown}"
                    if unknown
                    else f"has {len(wiring)} slots, the dumps {count}"
                ),
                fix=f"name {count} taps among h0..h{layers}, h{layers}+norm",
            )
    model = load_draft(draft, reference.model.get_input_embeddings().weight, base) if draft is not None else None
    for item in getattr(model, "filled", ()):
        if progress:
            progress(f"acceptance: the draft's checkpoint lacked {item}")
    train: list[tuple[Any, Any, Any]] = []  # (features from the dump, next ids, target's tokens)
    test: list[tuple[dict[str, Any], Any, Any]] = []  # (every tap, next ids, target's tokens)
    names: list[dict[str, float]] = []
    for index, sample in enumerate(dumpset.samples(max_tokens)):
        if len(sample.token_ids) < 2:
            continue
        taps = reference.taps(sample.token_ids, source=sample.path)
        tokens = reference.greedy(taps[f"h{reference.num_layers}+norm"])
        if model is not None or index % HELD_OUT == HELD_OUT - 1:
            test.append((taps, sample.token_ids[1:], tokens[1:]))
            names = [
                _add(total, cosine_table(slot, taps))
                for total, slot in zip(names or [{} for _ in sample.slots], sample.slots, strict=False)
            ]
        else:
            train.append(
                (torch.cat([slot.float() for slot in sample.slots], dim=-1)[:-1], sample.token_ids[1:], tokens[1:])
            )
        if progress:
            progress(f"acceptance: {index + 1} dump samples through {reference.label}")
    if not test or (model is None and not train):
        raise InputError(
            f"too few dump samples to train and measure ({len(train) + len(test)}; at least {HELD_OUT} are needed)",
            where=str(dumps),
            fix="pass more dumps or a larger --max-tokens",
        )
    trained_on = tuple(max(table, key=table.__getitem__) for table in names)
    if model is not None:
        predict = lambda features, next_ids: model.target_tokens(model(features, next_ids))  # noqa: E731
    else:
        head = _train(reference, train, steps, seed, progress)
        predict = lambda features, next_ids: head.vocabulary[head(features, next_ids).argmax(-1)]  # noqa: E731
    results = []
    for wiring in dict.fromkeys([trained_on, *wirings]):
        hits = total = 0
        with torch.inference_mode():
            for taps, next_ids, tokens in test:
                features = torch.cat([taps[tap] for tap in wiring], dim=-1)[:-1]
                hits += int((predict(features, next_ids) == tokens).sum())
                total += len(tokens)
        results.append((wiring, hits / total))
    return AcceptanceReport(
        trained_on,
        tuple(results),
        sum(len(item[2]) for item in train),
        sum(len(item[2]) for item in test),
        0 if model is not None else steps,
        str(draft) if draft else "",
        getattr(model, "filled", ()),
    )


def _add(total: dict[str, float], table: dict[str, float]) -> dict[str, float]:
    return {tap: total.get(tap, 0.0) + cosine for tap, cosine in table.items()}


def _train(
    reference: ReferenceModel,
    train: list[tuple[Any, Any, Any]],
    steps: int,
    seed: int,
    progress: Callable[[str], None] | None,
) -> Any:
    torch = require_torch()
    torch.manual_seed(seed)
    features, next_ids, tokens = (torch.cat([item[part] for item in train]) for part in range(3))
    produced, counts = tokens.unique(return_counts=True)
    vocabulary = produced[counts.argsort(descending=True, stable=True)[:DRAFT_VOCAB]].sort().values
    kept = torch.isin(tokens, vocabulary)  # positions whose token the draft vocabulary lacks teach nothing
    features, next_ids, labels = features[kept], next_ids[kept], torch.searchsorted(vocabulary, tokens[kept])
    head = _head(reference, features.shape[-1], vocabulary)
    optimizer = torch.optim.AdamW(
        [parameter for parameter in head.parameters() if parameter.requires_grad], lr=3e-3, weight_decay=0.01
    )
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        rows = torch.randint(0, len(labels), (min(512, len(labels)),), generator=generator)
        loss = torch.nn.functional.cross_entropy(head(features[rows], next_ids[rows]), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if progress and (step + 1) % 100 == 0:
            progress(f"acceptance: surrogate head step {step + 1}/{steps}, loss {float(loss):.3f}")
    return head.eval()


def _head(reference: ReferenceModel, width: int, vocabulary: Any) -> Any:
    """An EAGLE-3-shaped head: fc over the slots, the next token's embedding (the target's,
    frozen), one block, and an lm_head over `vocabulary` starting from the target's rows."""
    torch = require_torch()
    embedding = reference.model.get_input_embeddings().weight.detach().float().cpu()
    lm_head = reference.model.get_output_embeddings().weight.detach().float().cpu()[vocabulary]
    hidden = embedding.shape[1]

    class Head(torch.nn.Module):  # type: ignore[name-defined]  # torch, imported as the probe runs
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("vocabulary", vocabulary)  # the draft's token ids, in the target's vocabulary
            self.fc = torch.nn.Linear(width, hidden, bias=False)
            self.embed = torch.nn.Embedding.from_pretrained(embedding.clone(), freeze=True)
            self.block = torch.nn.Sequential(
                torch.nn.Linear(2 * hidden, 4 * hidden), torch.nn.SiLU(), torch.nn.Linear(4 * hidden, hidden)
            )
            self.norm = torch.nn.RMSNorm(hidden)
            self.lm_head = torch.nn.Linear(hidden, lm_head.shape[0], bias=False)
            self.lm_head.weight = torch.nn.Parameter(lm_head.clone())

        def forward(self, features: Any, next_ids: Any) -> Any:
            return self.lm_head(
                self.norm(self.block(torch.cat([self.embed(next_ids), self.fc(features.float())], dim=-1)))
            )

    return Head()
