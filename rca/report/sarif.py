"""SARIF 2.1.0 logs, so that CI code scanning shows rca's findings on the lines they cite.

The rule of a result is a hypothesis of the catalog (`embed-slot-added`), described from its
catalog entry; a location names the input it belongs to (`uriBaseId`: serving, training, draft,
...) with its path relative to that input's root, as every citation does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from rca.inputs.files import resolved
from rca.knowledge import catalog
from rca.model import Diagnosis, Hypothesis, Severity, Status, Step

SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


def rule(hypothesis_id: str) -> dict | None:
    """The reporting descriptor of a catalog hypothesis (None for an id the catalog lacks)."""
    entry = catalog().get(hypothesis_id)
    if entry is None:
        return None
    return {
        "id": hypothesis_id,
        "name": hypothesis_id,
        "shortDescription": {"text": entry.title},
        "fullDescription": {"text": " ".join(entry.summary.split())},
        "help": {"text": entry.fix},
        **({"helpUri": entry.references[0]} if entry.references else {}),
    }


def location(path: str, line: int, end_line: int | None = None, base: str | None = None, note: str = "") -> dict:
    region = {"startLine": line, **({"endLine": end_line} if end_line and end_line > line else {})}
    artifact = {"uri": path, **({"uriBaseId": base} if base else {})}
    return {
        "physicalLocation": {"artifactLocation": artifact, "region": region},
        **({"message": {"text": note}} if note else {}),
    }


def log(results: list[dict], rule_ids: Iterable[str], bases: Mapping[str, str] | None = None) -> str:
    """One run of rca with its results and the rules they name."""
    rules = [described for described in (rule(rule_id) for rule_id in dict.fromkeys(rule_ids)) if described is not None]
    run: dict = {"tool": {"driver": {"name": "rca", "rules": rules}}, "results": results}
    if bases:
        run["originalUriBaseIds"] = {name: {"uri": uri} for name, uri in bases.items()}
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"


def render(diagnosis: Diagnosis) -> str:
    """`rca diagnose --format sarif`: the root cause, each independent cause, each warning and note
    as one result on the lines it cites, at SARIF's level for its severity (`error`, `warning`,
    `note`); an inconclusive diagnosis as one warning naming what would settle it. Rival
    explanations of the same difference are the root cause's alternatives, not results of their own."""
    status = diagnosis.verdict.status
    shown = _shown(diagnosis)
    if not shown and status is not Status.INCONCLUSIVE:
        return log([], [])
    results = [_result(diagnosis, hypothesis, hypothesis is shown[0]) for hypothesis in shown]
    if status is Status.INCONCLUSIVE and (not shown or shown[0].severity is not Severity.CAUSE):
        results.insert(0, _unresolved(diagnosis))
    used = {step.location.input for hypothesis in shown for step in hypothesis.citations}
    return log(results, [result["ruleId"] for result in results], _bases(diagnosis.inputs, used))


def _shown(diagnosis: Diagnosis) -> list[Hypothesis]:
    root = next((h for h in diagnosis.hypotheses if h.id == diagnosis.verdict.root_cause), None)
    shown = [root] if root is not None else []
    for hypothesis in diagnosis.hypotheses:
        if hypothesis is root or hypothesis.id == "wiring-consistent":
            continue
        rival = root is not None and set(hypothesis.explains) & set(root.explains)
        if hypothesis.severity is not Severity.CAUSE or not rival:
            shown.append(hypothesis)
    return shown


def _result(diagnosis: Diagnosis, hypothesis: Hypothesis, root: bool) -> dict:
    citations = _unique(hypothesis.citations)
    message = diagnosis.verdict.summary if root and diagnosis.verdict.root_cause else hypothesis.reason
    return {
        "ruleId": hypothesis.id,
        "level": hypothesis.severity.sarif_level,
        "message": {"text": message or hypothesis.title},
        **(
            {
                "locations": [
                    location(
                        step.location.path, step.location.line, step.location.end_line, step.location.input, step.note
                    )
                    for step in citations
                ]
            }
            if citations
            else {}
        ),
        "properties": {
            "status": diagnosis.verdict.status.value,
            "severity": hypothesis.severity.value,
            "score": round(hypothesis.score, 4),
            "fix": hypothesis.fix,
        },
    }


def _unresolved(diagnosis: Diagnosis) -> dict:
    return {
        "ruleId": "wiring-unresolved",
        "level": "warning",
        "message": {"text": diagnosis.verdict.summary},
        "properties": {"status": diagnosis.verdict.status.value, "settled_by": diagnosis.verdict.settled_by},
    }


def _unique(steps: Iterable[Step]) -> list[Step]:
    seen: dict[tuple, Step] = {}
    for step in steps:
        seen.setdefault((step.location.input, step.location.path, step.location.line), step)
    return list(seen.values())


def _bases(inputs: Mapping[str, str], used: set[str]) -> dict[str, str]:
    """File URIs of the source inputs that are local directories, so that a viewer can open the
    cited files (a release's files have no local root; configs are cited as given)."""
    bases = {}
    for name in sorted(used):
        spec = inputs.get(name.split(":")[-1])
        if name in ("serving", "training") and spec and Path(spec).is_dir():
            bases[name] = resolved(Path(spec)).as_uri() + "/"
    return bases
