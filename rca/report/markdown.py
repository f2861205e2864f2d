"""The Markdown case report: pasteable into an issue or a pull request."""

from __future__ import annotations

from ..model import Diagnosis, Hypothesis, Step
from .common import cited, headline, hypothesis_label, slot_rows


def render(diagnosis: Diagnosis) -> str:
    lines = [f"# rca: {headline(diagnosis)}", "", diagnosis.verdict.summary, ""]
    lines += ["## Wiring", "", "| | training | serving | |", "|---|---|---|---|"]
    lines += [f"| {label} | `{left}` | `{right}` | {mark} |" for label, left, right, mark in slot_rows(diagnosis)]
    if diagnosis.hypotheses:
        lines += ["", "## Hypotheses", ""]
        for hypothesis in diagnosis.hypotheses:
            lines += _hypothesis(hypothesis)
    for side in ("serving", "training"):
        wiring = diagnosis.wirings[side]
        lines += ["", f"## How {side} wires it", ""]
        if wiring.steps:
            lines += ["| where | what |", "|---|---|"]
            lines += [f"| `{cited(step)}` | {_escape(step.note)} |" for step in wiring.steps]
        lines += [f"- note: {_escape(note)}" for note in wiring.notes]
    if diagnosis.agent is not None:
        lines += ["", "## Evidence the agent gathered", ""]
        for number, step in enumerate(diagnosis.agent["steps"], 1):
            lines += [f"{number}. **{step['probe']}** — why: {_escape(step['reason'])}. Observed: {_escape(step['observed'])}"]
        lines += ["", f"Stopped: {_escape(diagnosis.agent['stopped'])}."]
        for missing in diagnosis.agent["missing"]:
            lines.append(f"- missing: `{missing['probe']}` ({_escape(missing['reason'])}); gather it with `{missing['command']}`")
    if diagnosis.warnings:
        lines += ["", "## Warnings", ""] + [f"- {_escape(warning)}" for warning in diagnosis.warnings]
    if diagnosis.inputs:
        lines += ["", "## Inputs", ""] + [f"- `{key}`: `{value}`" for key, value in diagnosis.inputs.items()]
    return "\n".join(lines) + "\n"


def _hypothesis(hypothesis: Hypothesis) -> list[str]:
    lines = [f"### {hypothesis.rank}. `{hypothesis_label(hypothesis)}` — {hypothesis.score:.2f}", "", f"**{hypothesis.title}.** {_escape(hypothesis.reason)}", ""]
    if hypothesis.fix:
        lines += [f"**Fix:** {_escape(hypothesis.fix)}", ""]
    if hypothesis.evidence:
        lines += ["Evidence:", ""]
        lines += [f"- {_escape(item.summary)} (likelihood ratio {item.likelihood_ratio:g}, {item.confidence.value})" for item in hypothesis.evidence]
        lines.append("")
    if hypothesis.citations:
        lines += ["Citations:", ""] + [_citation(step) for step in hypothesis.citations] + [""]
    return lines


def _citation(step: Step) -> str:
    code = f" — `{step.code}`" if step.code and "`" not in step.code else ""
    return f"- `{cited(step)}` {_escape(step.note)}{code}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")
