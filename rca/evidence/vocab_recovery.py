"""A draft's vocab map recovered from its head: for each row of its `lm_head`, the target row it
still points at.

EAGLE-3 trainers start a reduced-vocabulary draft's `lm_head` from the target's rows of the tokens
it keeps, and training moves the rows only so far: row i stays nearest to the target's row of the
same token. Where the checkpoint has lost its `d2t` (or holds a wrong one), the nearest target row
of each draft row gives it back (`d2t[i] = j - i`, `t2d[j]` set), provided the rows agree with the
target's as trained heads do; each target token is claimed once, the most alike pairs first. The whole of both heads
is read (draft vocabulary x hidden, target vocabulary x hidden), and the comparison costs draft
vocabulary x target vocabulary x hidden multiply-adds, so a model too large for the device says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rca.evidence.reference import ProbeUnavailable, require_torch, resolve_device
from rca.inputs.checkpoint import Checkpoint
from rca.inputs.draft import weights_directory
from rca.model import CheckpointEdit

HEADS = ("lm_head.weight", "embed_tokens.weight")  # a target with tied embeddings scores with its embedding
ALIGNED = 0.5  # the least cosine of a draft row with the target row of its token
COVERED = 0.95  # the share of draft rows that must reach it
MAX_WORK = {"cpu": 2e11, "cuda": 2e14}  # multiply-adds of the comparison a device is given
CHUNK = 4096  # draft rows compared at once
CANDIDATES = 8  # nearest target rows kept per draft row
CLEAR = 0.01  # a row whose two nearest target rows are closer than this is told apart by a guess


@dataclass(frozen=True)
class RecoveredMap:
    d2t: tuple[int, ...]  # target id of draft id i is i + d2t[i]
    target_vocab: int
    mean_cosine: float
    aligned: float  # the share of draft rows at ALIGNED or more with their target row
    ambiguous: int  # rows nearly as close to another target row (tokens training never told apart)
    draft_head: str  # where the rows come from, for the report
    target_head: str

    @property
    def edit(self) -> CheckpointEdit:
        return CheckpointEdit({"d2t": self.d2t}, self.target_vocab)

    @property
    def summary(self) -> str:
        guessed = (
            f"; {self.ambiguous:,} rows are about as close to another target row (tokens training never moved "
            "apart, seldom proposed): theirs is a guess"
            if self.ambiguous
            else ""
        )
        return (
            f"recovered from the {len(self.d2t):,} rows of the draft's lm_head ({self.draft_head}): each row's nearest "
            f"row of the target's {self.target_head}, each target token once (mean cosine {self.mean_cosine:.2f}, "
            f"{self.aligned:.0%} of the rows at {ALIGNED} or more{guessed})"
        )


def recover_map(
    draft: Path,
    target: Path,
    base: Path | None = None,
    device: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> RecoveredMap:
    """The vocab map the draft's `lm_head` rows give, or ProbeUnavailable saying why they give none."""
    torch = require_torch()
    draft_checkpoint = Checkpoint.open(weights_directory(draft), base, flag="--draft")
    target_checkpoint = Checkpoint.open(target, base)
    draft_head, target_head = draft_checkpoint.find(["lm_head.weight"]), target_checkpoint.find(HEADS)
    if draft_head is None or target_head is None:
        missing = "the draft has no lm_head" if draft_head is None else "the target has no lm_head or embedding"
        raise ProbeUnavailable(f"no vocab map to recover: {missing}", fix="pass the draft's and the target's weights")
    rows, width = draft_checkpoint.entry(draft_head).shape
    target_rows, target_width = target_checkpoint.entry(target_head).shape
    if width != target_width or rows > target_rows:
        raise ProbeUnavailable(
            f"no vocab map to recover: the draft's lm_head is [{rows}, {width}], the target's [{target_rows}, "
            f"{target_width}]",
            fix="pass the target the draft was trained for",
        )
    where = resolve_device(device)
    work = rows * target_rows * width
    if work > MAX_WORK["cuda" if where.startswith("cuda") else "cpu"]:
        raise ProbeUnavailable(
            f"recovering the vocab map compares {rows:,} x {target_rows:,} rows of width {width}: too much for the "
            f"{where}",
            fix="run it with --device cuda, or export the draft's d2t with its checkpoint",
        )
    if progress:
        progress(f"recovering the vocab map: {rows:,} draft rows against {target_rows:,} target rows")
    ours = torch.nn.functional.normalize(draft_checkpoint.rows(draft_head, torch.arange(rows)).to(where), dim=-1)
    theirs = torch.nn.functional.normalize(
        target_checkpoint.rows(target_head, torch.arange(target_rows)).to(where), dim=-1
    )
    candidates, scores_of = [], []
    for start in range(0, rows, CHUNK):
        scores = ours[start : start + CHUNK] @ theirs.T
        value, index = scores.topk(min(CANDIDATES, target_rows), dim=-1)
        scores_of.append(value.cpu())
        candidates.append(index.cpu())
    values, indices = torch.cat(scores_of), torch.cat(candidates)
    targets, cosines = _assign(torch, values, indices, ours, theirs)
    ambiguous = int(((values[:, 0] - values[:, 1]) < CLEAR).sum()) if values.shape[1] > 1 else 0
    aligned = float((cosines >= ALIGNED).float().mean())
    if aligned < COVERED:
        raise ProbeUnavailable(
            f"no vocab map to recover: only {aligned:.0%} of the draft's lm_head rows resemble a target row (cosine "
            f"{ALIGNED} or more); its head was not started from the target's",
            fix="export the draft's d2t with its checkpoint",
        )
    d2t = tuple(int(value) for value in (targets - torch.arange(rows)).tolist())
    return RecoveredMap(d2t, target_rows, float(cosines.mean()), aligned, ambiguous, draft_head, target_head)


def _assign(torch, values, indices, ours, theirs):
    """One target row per draft row, the most alike pairs first (a target token is claimed once):
    each row's nearest candidates, then, for a row whose candidates were all claimed, the nearest
    target row left."""
    rows = len(values)
    targets = torch.full((rows,), -1, dtype=torch.long)
    cosines = torch.zeros(rows)
    taken = torch.zeros(theirs.shape[0], dtype=torch.bool)
    order = values.flatten().argsort(descending=True)
    for flat in order.tolist():
        row, rank = divmod(flat, values.shape[1])
        target = int(indices[row, rank])
        if targets[row] < 0 and not taken[target]:
            targets[row], cosines[row], taken[target] = target, values[row, rank], True
    for row in (targets < 0).nonzero().flatten().tolist():  # every candidate claimed by a closer row
        scores = (theirs @ ours[row]).cpu().masked_fill(taken, float("-inf"))
        target = int(scores.argmax())
        targets[row], cosines[row], taken[target] = target, scores[target], True
    return targets, cosines
