"""The report's diagram: the two wirings side by side, which target state feeds which draft input
on each side, differences and patched steps marked, small enough to read."""

from __future__ import annotations

import re

from rca.model import Location, Step, StepKind, Tap, Wiring
from rca.report.diagram import sides_mermaid


def _wiring(side: str, layers: list[int], last: int | None = 61, steps: tuple[Step, ...] = ()) -> Wiring:
    return Wiring(side, tuple(Tap(layer) for layer in layers), Tap(last) if last is not None else None, steps)


PATCH = Step(
    Location("serving", "sglang/srt/models/deepseek_v2.py", 2545, 2547),
    "layers_to_capture = [0, 3, 31]",
    "self.model.layers_to_capture = [...]",
    StepKind.ASSIGN,
    patched=True,
)


def _edges(diagram: str) -> list[tuple[str, str, str]]:
    names = dict(re.findall(r"^\s+(h_\d+|d_\d+)\S*?\[\"?\(?\[?\"?([^\"\]]+)", diagram, re.MULTILINE))
    return [(names[a], side, names[b]) for a, side, b in re.findall(r"^  (h_\d+) -- (\w+) --> (d_\d+)$", diagram, re.M)]


def test_the_founding_case_shows_each_side_feeding_each_slot_and_the_patch_at_the_embedding() -> None:
    diagram = sides_mermaid(_wiring("training", [3, 31, 59]), _wiring("serving", [0, 3, 31], None, (PATCH,)))
    assert diagram.startswith("flowchart LR\n")
    assert _edges(diagram) == [
        ("h3", "training", "slot 0"), ("h0", "serving", "slot 0"),
        ("h31", "training", "slot 1"), ("h3", "serving", "slot 1"),
        ("h59", "training", "slot 2"), ("h31", "serving", "slot 2"),
        ("h61", "training", "verifier-last"),
    ]  # fmt: skip
    assert "linkStyle 0,1,2,3,4,5 stroke:#d33" in diagram  # the six edges of the three differing slots
    assert re.search(r"class (h_\d+),(h_\d+) differs", diagram)  # h0 (serving only) and h59 (training only)
    patched = re.search(r'p_serving\["serving, patched:<br/>(.*?)"\]', diagram)
    assert patched and "deepseek_v2.py:2545-2547" in patched[1]
    (target,) = re.findall(r"p_serving -.-> (h_\d+)", diagram)
    assert f'{target}(["h0"])' in diagram  # the patch points at the state only serving feeds


def test_a_consistent_wiring_draws_one_edge_per_input_and_marks_nothing() -> None:
    diagram = sides_mermaid(_wiring("training", [2, 16, 29], 32), _wiring("serving", [2, 16, 29], 32))
    assert [side for _, side, _ in _edges(diagram)] == ["both"] * 4
    assert "linkStyle" not in diagram and "differs" not in diagram and "patched" not in diagram


def test_the_diagram_stays_small_for_a_wide_draft() -> None:
    """Eight slots each side, all shifted: one node per state and per input, two edges per input,
    every label short; no chain of steps (they are the text below it)."""
    many = list(range(1, 60, 7))[:8]
    diagram = sides_mermaid(_wiring("training", [layer + 1 for layer in many]), _wiring("serving", many))
    nodes = re.findall(r"^\s+(?:h|d)_\d+[\[(]", diagram, re.MULTILINE)
    assert len(nodes) == 16 + 1 + 9  # states fed (with the verifier's), inputs (with the verifier-last)
    assert len(_edges(diagram)) == 2 * 8 + 1
    assert max(len(line) for line in diagram.splitlines()) < 120
