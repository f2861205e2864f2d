"""Pieces shared by the human-readable reports."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from rca.model import RULED_OUT, Diagnosis, Hypothesis, Severity, Status, Step, Tap, Verdict, Wiring


def taps(slots: tuple[Tap, ...]) -> str:
    return "[" + ", ".join(str(tap) for tap in slots) + "]" if slots else "(unresolved)"


def headline(diagnosis: Diagnosis) -> str:
    """The verdict in one line, with the count of warnings a reader must not miss."""
    verdict = diagnosis.verdict
    text = verdict.status.value
    root = next((h for h in diagnosis.hypotheses if h.id == verdict.root_cause), None)
    if root is not None:
        text += f": {root.id} ({root.score:.2f})"
    count = len(diagnosis.warnings) + len(verdict.warnings)
    return text + (f", {count} warning{'s' if count > 1 else ''}" if count else "")


def severity_label(hypothesis: Hypothesis, verdict: Verdict) -> str:
    """How much a hypothesis matters, as reports print it: its severity, or `alternative` for a
    rival explanation of a difference the verdict's cause explains (none for a consistent wiring)."""
    if hypothesis.id == "wiring-consistent":
        return ""
    if hypothesis.severity is Severity.CAUSE and hypothesis.id not in verdict.causes:
        return "alternative"
    return hypothesis.severity.value


def conditional(hypothesis: Hypothesis) -> str:
    """The hypothesis's reason, stated as fact only when its score allows it."""
    if hypothesis.score >= RULED_OUT:
        return hypothesis.reason
    return f"unlikely ({hypothesis.score:.2f}); were it the cause: {hypothesis.reason}"


def slot_rows(diagnosis: Diagnosis) -> list[tuple[str, str, str, str]]:
    """(label, training, serving, mark) rows comparing the two wirings slot by slot."""
    training, serving = diagnosis.wirings["training"], diagnosis.wirings["serving"]
    root = diagnosis.hypotheses[0] if diagnosis.verdict.root_cause and diagnosis.hypotheses else None
    graph = list(root.params.get("graph_taps") or ()) if root is not None else []  # what graph-replayed batches feed
    rows = []
    for index in range(max(len(training.slots), len(serving.slots))):
        left = str(training.slots[index]) if index < len(training.slots) else "-"
        right = str(serving.slots[index]) if index < len(serving.slots) else "-"
        compared = bool(training.slots) and bool(serving.slots)  # a side that resolved nothing is not compared
        mark = ("ok" if left == right else "DIFFERS") if compared else ""
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
    params = ", ".join(
        str(value) for key, value in hypothesis.params.items() if key in ("tap", "offset") and value is not None
    )
    return f"{hypothesis.id}" + (f" ({params})" if params else "")


RUNTIME_DEPENDENT = ("capture-before-allreduce", "graph-captured-defaults")


def diagnose_command(diagnosis: Diagnosis, *extra: str) -> str:
    """The `rca diagnose` command line of this diagnosis's inputs, with `extra` options (which
    replace an input given with the same option)."""
    replaced = {word for option in extra for word in option.split() if word.startswith("--")}
    options = [
        f"--{flag} {shlex.quote(value)}"
        for key, value in diagnosis.inputs.items()
        if f"--{(flag := key.replace('_', '-'))}" not in replaced
    ]
    return " ".join(["rca diagnose", *options, *extra])


_WEIGHTS_INDEX_COMMAND = (
    "hf download ORG/NAME model.safetensors.index.json --local-dir MODEL_DIR (beside its config.json), then "
    "the same launch with MODEL_DIR as the model"
)


def missing_evidence(diagnosis: Diagnosis) -> list[tuple[str, str]]:
    """What evidence would settle more than this diagnosis did, and the command that gathers it."""
    if diagnosis.verdict.drafting:  # MTP layers: no wiring, dumps or capture apply; only their weights' index
        settled_by = diagnosis.verdict.settled_by
        return [(f"{settled_by} is not at hand", _WEIGHTS_INDEX_COMMAND)] if settled_by else []
    missing: list[tuple[str, str]] = []
    agent = diagnosis.agent
    if agent is not None:
        missing += [(f"{item['probe']} could not run ({item['reason']})", item["command"]) for item in agent["missing"]]
        impact = agent.get("impact")
        if impact and not impact["measured"]:
            missing.append((f"what the mismatch costs could not be measured ({impact['reason']})", impact["command"]))
    training = diagnosis.wirings["training"]
    if agent is None and "dumps" in diagnosis.inputs:
        missing.append(("the training dumps were not probed", diagnose_command(diagnosis, "--probe")))
    elif agent is None and not training.resolved:
        missing.append(
            (
                "what training fed is unknown: its source (--training SRC) would tell, or its dumps probed",
                diagnose_command(diagnosis, "--dumps DUMPS --target MODEL_DIR --probe"),
            )
        )
    top = diagnosis.hypotheses[0] if diagnosis.hypotheses else None
    if diagnosis.verdict.status is not Status.MISMATCH or (
        top is not None and (top.score < 0.9 or top.id in RUNTIME_DEPENDENT)
    ):
        missing.append(
            (
                "what the served draft receives at run time (a capture compared with the training dumps)",
                "rca capture --output cap -- <the server's launch command>; rca probe compare --capture cap --dumps "
                "DUMPS",
            )
        )
    return missing


def engine_lines(engine: Mapping[str, Any]) -> list[str]:
    """What the engine measured (rca.evidence.engine.verify.EngineCheck.to_json), one line each."""
    lines = [str(engine["summary"])]
    for label, key in (("as served", "as_served"), ("with the fix", "with_fix")):
        measured = engine.get(key)
        if measured:
            positions = ", ".join(f"{rate:.3f}" for rate in measured.get("by_position", ()))
            lines.append(
                f"{label}: {measured['accepted_tokens']:,} of {measured['draft_tokens']:,} draft tokens accepted "
                f"({measured['acceptance']:.3f}), mean acceptance length {measured['mean_acceptance_length']:.2f}"
                + (f", by position {positions}" if positions else "")
                + f" ({measured['prompts']} prompts, {measured['engine']})"
            )
    lines += [f"not measured: {reason}" for reason in engine.get("failed", ())]
    return lines
