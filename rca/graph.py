"""The dataflow graph: code entities and values with source ranges, and the flows between them.

Nodes are statements or config keys (one node per location and kind, however often evaluation
passes through it); edges say that a value flowed (`data`) or that a condition decided whether
a statement ran (`control`). The explanation a user reads is a path in this graph from a config
key or default to the draft input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import networkx as nx

from .model import Location, Step

_MAX_VALUES = 6


@dataclass(frozen=True, slots=True)
class NodeKey:
    kind: str
    location: Location


class DataflowGraph:
    def __init__(self) -> None:
        self.g = nx.DiGraph()
        self._order = 0

    def node(self, kind: str, location: Location, note: str = "", code: str = "") -> NodeKey:
        key = NodeKey(kind, location)
        if key not in self.g:
            self._order += 1
            self.g.add_node(key, order=self._order, note=note, code=code, values=[])
        elif note and not self.g.nodes[key]["note"]:
            self.g.nodes[key]["note"] = note
        return key

    def flow(self, sources: Iterable[NodeKey], target: NodeKey, kind: str = "data") -> None:
        for source in sources:
            if source != target:
                if self.g.has_edge(source, target) and self.g.edges[source, target]["kind"] == "data":
                    continue
                self.g.add_edge(source, target, kind=kind)

    def observe(self, key: NodeKey, value: str) -> None:
        values = self.g.nodes[key]["values"]
        if value not in values and len(values) < _MAX_VALUES:
            values.append(value)

    def describe(self, key: NodeKey) -> str:
        data = self.g.nodes[key]
        note = data["note"]
        values = data["values"]
        if values:
            shown = ", ".join(values)
            note = f"{note}: {shown}" if note else shown
        return note

    def step(self, key: NodeKey) -> Step:
        return Step(key.location, self.describe(key), self.g.nodes[key]["code"])

    def path(self, sources: Iterable[NodeKey], sink: NodeKey) -> list[NodeKey]:
        """Nodes on any path from one of `sources` to `sink`, in evaluation order."""
        if sink not in self.g:
            return []
        upstream = nx.ancestors(self.g, sink) | {sink}
        on_path: set[NodeKey] = set()
        for source in sources:
            if source in upstream:
                on_path |= (nx.descendants(self.g, source) | {source}) & upstream
        return sorted(on_path, key=lambda key: self.g.nodes[key]["order"])

    def ancestors_of_kind(self, sink: NodeKey, kind: str) -> list[NodeKey]:
        if sink not in self.g:
            return []
        found = [key for key in nx.ancestors(self.g, sink) if key.kind == kind]
        return sorted(found, key=lambda key: self.g.nodes[key]["order"])
