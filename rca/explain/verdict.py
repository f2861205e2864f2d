"""The verdict: consistent, a mismatch with its root cause, or inconclusive, in one sentence."""

from __future__ import annotations

from rca.knowledge import catalog
from rca.model import Hypothesis, Status, Tap, Verdict, Wiring


def verdict_of(training: Wiring, serving: Wiring, hypotheses: tuple[Hypothesis, ...]) -> Verdict:
    missing = [wiring for wiring in (training, serving) if not wiring.resolved]
    reasons = "; ".join(note for wiring in missing for note in wiring.notes[-1:]) or "unresolved"
    hypotheses = tuple(h for h in hypotheses if not h.params.get("suspicion"))  # candidates, not causes
    if hypotheses and catalog()[hypotheses[0].id].contract:
        top = hypotheses[0]
        broken = f"{top.title[:1].lower() + top.title[1:]} ({top.score:.2f})"
        party = "its training" if catalog()[top.id].scope == "training" else "the serving engine"
        if not missing and training.slots == serving.slots:
            summary = (
                f"the wiring is consistent (serving feeds {_taps(serving.slots)}, as trained), but the draft's "
                f"contract with {party} is not: {broken}"
            )
        else:
            wiring = (
                f"the wiring was not checked ({reasons})"
                if missing
                else f"the wiring differs too (serving feeds {_taps(serving.slots)} where training fed "
                f"{_taps(training.slots)})"
            )
            summary = f"the draft's contract with {party} is broken: {broken}; {wiring}"
        return Verdict(Status.MISMATCH, top.id, summary)
    if missing:
        return Verdict(
            Status.INCONCLUSIVE,
            None,
            f"the {' and '.join(w.side for w in missing)} wiring could not be resolved: {reasons}",
        )
    top = hypotheses[0]
    if top.id == "wiring-consistent":
        return Verdict(
            Status.CONSISTENT,
            None,
            f"serving feeds the draft what it was trained on ({_taps(serving.slots)}); look beyond the hidden-state "
            f"wiring",
        )
    graph, partial = top.params.get("graph_taps"), top.params.get("partial_taps")
    if graph:
        fed = f"serving feeds [{', '.join(graph)}] in graph-replayed batches"
    elif partial:
        fed = f"serving feeds [{', '.join(partial)}] in batches whose all-reduce is fused into the next layer"
    else:
        fed = f"serving feeds {_taps(serving.slots)}"
    return Verdict(
        Status.MISMATCH,
        top.id,
        f"{fed} where training fed {_taps(training.slots)}: {top.title[:1].lower() + top.title[1:]} ({top.score:.2f})",
    )


def _taps(slots: tuple[Tap, ...]) -> str:
    return "[" + ", ".join(str(tap) for tap in slots) + "]"
