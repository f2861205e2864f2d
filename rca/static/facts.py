"""Facts analyzers establish about one side, and findings they report.

Facts chain: a `CaptureSet` (which layers a side asks to capture, and where that set lives)
lets the capture-site analyzer find the `CapturedTaps`; a reader or concatenation turns those
into the `DraftInput`; `DraftWidth` says how many slots the draft's `fc` takes. Each fact keeps
handles on the evaluated values so that later analyzers can continue from them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from rca.model import (
    CheckpointEdit,
    Confidence,
    ConfigEdit,
    Location,
    Severity,
    Step,
    Tap,
)
from rca.static.evaluate.values import TensorVal, Val
from rca.static.graph import NodeKey


@dataclass(frozen=True, eq=False)
class Fact:
    side: str
    analyzer: str
    location: Location
    note: str


class IdsOrigin(str, enum.Enum):
    """Where a side's layer ids come from."""

    CONFIG = "config"  # a key of the draft's config (or the trainer's)
    DEFAULT = "default"  # the code's default, the config setting none
    CODE = "code"  # written in the code itself
    DUMP_METADATA = "dump metadata"  # the record the training dumps keep
    ENGINE = "engine"  # set by the engine; the draft's ids are never read

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # formats as its value, as on Python 3.10


@dataclass(frozen=True, eq=False)
class CaptureSet(Fact):
    ids: Val  # the layer ids as delivered to the model (None: the model's default)
    ids_origin: IdsOrigin
    owner: Val  # the object holding the capture set
    attribute: str  # its field name
    value: Val  # the set as stored
    delivery: Step | None = None
    config_keys: tuple[tuple, ...] = ()  # draft-config key paths the ids were read from (or looked for)


@dataclass(frozen=True, eq=False)
class CapturedTaps(Fact):
    tensors: tuple[TensorVal, ...]
    sinks: tuple[NodeKey, ...]  # the append statements that captured them
    stacked: bool = False  # dumped as one [tokens, layers, hidden] tensor (a server's extraction), not a list
    steps: tuple[Step, ...] = ()  # cited steps beyond the dataflow path (an engine's own capture code)

    @property
    def taps(self) -> tuple[Tap | None, ...]:
        return tuple(tensor.as_tap() for tensor in self.tensors)


@dataclass(frozen=True, eq=False)
class DraftInput(Fact):
    slots: tuple[Tap, ...]
    verifier_last: Tap | None
    sinks: tuple[NodeKey, ...]
    steps: tuple[Step, ...] = ()  # cited steps beyond the dataflow path (readers, concatenation)


@dataclass(frozen=True, eq=False)
class DraftWidth(Fact):
    slots: int | None  # how many target-width slots the draft's fc takes


@dataclass(frozen=True, eq=False)
class Aspect(Fact):
    """What an analyzer established on one side for its own comparison across the sides (in its
    `across`): carried on the side's wiring, and shown in its JSON, under the key the analyzer
    declares in `establishes`. `value` has `to_json` and cites its `steps`."""

    key: str
    value: Any


@dataclass(frozen=True)
class Finding:
    """A hazard or an observation about the code, as evidence for (or against) a hypothesis."""

    code: str
    name: str
    side: str
    message: str
    location: Location
    confidence: Confidence = Confidence.INFERRED
    hypothesis: str | None = None  # the hypothesis this supports
    likelihood_ratio: float = 1.0
    steps: tuple[Step, ...] = field(default=())
    taps: tuple[Tap, ...] = ()  # the taps it concerns, as the hypothesis should show them
    fix: str = ""  # the fix this finding calls for, when it is more specific than the hypothesis's
    edit: ConfigEdit | CheckpointEdit | None = None  # that fix as an edit of the draft, where it is one
    # cause: acceptance falls on this launch; warning: what the code makes possible and only tensors
    # settle, a candidate for its hypothesis and no difference (it never outranks a consistent wiring
    # until an observation raises it); note: context
    severity: Severity = Severity.CAUSE
