"""Pieces shared by the human-readable reports."""

from __future__ import annotations

from ..model import Diagnosis, Hypothesis, Step, Tap, Wiring


def taps(slots: tuple[Tap, ...]) -> str:
    return "[" + ", ".join(str(tap) for tap in slots) + "]" if slots else "(unresolved)"


def headline(diagnosis: Diagnosis) -> str:
    verdict = diagnosis.verdict
    if verdict.root_cause:
        top = diagnosis.hypotheses[0]
        return f"{verdict.status.value}: {verdict.root_cause} ({top.score:.2f})"
    return verdict.status.value


def slot_rows(diagnosis: Diagnosis) -> list[tuple[str, str, str, str]]:
    """(label, training, serving, mark) rows comparing the two wirings slot by slot."""
    training, serving = diagnosis.wirings["training"], diagnosis.wirings["serving"]
    root = diagnosis.hypotheses[0] if diagnosis.verdict.root_cause and diagnosis.hypotheses else None
    graph = list(root.params.get("graph_taps") or ()) if root is not None else []  # what graph-replayed batches feed
    rows = []
    for index in range(max(len(training.slots), len(serving.slots))):
        left = str(training.slots[index]) if index < len(training.slots) else "-"
        right = str(serving.slots[index]) if index < len(serving.slots) else "-"
        mark = "ok" if left == right else "DIFFERS"
        if index < len(graph) and graph[index] != left:
            mark = f"DIFFERS in graphs ({graph[index]})"
        rows.append((f"slot {index}", left, right, mark))
    rows.append(("verifier-last", str(training.verifier_last or "-"), str(serving.verifier_last or "-"), ""))
    rows.append(("fc slots", _count(training.fc_slots), _count(serving.fc_slots), ""))
    rows.append(("layer ids", _ids(training), _ids(serving), ""))
    return rows


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _ids(wiring: Wiring) -> str:
    return "-" if wiring.ids is None else str(list(wiring.ids))


def cited(step: Step) -> str:
    mark = " [patched]" if step.patched else ""
    return f"{step.location}{mark}"


def hypothesis_label(hypothesis: Hypothesis) -> str:
    params = ", ".join(str(value) for key, value in hypothesis.params.items() if key in ("tap", "offset") and value is not None)
    return f"{hypothesis.id}" + (f" ({params})" if params else "")
