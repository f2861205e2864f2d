"""Case directories: `case.toml` holds the inputs of a diagnosis and, for bundled cases, the
verdict it must reach. Paths inside a case are relative to its directory."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError
from .inputs import Inputs
from .model import Diagnosis, Tap

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CASE_FILE = "case.toml"
INPUT_KEYS = ("serving", "serving_patch", "serving_args", "training", "training_patch", "training_engine", "dumps", "draft", "target")


@dataclass(frozen=True)
class Expected:
    """The verdict a bundled case must reach."""

    status: str | None = None
    root_cause: str | None = None
    serving: tuple[str, ...] | None = None
    training: tuple[str, ...] | None = None
    verifier_last: str | None = None
    fix_ids: tuple[int, ...] | None = None
    ranked_below: tuple[str, ...] = ()  # hypotheses that must rank below the root cause

    def misses(self, diagnosis: Diagnosis) -> list[str]:
        """What the diagnosis got wrong, one line each (empty when it matches)."""
        problems = []
        if self.status and diagnosis.verdict.status.value != self.status:
            problems.append(f"status {diagnosis.verdict.status.value}, expected {self.status}")
        if self.root_cause and diagnosis.verdict.root_cause != self.root_cause:
            problems.append(f"root cause {diagnosis.verdict.root_cause}, expected {self.root_cause}")
        for side in ("serving", "training"):
            wanted = getattr(self, side)
            got = [str(tap) for tap in diagnosis.wirings[side].slots]
            if wanted is not None and got != list(wanted):
                problems.append(f"{side} slots {got}, expected {list(wanted)}")
        last = diagnosis.wirings["training"].verifier_last
        if self.verifier_last and str(last) != self.verifier_last:
            problems.append(f"training verifier-last {last}, expected {self.verifier_last}")
        if self.fix_ids is not None and diagnosis.hypotheses and str(list(self.fix_ids)) not in diagnosis.hypotheses[0].fix:
            problems.append(f"fix {diagnosis.hypotheses[0].fix!r} does not set {list(self.fix_ids)}")
        ranks = {hypothesis.id: hypothesis.rank for hypothesis in reversed(diagnosis.hypotheses)}
        for below in self.ranked_below:
            if self.root_cause in ranks and ranks.get(below, 10**6) <= ranks[self.root_cause]:
                problems.append(f"{below} ranks {ranks.get(below)}, not below {self.root_cause}")
        return problems


@dataclass(frozen=True)
class Case:
    directory: Path
    title: str
    inputs: Inputs
    expected: Expected | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def load_case(directory: Path) -> Case:
    path = directory / CASE_FILE
    if not directory.is_dir():
        raise InputError("case directory does not exist", where=str(directory), fix="pass a directory holding a case.toml")
    if not path.is_file():
        raise InputError(f"no {CASE_FILE} in the case directory", where=str(directory), fix=f"create {CASE_FILE} with an [inputs] table")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"malformed case file: {error}", where=str(path), fix="correct the TOML syntax") from None
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        raise InputError("case file has no [inputs] table", where=str(path), fix="add [inputs] with serving, training, draft and target")
    unknown = sorted(set(inputs) - set(INPUT_KEYS))
    if unknown:
        raise InputError(f"unknown inputs {unknown}", where=str(path), fix=f"use only {', '.join(INPUT_KEYS)}")
    for key, value in inputs.items():
        if not isinstance(value, str):
            raise InputError(f"input {key} is {value!r}, not a string", where=str(path), fix="quote paths and source specs")
    expected = None
    if isinstance(data.get("expected"), dict):
        raw = data["expected"]
        for side in ("serving", "training"):
            for tap in raw.get(side, []):
                Tap.parse(tap)
        expected = Expected(
            status=raw.get("status"),
            root_cause=raw.get("root_cause"),
            serving=tuple(raw["serving"]) if "serving" in raw else None,
            training=tuple(raw["training"]) if "training" in raw else None,
            verifier_last=raw.get("verifier_last"),
            fix_ids=tuple(raw["fix_ids"]) if "fix_ids" in raw else None,
            ranked_below=tuple(raw.get("ranked_below", ())),
        )
    return Case(directory, str(data.get("title", directory.name)), Inputs(**inputs, base=directory.resolve()), expected, data)
