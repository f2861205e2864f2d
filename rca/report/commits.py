"""Renderers of `rca diff` and `rca history`: text, Markdown (a pull-request comment), JSON and
SARIF 2.1.0 (code-scanning results on the changed lines)."""

from __future__ import annotations

import json
from collections.abc import Callable

from rca.history.changes import History, Responsible, WiringChange
from rca.model import Tap
from rca.report import sarif

FORMATS = ("text", "markdown", "json", "sarif")
_LEVELS = {"introduces": "error", "changes": "warning", "keeps": "warning", "removes": "note"}
_EFFECTS = {
    "introduces": "introduces a mismatch",
    "removes": "removes the mismatch",
    "changes": "changes the mismatch",
    "keeps": "leaves the mismatch as it was",
    "none": "leaves the wiring consistent",
    "inconclusive": "cannot be judged: a side could not be resolved",
}


def _taps(slots: tuple[Tap, ...]) -> str:
    return "[" + ", ".join(str(tap) for tap in slots) + "]"


def _range(change: WiringChange) -> str:
    return f"{change.base.short}..{change.head.short}"


def _headline(change: WiringChange) -> str:
    cause = (
        change.after.verdict.root_cause
        if change.effect in ("introduces", "changes", "keeps")
        else change.before.verdict.root_cause
        if change.effect == "removes"
        else None
    )
    contract = "".join(
        f"; {verb} {', '.join(shown)}"
        for verb, ids in (("adds", change.contract_added), ("resolves", change.contract_removed))
        if (shown := [item for item in ids if item != cause]) and change.effect in ("changes", "keeps")
    )
    return _EFFECTS[change.effect] + (f" ({cause})" if cause else "") + contract


def _wiring_lines(change: WiringChange) -> list[str]:
    lines = []
    moved = change.slots_changed
    for side in ("serving", "training"):
        if side not in change.after.wirings:
            continue
        if side in moved:
            old, new = moved[side]
            lines.append(f"{side}: {_taps(old)} -> {_taps(new)}")
        else:
            lines.append(f"{side}: {_taps(change.after.wirings[side].slots)} (unchanged)")
    return lines


def _where(item: Responsible) -> str:
    return f"{item.commit.short + ' ' if item.commit else ''}{item.path}:{item.line}"


# -- diff ------------------------------------------------------------------------------------------


def diff_text(change: WiringChange) -> str:
    out = [f"rca diff {_range(change)}: {_headline(change)}"]
    out += [f"  {line}" for line in _wiring_lines(change)]
    out.append(f"  before: {change.before.verdict.summary}")
    out.append(f"  after:  {change.after.verdict.summary}")
    if change.responsible:
        out.append("  changed lines on the wiring path:")
        out += [f"    {_where(item):60} {item.code}" for item in change.responsible]
    elif change.effect != "none":
        out.append("  no changed line is cited by the diagnosis")
    if change.effect in ("introduces", "changes") and change.after.hypotheses:
        out.append(f"  fix: {change.after.hypotheses[0].fix}")
    return "\n".join(out) + "\n"


def diff_markdown(change: WiringChange) -> str:
    out = [f"### rca: `{_range(change)}` {_headline(change)}", ""]
    out += ["| side | before | after |", "|---|---|---|"]
    for side in ("serving", "training"):
        if side in change.after.wirings:
            old = change.before.wirings.get(side)
            out.append(
                f"| {side} | `{_taps(old.slots) if old else '-'}` | `{_taps(change.after.wirings[side].slots)}` |"
            )
    out += ["", f"**Before:** {change.before.verdict.summary}", "", f"**After:** {change.after.verdict.summary}", ""]
    if change.responsible:
        out += ["**Changed lines on the wiring path:**", ""]
        out += [f"- `{_where(item)}`: `{item.code}` ({item.note})" for item in change.responsible]
        out.append("")
    if change.effect in ("introduces", "changes") and change.after.hypotheses:
        out += [f"**Fix:** {change.after.hypotheses[0].fix}", ""]
    return "\n".join(out)


def _change_json(change: WiringChange) -> dict:
    return {
        "base": change.base.sha,
        "head": change.head.sha,
        "subject": change.head.subject,
        "effect": change.effect,
        "slots": {
            side: {"before": [str(t) for t in old], "after": [str(t) for t in new]}
            for side, (old, new) in change.slots_changed.items()
        },
        "before": {"status": change.before.verdict.status.value, "root_cause": change.before.verdict.root_cause},
        "after": {"status": change.after.verdict.status.value, "root_cause": change.after.verdict.root_cause},
        "contract": {"added": list(change.contract_added), "removed": list(change.contract_removed)},
        "responsible": [
            {
                "path": r.path,
                "line": r.line,
                "code": r.code,
                "note": r.note,
                "commit": r.commit.sha if r.commit else None,
            }
            for r in change.responsible
        ],
        "changed_files": list(change.changed_files),
    }


def diff_json(change: WiringChange) -> str:
    data = {"schema": "rca.diff/1", **_change_json(change), "diagnosis": change.after.to_json()}
    return json.dumps(data, indent=2) + "\n"


# -- history ---------------------------------------------------------------------------------------


def history_text(history: History) -> str:
    start = history.since.short if history.since else "the first commit"
    out = [
        f"rca history since {start}: {len(history.changes)} commit(s) changed the wiring ({history.analyzed} "
        f"of {history.commits} commits re-analyzed)"
    ]
    for change in history.changes:
        out.append(f"  {change.head.short} {change.head.date[:10]} {change.head.subject[:70]}")
        out.append(f"    {_headline(change)}")
        out += [f"    {line}" for line in _wiring_lines(change) if "->" in line]
        out += [f"      {_where(item)}  {item.code}" for item in change.responsible[:5]]
    return "\n".join(out) + "\n"


def history_markdown(history: History) -> str:
    out = [
        "### rca history",
        "",
        f"{history.analyzed} of {history.commits} commits re-analyzed; {len(history.changes)} changed the wiring.",
        "",
    ]
    out += ["| commit | effect | serving | training |", "|---|---|---|---|"]
    for change in history.changes:
        moved = change.slots_changed
        cells = [
            f"`{_taps(moved[side][0])}` → `{_taps(moved[side][1])}`" if side in moved else ""
            for side in ("serving", "training")
        ]
        out.append(
            f"| `{change.head.short}` {change.head.subject[:50]} | {_headline(change)} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(out) + "\n"


def history_json(history: History) -> str:
    data = {
        "schema": "rca.history/1",
        "since": history.since.sha if history.since else None,
        "head": history.head.sha,
        "commits": history.commits,
        "analyzed": history.analyzed,
        "changes": [_change_json(change) for change in history.changes],
    }
    return json.dumps(data, indent=2) + "\n"


# -- SARIF -----------------------------------------------------------------------------------------


def _sarif(changes: list[WiringChange]) -> str:
    results: list[dict] = []
    rule_ids: list[str] = []
    for change in changes:
        level = _LEVELS.get(change.effect)
        if level is None:
            continue
        diagnosis = change.before if change.effect == "removes" else change.after
        rule_id = diagnosis.verdict.root_cause or "wiring-consistent"
        rule_ids.append(rule_id)
        result: dict[str, object] = {
            "ruleId": rule_id,
            "level": level,
            "message": {"text": f"{_range(change)} {_headline(change)}: {diagnosis.verdict.summary}"},
            "properties": {"effect": change.effect, "base": change.base.sha, "head": change.head.sha},
        }
        if change.responsible:
            result["locations"] = [sarif.location(item.path, item.line) for item in change.responsible]
        results.append(result)
    return sarif.log(results, rule_ids)


DIFF_RENDERERS: dict[str, Callable[[WiringChange], str]] = {
    "text": diff_text,
    "markdown": diff_markdown,
    "json": diff_json,
    "sarif": lambda change: _sarif([change]),
}
HISTORY_RENDERERS: dict[str, Callable[[History], str]] = {
    "text": history_text,
    "markdown": history_markdown,
    "json": history_json,
    "sarif": lambda history: _sarif(list(history.changes)),
}
