"""The data model: taps, locations, wirings, evidence, hypotheses and the diagnosis.

Everything here is a frozen dataclass so that facts can be shared, cached and compared
without defensive copies. Every fact, step and evidence item carries where it came from.
"""

from __future__ import annotations

import copy
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SIDES = ("training", "serving")


class Severity(str, enum.Enum):
    """How much a finding or a hypothesis matters to the launch diagnosed, strongest first."""

    CAUSE = "cause"  # on the traffic as launched, acceptance falls because of it
    WARNING = "warning"  # a risk this launch does not meet, or evidence too weak to call a cause
    NOTE = "note"  # context a reader may want

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # formats as its value, as on Python 3.10

    @property
    def sarif_level(self) -> str:
        """SARIF's name for it: `error`, `warning`, `note`."""
        return {"cause": "error", "warning": "warning", "note": "note"}[self.value]

    @property
    def order(self) -> int:
        return ("cause", "warning", "note").index(self.value)


class Drafting(str, enum.Enum):
    """What a launch drafts with: what an analyzer can have to say about depends on it."""

    CAPTURED = "captured"  # a separate draft fed hidden states the engine captures from the target
    OWN_LAYERS = "own-layers"  # multi-token-prediction layers (the target checkpoint's own, or one it names)

    __str__ = str.__str__


RULED_OUT = 0.01  # a hypothesis scored below it is ruled out: reports never state it as fact, nor call it a warning


class Confidence(enum.Enum):
    """Where a piece of evidence came from, strongest first."""

    OBSERVED = "observed"  # seen in tensors (a probe, a capture)
    INFERRED = "inferred"  # derived by evaluating the code and configs
    HEURISTIC = "heuristic"  # a pattern or an assumption, not a derivation
    HISTORICAL = "historical"  # correlated with a change in history


_TAP_RE = re.compile(r"^h(?P<layer>\d+|\?)(?P<norm>\+norm)?(?P<partial>~partial)?(?P<nores>-residual)?$")


@dataclass(frozen=True, slots=True)
class Tap:
    """A point in the target's computation that can feed the draft, named independently of any framework.

    `layer` J is the residual stream after J decoder layers (h0 is the embedding output);
    None means the tap could not be resolved.
    """

    layer: int | None
    norm: bool = False
    partial: bool = False
    residual_missing: bool = False

    def __str__(self) -> str:
        text = "h?" if self.layer is None else f"h{self.layer}"
        if self.norm:
            text += "+norm"
        if self.partial:
            text += "~partial"
        if self.residual_missing:
            text += "-residual"
        return text

    @property
    def known(self) -> bool:
        return self.layer is not None

    @property
    def is_embedding(self) -> bool:
        return self.layer == 0 and not self.norm

    def shifted(self, delta: int) -> Tap:
        if self.layer is None:
            return self
        return Tap(self.layer + delta, self.norm, self.partial, self.residual_missing)

    @classmethod
    def parse(cls, text: str) -> Tap:
        match = _TAP_RE.match(text.strip())
        if not match:
            raise ValueError(f"not a tap name: {text!r} (expected h0..hN, optionally +norm)")
        layer = match["layer"]
        return cls(
            None if layer == "?" else int(layer),
            norm=bool(match["norm"]),
            partial=bool(match["partial"]),
            residual_missing=bool(match["nores"]),
        )


UNKNOWN_TAP = Tap(None)


@dataclass(frozen=True, slots=True)
class Location:
    """A 1-based, inclusive line range in one input (a source tree, a config, a dump)."""

    input: str  # "serving", "training", "draft", "target", "dumps", "patch:serving", ...
    path: str  # relative to the root of that input
    line: int
    end_line: int

    def __str__(self) -> str:
        if self.end_line > self.line:
            return f"{self.path}:{self.line}-{self.end_line}"
        return f"{self.path}:{self.line}"


class StepKind(str, enum.Enum):
    """What happens at a cited step, and what a node of the dataflow graph is."""

    CONFIG = "config"  # a config key and its value
    CONFIG_MISSING = "config-missing"  # a key a config does not have, where it would be
    DUMP = "dump"  # what a dump directory records
    SETTING = "setting"  # a launch setting
    ASSIGN = "assign"  # a name or field assigned
    CALL = "call"  # a call, with what it was handed
    TEST = "test"  # a condition that decided what ran
    APPEND = "append"  # a tensor appended to a capture list
    HANDLER = "handler"  # an `except` that caught an error
    LINK = "link"  # an attribute read that is the value stored under that name elsewhere
    ASSUMPTION = "assumption"  # what the analysis assumed about runtime state
    FC = "fc"  # the draft's fc
    TENSOR = "tensor"  # a tensor of a checkpoint: its name, dtype and shape
    NONE = ""  # not said

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # formats as its value, as on Python 3.10


# Where a derivation begins: a config value, a missing key, what a dump records.
DERIVATION_SOURCES = frozenset({StepKind.CONFIG, StepKind.CONFIG_MISSING, StepKind.DUMP})


@dataclass(frozen=True, slots=True)
class Step:
    """One cited step of a derivation: what happened at a location."""

    location: Location
    note: str
    code: str = ""  # the cited source text, one line, for reports
    kind: StepKind = StepKind.NONE  # what happens here
    patched: bool = False  # the cited lines come from the user's patch

    def citation(self) -> dict[str, Any]:
        cited = {
            "input": self.location.input,
            "path": self.location.path,
            "line": self.location.line,
            "end_line": self.location.end_line,
            "kind": self.kind.value,
            "note": self.note,
        }
        if self.code:
            cited["code"] = self.code
        if self.patched:
            cited["patched"] = True
        return cited

    @classmethod
    def from_citation(cls, data: Mapping[str, Any]) -> Step:
        location = Location(data["input"], data["path"], int(data["line"]), int(data.get("end_line", data["line"])))
        kind = StepKind(data.get("kind", ""))
        return cls(location, data.get("note", ""), data.get("code", ""), kind, bool(data.get("patched", False)))


@dataclass(frozen=True, slots=True)
class Note:
    """Something one side's analysis could not resolve, or had to assume, told with its wiring."""

    side: str
    text: str

    def __str__(self) -> str:
        return f"{self.side}: {self.text}"


@dataclass(frozen=True, slots=True)
class TemplateUse:
    """How one side renders conversations for the draft: its chat template and keyword arguments,
    and what they render for one conversation (its generation prompt, and the whole exchange)."""

    digest: str  # the template text's sha256, shortened
    kwargs: tuple[tuple[str, Any], ...]  # what the side passes the template (`enable_thinking`)
    prompt: str  # the question rendered with the generation prompt: what serving asks the draft to continue
    exchange: str  # the question and its answer rendered: what training shows the draft
    steps: tuple[Step, ...] = ()  # where the template and each argument come from

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "kwargs": dict(self.kwargs),
            "prompt": self.prompt,
            "exchange": self.exchange,
            "steps": [step.citation() for step in self.steps],
        }


@dataclass(frozen=True, slots=True)
class Wiring:
    """What one side feeds the draft: the ordered fc slots and the verifier-last tap."""

    side: str
    slots: tuple[Tap, ...]
    verifier_last: Tap | None
    steps: tuple[Step, ...] = ()
    fc_slots: int | None = None  # how many slots the draft's fc expects, where known
    ids: tuple[int, ...] | None = None  # the layer ids this side was configured with
    notes: tuple[str, ...] = ()  # unknowns and hazards found while resolving (rendered Notes: `side: text`)
    ids_steps: tuple[Step, ...] = ()  # the part of `steps` that derives the capture set from the ids
    # what analyzers established on this side for their comparisons across the sides, by the JSON
    # key each declares (`draft_norm`, `chat_template`, ...): each value has `to_json` and `steps`
    aspects: Mapping[str, Any] = field(default_factory=dict)

    def aspect(self, key: str) -> Any | None:
        """What the analyzer that declares `key` established on this side, where it did."""
        return self.aspects.get(key)

    @property
    def resolved(self) -> bool:
        return bool(self.slots) and all(tap.known for tap in self.slots)

    def to_json(self) -> dict[str, Any]:
        return {
            "slots": [str(tap) for tap in self.slots],
            "verifier_last": None if self.verifier_last is None else str(self.verifier_last),
            "fc_slots": self.fc_slots,
            "ids": None if self.ids is None else list(self.ids),
            "steps": [step.citation() for step in self.steps],
            "notes": list(self.notes),
            **{key: aspect.to_json() for key, aspect in sorted(self.aspects.items())},
        }


@dataclass(frozen=True, slots=True)
class Evidence:
    """An observation and how strongly it bears on one hypothesis (a likelihood ratio)."""

    summary: str
    confidence: Confidence
    likelihood_ratio: float
    citations: tuple[Step, ...] = ()
    severity: Severity | None = None  # of the finding it reports, where it reports one

    @property
    def direction(self) -> str:
        """Whether the observation raises the hypothesis's odds ("for"), lowers them ("against"),
        or only locates it ("neutral")."""
        if abs(self.likelihood_ratio - 1.0) < 1e-9:
            return "neutral"
        return "for" if self.likelihood_ratio > 1.0 else "against"

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "confidence": self.confidence.value,
            "likelihood_ratio": round(self.likelihood_ratio, 4),
            "direction": self.direction,
            **({"severity": self.severity.value} if self.severity is not None else {}),
            "citations": [step.citation() for step in self.citations],
        }


@dataclass(frozen=True, slots=True)
class ConfigEdit:
    """A fix that is one edit of the draft config: set the key at `keypath` to `value`. It can be
    applied to a copy of the draft and served, to see whether the engine agrees."""

    keypath: tuple[str, ...]
    value: Any

    def apply(self, config: dict[str, Any]) -> dict[str, Any]:
        """A copy of `config` with the edit made (parents created as needed)."""
        edited = copy.deepcopy(config)
        node = edited
        for key in self.keypath[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[self.keypath[-1]] = copy.deepcopy(self.value)
        return edited

    def to_json(self) -> dict[str, Any]:
        return {"file": "draft config", "key": ".".join(self.keypath), "value": self.value}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ConfigEdit:
        return ConfigEdit(tuple(str(data["key"]).split(".")), data["value"])


@dataclass(frozen=True, slots=True)
class CheckpointEdit:
    """A fix that gives the draft's checkpoint tensors it lacks or holds wrong (a vocab map recovered
    from its head): `d2t` as values, and `t2d` (the target ids it reaches, of `target_vocab`); or
    that takes tensors out of it (`dropped`: an untrained embedding, so the engine shares the target's)."""

    tensors: Mapping[str, tuple[int, ...]]
    target_vocab: int = 0
    dropped: tuple[str, ...] = ()

    def file_tensors(self) -> dict[str, Any]:
        """The tensors to write: each given one as int64, and t2d from d2t."""
        import torch

        written = {name: torch.tensor(values, dtype=torch.int64) for name, values in self.tensors.items()}
        if "d2t" in written:
            t2d = torch.zeros(self.target_vocab, dtype=torch.bool)
            t2d[torch.arange(len(written["d2t"])) + written["d2t"]] = True
            written["t2d"] = t2d
        return written

    def to_json(self) -> dict[str, Any]:
        return {
            "file": "draft checkpoint",
            "tensors": {name: list(values) for name, values in self.tensors.items()},
            "target_vocab": self.target_vocab,
            **({"dropped": list(self.dropped)} if self.dropped else {}),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> CheckpointEdit:
        return CheckpointEdit(
            {str(name): tuple(int(v) for v in values) for name, values in data["tensors"].items()},
            int(data["target_vocab"]),
            tuple(str(name) for name in data.get("dropped", ())),
        )


def edit_from_json(data: Mapping[str, Any]) -> ConfigEdit | CheckpointEdit:
    return CheckpointEdit.from_json(data) if data.get("file") == "draft checkpoint" else ConfigEdit.from_json(data)


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """A ranked explanation of what differs between the sides, with its evidence and fix."""

    id: str
    title: str
    score: float
    rank: int
    params: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    citations: tuple[Step, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    fix: str = ""
    fix_diff: str = ""  # the fix as a unified diff, where it is an edit of a config
    prior: float = 0.0  # the catalog's prior; `score` is the posterior after the evidence
    fix_edit: ConfigEdit | CheckpointEdit | None = None  # the fix as an edit of the draft, to serve and measure
    severity: Severity = Severity.CAUSE
    explains: tuple[str, ...] = ()  # the differences it accounts for (`-h59`, `contract:rope-mismatch`)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rank": self.rank,
            "severity": self.severity.value,
            "score": round(self.score, 4),
            "prior": self.prior,
            "title": self.title,
            "params": dict(self.params),
            "reason": self.reason,
            "citations": [step.citation() for step in self.citations],
            "evidence": [item.to_json() for item in self.evidence],
            "fix": self.fix,
            **({"fix_diff": self.fix_diff} if self.fix_diff else {}),
            **({"fix_edit": self.fix_edit.to_json()} if self.fix_edit is not None else {}),
            "explains": list(self.explains),
        }


class Status(str, enum.Enum):
    CONSISTENT = "consistent"
    MISMATCH = "mismatch"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    root_cause: str | None
    summary: str = ""
    causes: tuple[str, ...] = ()  # every hypothesis called a cause, the root first
    warnings: tuple[str, ...] = ()  # hypotheses called warnings: risks this launch does not meet, weak evidence
    assumptions: tuple[str, ...] = ()  # what the checks that decided rested on
    settled_by: str = ""  # inconclusive, or a tie: the input or evidence that would decide
    drafting: str = ""  # a launch that drafts with the target's own MTP layers, said: no wiring applies

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "root_cause": self.root_cause,
            "summary": self.summary,
            "causes": list(self.causes),
            "warnings": list(self.warnings),
            "assumptions": list(self.assumptions),
            **({"settled_by": self.settled_by} if self.settled_by else {}),
            **({"drafting": self.drafting} if self.drafting else {}),
        }


@dataclass(frozen=True, slots=True)
class Diagnosis:
    wirings: Mapping[str, Wiring]
    hypotheses: tuple[Hypothesis, ...]
    verdict: Verdict
    inputs: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    agent: Mapping[str, Any] | None = None  # the probes' transcript (rca.evidence.agent.Investigation.to_json)
    trainer: Mapping[str, Any] | None = None  # the trainer inferred from the draft config, when none was given
    engine: Mapping[str, Any] | None = None  # acceptance measured in the engine, as served and with the fix
    launch: Mapping[str, Any] | None = None  # what was read from the launch line (rca.inputs.launchline)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "rca.diagnosis/1",
            "inputs": dict(self.inputs),
            **({"launch": dict(self.launch)} if self.launch is not None else {}),
            "wiring": {side: wiring.to_json() for side, wiring in self.wirings.items()},
            "hypotheses": [hypothesis.to_json() for hypothesis in self.hypotheses],
            "verdict": self.verdict.to_json(),
            "warnings": list(self.warnings),
            **({"agent": dict(self.agent)} if self.agent is not None else {}),
            **({"trainer": dict(self.trainer)} if self.trainer is not None else {}),
            **({"engine": dict(self.engine)} if self.engine is not None else {}),
        }


def diagnosis_from_json(data: Mapping[str, Any]) -> Diagnosis:
    """A diagnosis read back from its `rca.diagnosis/1` JSON (a case's diagnosis.json); raises
    KeyError, TypeError or ValueError on a document of another shape."""
    if data.get("schema") != "rca.diagnosis/1":
        raise ValueError(f"schema {data.get('schema')!r}, not rca.diagnosis/1")

    def steps(items: Any) -> tuple[Step, ...]:
        return tuple(Step.from_citation(item) for item in items)

    def tap(text: str | None) -> Tap | None:
        return None if text is None else Tap.parse(text)

    wirings = {
        side: Wiring(
            side,
            tuple(Tap.parse(item) for item in wiring["slots"]),
            tap(wiring.get("verifier_last")),
            steps(wiring.get("steps", ())),
            wiring.get("fc_slots"),
            None if wiring.get("ids") is None else tuple(wiring["ids"]),
            tuple(wiring.get("notes", ())),
        )
        for side, wiring in data["wiring"].items()
    }
    hypotheses = tuple(
        Hypothesis(
            item["id"],
            item["title"],
            float(item["score"]),
            int(item["rank"]),
            dict(item.get("params", {})),
            item.get("reason", ""),
            steps(item.get("citations", ())),
            tuple(
                Evidence(
                    e["summary"],
                    Confidence(e["confidence"]),
                    float(e["likelihood_ratio"]),
                    steps(e.get("citations", ())),
                    Severity(e["severity"]) if e.get("severity") else None,
                )
                for e in item.get("evidence", ())
            ),
            item.get("fix", ""),
            item.get("fix_diff", ""),
            float(item.get("prior", 0.0)),
            edit_from_json(item["fix_edit"]) if item.get("fix_edit") else None,
            Severity(item.get("severity", "cause")),
            tuple(item.get("explains", ())),
        )
        for item in data["hypotheses"]
    )
    verdict = data["verdict"]
    return Diagnosis(
        wirings,
        hypotheses,
        Verdict(
            Status(verdict["status"]),
            verdict.get("root_cause"),
            verdict.get("summary", ""),
            tuple(verdict.get("causes", ())),
            tuple(verdict.get("warnings", ())),
            tuple(verdict.get("assumptions", ())),
            verdict.get("settled_by", ""),
            verdict.get("drafting", ""),
        ),
        dict(data.get("inputs", {})),
        tuple(data.get("warnings", ())),
        data.get("agent"),
        data.get("trainer"),
        data.get("engine"),
        data.get("launch"),
    )
