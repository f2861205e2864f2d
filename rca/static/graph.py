"""The dataflow graph: code entities and values with source ranges, and the flows between them.

Nodes are statements or config keys (one node per location and kind, however often evaluation
passes through it); edges say that a value flowed (`data`) or that a condition decided whether
a statement ran (`control`). The explanation a user reads is a path in this graph from a config
key or default to the draft input.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rca.model import Location, Step, StepKind

_MAX_VALUES = 6


@dataclass(frozen=True, slots=True, eq=False)
class NodeKey:
    """A node's identity. Evaluation looks nodes up tens of thousands of times per diagnosis: the
    hash is computed once (the generated one hashed the location and the kind, both in Python,
    at every lookup), and never pickled, since string hashes differ between processes."""

    kind: StepKind
    location: Location
    detail: str = ""  # tells apart nodes on one line (keys of a one-line JSON config)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.kind.value, self.location, self.detail)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not NodeKey:
            return NotImplemented
        return (
            self._hash == other._hash
            and self.location == other.location
            and self.kind is other.kind
            and self.detail == other.detail
        )

    def __reduce__(self) -> tuple:
        return NodeKey, (self.kind, self.location, self.detail)


class _Edges:
    """`graph.edges[a, b]` (the edge's attributes) and `graph.edges(data=True)`, as networkx has them."""

    def __init__(self, successors: dict[Any, dict[Any, dict]]) -> None:
        self._successors = successors

    def __getitem__(self, pair: tuple[Any, Any]) -> dict:
        return self._successors[pair[0]][pair[1]]

    def __call__(self, data: bool = False) -> Iterator[tuple]:
        for source, targets in self._successors.items():
            for target, attributes in targets.items():
                yield (source, target, attributes) if data else (source, target)

    def __iter__(self) -> Iterator[tuple]:
        return self()


class DiGraph:
    """A directed graph with node and edge attributes: the part of networkx's DiGraph the analysis
    uses (`key in g`, `g.nodes[key]`, `g.edges[a, b]`, `g.edges(data=True)`, `g.predecessors`),
    in insertion order as networkx keeps it. Every diagnosis builds one; importing networkx for
    it cost more than some analyses."""

    def __init__(self) -> None:
        self.nodes: dict[Any, dict] = {}
        self._succ: dict[Any, dict[Any, dict]] = {}
        self._pred: dict[Any, dict[Any, dict]] = {}
        self.edges = _Edges(self._succ)

    def __contains__(self, key: object) -> bool:
        return key in self.nodes

    def __iter__(self) -> Iterator[Any]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def add_node(self, key: Any, **attributes: Any) -> None:
        if key not in self.nodes:
            self.nodes[key] = {}
            self._succ[key] = {}
            self._pred[key] = {}
        self.nodes[key].update(attributes)

    def add_edge(self, source: Any, target: Any, **attributes: Any) -> None:
        for key in (source, target):
            if key not in self.nodes:
                self.add_node(key)
        data = self._succ[source].get(target, {})
        data.update(attributes)
        self._succ[source][target] = self._pred[target][source] = data

    def edge(self, source: Any, target: Any) -> dict | None:
        """The edge's attributes, or None where there is no such edge."""
        targets = self._succ.get(source)
        return targets.get(target) if targets is not None else None

    def has_edge(self, source: Any, target: Any) -> bool:
        return self.edge(source, target) is not None

    def predecessors(self, key: Any) -> Iterator[Any]:
        return iter(self._pred[key])

    def successors(self, key: Any) -> Iterator[Any]:
        return iter(self._succ[key])

    def reached(self, key: Any, upstream: bool) -> set[Any]:
        """The nodes from which `key` can be reached (`upstream`), or reached from it; not itself."""
        links = self._pred if upstream else self._succ
        seen: set[Any] = set()
        stack = list(links[key])
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(links[current])
        seen.discard(key)
        return seen


def _ancestors(graph: DiGraph, key: Any) -> set[Any]:
    return graph.reached(key, upstream=True)


def _descendants(graph: DiGraph, key: Any) -> set[Any]:
    return graph.reached(key, upstream=False)


class DataflowGraph:
    def __init__(self) -> None:
        self.g = DiGraph()
        self._order = 0

    def node(self, kind: StepKind, location: Location, note: str = "", code: str = "", keypath: tuple = ()) -> NodeKey:
        key = NodeKey(kind, location, ".".join(map(str, keypath)))
        if key not in self.g:
            self._order += 1
            self.g.add_node(key, order=self._order, note=note, code=code, values=[], keypath=keypath)
        elif note and not self.g.nodes[key]["note"]:
            self.g.nodes[key]["note"] = note
        return key

    def from_step(self, kind: StepKind, step: Step, keypath: tuple = ()) -> NodeKey:
        """A node for a step read outside the code (a config key, a dump's record)."""
        return self.node(kind, step.location, step.note, step.code, keypath)

    def flow(self, sources: Iterable[NodeKey], target: NodeKey, kind: str = "data") -> None:
        """Edges from `sources` to `target`; a data edge is never turned into a control edge."""
        for source in sources:
            if source != target:
                existing = self.g.edge(source, target)
                if existing is not None and existing["kind"] in ("data", kind):
                    continue
                self.g.add_edge(source, target, kind=kind)

    def observe(self, key: NodeKey, value: str) -> None:
        values = self.g.nodes[key]["values"]
        if value not in values and len(values) < _MAX_VALUES:
            values.append(value)

    def describe(self, key: NodeKey) -> str:
        data = self.g.nodes[key]
        note = data["note"] or data["code"].rstrip(":")  # a condition reads best as its own code
        values = data["values"]
        if values:
            shown = ", ".join(values)
            if not note:
                note = shown
            elif note.endswith("="):  # an assignment: `name = value`
                note = f"{note} {shown}"
            else:
                note = f"{note} -> {shown}" if not data["note"] else f"{note}: {shown}"
        return note

    def step(self, key: NodeKey) -> Step:
        return Step(key.location, self.describe(key), self.g.nodes[key]["code"], key.kind)

    def nearest(self, keys: Iterable[NodeKey], kind: str) -> NodeKey | None:
        """The most recent node of `kind` that `keys` are or derive from."""
        found = [node for key in keys if key in self.g for node in _ancestors(self.g, key) | {key} if node.kind == kind]
        return max(found, key=lambda node: self.g.nodes[node]["order"], default=None)

    def keypaths(
        self,
        keys: Iterable[NodeKey],
        kinds: frozenset[StepKind] = frozenset({StepKind.CONFIG, StepKind.CONFIG_MISSING}),
    ) -> list[tuple]:
        """Config key paths that `keys` derive from (nearest first)."""
        found: list[tuple] = []
        for key in keys:
            if key not in self.g:
                continue
            for node in sorted(_ancestors(self.g, key) | {key}, key=lambda k: -self.g.nodes[k]["order"]):
                path = self.g.nodes[node].get("keypath")
                if node.kind in kinds and path and path not in found:
                    found.append(path)
        return found

    def path(self, sources: Iterable[NodeKey], sink: NodeKey) -> list[NodeKey]:
        """Nodes on any path from one of `sources` to `sink`, in evaluation order."""
        if sink not in self.g:
            return []
        upstream = _ancestors(self.g, sink) | {sink}
        on_path: set[NodeKey] = set()
        for source in sources:
            if source in upstream:
                on_path |= (_descendants(self.g, source) | {source}) & upstream
        return sorted(on_path, key=lambda key: self.g.nodes[key]["order"])

    def ancestors(self, key: NodeKey) -> set[NodeKey]:
        return _ancestors(self.g, key) if key in self.g else set()

    def descendants(self, key: NodeKey) -> set[NodeKey]:
        return _descendants(self.g, key) if key in self.g else set()

    def derives_from(self, keys: Iterable[NodeKey], kind: str) -> bool:
        """Whether any of `keys` is, or flows from, a node of `kind`."""
        for key in keys:
            if key.kind == kind or (key in self.g and any(node.kind == kind for node in _ancestors(self.g, key))):
                return True
        return False

    def ancestors_of_kind(self, sink: NodeKey, kind: str) -> list[NodeKey]:
        if sink not in self.g:
            return []
        found = [key for key in _ancestors(self.g, sink) if key.kind == kind]
        return sorted(found, key=lambda key: self.g.nodes[key]["order"])

    def to_networkx(self) -> Any:
        """The graph as a networkx DiGraph, for its algorithms and file formats (GraphML): each node
        named by its location and kind, with its note, code and values as attributes. networkx is
        imported here, by what asks for it, not by every diagnosis."""
        import networkx as nx

        exported = nx.DiGraph()
        names = {key: f"{key.location}#{key.kind.value}" + (f"#{key.detail}" if key.detail else "") for key in self.g}
        for key in sorted(self.g, key=lambda key: self.g.nodes[key]["order"]):
            exported.add_node(
                names[key],
                kind=key.kind.value,
                location=str(key.location),
                note=self.describe(key),
                code=self.g.nodes[key]["code"],
                values="; ".join(self.g.nodes[key]["values"]),
                order=self.g.nodes[key]["order"],
            )
        for source, target, data in self.g.edges(data=True):
            exported.add_edge(names[source], names[target], kind=data["kind"])
        return exported
