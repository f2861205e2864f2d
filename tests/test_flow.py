"""rca.sdk.code.Flow: the forward walk analyzers subclass to ask where a local value came from."""

from __future__ import annotations

import libcst as cst

from rca.sdk.code import CLEAN, Flow, State, Taint


class _CallsOf(Flow):
    """Sources: each assignment from a call of `source()`; tests on `decided` take their branch."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[int, str] = {}
        self.seen: list[tuple[str, Taint]] = []

    def source(self, value: cst.BaseExpression, line: cst.CSTNode, depth: int) -> Taint:
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "source":
            self.sites[id(line)] = cst.Module([]).code_for_node(line).strip()
            return Taint(frozenset({id(line)}))
        return CLEAN

    def decide(self, node: cst.If, depth: int) -> bool | None:
        return True if isinstance(node.test, cst.Name) and node.test.value == "decided" else None

    def visit(self, node: cst.BaseSmallStatement, state: State, depth: int) -> None:
        if isinstance(node, cst.Expr) and isinstance(node.value, cst.Call) and node.value.args:
            self.seen.append((cst.Module([]).code_for_node(node.value), self.taint(node.value.args[0].value, state)))


def _walk(code: str) -> tuple[_CallsOf, State]:
    function = cst.ensure_type(cst.parse_module(code).body[0], cst.FunctionDef)
    flow = _CallsOf()
    return flow, flow.body(function.body.body, {}, 0)


def _sources(flow: _CallsOf, taint: Taint) -> set[str]:
    return {flow.sites[site] for site in taint.sites}


def test_a_value_carries_its_sources_through_assignments_and_unpacking() -> None:
    flow, state = _walk("def f(x):\n    a = source()\n    b, c = a + 1, x\n    d = c\n")
    assert _sources(flow, state["b"]) == {"a = source()"}
    assert _sources(flow, state["c"]) == {"a = source()"}  # a tuple's parts share the whole's sources
    assert state["d"] == state["c"] and not state["b"].unsure


def test_a_test_not_decided_makes_a_differing_name_unsure_and_a_decided_one_takes_its_branch() -> None:
    flow, state = _walk(
        "def f(flag, decided):\n"
        "    a = 0\n    b = 0\n"
        "    if flag:\n        a = source()\n"
        "    if decided:\n        b = source()\n    else:\n        b = 1\n"
    )
    assert state["a"].unsure and _sources(flow, state["a"]) == {"a = source()"}
    assert not state["b"].unsure and _sources(flow, state["b"]) == {"b = source()"}


def test_a_loop_step_sees_what_the_previous_step_left() -> None:
    flow, _ = _walk("def f(tokens):\n    for step in range(3):\n        use(tokens)\n        tokens = source()\n")
    first, second = flow.seen
    assert first[1] == CLEAN  # the first walk of the body: the argument's own tokens
    assert _sources(flow, second[1]) == {"tokens = source()"}  # the second: what step one assigned
    assert flow.assigned_in_loop == {"tokens"}
