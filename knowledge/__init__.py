"""The hypothesis catalog: one self-describing TOML file per hypothesis, named by its id."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CATALOG_DIR = Path(__file__).parent / "hypotheses"


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    prior: float
    summary: str
    why: str
    evidence_for: tuple[str, ...]
    evidence_against: tuple[str, ...]
    fix: str
    references: tuple[str, ...]
    scope: str = "wiring"  # "wiring": what the draft is fed; "contract": how the engine serves the draft itself

    @property
    def contract(self) -> bool:
        return self.scope == "contract"

    def render(self) -> str:
        """The entry as `rca explain` prints it."""
        lines = [
            f"{self.id}: {self.title}",
            "",
            self.summary.strip(),
            "",
            "Why it hurts acceptance:",
            f"  {self.why.strip()}",
        ]
        lines += ["", "Evidence for:"] + [f"  - {item}" for item in self.evidence_for]
        if self.evidence_against:
            lines += ["", "Evidence against:"] + [f"  - {item}" for item in self.evidence_against]
        lines += ["", "Fix:", f"  {self.fix.strip()}", "", f"Prior: {self.prior}"]
        if self.references:
            lines += ["", "References:"] + [f"  - {item}" for item in self.references]
        return "\n".join(lines)


@lru_cache(maxsize=1)
def catalog() -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for path in sorted(CATALOG_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        entry = Entry(
            id=data["id"],
            title=data["title"],
            prior=float(data["prior"]),
            summary=data["summary"],
            why=data["why"],
            evidence_for=tuple(data.get("evidence_for", ())),
            evidence_against=tuple(data.get("evidence_against", ())),
            fix=data["fix"],
            references=tuple(data.get("references", ())),
            scope=str(data.get("scope", "wiring")),
        )
        if entry.scope not in ("wiring", "contract"):
            raise RuntimeError(f"{path.name}: scope {entry.scope!r} is neither 'wiring' nor 'contract'")
        if entry.id != path.stem:
            raise RuntimeError(f"{path.name}: id {entry.id!r} does not match the file name")
        entries[entry.id] = entry
    return entries
