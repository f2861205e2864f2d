"""The Markdown report (`report.md` of a case, `--format markdown`): readable in a minute, pasteable
into an issue. The verdict first, then the two wirings side by side, the derivation of each as a
diagram and as text, the ranked hypotheses with their evidence, citations and fix (as a diff where
it is a config edit), the agent's transcript, and what evidence is missing with the command that
would gather it."""

from __future__ import annotations

import re

from rca.model import RULED_OUT, Diagnosis, Hypothesis, Status, Step, Verdict
from rca.report.common import (
    cited,
    conditional,
    engine_lines,
    headline,
    hypothesis_label,
    missing_evidence,
    severity_label,
    slot_rows,
    taps,
)
from rca.report.diagram import sides_mermaid

MAX_HYPOTHESES = 6  # the runner-up is always shown; the others below RULED_OUT are listed by name only


def render(diagnosis: Diagnosis) -> str:
    lines = [f"# rca: {headline(diagnosis)}", "", verdict_paragraph(diagnosis), ""]
    if diagnosis.verdict.assumptions:
        lines += ["## Assumed", ""] + [f"- {_escape(item)}" for item in diagnosis.verdict.assumptions] + [""]
    if diagnosis.warnings:
        lines += ["## Warnings", ""] + [f"- {_escape(warning)}" for warning in diagnosis.warnings] + [""]
    if not diagnosis.verdict.drafting:  # the target's own MTP layers: no wiring to show
        lines += ["## The two wirings", "", "| | training | serving | |", "|---|---|---|---|"]
        lines += [f"| {label} | `{left}` | `{right}` | {mark} |" for label, left, right, mark in slot_rows(diagnosis)]
    training, serving = diagnosis.wirings["training"], diagnosis.wirings["serving"]
    if training.slots or serving.slots:
        lines += ["", "```mermaid", sides_mermaid(training, serving), "```"]
    for side in ("serving", "training"):
        wiring = diagnosis.wirings[side]
        if not (wiring.slots or wiring.steps or wiring.notes):  # nothing derived nor said (an MTP launch)
            continue
        lines += ["", f"## How {side} derives {taps(wiring.slots)}", ""]
        if wiring.steps:
            lines += ["| where | what |", "|---|---|"]
            lines += [f"| `{cited(step)}` | {_escape(step.note)} |" for step in wiring.steps] + [""]
        lines += [f"- note: {_escape(note)}" for note in wiring.notes]
    if diagnosis.hypotheses:
        lines += ["", "## Hypotheses, most likely first", ""]
        shown = [h for h in diagnosis.hypotheses[:MAX_HYPOTHESES] if h.rank <= 2 or h.score >= RULED_OUT]
        for hypothesis in shown:
            lines += _hypothesis(hypothesis, diagnosis.verdict)
        hidden = [h for h in diagnosis.hypotheses if h not in shown]
        if hidden:
            lines += [f"Also considered: {', '.join(f'`{h.id}` ({h.score:.2f})' for h in hidden)}.", ""]
    if diagnosis.agent is not None:
        lines += ["## What the agent did", ""]
        for number, step in enumerate(diagnosis.agent["steps"], 1):
            lines += [
                f"{number}. **{step['probe']}**, because it {_escape(step['reason'])}.",
                f"   Observed: {_escape(step['observed'])}.",
            ]
        if not diagnosis.agent["steps"]:
            lines.append("No probe ran.")
        lines += ["", f"Stopped: {_escape(diagnosis.agent['stopped'])}.", ""]
        impact = diagnosis.agent.get("impact")
        if impact and impact["measured"]:
            lines += [
                "## What the mismatch costs",
                "",
                f"{_escape(impact['summary'][:1].upper() + impact['summary'][1:])}.",
                "",
            ]
    if diagnosis.engine is not None:
        lines += ["## In the engine", "", *(f"- {_escape(line)}" for line in engine_lines(diagnosis.engine)), ""]
    missing = missing_evidence(diagnosis)
    if missing:
        lines += ["## Evidence that would settle more", ""]
        lines += [f"- {_escape(what)}: `{command}`" for what, command in missing]
        lines.append("")
    if diagnosis.inputs:
        lines += ["## Inputs", ""] + [f"- `{key}`: `{value}`" for key, value in diagnosis.inputs.items()] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def verdict_paragraph(diagnosis: Diagnosis) -> str:
    """One paragraph: what each side feeds, the most likely cause and how sure, the fix, the runner-up."""
    verdict = diagnosis.verdict
    if verdict.status is not Status.MISMATCH or not diagnosis.hypotheses:
        return f"**Verdict: {verdict.status.value}.** {_escape(verdict.summary[:1].upper() + verdict.summary[1:])}."
    training, serving = diagnosis.wirings["training"], diagnosis.wirings["serving"]
    top = next(h for h in diagnosis.hypotheses if h.id == verdict.root_cause)
    fed = (
        f"{_escape(verdict.drafting[:1].upper() + verdict.drafting[1:])}: no wiring applies. "
        if verdict.drafting
        else f"Serving feeds the draft {taps(serving.slots)}; training fed it {taps(training.slots)}. "
    )
    text = f"**Verdict: mismatch.** {fed}Most likely ({top.score:.2f}): **`{top.id}`**: {_escape(top.reason)}."
    if top.fix:
        text += f" **Fix:** {_escape(top.fix)}."
    others = [h for h in diagnosis.hypotheses if h is not top]
    if others:
        runner = others[0]
        text += f" Next most likely: `{runner.id}` ({runner.score:.2f})."
    if verdict.settled_by:
        text += f" What would separate them: {_escape(verdict.settled_by)}."
    return text


def _hypothesis(hypothesis: Hypothesis, verdict: Verdict) -> list[str]:
    reason = conditional(hypothesis)
    if not re.match(r"h\d", reason):  # a tap keeps its name
        reason = reason[:1].upper() + reason[1:]
    lines = [
        f"### {hypothesis.rank}. `{hypothesis_label(hypothesis)}` — {hypothesis.score:.2f}"
        + (f", {severity}" if (severity := severity_label(hypothesis, verdict)) else ""),
        "",
        f"**{hypothesis.title}.** {_escape(reason)}.",
        "",
    ]
    if hypothesis.evidence:
        lines += ["| evidence | likelihood ratio | bears | from |", "|---|---|---|---|"]
        lines += [
            f"| {_escape(item.summary)} | {item.likelihood_ratio:.3g} | {item.direction} | {item.confidence.value} |"
            for item in hypothesis.evidence
        ]
        lines += [
            "",
            f"Prior {hypothesis.prior:g} (how often this cause is reported), times these likelihood ratios, "
            f"normalized over the hypotheses that explain the same differences: posterior {hypothesis.score:.2f}.",
            "",
        ]
    if hypothesis.citations:
        lines += ["Cited:", ""] + [_citation(step) for step in hypothesis.citations] + [""]
    if hypothesis.fix:
        lines += [f"**Fix:** {_escape(hypothesis.fix)}", ""]
        if hypothesis.fix_diff and hypothesis.rank == 1:
            lines += ["```diff", hypothesis.fix_diff.rstrip("\n"), "```", ""]
    return lines


def _citation(step: Step) -> str:
    code = f" — `{step.code}`" if step.code and "`" not in step.code else ""
    return f"- `{cited(step)}` {_escape(step.note)}{code}"


def _escape(text: str) -> str:
    """Text for Markdown: table bars escaped, angle brackets as entities (not HTML tags)."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").rstrip(".")
