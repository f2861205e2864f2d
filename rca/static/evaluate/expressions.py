"""Expressions and calls: names, literals, containers, operators, comprehensions, lambdas, calls
with Python's argument binding. Values of kinds the library models (configs, tensors, layers)
are handed to it. Part of `Evaluator` (see interp.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import libcst as cst

from rca.model import StepKind
from rca.static.evaluate.interface import Frame, Parts
from rca.static.evaluate.library import builtins, calls, layers
from rca.static.evaluate.policy import GUARD_ASSUMED, guards_its_read, off
from rca.static.evaluate.statements import MAX_UNROLL, Return
from rca.static.evaluate.syntax import block_of, decorators
from rca.static.evaluate.values import (
    NO_SRC,
    NONE,
    BuiltinFn,
    ClassRef,
    DecoderLayer,
    FuncRef,
    LambdaRef,
    MutDict,
    MutList,
    ObjRef,
    Opaque,
    Val,
    hashable,
    make_set,
    sources_of,
)

if TYPE_CHECKING:
    from rca.static.codeindex import FunctionInfo, ModuleInfo

# Calls nest at most this deep; deeper calls return an unknown value.
MAX_DEPTH = 14


class Expressions(Parts):
    """How the evaluator computes expressions and calls."""

    def _eval(self, node: cst.BaseExpression, frame: Frame) -> Val:
        self._tick()
        method = getattr(self, "_e_" + type(node).__name__, None)
        if method is None:
            self.unmodeled(frame, node, f"the expression `{type(node).__name__}`")
            return Val(Opaque(type(node).__name__, "", "expression not modeled"))
        return method(node, frame)

    def _e_Name(self, node: cst.Name, frame: Frame) -> Val:
        if node.value in ("True", "False", "None"):
            return Val({"True": True, "False": False, "None": None}[node.value])
        return self._lookup(frame, node.value, node)

    def _e_Integer(self, node: cst.Integer, frame: Frame) -> Val:
        try:
            value = node.evaluated_value
        except (SyntaxError, ValueError):  # more decimal digits than Python converts
            value = None
        if value is None or value.bit_length() > builtins.MAX_INT_BITS:
            return Val(Opaque("integer", "", "literal too large to compute with"))
        return Val(value)

    def _e_Float(self, node: cst.Float, frame: Frame) -> Val:
        return Val(node.evaluated_value)

    def _e_SimpleString(self, node: cst.SimpleString, frame: Frame) -> Val:
        value = node.evaluated_value
        return Val(value if isinstance(value, str) else Opaque("bytes"))

    def _e_ConcatenatedString(self, node: cst.ConcatenatedString, frame: Frame) -> Val:
        value = node.evaluated_value
        return Val(value if isinstance(value, str) else Opaque("string"))

    def _e_FormattedString(self, node: cst.FormattedString, frame: Frame) -> Val:
        """A string, where every part is a literal or a plain `{value}` of a known str, int or bool
        (a config's architecture name prefixed: `f"Eagle3{arch}"`); an unknown string otherwise."""
        unknown = Val(Opaque("f-string", "", "formatted string"))
        text: list[str] = []
        src: frozenset = frozenset()
        for part in node.parts:
            if isinstance(part, cst.FormattedStringText):
                if any(mark in part.value for mark in "{}\\"):  # escapes are kept as written
                    return unknown
                text.append(part.value)
                continue
            part = cast(cst.FormattedStringExpression, part)  # the one other kind of part
            if part.conversion is not None or part.format_spec is not None:
                return unknown
            value = self._eval(part.expression, frame)
            if not isinstance(value.v, (str, int)):
                return unknown.with_src(value.src)
            text.append(str(value.v))
            src |= value.src
        return Val("".join(text), src)

    def _e_Ellipsis(self, node: cst.Ellipsis, frame: Frame) -> Val:
        return Val(Ellipsis)

    def _e_Await(self, node: cst.Await, frame: Frame) -> Val:
        return self._eval(node.expression, frame)

    def _e_NamedExpr(self, node: cst.NamedExpr, frame: Frame) -> Val:
        value = self._eval(node.value, frame)
        self._assign(node.target, value, frame, node, record=False)
        return value

    def _elements(self, elements: Any, frame: Frame) -> list[Val]:
        values: list[Val] = []
        for element in elements:
            if isinstance(element, cst.StarredElement):
                inner = self.iterate(self._eval(element.value, frame), frame, element)
                values.extend(inner if inner is not None else [Val(Opaque("starred"))])
            else:
                values.append(self._eval(element.value, frame))
        return values

    def _e_List(self, node: cst.List, frame: Frame) -> Val:
        items = self._elements(node.elements, frame)
        return Val(MutList(items), sources_of(items))

    def _e_Tuple(self, node: cst.Tuple, frame: Frame) -> Val:
        items = self._elements(node.elements, frame)
        return Val(MutList(items, tuple_like=True), sources_of(items))

    def _e_Set(self, node: cst.Set, frame: Frame) -> Val:
        values = self._elements(node.elements, frame)
        return make_set(values, frozen=False)

    def _e_Dict(self, node: cst.Dict, frame: Frame) -> Val:
        items: dict[Any, Val] = {}
        for element in node.elements:
            if isinstance(element, cst.DictElement):
                key = self._eval(element.key, frame)
                if hashable(key.v):
                    items[key.v] = self._eval(element.value, frame)
            else:
                inner = self._eval(element.value, frame)
                if isinstance(inner.v, MutDict):
                    items.update(inner.v.items)
        return Val(MutDict(items))

    def _e_Attribute(self, node: cst.Attribute, frame: Frame) -> Val:
        owner = self._eval(node.value, frame)
        return self.attribute(owner, node.attr.value, frame, node)

    def _e_Subscript(self, node: cst.Subscript, frame: Frame) -> Val:
        owner = self._eval(node.value, frame)
        if len(node.slice) != 1:
            keys = [self._slice_value(element.slice, frame) for element in node.slice]
            return self.subscript(owner, Val(MutList(keys, tuple_like=True)), frame, node)
        return self.subscript(owner, self._slice_value(node.slice[0].slice, frame), frame, node)

    def _slice_value(self, element: cst.BaseSlice, frame: Frame) -> Val:
        if isinstance(element, cst.Index):
            return self._eval(element.value, frame)
        assert isinstance(element, cst.Slice)
        parts = [
            self.concrete(self._eval(part, frame), frame, part) if part is not None else NONE
            for part in (element.lower, element.upper, element.step)
        ]
        if all(isinstance(part.v, (int, type(None))) for part in parts):
            return Val(slice(*(part.v for part in parts)), frozenset().union(*(part.src for part in parts)))
        return Val(Opaque("slice", "", "slice bounds unknown"))

    def _e_IfExp(self, node: cst.IfExp, frame: Frame) -> Val:
        value = self._eval(node.test, frame)
        if isinstance(value.v, Opaque) and guards_its_read(node.test, [node.body], [node.orelse]):
            truth = True
            self.assume(frame, node.test, f"unknown runtime condition assumed true: {GUARD_ASSUMED}")
        else:
            truth = self.truth(value, frame, node.test)
        self.control.append(self._control_entry(node.test, frame, value, truth))
        try:
            chosen = self._eval(node.body if truth else node.orelse, frame)
        finally:
            self.control.pop()
        return chosen.with_src(value.src)

    def _e_BooleanOperation(self, node: cst.BooleanOperation, frame: Frame) -> Val:
        """Three-valued `and`/`or`: an unknown operand stays unknown unless the other decides."""
        left = self._eval(node.left, frame)
        short_circuit = isinstance(node.operator, cst.Or)  # the value of `left` that decides alone
        left_truth = self._known_truth(left, frame, node.left)
        if left_truth is not None:
            if left_truth == short_circuit:
                return left
            return self._eval(node.right, frame).with_src(left.src)
        right = self._eval(node.right, frame)
        if self._known_truth(right, frame, node.right) == short_circuit:
            return right.with_src(left.src)
        all_off = (off(left) or off(right)) if short_circuit else (off(left) and off(right))
        return Val(Opaque("condition", "", "depends on an unknown value", off=all_off), left.src | right.src)

    def _known_truth(self, value: Val, frame: Frame, node: cst.CSTNode) -> bool | None:
        if isinstance(value.v, Opaque) and self.policy.settled_truth(value.v) is None:
            return None
        return self.truth(value, frame, node)

    def _e_UnaryOperation(self, node: cst.UnaryOperation, frame: Frame) -> Val:
        operand = self._eval(node.expression, frame)
        if isinstance(node.operator, cst.Not):
            known = self._known_truth(operand, frame, node.expression)
            if known is None:  # stays unknown: the `if` around it decides, knowing it is negated
                return Val(Opaque("not", "", "negation of an unknown value", off=not off(operand)), operand.src)
            return Val(not known, operand.src)
        if isinstance(operand.v, (int, float)) and not isinstance(operand.v, bool):
            if isinstance(node.operator, cst.Minus):
                return Val(-operand.v, operand.src)
            if isinstance(node.operator, cst.Plus):
                return operand
            if isinstance(node.operator, cst.BitInvert) and isinstance(operand.v, int):
                return Val(~operand.v, operand.src)
        return Val(Opaque("unary", "", "operand unknown"), operand.src)

    def _e_BinaryOperation(self, node: cst.BinaryOperation, frame: Frame) -> Val:
        left = self._eval(node.left, frame)
        right = self._eval(node.right, frame)
        return self.binary(type(node.operator).__name__, left, right, frame, node)

    def _e_Comparison(self, node: cst.Comparison, frame: Frame) -> Val:
        left = self._eval(node.left, frame)
        src = left.src
        result: Any = True
        for target in node.comparisons:
            right = self._eval(target.comparator, frame)
            src = src | right.src
            if isinstance(target.operator, (cst.Is, cst.IsNot)):
                left, right = self.unset(left, frame, node.left), self.unset(right, frame, target.comparator)
                src = src | left.src | right.src
            outcome = builtins.compare(self, type(target.operator).__name__, left, right)
            if isinstance(outcome, Opaque):
                return Val(outcome, src)
            if not outcome:
                result = False
                break
            left = right
        return Val(result, src)

    def _comprehension(self, for_in: cst.CompFor, frame: Frame, produce: Callable[[Frame], None]) -> bool:
        """Run `produce` for each item; False when an iterable's items are unknown (`range(n)` of an
        unknown `n`): what the comprehension makes is then unknown, not empty."""
        iterable = self._eval(for_in.iter, frame)
        items = self.iterate(iterable, frame, for_in.iter)
        if items is None:
            return False
        known = True
        for count, item in enumerate(items):
            if count >= MAX_UNROLL:
                break
            self._assign(for_in.target, item.with_src(iterable.src), frame, for_in, record=False)
            keep = True
            for condition in for_in.ifs:
                test = self._eval(condition.test, frame)
                if not self.truth(test, frame, condition.test):
                    keep = False
                    break
            if not keep:
                continue
            if for_in.inner_for_in is not None:
                known = self._comprehension(for_in.inner_for_in, frame, produce) and known
            else:
                produce(frame)
        return known

    def _comp_frame(self, frame: Frame) -> Frame:
        inner = Frame(
            frame.module,
            frame.anchor,
            frame.func,
            dict(frame.locals),
            frame.closure,
            frame.lazy,
            frame.self_val,
            frame.owner,
            frame.current,
        )
        inner.resolving = frame.resolving
        return inner

    def _e_ListComp(self, node: cst.ListComp, frame: Frame) -> Val:
        results: list[Val] = []
        inner = self._comp_frame(frame)
        if not self._comprehension(node.for_in, inner, lambda f: results.append(self._eval(node.elt, f))):
            return Val(Opaque("comprehension", "", "items of an unknown iterable"), sources_of(results))
        return Val(MutList(results), sources_of(results))

    def _e_GeneratorExp(self, node: cst.GeneratorExp, frame: Frame) -> Val:
        value = self._e_ListComp(node, frame)  # type: ignore[arg-type]
        if isinstance(value.v, MutList):
            value.v.tuple_like = True
        return value

    def _e_SetComp(self, node: cst.SetComp, frame: Frame) -> Val:
        value = self._e_ListComp(node, frame)  # type: ignore[arg-type]
        return make_set(value.v.items, frozen=False) if isinstance(value.v, MutList) else value

    def _e_DictComp(self, node: cst.DictComp, frame: Frame) -> Val:
        items: dict[Any, Val] = {}
        inner = self._comp_frame(frame)

        def produce(f: Frame) -> None:
            key = self._eval(node.key, f)
            if hashable(key.v) or isinstance(key.v, Opaque):  # an unknown key (an f-string) keeps its value
                items[key.v] = self._eval(node.value, f)

        if not self._comprehension(node.for_in, inner, produce):
            return Val(Opaque("comprehension", "", "items of an unknown iterable"), sources_of(list(items.values())))
        return Val(MutDict(items), sources_of(list(items.values())))

    def _e_Lambda(self, node: cst.Lambda, frame: Frame) -> Val:
        return Val(LambdaRef(node, frame.module, frame.anchor, frame))

    def _e_Call(self, node: cst.Call, frame: Frame) -> Val:
        fn = self._eval(node.func, frame)
        args, kwargs = self._call_arguments(node, frame)
        return self._call(fn, args, kwargs, node, frame)

    def _call_arguments(self, node: cst.Call, frame: Frame) -> tuple[list[Val], dict[str, Val]]:
        args: list[Val] = []
        kwargs: dict[str, Val] = {}
        for arg in node.args:
            value = self._eval(arg.value, frame)
            if arg.star == "*":
                items = self.iterate(value, frame, arg.value)
                args.extend(items if items is not None else [])
            elif arg.star == "**":
                if isinstance(value.v, MutDict):
                    kwargs.update({str(key): item for key, item in value.v.items.items()})
            elif arg.keyword is not None:
                kwargs[arg.keyword.value] = value
            else:
                args.append(value)
        return args, kwargs

    @staticmethod
    def _params(node: cst.FunctionDef | cst.Lambda) -> list[cst.Param]:
        params = node.params
        return [*params.posonly_params, *params.params]

    def bind_params(
        self, func: FunctionInfo, args: list[Val], kwargs: dict[str, Val], self_val: Val | None, module: ModuleInfo
    ) -> dict[str, Val]:
        """`func`'s parameters bound to a call's arguments, defaults evaluated in `module`."""
        return self._bind(func.node, args, kwargs, self_val, self._module_frame(module, func.node))

    def _bind(
        self,
        node: cst.FunctionDef | cst.Lambda,
        args: list[Val],
        kwargs: dict[str, Val],
        self_val: Val | None,
        default_frame: Frame,
        open_varargs: bool = False,
    ) -> dict[str, Val]:
        """Parameters bound as Python would bind them; what no argument gives is its default, else
        unknown. With `open_varargs` (a function entered on its own), *args and **kwargs are unknown."""
        bound: dict[str, Val] = {}
        positional = self._params(node)
        values = list(args)
        if self_val is not None and positional:
            bound[positional[0].name.value] = self_val
            positional = positional[1:]
        remaining = dict(kwargs)

        def argument(param: cst.Param, values: list[Val]) -> Val:
            name = param.name.value
            if values:
                return values.pop(0)
            if name in remaining:
                return remaining.pop(name)
            if param.default is not None:
                return self._eval(param.default, default_frame)
            return Val(Opaque(name, "", "argument not known"))

        for param in positional:
            bound[param.name.value] = argument(param, values)
        params = node.params
        for param in params.kwonly_params:
            bound[param.name.value] = argument(param, [])
        if isinstance(params.star_arg, cst.Param):
            name = params.star_arg.name.value
            bound[name] = Val(Opaque(name)) if open_varargs else Val(MutList(values, tuple_like=True))
        if params.star_kwarg is not None:
            name = params.star_kwarg.name.value
            bound[name] = Val(Opaque(name)) if open_varargs else Val(MutDict(dict(remaining)))
        return bound

    def _bind_unknown_params(
        self, func: FunctionInfo, bindings: dict[str, Val], self_val: Val | None
    ) -> dict[str, Val]:
        """Parameters for a goal-directed run: given bindings, else defaults, else unknown."""
        receiver = None if "staticmethod" in decorators(func.node) else self_val
        bound = self._bind(
            func.node, [], dict(bindings), receiver, self._module_frame(func.module, func.node), open_varargs=True
        )
        return {**bindings, **bound}

    def _call(
        self, fn: Val, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None
    ) -> Val:
        payload = fn.v
        if isinstance(payload, FuncRef):
            return self.call_function(payload, args, kwargs, node, frame)
        if isinstance(payload, LambdaRef):
            inner = Frame(payload.module, payload.anchor, None, {}, enclosing=payload.frame)
            inner.locals.update(self._bind(payload.node, args, kwargs, None, inner))
            return self._eval(payload.node.body, inner)
        if isinstance(payload, ClassRef):
            return self._instantiate(payload.info, args, kwargs, node, frame)
        if isinstance(payload, BuiltinFn):
            return builtins.call_builtin(self, payload, fn, args, kwargs, node, frame)
        if isinstance(payload, DecoderLayer):
            return layers.call_layer(self, fn, args, kwargs, node, frame)
        if isinstance(payload, Opaque):
            return calls.call_unknown(self, fn, args, kwargs, node, frame)
        if isinstance(payload, ObjRef):
            call = self.object_attribute(fn, "__call__") if self._has_method(payload.cls, "__call__") else None
            if call is not None:
                return self._call(call, args, kwargs, node, frame)
            forward = self.object_attribute(fn, "forward") if self._has_method(payload.cls, "forward") else None
            if forward is not None:
                return self._call(forward, args, kwargs, node, frame)
        return Val(Opaque("call", "", "call of a value that is not callable here"))

    def call_function(
        self, ref: FuncRef, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None
    ) -> Val:
        func = ref.info
        if self.depth >= MAX_DEPTH:
            return Val(Opaque(func.name, func.qualname, "call depth limit reached"))
        sources = NO_SRC
        if frame is not None and node is not None:
            incoming = (
                frozenset().union(*(arg.src for arg in [*args, *kwargs.values()])) if (args or kwargs) else NO_SRC
            )
            if incoming:
                key = self.node(StepKind.CALL, frame, node, f"calls {func.qualname}", incoming)
                sources = frozenset({key})
        callee = self._function_frame(func, ref.bound, closure=ref.closure)
        bound = self._bind(
            func.node,
            [a.with_src(sources) if sources else a for a in args],
            {k: (v.with_src(sources) if sources else v) for k, v in kwargs.items()},
            ref.bound,
            self._module_frame(func.module, func.node),
        )
        callee.locals.update(bound)
        collector = layers.is_collector_call(ref)
        appends_before = len(self.events.appends)
        self.depth += 1
        try:
            self._exec_block(block_of(func.node), callee)
        except Return as returned:
            return returned.value
        except RecursionError:
            return Val(Opaque(func.name, func.qualname, "too deeply nested to evaluate"))
        finally:
            self.depth -= 1
            if collector and len(self.events.appends) == appends_before:
                layers.collect(self, ref, args, node, frame)
        return NONE
