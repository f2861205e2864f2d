"""What an evaluation did that analyzers look back on: tensors appended to capture lists, exceptions
the analyzed code caught, fields stored, launch settings read, concatenations, and constructs the
evaluator does not model. `Evaluator.trace()` hands out the events of one stretch of evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rca.model import Location
from rca.static.evaluate.values import NO_SRC, ConfigObj, LayerStack, ObjRef, Val
from rca.static.graph import NodeKey


@dataclass
class AppendEvent:
    """A tensor appended to a list (or handed to a collector): the capture sites."""

    list_id: int
    value: Val
    node: NodeKey
    controls: tuple[NodeKey, ...]  # the conditions that decided this append ran


@dataclass
class RaiseEvent:
    """An exception the analyzed code raised and an `except` caught (a silent fallback)."""

    kind: str
    message: str
    location: Location | None
    handled_at: Location | None = None
    sources: frozenset[NodeKey] = NO_SRC


class FieldStore(NamedTuple):
    """`owner.attribute = value` on an analyzed object."""

    owner: ObjRef
    attribute: str
    value: Val


class ConfigStore(NamedTuple):
    """`config.attribute = value` on a config read from a file (an engine's config builder adding a
    field the model reads later)."""

    config: ConfigObj
    attribute: str
    value: Val  # cited by the assignment (not by the config object it was set on)


class SettingRead(NamedTuple):
    """A launch setting the evaluation used, with the node citing it."""

    attribute: str
    value: Any
    node: NodeKey


class Unmodeled(NamedTuple):
    """A statement or expression the evaluator does not model, reached on the path it followed."""

    construct: str
    location: Location

    def __str__(self) -> str:
        return f"{self.construct} at {self.location} not evaluated"


@dataclass
class Events:
    """Every event of one evaluator, in evaluation order."""

    appends: list[AppendEvent] = field(default_factory=list)
    handled: list[RaiseEvent] = field(default_factory=list)
    stores: list[FieldStore] = field(default_factory=list)
    settings_read: list[SettingRead] = field(default_factory=list)
    concats: list[Val] = field(default_factory=list)
    unmodeled: list[Unmodeled] = field(default_factory=list)
    assumptions: list[NodeKey] = field(default_factory=list)  # graph nodes of the assumptions made
    layer_calls: dict[NodeKey, LayerStack] = field(default_factory=dict)  # decoder-layer call statements
    config_stores: list[ConfigStore] = field(default_factory=list)
    _assumed: set[NodeKey] = field(default_factory=set, repr=False)

    def assumed(self, key: NodeKey) -> None:
        """Record the node of an assumption, once: in order for traces, in a set to ask whether it
        is known (evaluation makes thousands)."""
        if key not in self._assumed:
            self._assumed.add(key)
            self.assumptions.append(key)

    def counts(self) -> tuple[int, ...]:
        return (
            len(self.appends),
            len(self.handled),
            len(self.stores),
            len(self.settings_read),
            len(self.concats),
            len(self.unmodeled),
            len(self.assumptions),
            len(self.config_stores),
        )


class Trace:
    """The events of a stretch of evaluation: those recorded after it began and, once it ended,
    before it ended."""

    def __init__(self, events: Events) -> None:
        self._events = events
        self._start = events.counts()
        self._end: tuple[int, ...] | None = None

    def _slice(self, which: int, items: list) -> list:
        end = self._end[which] if self._end is not None else len(items)
        return items[self._start[which] : end]

    @property
    def appends(self) -> list[AppendEvent]:
        return self._slice(0, self._events.appends)

    @property
    def handled(self) -> list[RaiseEvent]:
        return self._slice(1, self._events.handled)

    @property
    def stores(self) -> list[FieldStore]:
        return self._slice(2, self._events.stores)

    @property
    def settings_read(self) -> list[SettingRead]:
        return self._slice(3, self._events.settings_read)

    @property
    def concats(self) -> list[Val]:
        return self._slice(4, self._events.concats)

    @property
    def unmodeled(self) -> list[Unmodeled]:
        return self._slice(5, self._events.unmodeled)

    @property
    def assumptions(self) -> list[NodeKey]:
        return self._slice(6, self._events.assumptions)

    @property
    def config_stores(self) -> list[ConfigStore]:
        return self._slice(7, self._events.config_stores)


@contextmanager
def tracing(events: Events) -> Iterator[Trace]:
    trace = Trace(events)
    try:
        yield trace
    finally:
        trace._end = events.counts()
