"""The dataflow graph's own adjacency answers as networkx's DiGraph does, for what the analysis asks."""

from __future__ import annotations

import random

import networkx as nx

from rca.static.graph import DiGraph, _ancestors, _descendants


def test_the_graph_answers_as_networkx() -> None:
    chance = random.Random(7)
    ours, theirs = DiGraph(), nx.DiGraph()
    for number in range(60):
        for graph in (ours, theirs):
            graph.add_node(number, order=number)
    for _ in range(150):
        source, target, kind = chance.randrange(60), chance.randrange(60), chance.choice(["data", "control"])
        for graph in (ours, theirs):
            graph.add_edge(source, target, kind=kind)
    assert list(ours.nodes) == list(theirs.nodes) and len(ours) == len(theirs)
    assert list(ours.edges(data=True)) == list(theirs.edges(data=True))
    for node in range(60):
        assert ours.nodes[node] == theirs.nodes[node] and (node in ours) == (node in theirs)
        assert list(ours.predecessors(node)) == list(theirs.predecessors(node))
        assert list(ours.successors(node)) == list(theirs.successors(node))
        assert _ancestors(ours, node) == nx.ancestors(theirs, node)
        assert _descendants(ours, node) == nx.descendants(theirs, node)
    for source, target in theirs.edges:
        assert ours.has_edge(source, target) and ours.edges[source, target] == theirs.edges[source, target]
    assert not ours.has_edge(-1, 0) and 60 not in ours
