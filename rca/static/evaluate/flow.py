"""A flow-sensitive read of one function's local names: which sources each value derives from.

The symbolic evaluator computes values; some questions need only where a value came from (does the
token fed at step two derive from the draft's argmax at step one?). `Flow` walks a function body
forward with a state mapping each local name to its `Taint` (the source sites it derives from),
through assignments, branches (joined, unless the analysis decides the test) and loops (each body
walked twice, so a step sees what the previous one left). An analysis subclasses it and says where
sources start (`source`), which tests it decides (`decide`) and what it reads (`visit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from rca.static.codeindex import walk

State = dict[str, "Taint"]


@dataclass(frozen=True)
class Taint:
    """The source sites (node ids) a value derives from; `unsure` where it differs between the
    branches of a test the analysis does not decide."""

    sites: frozenset[int] = frozenset()
    unsure: bool = False

    def __or__(self, other: Taint) -> Taint:
        return Taint(self.sites | other.sites, self.unsure or other.unsure)


CLEAN = Taint()


class Flow:
    """The walk; `depth` counts the loops around a statement (0: outside every loop)."""

    def __init__(self) -> None:
        self.assigned: dict[str, list[cst.CSTNode]] = {}  # a name -> the statements assigning it
        self.assigned_in_loop: set[str] = set()

    # -- what an analysis says ----------------------------------------------------------------------

    def source(self, value: cst.BaseExpression, line: cst.CSTNode, depth: int) -> Taint:
        """The sources an assigned value starts (beyond those of the names it reads)."""
        return CLEAN

    def decide(self, node: cst.If, depth: int) -> bool | None:
        """The branch a test takes in the analyzed run; None: both, joined."""
        return None

    def visit(self, node: cst.BaseSmallStatement, state: State, depth: int) -> None:
        """Called after each small statement, with the state it leaves."""

    def loop_pass(self, node: cst.For | cst.While, depth: int, number: int | None) -> None:
        """Called before each of the two walks of a loop's body (number 0, 1) and after them (None)."""

    # -- the walk ----------------------------------------------------------------------------------

    def taint(self, node: cst.CSTNode, state: State) -> Taint:
        """The sources of the names an expression reads (not an attribute's name, `x.input_ids`, nor
        a keyword's, `f(input_ids=...)`)."""
        found, named = CLEAN, set()
        for child in walk(node, lambda n: not isinstance(n, (cst.Lambda, cst.FunctionDef))):
            if isinstance(child, cst.Attribute):
                named.add(id(child.attr))
            elif isinstance(child, cst.Arg) and child.keyword is not None:
                named.add(id(child.keyword))
            elif isinstance(child, cst.Name) and id(child) not in named:
                found = found | state.get(child.value, CLEAN)
        return found

    def body(self, statements: Sequence[cst.CSTNode], state: State, depth: int) -> State:
        for statement in statements:
            state = self.statement(statement, state, depth)
        return state

    def statement(self, node: cst.CSTNode, state: State, depth: int) -> State:
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                state = self._small(small, node, state, depth)
            return state
        if isinstance(node, cst.If):
            return self._branch(node, state, depth)
        if isinstance(node, (cst.For, cst.While)):
            return self._loop(node, state, depth)
        if isinstance(node, cst.With):
            return self.body(node.body.body, state, depth)
        if isinstance(node, cst.Try):
            state = self.body(node.body.body, state, depth)
            for handler in node.handlers:
                state = join(state, self.body(handler.body.body, dict(state), depth))
            return self.body(node.finalbody.body.body, state, depth) if node.finalbody else state
        return state

    def _small(self, node: cst.BaseSmallStatement, line: cst.CSTNode, state: State, depth: int) -> State:
        if isinstance(node, cst.Assign):
            value = self.taint(node.value, state) | self.source(node.value, line, depth)
            for target in node.targets:
                state = self.store(target.target, value, line, state, depth)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)) and node.value is not None:
            value = self.taint(node.value, state)
            if isinstance(node, cst.AugAssign):
                value = value | self.taint(node.target, state)
            state = self.store(node.target, value, line, state, depth)
        self.visit(node, state, depth)
        return state

    def store(self, target: cst.CSTNode, value: Taint, line: cst.CSTNode, state: State, depth: int) -> State:
        state = dict(state)
        if isinstance(target, cst.Name):
            state[target.value] = value
            self.assigned.setdefault(target.value, []).append(line)
            if depth:
                self.assigned_in_loop.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                state = self.store(element.value, value, line, state, depth)
        elif isinstance(target, cst.StarredElement):
            state = self.store(target.value, value, line, state, depth)
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):  # x[i] = ...: x changes
            name = target.value.value
            state[name] = state.get(name, CLEAN) | value
        return state

    def _branch(self, node: cst.If, state: State, depth: int) -> State:
        decided = self.decide(node, depth)
        orelse = node.orelse
        if decided is not None:
            if decided:
                return self.body(node.body.body, state, depth)
            if isinstance(orelse, cst.If):
                return self._branch(orelse, state, depth)
            return self.body(orelse.body.body, state, depth) if orelse is not None else state
        taken = self.body(node.body.body, dict(state), depth)
        if isinstance(orelse, cst.If):
            other = self._branch(orelse, dict(state), depth)
        elif orelse is not None:
            other = self.body(orelse.body.body, dict(state), depth)
        else:
            other = state
        return join(taken, other)

    def _loop(self, node: cst.For | cst.While, state: State, depth: int) -> State:
        if isinstance(node, cst.For):
            state = self.store(node.target, self.taint(node.iter, state), node, state, depth)
        self.loop_pass(node, depth, 0)
        first = self.body(node.body.body, dict(state), depth + 1)
        self.loop_pass(node, depth, 1)
        second = self.body(node.body.body, first, depth + 1)
        self.loop_pass(node, depth, None)
        return join(state, second, loop=True)


def join(first: State, second: State, loop: bool = False) -> State:
    """Two paths' states together: after a test the code does not decide, a name whose sources differ
    is unsure; after a loop (run or not), a name holds either path's sources."""
    joined = {}
    for name in first.keys() | second.keys():
        a, b = first.get(name, CLEAN), second.get(name, CLEAN)
        joined[name] = a | b if loop or a.sites == b.sites else Taint(a.sites | b.sites, True)
    return joined
