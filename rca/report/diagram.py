"""Diagrams of the dataflow: the cited path of a wiring as Mermaid (renders on GitHub and GitLab),
and the whole dataflow graph of a side as Mermaid, DOT or JSON (`rca graph`)."""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING

from rca.model import StepKind, Wiring

if TYPE_CHECKING:  # the graph is loaded by `rca graph` only, not by every report
    from rca.static.graph import DataflowGraph, NodeKey

_SHAPES = {
    StepKind.CONFIG: ('[/"', '"/]'),
    StepKind.CONFIG_MISSING: ('[/"', '"/]'),
    StepKind.DUMP: ('[("', '")]'),
    StepKind.FC: ('[["', '"]]'),
    StepKind.TEST: ('{{"', '"}}'),
}
_MAX_LABEL = 90


def wiring_mermaid(wiring: Wiring, prefix: str) -> str:
    """The steps of a wiring's derivation, in order, from the config key to the draft input."""
    lines = ["flowchart TD"]
    names = []
    for index, step in enumerate(wiring.steps):
        name = f"{prefix}{index}"
        names.append(name)
        lines.append(f"  {name}{_node(step.kind, f'{step.location}', step.note, step.patched)}")
    lines += [f"  {a} --> {b}" for a, b in itertools.pairwise(names)]
    if names:
        lines.append(
            f'  {names[-1]} --> {prefix}draft(["draft fc '
            f'input: {_escape(", ".join(str(tap) for tap in wiring.slots))}"])'
        )
    patched = [name for name, step in zip(names, wiring.steps, strict=False) if step.patched]
    if patched:
        lines += ["  classDef patched stroke:#d33,stroke-width:2px", f"  class {','.join(patched)} patched"]
    return "\n".join(lines)


def graph_mermaid(graph: DataflowGraph) -> str:
    keys = _ordered(graph)
    index = {key: f"n{number}" for number, key in enumerate(keys)}
    lines = ["flowchart TD"]
    lines += [f"  {index[key]}{_node(key.kind, str(key.location), graph.describe(key), False)}" for key in keys]
    lines += [
        f"  {index[a]} {'-.->' if data['kind'] == 'control' else '-->'} {index[b]}"
        for a, b, data in graph.g.edges(data=True)
    ]
    return "\n".join(lines) + "\n"


def graph_dot(graph: DataflowGraph) -> str:
    keys = _ordered(graph)
    index = {key: f"n{number}" for number, key in enumerate(keys)}
    lines = ["digraph dataflow {", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for key in keys:
        label = f"{key.location}\\n{_clip(graph.describe(key))}".replace('"', '\\"')
        lines.append(f'  {index[key]} [label="{label}", tooltip="{key.kind}"];')
    lines += [
        f"  {index[a]} -> {index[b]}{' [style=dashed]' if data['kind'] == 'control' else ''};"
        for a, b, data in graph.g.edges(data=True)
    ]
    return "\n".join([*lines, "}"]) + "\n"


def graph_json(graph: DataflowGraph, side: str) -> str:
    keys = _ordered(graph)
    index = {key: number for number, key in enumerate(keys)}
    nodes = [
        {
            "id": index[key],
            "kind": key.kind,
            "input": key.location.input,
            "path": key.location.path,
            "line": key.location.line,
            "end_line": key.location.end_line,
            "note": graph.describe(key),
            "code": graph.g.nodes[key]["code"],
            "values": list(graph.g.nodes[key]["values"]),
        }
        for key in keys
    ]
    edges = [{"from": index[a], "to": index[b], "kind": data["kind"]} for a, b, data in graph.g.edges(data=True)]
    return json.dumps({"schema": "rca.graph/1", "side": side, "nodes": nodes, "edges": edges}, indent=2) + "\n"


def graph_graphml(graph: DataflowGraph) -> str:
    """GraphML (networkx's writer), for graph tools such as Gephi, yEd or networkx itself."""
    import networkx as nx

    return "\n".join(nx.generate_graphml(graph.to_networkx())) + "\n"


def _ordered(graph: DataflowGraph) -> list[NodeKey]:
    return sorted(graph.g.nodes, key=lambda key: graph.g.nodes[key]["order"])


def _node(kind: str, where: str, note: str, patched: bool) -> str:
    left, right = _SHAPES.get(kind, ('["', '"]'))
    mark = " [patched]" if patched else ""
    return f"{left}{_escape(where + mark)}<br/>{_escape(_clip(note))}{right}"


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_LABEL else text[: _MAX_LABEL - 1] + "…"


def _escape(text: str) -> str:
    """Mermaid labels in quotes: quotes and angle brackets as entities."""
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
