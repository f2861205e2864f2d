"""Probe: whether the draft's `lm_head` rows line up with the target rows its vocab map names."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rca.sdk import (
    Confidence,
    Evidence,
    InputError,
    Location,
    Observation,
    Probe,
    ProbeInputs,
    Step,
    StepKind,
    Tap,
    Wiring,
)
from rca.sdk.evidence import mean_cosine, require_torch
from rca.sdk.inputs import Checkpoint, tokenizer_ids, weights_directory

HEADS = ("lm_head.weight", "embed_tokens.weight")  # a target with tied embeddings scores with its embedding
SAMPLE = 256  # draft ids compared, spread over the draft vocabulary
ALIGNED = 0.5  # mean cosine of rows that are the same token's (a head initialized from the target's and trained)
MARGIN = 0.2  # how far the named rows must beat the other reading


def _nearest(torch: Any, rows: Any, target: Checkpoint, name: str, chunk: int = 16384) -> float:
    """The mean cosine of each row with its nearest row of the target's `name` (read in chunks)."""
    count = target.entry(name).shape[0]
    ours = torch.nn.functional.normalize(rows.float(), dim=-1)
    best = torch.full((len(rows),), -1.0)
    for start in range(0, count, chunk):
        theirs = torch.nn.functional.normalize(
            target.rows(name, torch.arange(start, min(count, start + chunk))), dim=-1
        )
        best = torch.maximum(best, (ours @ theirs.T).max(dim=-1).values)
    return float(best.mean())


class VocabMapRows(Probe):
    """Whether the draft's `lm_head` row i matches the target's row `i + d2t[i]`, row `i`, or neither.

    ## Why it matters
    EAGLE-3 trainers start a reduced-vocabulary draft's `lm_head` from the target's rows of the
    tokens it keeps, so after training row i still points where the target's row for the same
    token does. Comparing a few hundred rows of both checkpoints tells a right map (rows `i + d2t[i]`
    match) from a missing or zeroed one (the draft's vocabulary is not the first target ids: rows
    `i` do not match), reading only those rows of the draft. Where neither matches, the compared rows
    are held against every target row: rows that are target rows, but not the ones the map names,
    show a wrong or missing map (a shuffled `d2t` passes every static check); rows that resemble no
    target row come from a head not started from the target's and say nothing of the map. Rows
    that match rows i show the draft was trained on the first target ids: served so, it is right,
    but a reduced vocabulary that is the first N ids was never selected from data, and the draft
    can never propose the target's other tokens.
    """

    name = "vocab-map-rows"
    cost = 0.5
    command = "rca probe vocab-map"
    arguments = "--draft DRAFT_DIR --target MODEL_DIR"
    settles = ("vocab-map-missing", "vocab-map-invalid", "vocab-first-ids")

    def applies(self, inputs: ProbeInputs) -> bool:
        return inputs.draft is not None and any(weights_directory(inputs.draft).glob("*.safetensors"))

    def unavailable(self, inputs: ProbeInputs) -> str | None:
        if not self.applies(inputs):
            return "the draft has no safetensors weights (--draft DIR with the checkpoint)"
        if inputs.model_directory is None:
            return "the target has no safetensors weights (--target is a config only)"
        return None

    def predict(self, slots: tuple[Tap, ...]) -> Hashable:
        return None  # says nothing about which states training fed

    def bearing(self, observation: Observation, serving: Wiring) -> dict[str, Evidence]:
        cited, said = observation.citations[:2], observation.summary
        if observation.value == "mapped":
            return {"vocab-map-invalid": Evidence(said, Confidence.OBSERVED, 0.1, cited)}
        if observation.value == "identity":  # the draft was trained on the first target ids: serving them is right
            against = Evidence(said, Confidence.OBSERVED, 0.1, cited)
            bearing = {"vocab-map-missing": against, "vocab-map-invalid": against}
            if observation.data.get("reduced"):  # ... but a reduced vocabulary is then no selection at all
                bearing["vocab-first-ids"] = Evidence(said, Confidence.OBSERVED, 10.0, cited)
            return bearing
        if observation.value == "misnamed":  # the rows are target rows, but other than those the ids reach
            broken = "vocab-map-invalid" if observation.data.get("d2t") else "vocab-map-missing"
            return {broken: Evidence(said, Confidence.OBSERVED, 20.0, cited)}
        return {}  # "unaligned": a head not started from the target's says nothing of the map

    def run(self, inputs: ProbeInputs, progress: Any = None) -> Observation:
        torch = require_torch()
        assert inputs.draft is not None and inputs.model_directory is not None
        draft = Checkpoint.open(weights_directory(inputs.draft), inputs.base, flag="--draft")
        target = Checkpoint.open(inputs.model_directory, inputs.base)
        draft_head, target_head = draft.find(["lm_head.weight"]), target.find(HEADS)
        if draft_head is None or target_head is None:
            missing = "the draft has no lm_head" if draft_head is None else "the target has no lm_head or embedding"
            return Observation(self.name, None, missing, reliability=0.5)
        rows, width = draft.entry(draft_head).shape
        target_rows, target_width = target.entry(target_head).shape
        if width != target_width:
            return Observation(
                self.name, None, f"the draft's lm_head is {width} wide, the target's {target_width}", reliability=0.5
            )
        name = draft.find(["d2t"])
        try:
            offsets = [int(value) for value in draft.values(name)] if name is not None else None
        except InputError as error:
            return Observation(self.name, None, f"d2t unreadable: {error.what}", reliability=0.5)
        if offsets is not None and len(offsets) != rows:
            return Observation(self.name, None, f"d2t has {len(offsets)} entries, lm_head {rows} rows", reliability=0.5)
        # fewer rows than the target's that hold every id its tokenizer emits: the same vocabulary, padded less
        emitted = tokenizer_ids(inputs.model_directory, inputs.base) if rows < target_rows else None
        padded = emitted if emitted is not None and emitted.exact and rows >= emitted.count else None
        ids = torch.linspace(0, rows - 1, min(SAMPLE, rows)).round().long().unique()
        mapped = ids + torch.tensor([offsets[i] for i in ids.tolist()]) if offsets is not None else None
        own = draft.rows(draft_head, ids)
        identity = mean_cosine(torch, own, target.rows(target_head, ids))
        named = (
            mean_cosine(torch, own, target.rows(target_head, mapped))
            if mapped is not None and bool(((mapped >= 0) & (mapped < target_rows)).all())
            else None
        )
        if progress:
            progress(f"{self.name}: {len(ids)} rows of each lm_head compared")
        if named is not None and named >= ALIGNED and named >= identity + MARGIN:
            value, said = "mapped", f"the draft's lm_head rows match the target's rows i + d2t[i] (cosine {named:.2f})"
        elif identity >= ALIGNED and (named is None or identity >= named + MARGIN or named == identity):
            value, said = "identity", f"the draft's lm_head rows match the target's rows i (cosine {identity:.2f})"
            if padded is not None:
                said += f": its {rows:,} rows hold every id the target's tokenizer emits ({padded.said}), the rest pad"
            elif rows < target_rows:
                said += (
                    f": its {rows:,} tokens are the target's first {rows:,} ids, not a selection of the tokens its "
                    f"data uses, and it can never propose one of the other {target_rows - rows:,}"
                )
        else:
            shown = f"{named:.2f}" if named is not None else "no d2t"
            nearest = _nearest(torch, own, target, target_head)
            if progress:
                progress(f"{self.name}: each compared row against every row of the target's {target_head}")
            if nearest >= ALIGNED:
                value = "misnamed"
                said = (
                    f"the draft's lm_head rows are target rows (the {len(ids)} compared have a nearest target row at "
                    f"mean cosine {nearest:.2f}), but neither the rows d2t names ({shown}) nor rows i "
                    f"({identity:.2f}): the map sends draft tokens to other target tokens than their rows score"
                )
            else:
                value = "unaligned"
                said = (
                    f"the draft's lm_head rows resemble no target row (mean nearest cosine {nearest:.2f}): its head "
                    "was not started from the target's, so its rows say nothing of the map"
                )
        citations = (
            Step(
                Location("draft", f"{draft.directory.name}/{draft.weight_map[draft_head]}", 1, 1),
                said,
                kind=StepKind.TENSOR,
            ),
            Step(
                Location("target", f"{target.directory.name}/{target.weight_map[target_head]}", 1, 1),
                f"{len(ids)} rows of {target_head}",
                kind=StepKind.TENSOR,
            ),
        )
        return Observation(
            self.name,
            value,
            said,
            {
                "value": value,
                "rows_compared": len(ids),
                "cosine_named": None if named is None else round(named, 4),
                "cosine_identity": round(identity, 4),
                "d2t": name,
                "d2t_nonzero": bool(offsets and any(offsets)),
                "reduced": rows < target_rows and padded is None,
                "bytes_read": draft.bytes_read + target.bytes_read,
            },
            citations,
        )
