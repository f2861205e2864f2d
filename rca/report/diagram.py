"""Diagrams of the dataflow: the two wirings side by side as Mermaid (renders on GitHub and GitLab),
and the whole dataflow graph of a side as Mermaid, DOT, JSON or GraphML (`rca graph`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rca.model import StepKind, Tap, Wiring

if TYPE_CHECKING:  # the graph is loaded by `rca graph` only, not by every report
    from rca.static.graph import DataflowGraph, NodeKey

_SHAPES: dict[str, tuple[str, str]] = {
    StepKind.CONFIG: ('[/"', '"/]'),
    StepKind.CONFIG_MISSING: ('[/"', '"/]'),
    StepKind.DUMP: ('[("', '")]'),
    StepKind.FC: ('[["', '"]]'),
    StepKind.TEST: ('{{"', '"}}'),
}
_MAX_LABEL = 90
_MAX_PATCHED = 4  # patched steps named in a side's node of the side-by-side diagram


def sides_mermaid(training: Wiring, serving: Wiring) -> str:
    """Training and serving side by side: which target state feeds which draft input on each side,
    the inputs where they differ drawn thick and red, the states only one side feeds shaded, and a
    side's patched steps pointing at the states only that side feeds."""
    inputs = [f"slot {index}" for index in range(max(len(training.slots), len(serving.slots)))] + ["verifier-last"]
    feeds = {side: _feeds(wiring, len(inputs) - 1) for side, wiring in (("training", training), ("serving", serving))}
    states = sorted(
        {tap for taps in feeds.values() for tap in taps if tap is not None},
        key=lambda tap: (tap.layer is None, tap.layer or 0, str(tap)),
    )
    name = {tap: f"h_{index}" for index, tap in enumerate(states)}
    lines = ["flowchart LR", '  subgraph target["target hidden states"]', "    direction TB"]
    lines += [f'    {name[tap]}(["{_escape(str(tap))}"])' for tap in states]
    lines += ["  end", '  subgraph draft["draft inputs"]', "    direction TB"]
    lines += [f'    d_{index}["{label}"]' for index, label in enumerate(inputs)] + ["  end"]
    edges: list[str] = []
    differing: list[int] = []
    for index, (trained, served) in enumerate(zip(feeds["training"], feeds["serving"], strict=True)):
        if trained is not None and trained == served:
            edges.append(f"  {name[trained]} -- both --> d_{index}")
            continue
        for side, tap in (("training", trained), ("serving", served)):
            if tap is not None:
                differing += [len(edges)] if trained is not None and served is not None else []
                edges.append(f"  {name[tap]} -- {side} --> d_{index}")
    lines += edges
    compared = [index for index, pair in enumerate(zip(*feeds.values(), strict=True)) if None not in pair]
    fed = {side: {tap for index in compared if (tap := taps[index]) is not None} for side, taps in feeds.items()}
    only = {"training": fed["training"] - fed["serving"], "serving": fed["serving"] - fed["training"]}
    patched: list[str] = []
    for side, wiring in (("training", training), ("serving", serving)):
        steps = [step for step in wiring.steps if step.patched]
        if steps:
            node = f"p_{side}"
            patched.append(node)
            said = "<br/>".join(_escape(f"{step.location}: {_clip(step.note)}") for step in steps[:_MAX_PATCHED])
            more = f"<br/>and {len(steps) - _MAX_PATCHED} more" if len(steps) > _MAX_PATCHED else ""
            lines.append(f'  {node}["{side}, patched:<br/>{said}{more}"]')
            lines += [f"  {node} -.-> {name[tap]}" for tap in sorted(only[side], key=str)]
    if differing:
        lines.append(f"  linkStyle {','.join(map(str, differing))} stroke:#d33,stroke-width:3px")
    changed = sorted(name[tap] for taps in only.values() for tap in taps)
    if changed:
        lines += ["  classDef differs fill:#fdd,stroke:#d33", f"  class {','.join(changed)} differs"]
    if patched:
        lines += ["  classDef patched stroke:#d33,stroke-width:2px", f"  class {','.join(patched)} patched"]
    return "\n".join(lines)


def _feeds(wiring: Wiring, slots: int) -> list[Tap | None]:
    """What a side feeds each draft input: its slots (None past its own), then the verifier-last state."""
    return [
        *(wiring.slots[index] if index < len(wiring.slots) else None for index in range(slots)),
        wiring.verifier_last,
    ]


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
