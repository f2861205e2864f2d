"""The evaluator as the library sees it: the frame of a running function, and the narrow interface
(`Interpreter`) through which the models of built-ins, configs, tensors and layers ask the
interpreter to evaluate, call, record and assume. The library never reaches further in."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import libcst as cst

from rca.model import Location
from rca.static.evaluate.values import NO_SRC, EvalRaise, FuncRef, MutDict, MutList, Val
from rca.static.graph import DataflowGraph, NodeKey

if TYPE_CHECKING:
    from rca.inputs.configs import ConfigFile
    from rca.static.codeindex import ClassInfo, CodeIndex, FunctionInfo, ModuleInfo
    from rca.static.evaluate.policy import Policy
    from rca.static.evaluate.trace import Events


class BudgetExceeded(Exception):
    """The evaluation took more steps than its budget: what it found so far stands."""


@dataclass
class Frame:
    """The state of one running function (or module body, or lambda)."""

    module: ModuleInfo
    anchor: Any  # the def (or module) whose lines locate nodes
    func: FunctionInfo | None = None
    locals: dict[str, Val] = field(default_factory=dict)
    closure: dict[str, Val] | None = None
    lazy: bool = False  # resolve missing locals from their reaching definitions
    self_val: Val | None = None
    owner: ClassInfo | None = None  # the class defining the running method, for super()
    current: cst.CSTNode | None = None  # the statement being executed
    resolving: set[tuple[str, int]] = field(default_factory=set)  # (name, statement) being run to bind name
    enclosing: Frame | None = None  # for a lambda: the frame its free names come from
    guards: set[str] = field(default_factory=set)  # unbound parameters a goal path's conditions were assumed on


class Interpreter(Protocol):
    """What the library may use of the evaluator."""

    index: CodeIndex
    graph: DataflowGraph
    num_layers: int | None
    target: ConfigFile | None
    draft: ConfigFile | None
    policy: Policy
    events: Events
    config_fields: dict[tuple[int, tuple], dict[str, Val]]
    config_lists: dict[tuple[int, tuple], MutList]
    readers_of_settings: set[str]  # files whose imports are followed to evaluate a launch setting

    def loc(self, frame: Frame, node: cst.CSTNode) -> Location: ...

    def call_node(
        self, frame: Frame | None, node: cst.CSTNode | None, sources: frozenset[NodeKey], note: str
    ) -> frozenset[NodeKey]:
        """Cite a call statement as a graph node fed by `sources` (nothing when either is missing)."""
        ...

    def assume(self, frame: Frame | None, node: cst.CSTNode | None, note: str) -> frozenset[NodeKey]:
        """Record an assumption made at `node`; its graph node, as the source of what follows from it."""
        ...

    def call(
        self,
        fn: Val,
        args: list[Val],
        kwargs: dict[str, Val] | None = None,
        node: cst.CSTNode | None = None,
        frame: Frame | None = None,
    ) -> Val: ...

    def call_function(
        self, ref: FuncRef, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None
    ) -> Val: ...

    def attribute(self, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None) -> Val: ...

    def object_attribute(self, owner: Val, name: str) -> Val:
        """An attribute of an analyzed instance: a field, a method, or a field resolved from its code."""
        ...

    def set_attribute(self, owner: Val, name: str, value: Val) -> None: ...

    def field(self, obj: Val, name: str) -> Val: ...

    def truth(self, value: Val, frame: Frame | None, node: cst.CSTNode | None, default: bool = False) -> bool: ...

    def concrete(self, value: Val, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        """An unknown number settled by the deployment assumptions, when one applies."""
        ...

    def iterate(
        self, value: Val, frame: Frame | None, node: cst.CSTNode | None, count: int | None = None
    ) -> list[Val] | None: ...

    def record_append(
        self, target: MutList | MutDict, value: Val, frame: Frame | None, node: cst.CSTNode | None
    ) -> Val: ...

    def link(self, attribute: str, value: Val, node: NodeKey | None = None) -> None:
        """Make `<unknown object>.attribute` read `value` (a launch setting)."""
        ...

    def has_link(self, name: str) -> bool: ...

    def linked(self, name: str, value: Val) -> AbstractContextManager[None]:
        """While inside, `<unknown object>.name` reads `value`."""
        ...

    def isolated(self) -> AbstractContextManager[None]:
        """Evaluate out of execution order: the conditions around the current point do not decide."""
        ...

    def mro(self, cls: ClassInfo) -> list[ClassInfo]: ...

    def bind_params(
        self, func: FunctionInfo, args: list[Val], kwargs: dict[str, Val], self_val: Val | None, module: ModuleInfo
    ) -> dict[str, Val]:
        """`func`'s parameters bound to a call's arguments, defaults evaluated in `module`."""
        ...

    def is_enum(self, cls: ClassInfo) -> bool: ...

    def find_methods(self, name: str) -> list[FunctionInfo]: ...

    def singleton(self, cls: ClassInfo) -> Val: ...


if TYPE_CHECKING:

    class Parts(Interpreter):
        """The evaluator as each of its parts (the classes `Evaluator` is made of: statements,
        expressions, objects, goals) sees it, for the type checker only: the library's interface,
        typed, and what the parts give one another, which only the whole has, as `Any`."""

        depth: int  # how deep calls nest now

        def __getattr__(self, name: str) -> Any: ...

else:
    Parts = object  # at run time a part is a plain class, as before


def raised(
    kind: str,
    message: str,
    ev: Interpreter,
    frame: Frame | None,
    node: cst.CSTNode | None,
    src: frozenset[NodeKey] = NO_SRC,
) -> EvalRaise:
    """An exception of the analyzed code, located at `node`."""
    error = EvalRaise(kind, message, node, src)
    if frame is not None and node is not None:
        error.location = ev.loc(frame, node)
    return error
