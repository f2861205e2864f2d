"""Statements: blocks, assignments, conditions, loops, `try`, `with`, imports and nested defs, run
along the one path the policy chooses. Part of `Evaluator` (see interp.py)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from rca.model import StepKind
from rca.static.codeindex import FunctionInfo, dotted_name
from rca.static.evaluate.interface import Frame, Parts
from rca.static.evaluate.library import builtins
from rca.static.evaluate.library.layers import LAYER_STACKS
from rca.static.evaluate.policy import ASSUMPTIONS, UNKNOWN_LOOP
from rca.static.evaluate.syntax import block_of, name_of, stored_names
from rca.static.evaluate.trace import ConfigStore, FieldStore, RaiseEvent
from rca.static.evaluate.values import (
    NONE,
    ConfigObj,
    DecoderLayer,
    EvalRaise,
    FuncRef,
    ModuleRef,
    MutDict,
    MutList,
    ObjRef,
    Opaque,
    TensorVal,
    Val,
    describe,
    hashable,
)
from rca.static.graph import NodeKey

# Loops are unrolled up to this many iterations.
MAX_UNROLL = 4096


def _stored_as(value: Opaque, attribute: str) -> Opaque:
    """An unknown value stored as `owner.start_layer` or `owner.layers` is reached through that name
    from then on: the name marks a runtime state the policy answers (a pipeline stage's first
    layer) or the decoder layers, whatever a function the evaluator followed called it (`sum`, or
    `modules` in vLLM's `make_layers`), as when that function is not followed and its unknown
    result is unpacked into those names."""
    if value.hint == attribute or (attribute not in LAYER_STACKS and attribute not in ASSUMPTIONS):
        return value
    return value.reached_as(attribute)


class Return(Exception):
    def __init__(self, value: Val) -> None:
        self.value = value


class Break(Exception):
    pass


class Continue(Exception):
    pass


@dataclass
class Control:
    """A condition around the running statement: what it decides is control-dependent on it."""

    node: NodeKey | None


# Statements the evaluator runs; any other statement it reaches is recorded as not evaluated.
MODELED_STATEMENTS = (
    "SimpleStatementLine",
    "If",
    "For",
    "While",
    "Try",
    "TryStar",
    "With",
    "FunctionDef",
    "Expr",
    "Assign",
    "AnnAssign",
    "AugAssign",
    "Return",
    "Raise",
    "Break",
    "Continue",
    "Assert",
    "Import",
    "ImportFrom",
    "Pass",
    "Del",
    "Global",
    "Nonlocal",
)


class Statements(Parts):
    """How the evaluator runs statements."""

    def _exec_block(self, statements: list[cst.CSTNode], frame: Frame) -> None:
        for statement in statements:
            self._exec_stmt(statement, frame)

    def _exec_stmt(self, statement: cst.CSTNode, frame: Frame) -> None:
        self._tick()
        previous = frame.current
        if not isinstance(statement, cst.BaseSmallStatement):
            frame.current = statement
        try:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    self._exec_small(small, frame, statement)
            elif isinstance(statement, cst.BaseSmallStatement):
                self._exec_small(statement, frame, statement)
            elif isinstance(statement, cst.If):
                self._exec_if(statement, frame)
            elif isinstance(statement, cst.For):
                self._exec_for(statement, frame)
            elif isinstance(statement, cst.While):
                self._exec_while(statement, frame)
            elif isinstance(statement, (cst.Try, cst.TryStar)):
                self._exec_try(statement, frame)
            elif isinstance(statement, cst.With):
                for item in statement.items:
                    value = self._eval(item.item, frame)
                    if item.asname is not None:
                        self._assign(item.asname.name, value, frame, statement)
                self._exec_block(block_of(statement), frame)
            elif isinstance(statement, cst.FunctionDef):
                if frame.func is not None:  # module-level defs are globals, resolved when named
                    info = FunctionInfo(frame.module, statement, statement.name.value)
                    frame.locals[statement.name.value] = Val(FuncRef(info, closure=dict(frame.locals)))
            elif not (
                isinstance(statement, cst.ClassDef) and frame.func is None
            ):  # module-level classes are globals too
                self.unmodeled(frame, statement, _construct(statement))
        finally:
            frame.current = previous

    def _exec_small(self, small: cst.CSTNode, frame: Frame, line: cst.CSTNode) -> None:
        if isinstance(small, cst.Expr):
            self._eval(small.value, frame)
        elif isinstance(small, cst.Assign):
            value = self._eval(small.value, frame)
            for target in small.targets:
                self._assign(target.target, value, frame, line)
        elif isinstance(small, cst.AnnAssign):
            if small.value is not None:
                self._assign(small.target, self._eval(small.value, frame), frame, line)
        elif isinstance(small, cst.AugAssign):
            current = self._eval(small.target, frame)
            operand = self._eval(small.value, frame)
            operator = type(small.operator).__name__.replace("Assign", "")
            if operator == "Add" and isinstance(current.v, MutList) and not current.v.tuple_like:
                if len(current.v.items) + builtins.length(operand) > builtins.MAX_ITEMS:  # `x += x` in a loop
                    result = Val(Opaque("list", "", "too long to compute"), current.src | operand.src)
                else:
                    current.v.items.extend(self.iterate(operand, frame, small.value) or [Val(Opaque("item"))])
                    result = Val(current.v, current.src | operand.src)
            else:
                result = self.binary(operator, current, operand, frame, small)
            self._assign(small.target, result, frame, line)
        elif isinstance(small, cst.Return):
            raise Return(self._eval(small.value, frame) if small.value is not None else NONE)
        elif isinstance(small, cst.Raise):
            kind = "Exception"
            if small.exc is not None:
                exc = small.exc.func if isinstance(small.exc, cst.Call) else small.exc
                kind = dotted_name(exc) or kind
            error = EvalRaise(
                kind.split(".")[-1], frame.module.code(*frame.module.lines_of(small, frame.anchor)), small
            )
            error.location = self.loc(frame, small)
            raise error
        elif isinstance(small, cst.Break):
            raise Break()
        elif isinstance(small, cst.Continue):
            raise Continue()
        elif isinstance(small, cst.Assert):
            test = self.truth(self._eval(small.test, frame), frame, small.test, default=True)
            if test is False:
                error = EvalRaise(
                    "AssertionError", frame.module.code(*frame.module.lines_of(small, frame.anchor)), small
                )
                error.location = self.loc(frame, small)
                raise error
        elif isinstance(small, (cst.Import, cst.ImportFrom)):
            self._exec_import(small, frame)

    def _exec_import(self, small: cst.Import | cst.ImportFrom, frame: Frame) -> None:
        if isinstance(small, cst.Import):
            for alias in small.names:
                dotted = dotted_name(alias.name)
                if dotted:
                    local = alias.asname.name.value if alias.asname is not None else dotted.split(".")[0]  # type: ignore[union-attr]
                    frame.locals[local] = self._import(dotted if alias.asname is not None else local, None)
            return
        if isinstance(small.names, cst.ImportStar):
            return
        base = self.index._absolute_from(frame.module, small)
        for alias in small.names:
            name = dotted_name(alias.name)
            if base is not None and name:
                local = alias.asname.name.value if alias.asname is not None else name  # type: ignore[union-attr]
                frame.locals[local] = self._import(base, name)

    def _exec_if(self, statement: cst.If, frame: Frame) -> None:
        test_value = self._eval(statement.test, frame)
        if isinstance(test_value.v, Opaque) and not self.policy.settles(test_value.v):
            body = block_of(statement)
            orelse = (
                [statement.orelse]
                if isinstance(statement.orelse, cst.If)
                else block_of(statement.orelse)
                if statement.orelse is not None
                else []
            )
            truth, why = self.policy.branch(
                statement, body, orelse, test_value.v, lambda: self._names_set_after(statement, frame)
            )
            self.assume(frame, statement.test, f"unknown runtime condition assumed {why}")
        else:
            truth = self.truth(test_value, frame, statement.test)
        entry = self._control_entry(statement.test, frame, test_value, truth)
        self.control.append(entry)
        try:
            if truth:
                self._exec_block(block_of(statement), frame)
            elif statement.orelse is not None:
                if isinstance(statement.orelse, cst.If):
                    self._exec_stmt(statement.orelse, frame)
                else:
                    self._exec_block(block_of(statement.orelse), frame)
        finally:
            self.control.pop()

    def _names_set_after(self, statement: cst.CSTNode, frame: Frame) -> set[str]:
        """Names assigned by the statements that follow `statement` in its function."""
        if frame.func is None:
            return set()
        parents = self._parent_map(frame.func)
        found: set[str] = set()
        node = statement
        while node is not frame.func.node and node in parents:
            block = parents[node]
            siblings: list[cst.CSTNode] = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
            if node in siblings:
                found |= stored_names(siblings[siblings.index(node) + 1 :])
            node = block
        return found

    def _control_entry(self, test: cst.BaseExpression, frame: Frame, value: Val, truth: bool) -> Control:
        key = None
        if value.src:
            key = self.node(StepKind.TEST, frame, test, "", value.src)
            self.graph.observe(key, "true" if truth else "false")
        return Control(key)

    def _exec_for(self, statement: cst.For, frame: Frame) -> None:
        iterable = self._eval(statement.iter, frame)
        items = self.iterate(iterable, frame, statement.iter)
        if items is None:
            self.assume(frame, statement.iter, UNKNOWN_LOOP)
            items = [
                Val(Opaque(name_of(statement.target) or "item", "", "an item of an unknown collection"), iterable.src)
            ]
        broke = False
        for count, item in enumerate(items):
            if count >= MAX_UNROLL:
                break
            self._assign(statement.target, item, frame, statement.target)
            try:
                self._exec_block(block_of(statement), frame)
            except Break:
                broke = True
                break
            except Continue:
                continue
        if not broke and statement.orelse is not None:
            self._exec_block(block_of(statement.orelse), frame)

    def _exec_while(self, statement: cst.While, frame: Frame) -> None:
        for _ in range(MAX_UNROLL):
            value = self._eval(statement.test, frame)
            truth = self.truth(value, frame, statement.test)
            if not truth:
                break
            self.control.append(self._control_entry(statement.test, frame, value, truth))
            try:
                self._exec_block(block_of(statement), frame)
            except Break:
                break
            except Continue:
                continue
            finally:
                self.control.pop()

    def _exec_try(self, statement: cst.Try | cst.TryStar, frame: Frame) -> None:
        try:
            try:
                self._exec_block(block_of(statement), frame)
            except EvalRaise as error:
                handler = self._matching_handler(statement, error, frame)
                if handler is None:
                    raise
                self._record_handled(error, handler, frame)
                if handler.name is not None:
                    frame.locals[name_of(handler.name.name)] = Val(
                        Opaque(error.kind, error.kind, error.message, instance=True)
                    )
                self._exec_block(block_of(handler), frame)
            else:
                if statement.orelse is not None:
                    self._exec_block(block_of(statement.orelse), frame)
        finally:
            if statement.finalbody is not None:
                self._exec_block(block_of(statement.finalbody), frame)

    def _record_handled(
        self, error: EvalRaise, handler: cst.ExceptHandler | cst.ExceptStarHandler, frame: Frame
    ) -> None:
        location = self.loc(frame, handler)
        key = self.node(StepKind.HANDLER, frame, handler, f"{error.kind} caught: {error.message}", error.src)
        self.graph.observe(key, error.kind)
        self.events.handled.append(RaiseEvent(error.kind, error.message, error.location, location, error.src))

    def _matching_handler(
        self, statement: cst.Try | cst.TryStar, error: EvalRaise, frame: Frame
    ) -> cst.ExceptHandler | cst.ExceptStarHandler | None:
        for handler in statement.handlers:
            if handler.type is None:
                return handler
            names = []
            kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
            for kind in kinds:
                expression = kind.value if isinstance(kind, cst.Element) else kind
                dotted = dotted_name(expression)  # type: ignore[arg-type]
                if dotted:
                    names.append(dotted.split(".")[-1])
            if any(builtins.exception_matches(error.kind, name) for name in names):
                return handler
        return None

    def _record_assignment(self, value: Val, frame: Frame, line: cst.CSTNode, note: str) -> Val:
        if isinstance(value.v, Opaque) and not value.src:
            return value
        key = self.node(StepKind.ASSIGN, frame, line, note, value.src)
        self.graph.observe(key, describe(value))
        return Val(value.v, frozenset({key}))

    def _assign(
        self,
        target: cst.BaseExpression | cst.BaseElement,
        value: Val,
        frame: Frame,
        line: cst.CSTNode,
        record: bool = True,
    ) -> None:
        if isinstance(target, cst.Name):
            if record:
                value = self._record_assignment(value, frame, line, f"{target.value} =")
            if isinstance(value.v, Opaque):
                value = Val(value.v.named(target.value), value.src)
            frame.locals[target.value] = value
        elif isinstance(target, (cst.Tuple, cst.List)):
            self._unpack(target, value, frame, line)
        elif isinstance(target, cst.Attribute):
            owner = self._eval(target.value, frame)
            if record:
                value = self._record_assignment(value, frame, line, f".{target.attr.value} =")
            if isinstance(value.v, Opaque):
                value = Val(_stored_as(value.v.named(target.attr.value), target.attr.value), value.src)
            self.set_attribute(owner, target.attr.value, value)
        elif isinstance(target, cst.Subscript):
            owner = self._eval(target.value, frame)
            if len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index):
                key = self._eval(target.slice[0].slice.value, frame)
                if record:
                    value = self._record_assignment(value, frame, line, "item =")
                if isinstance(owner.v, MutDict) and isinstance(value.v, TensorVal):  # captures kept by layer index
                    value = self.record_append(owner.v, value, frame, line)
                self._setitem(owner, key, value)
        elif isinstance(target, cst.StarredElement):
            self._assign(target.value, value, frame, line, record)

    def _unpack(self, target: cst.Tuple | cst.List, value: Val, frame: Frame, line: cst.CSTNode) -> None:
        elements = [element.value if isinstance(element, cst.Element) else element for element in target.elements]
        items = self.iterate(value, frame, target, count=len(elements))
        star = next((i for i, element in enumerate(target.elements) if isinstance(element, cst.StarredElement)), None)
        if items is None or (star is None and len(items) != len(elements)):
            parent = value.v if isinstance(value.v, Opaque) else None
            for element in elements:
                hint = name_of(element) or "item"
                self._assign(
                    element,
                    Val(Opaque(hint, "", "unpacked from an unknown value", parent=parent), value.src),
                    frame,
                    line,
                )
            return
        if star is not None:
            tail = len(elements) - star - 1
            middle = items[star : len(items) - tail] if tail else items[star:]
            items = items[:star] + [Val(MutList(list(middle)))] + (items[len(items) - tail :] if tail else [])
        for element, item in zip(elements, items, strict=False):
            self._assign(element, item.with_src(value.src), frame, line)

    def set_attribute(self, owner: Val, name: str, value: Val) -> None:
        assigned = value  # cited by the assignment alone
        value = value.with_src(owner.src)  # which object holds the value is part of where it came from
        if isinstance(owner.v, ObjRef):
            owner.v.fields[name] = value
            self.events.stores.append(FieldStore(owner.v, name, value))
        elif isinstance(owner.v, DecoderLayer):
            owner.v.fields[name] = value
        elif isinstance(owner.v, ModuleRef):
            self._globals[(id(owner.v.info), name)] = value
        elif isinstance(owner.v, ConfigObj):
            self.config_fields.setdefault((id(owner.v.file), owner.v.path), {})[name] = value
            self.events.config_stores.append(ConfigStore(owner.v, name, assigned))

    def _setitem(self, owner: Val, key: Val, value: Val) -> None:
        if isinstance(owner.v, MutDict) and hashable(key.v):
            owner.v.items[key.v] = value
        elif (
            isinstance(owner.v, MutList)
            and isinstance(key.v, int)
            and -len(owner.v.items) <= key.v < len(owner.v.items)
        ):
            owner.v.items[key.v] = value


def _construct(statement: cst.CSTNode) -> str:
    """How a report names a statement kind: `match`, `class` (inside a function)."""
    return {"Match": "`match`", "ClassDef": "a class defined inside a function"}.get(
        type(statement).__name__, f"`{type(statement).__name__}`"
    )
