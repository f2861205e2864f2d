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
from rca.model import Diagnosis, Status, Step

SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVELS = {Status.MISMATCH: "error", Status.INCONCLUSIVE: "warning"}


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
    """`rca diagnose --format sarif`: the root cause as one result on the lines it cites (none when
    the wiring is consistent)."""
    status = diagnosis.verdict.status
    if status is Status.CONSISTENT or (not diagnosis.hypotheses and status is not Status.INCONCLUSIVE):
        return log([], [])
    top = diagnosis.hypotheses[0] if diagnosis.hypotheses else None
    rule_id = diagnosis.verdict.root_cause or (top.id if top else "wiring-unresolved")
    citations = _unique(top.citations if top else ())
    result = {
        "ruleId": rule_id,
        "level": _LEVELS[status],
        "message": {"text": diagnosis.verdict.summary},
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
        "properties": {"status": status.value, **({"score": round(top.score, 4), "fix": top.fix} if top else {})},
    }
    return log([result], [rule_id], _bases(diagnosis.inputs, {step.location.input for step in citations}))


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
