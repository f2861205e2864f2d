"""The dataflow graph's own adjacency answers as networkx's DiGraph does, for what the analysis asks."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys

import networkx as nx

from rca.model import Location, StepKind
from rca.static.graph import DiGraph, NodeKey, _ancestors, _descendants


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


def test_a_node_key_rebuilt_or_unpickled_is_the_same_node() -> None:
    """A node key hashes once, when made: one made again for the same step, or passed through a
    pickle (a forked analysis sends its graph), is equal to it and finds its node."""
    location = Location("serving", "model.py", 3, 4)
    key = NodeKey(StepKind.CALL, location, "x")
    for again in (pickle.loads(pickle.dumps(key)), NodeKey(StepKind.CALL, Location("serving", "model.py", 3, 4), "x")):
        assert again == key and hash(again) == hash(key) and {key: "found"}[again] == "found"
    assert NodeKey(StepKind.TEST, location, "x") != key
    assert NodeKey(StepKind.CALL, location) != key
    assert NodeKey(StepKind.CALL, Location("serving", "model.py", 3, 5), "x") != key


def test_a_node_key_unpickled_in_another_process_hashes_as_that_process_does() -> None:
    """String hashes differ between processes: a key sent from a forked or earlier process must
    hash as keys made where it is read, or the graph there would not find its node."""
    key = NodeKey(StepKind.CALL, Location("serving", "model.py", 3, 4), "x")
    check = (
        "import pickle, sys; from rca.model import Location, StepKind; from rca.static.graph import NodeKey; "
        "key = pickle.loads(sys.stdin.buffer.read()); "
        "made = NodeKey(StepKind.CALL, Location('serving', 'model.py', 3, 4), 'x'); "
        "print(key == made and hash(key) == hash(made))"
    )
    seeded = {**os.environ, "PYTHONHASHSEED": "12345"}
    answer = subprocess.run(
        [sys.executable, "-c", check], input=pickle.dumps(key), capture_output=True, env=seeded, check=True
    )
    assert answer.stdout.strip() == b"True"
