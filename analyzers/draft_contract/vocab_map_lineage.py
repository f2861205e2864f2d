"""Whether a fine-tuned draft's vocab map is its parent's: a regenerated map with carried-over rows."""

from __future__ import annotations

from collections.abc import Iterator

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Reports, SideContext
from rca.sdk.examples import SMALL_VOCAB_DRAFT, SMALL_VOCAB_TARGET, d2t_offsets
from rca.sdk.inputs import DraftWeights

_KEPT = (1, 5, 9, 13, 17, 21, 25, 29)  # the target ids a parent draft of 8 tokens keeps
_REGENERATED = (1, 5, 9, 13, 18, 22, 26, 30)  # the map a fine-tune selected again from new data
_SHOWN = 3  # draft ids quoted where the maps differ


def _checkpoint(d2t: tuple[int, ...]) -> dict:
    return {"d2t": ("I64", (8,), d2t_offsets(d2t)), "lm_head.weight": ("F16", (8, 4), None)}


class VocabMapLineage(Analyzer):
    """Compares a fine-tuned draft's vocab map with the one of the draft it was fine-tuned from.

    ## What it reads
    With `--parent-draft DIR`: the `d2t` of both checkpoints (for each draft id i, the offset to
    its target id), as the vocab-map check reads them, and the ids where the two send draft token i
    to different target tokens.

    ## Why it matters
    Fine-tuning that selects the draft vocabulary again from new data writes a new map, while the
    `lm_head` rows it starts from still score the parent's tokens: row i now stands for another
    token, and the training accuracy, measured through the new map, looks fine. The probe
    `vocab-map-carried` settles it by comparing the two heads' rows where the maps differ.
    """

    code = "RCA-D106"
    name = "vocab-map-lineage"
    formerly = ("RCA-S115",)
    sides = frozenset({"serving"})
    compares = Compares(
        training="the vocab map and head rows of the draft it was fine-tuned from (--parent-draft)",
        serving="the fine-tuned draft's map, which the engine loads",
    )
    reports = (Reports("vocab-map-changed", hypothesis="vocab-map-regenerated"),)
    VALID = (
        Example(
            files={},
            target=SMALL_VOCAB_TARGET,
            draft=SMALL_VOCAB_DRAFT,
            weights=_checkpoint(_KEPT),
            parent_weights=_checkpoint(_KEPT),
            why="the fine-tune kept its parent's map",
        ),
    )
    INVALID = (
        Example(
            files={},
            target=SMALL_VOCAB_TARGET,
            draft=SMALL_VOCAB_DRAFT,
            weights=_checkpoint(_REGENERATED),
            parent_weights=_checkpoint(_KEPT),
            finding="vocab-map-changed",
            path="model.safetensors",
            line=1,
            message=(
                "the draft's d2t sends 4 of its 8 tokens to other target tokens than its parent's "
                "(parent/model.safetensors) does (draft id 4: target 17 in the parent, 18 here; 5: 21, 22; 6: 25, "
                "26): a fine-tune regenerated the map, while lm_head row i was trained for the parent's token"
            ),
            why="a resumed fine-tune selected the draft vocabulary again from its own data",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.parent is not None and ctx.draft is not None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.parent is not None
        child, parent = ctx.declared_draft.weights, ctx.parent.weights
        mine, theirs = _targets(child), _targets(parent)
        if child is None or parent is None or mine is None or theirs is None:
            which = "the draft" if mine is None else "its parent"
            ctx.note(f"the vocab map was not compared with the parent's: {which} has no readable d2t in its checkpoint")
            return
        differing = [i for i in range(min(len(mine), len(theirs))) if mine[i] != theirs[i]]
        differing += list(range(min(len(mine), len(theirs)), max(len(mine), len(theirs))))
        if not differing:
            return
        d2t = child.find("d2t")
        parent_d2t = parent.find("d2t")
        assert d2t is not None and parent_d2t is not None
        quoted = "; ".join(
            f"{'draft id ' if n == 0 else ''}{i}: "
            + (f"target {theirs[i]} in the parent, {mine[i]} here" if n == 0 else f"{theirs[i]}, {mine[i]}")
            for n, i in enumerate(i for i in differing if i < min(len(mine), len(theirs)))
            if n < _SHOWN
        )
        yield self.finding(
            ctx,
            "vocab-map-changed",
            f"the draft's d2t sends {len(differing):,} of its {len(mine):,} tokens to other target tokens than its "
            f"parent's ({parent.shown(parent_d2t)}) does ({quoted}): a fine-tune regenerated the map, while "
            f"lm_head row i was trained for the parent's token",
            child.step(d2t.name).location,
            likelihood_ratio=5.0,
            steps=(child.step(d2t.name), parent.step(parent_d2t.name)),
        )


def _targets(weights: DraftWeights | None) -> tuple[int, ...] | None:
    """The target id of each draft token (`i + d2t[i]`), as the checkpoint's map says."""
    tensor = weights.find("d2t") if weights is not None else None
    values = weights.values.get(tensor.name) if weights is not None and tensor is not None else None
    if values is None or not all(isinstance(value, int) for value in values):
        return None
    return tuple(i + offset for i, offset in enumerate(values))
