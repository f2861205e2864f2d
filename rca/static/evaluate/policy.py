"""The one path: what the evaluator assumes where the analyzed code asks about runtime state it
cannot see, and which branch it takes at a condition it cannot decide.

The path is the one rank 0 of a single pipeline stage takes while serving an EAGLE-3 draft, with
optional runtime features off. Names that reach that state have a value below (`ASSUMPTIONS`);
any other unknown condition is decided by `Policy.branch` and taken as false ("feature off") when
nothing else decides. Every decision comes back with the note the evaluator records, at its
location, so that every result can be read together with what was assumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import libcst as cst

from rca.static.codeindex import dotted_name, walk
from rca.static.evaluate.syntax import always_exits, ends_in_raise, returns_false, stored_names
from rca.static.evaluate.values import Opaque, Val


@dataclass(frozen=True)
class Assumption:
    value: object  # a constant, or "num_layers" for the target's decoder-layer count
    why: str


# Keyed by the attribute or function name the unknown value was reached through.
ASSUMPTIONS: dict[str, Assumption] = {
    "is_first_rank": Assumption(True, "a single pipeline-parallel stage (first and last rank)"),
    "is_last_rank": Assumption(True, "a single pipeline-parallel stage (first and last rank)"),
    "rank_in_group": Assumption(0, "the view of tensor-parallel rank 0"),
    "tp_rank": Assumption(0, "the view of tensor-parallel rank 0"),
    "local_rank": Assumption(0, "the view of tensor-parallel rank 0"),
    "start_layer": Assumption(0, "a single pipeline stage holds every decoder layer"),
    "end_layer": Assumption("num_layers", "a single pipeline stage holds every decoder layer"),
    "is_eagle3": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    "speculative_config": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    "spec_config": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    "draft_model_config": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    "use_aux_hidden_state_outputs": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    # A training run's own override of the capture layers (SpecForge's model.aux_hidden_state_layer_ids):
    # run settings are not an input, so the trainer's documented fallbacks decide.
    "aux_hidden_state_layer_ids": Assumption(None, "no run setting overrides the capture layers"),
}

GUARD_ASSUMED = "an unknown object has the attribute its guard checks for"
UNKNOWN_LOOP = "loop over an unknown collection: its body is read once, for one unknown item"


class Policy:
    """Decides what the analyzed code cannot: the value of a named runtime state, the branch at an
    unknown condition. It keeps what the current search is after (`wanting`, `seeking_truth`)."""

    def __init__(self, num_layers: int | None) -> None:
        self.num_layers = num_layers
        self.wanted: set[str] = set()  # names whose assignments an unknown branch should lead to
        self.seeking_truth = False  # while asking whether a condition can be true
        self.view: dict[str, Assumption] = {}  # a pipeline stage's own answers, over ASSUMPTIONS

    @contextmanager
    def stage(self, view: dict[str, Assumption]) -> Iterator[None]:
        """While inside, the runtime state of one pipeline stage (its first layer, whether it is the
        first or last rank) answers in place of the single-stage assumptions."""
        saved, self.view = self.view, {**self.view, **view}
        try:
            yield
        finally:
            self.view = saved

    def assumption(self, opaque: Opaque) -> Assumption | None:
        return self.view.get(opaque.hint) or ASSUMPTIONS.get(opaque.hint)

    @contextmanager
    def wanting(self, names: set[str]) -> Iterator[None]:
        """While looking for values stored under these names, branch toward their assignments."""
        saved = self.wanted
        self.wanted = saved | names
        try:
            yield
        finally:
            self.wanted = saved

    @contextmanager
    def seeking(self) -> Iterator[None]:
        """While asking whether a condition can be true, avoid branches that return false."""
        saved, self.seeking_truth = self.seeking_truth, True
        try:
            yield
        finally:
            self.seeking_truth = saved

    def settles(self, opaque: Opaque) -> bool:
        """Whether a deployment assumption gives this unknown a value."""
        return self.assumption(opaque) is not None

    def settled_truth(self, opaque: Opaque) -> bool | None:
        """The truth an assumption gives this unknown, when it gives a boolean."""
        assumption = self.assumption(opaque)
        return assumption.value if assumption is not None and isinstance(assumption.value, bool) else None

    def truth(self, opaque: Opaque, default: bool) -> tuple[bool, str]:
        """The truth of an unknown condition, and the note recording why."""
        assumption = self.assumption(opaque)
        if assumption is not None and isinstance(assumption.value, bool):
            return assumption.value, f"`{opaque.hint}` assumed {assumption.value}: {assumption.why}"
        truth = opaque.off or default
        return truth, f"unknown runtime condition assumed {'true' if truth else 'false'}" + (
            " (an optional feature off)" if opaque.off else ""
        )

    def unset(self, opaque: Opaque) -> str | None:
        """The note for an unknown setting the assumptions say is not given (read as None)."""
        assumption = self.assumption(opaque)
        if assumption is not None and assumption.value is None:
            return f"`{opaque.hint}` assumed unset: {assumption.why}"
        return None

    def number(self, opaque: Opaque) -> tuple[object, str] | None:
        """An unknown number the assumptions settle (a rank, a layer bound), with its note."""
        assumption = self.assumption(opaque)
        if assumption is None:
            return None
        number = self.num_layers if assumption.value == "num_layers" else assumption.value
        if number is None:
            return None
        return number, f"`{opaque.hint}` assumed {number}: {assumption.why}"

    def branch(
        self, statement: cst.If, body: list, orelse: list, test: Opaque, names_after: Callable[[], set[str]]
    ) -> tuple[bool, str]:
        """For an unknown condition: the branch from which a value being looked for gets set
        (in the branch, or after it when the other branch returns early); when asking whether a
        condition can be true, the branch that does not return a false constant; else the branch
        that does not raise (the code's normal path); else the branch a `hasattr` guard opens
        onto the attribute it checks; else "feature off". Returns the truth and why."""
        if self.wanted:
            later = bool(names_after() & self.wanted)
            reach_if_true = bool(stored_names(body) & self.wanted) or (later and not always_exits(body))
            reach_if_false = bool(stored_names(orelse) & self.wanted) or (
                later and not (orelse and always_exits(orelse))
            )
            if reach_if_true != reach_if_false:
                wanted = ", ".join(
                    sorted(self.wanted & (stored_names(body if reach_if_true else orelse) | names_after()))
                )
                return reach_if_true, f"{str(reach_if_true).lower()}: the path that sets {wanted}"
        if self.seeking_truth and returns_false(body) != (bool(orelse) and returns_false(orelse)):
            return not returns_false(body), "so that the condition sought can still be true"
        raises_if_true = ends_in_raise(body)
        raises_if_false = isinstance(statement.orelse, cst.Else) and ends_in_raise(orelse)
        if raises_if_false and not raises_if_true:
            return True, "true: the other branch raises"
        if raises_if_true and not raises_if_false:
            return False, "false: that branch raises"
        if guards_its_read(statement.test, body, orelse):
            return True, f"true: {GUARD_ASSUMED}"
        return test.off, "true (with the optional feature it tests off)" if test.off else "false"


def guards_its_read(test: cst.BaseExpression, body: list, orelse: list) -> bool:
    """`hasattr(x, "a")` guarding code that reads `x.a`, with a fallback that does not use `x`
    (`x.a if hasattr(x, "a") else 0`): the object the code expects has the attribute. A chain of
    alternatives (`elif hasattr(x, "b"): ... x.b`) is duck typing, not a guard, and is left alone."""
    if not (
        isinstance(test, cst.Call)
        and dotted_name(test.func) == "hasattr"
        and len(test.args) == 2
        and isinstance(test.args[1].value, cst.SimpleString)
    ):
        return False
    owner, name = test.args[0].value, test.args[1].value.evaluated_value

    def reads(parts: list, attribute: str | bytes | None) -> bool:
        return any(
            isinstance(found, cst.Attribute)
            and found.value.deep_equals(owner)
            and attribute in (None, found.attr.value)
            for part in parts
            for found in walk(part)
        )

    return reads(body, name) and not reads(orelse, None)


def off(value: Val) -> bool:
    """A condition's truth with every unknown in it taken as off."""
    return value.v.off if isinstance(value.v, Opaque) else bool(value.v) if isinstance(value.v, (bool, int)) else False
