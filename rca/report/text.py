"""The terminal report: verdict, the two wirings side by side, ranked hypotheses, the derivations."""

from __future__ import annotations

from rca.model import RULED_OUT, Diagnosis, Step
from rca.report.common import (
    cited,
    engine_lines,
    headline,
    hypothesis_label,
    missing_evidence,
    severity_label,
    slot_rows,
)

MAX_HYPOTHESES = 5
MAX_CITATIONS = 8


def render(diagnosis: Diagnosis) -> str:
    verdict = diagnosis.verdict
    lines = [f"rca: {headline(diagnosis)}", verdict.summary, ""]
    if verdict.assumptions:
        lines += ["Assumed"] + [f"  {assumption}" for assumption in verdict.assumptions] + [""]
    if diagnosis.warnings:
        lines += ["Warnings"] + [f"  {warning}" for warning in diagnosis.warnings] + [""]
    rows = [("", "training", "serving", ""), *slot_rows(diagnosis)] if not verdict.drafting else []  # no wiring
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(3)]
    for row in rows:
        lines.append(
            "  "
            + "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
            + (f"  {row[3]}" if row[3] else "")
        )
    if diagnosis.hypotheses:
        lines += ["", "Hypotheses"]
        shown = [h for h in diagnosis.hypotheses[:MAX_HYPOTHESES] if h.rank == 1 or h.score >= RULED_OUT]
        for hypothesis in shown:
            severity = severity_label(hypothesis, verdict)
            lines.append(
                f"  {hypothesis.rank}. {hypothesis_label(hypothesis)}  {hypothesis.score:.2f}  "
                + (f"{severity}: " if severity else "")
                + hypothesis.title
            )
            lines.append(f"     {hypothesis.reason}")
            if hypothesis.fix and hypothesis.rank == 1:
                lines.append(f"     fix: {hypothesis.fix}")
            for step in hypothesis.citations[:MAX_CITATIONS] if hypothesis.rank == 1 else ():
                lines.append(f"       {cited(step):48} {step.code or step.note}")
            hidden = len(hypothesis.citations) - MAX_CITATIONS
            if hypothesis.rank == 1 and hidden > 0:
                lines.append(f"       (and {hidden} more in --format json or markdown)")
        unlikely = [hypothesis_label(h) for h in diagnosis.hypotheses if h not in shown and h.score < RULED_OUT]
        if unlikely:
            lines.append(f"  ruled out (under {RULED_OUT}): {', '.join(unlikely)}")
        more = len(diagnosis.hypotheses) - len(shown) - len(unlikely)
        if more:
            lines.append(f"  (and {more} more)")
    for side in ("serving", "training"):
        wiring = diagnosis.wirings[side]
        if wiring.steps:
            lines += ["", f"How {side} wires it"]
            lines += [_step_line(step) for step in wiring.steps]
        for note in wiring.notes:
            lines.append(f"  note: {note}")
    if diagnosis.agent is not None:
        lines += ["", "What the agent did"]
        for number, step in enumerate(diagnosis.agent["steps"], 1):
            lines += [f"  {number}. {step['probe']}: {step['reason']}", f"     observed: {step['observed']}"]
        if not diagnosis.agent["steps"]:
            lines.append("  no probe ran")
        lines.append(f"  stopped: {diagnosis.agent['stopped']}")
        impact = diagnosis.agent.get("impact")
        if impact and impact["measured"]:
            lines += ["", "What the mismatch costs", f"  {impact['summary']}"]
    if diagnosis.engine is not None:
        lines += ["", "In the engine", *(f"  {line}" for line in engine_lines(diagnosis.engine))]
    missing = missing_evidence(diagnosis)
    if missing:
        lines += ["", "Evidence that would settle more"] + [f"  {what}:\n    {command}" for what, command in missing]
    return "\n".join(lines) + "\n"


def _step_line(step: Step) -> str:
    return f"  {cited(step):48} {step.note}"
