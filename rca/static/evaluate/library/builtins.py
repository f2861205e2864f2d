"""Python itself: the built-in functions, lists, dicts, sets and strings, arithmetic and comparison
on plain values, and the few standard-library functions analyzed code wires with (`islice`,
`MethodType`, `copy`). Where a built-in meets a domain object (`len` of the layer stack,
`hasattr` of a config) it asks that object's model."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from rca.static.evaluate.interface import Frame, Interpreter, raised
from rca.static.evaluate.library import configs, layers, tensors
from rca.static.evaluate.values import (
    NONE,
    BuiltinFn,
    ClassRef,
    ConfigObj,
    EnumMember,
    EvalRaise,
    FuncRef,
    MutDict,
    MutList,
    ObjRef,
    Opaque,
    SetVal,
    SuperRef,
    TensorVal,
    Val,
    describe,
    make_set,
    python_to_val,
    sources_of,
    to_python,
)
from rca.static.graph import NodeKey

_EXCEPTION_PARENTS = {
    "KeyError": "LookupError",
    "IndexError": "LookupError",
    "LookupError": "Exception",
    "ZeroDivisionError": "ArithmeticError",
    "ArithmeticError": "Exception",
}


def exception_matches(kind: str, handler: str) -> bool:
    if handler in ("Exception", "BaseException", kind):
        return True
    parent = _EXCEPTION_PARENTS.get(kind)
    while parent is not None:
        if parent == handler:
            return True
        parent = _EXCEPTION_PARENTS.get(parent)
    return False


def attribute(ev: Interpreter, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None) -> Val:
    """An attribute of a plain value: a bound method of a container or scalar, an item of a
    transformers output; reading one of None raises as Python would."""
    payload = owner.v
    if payload is None:
        raise raised("AttributeError", f"'NoneType' object has no attribute '{name}'", ev, frame, node, owner.src)
    if isinstance(payload, MutList):
        return Val(BuiltinFn(f"list.{name}", owner))
    if isinstance(payload, MutDict):
        if payload.attrs:
            item = payload.items.get(name, NONE)
            return Val(item.v, item.src | owner.src)
        if hasattr(dict, name):
            return Val(BuiltinFn(f"dict.{name}", owner))
        # Code that reads an attribute of a mapping holds, at run time, the object built from it (a
        # launch's `--speculative-config` JSON becomes the engine's `SpeculativeConfig`): its keys
        # are that object's fields, and its other attributes are unknown, named as read.
        held = payload.items.get(name)
        if held is not None:
            return Val(held.v, held.src | owner.src)
        return Val(Opaque(name, "", "attribute of an object built from a mapping"), owner.src)
    if isinstance(payload, SetVal):
        return Val(BuiltinFn(f"set.{name}", owner))
    if isinstance(payload, (str, int, float, bool)):
        if not hasattr(payload, name):
            raise raised(
                "AttributeError",
                f"'{type(payload).__name__}' object has no attribute '{name}'",
                ev,
                frame,
                node,
                owner.src,
            )
        return Val(BuiltinFn(f"py.{name}", owner))
    return Val(Opaque(name, "", "attribute of an unmodeled value"), owner.src)


def subscript(
    ev: Interpreter, owner: Val, index: Any, src: frozenset[NodeKey], frame: Frame | None, node: cst.CSTNode | None
) -> Val | None:
    """`seq[i]`, `seq[a:b]`, `mapping[key]`, `Enum["NAME"]`, `text[i]`; None for other payloads."""
    payload = owner.v
    if isinstance(payload, MutList):
        if isinstance(index, bool) or not isinstance(index, (int, slice)):
            return Val(Opaque("item", "", "index unknown"), src)
        if isinstance(index, slice):
            return Val(MutList(payload.items[index], payload.tuple_like), src)
        if not -len(payload.items) <= index < len(payload.items):
            raise raised(
                "IndexError", f"index {index} out of range for a sequence of {len(payload.items)}", ev, frame, node, src
            )
        item = payload.items[index]
        return Val(item.v, item.src | src)
    if isinstance(payload, MutDict):
        if isinstance(index, (int, float, str, bool, type(None), tuple)) and index in payload.items:
            item = payload.items[index]
            return Val(item.v, item.src | src)
        if isinstance(index, Opaque):
            return Val(Opaque("item", "", "key unknown"), src)
        missing = configs.missing_node(ev, payload.config[0], payload.config[1] + (index,)) if payload.config else None
        path = ".".join(map(str, payload.config[1] + (index,))) if payload.config else repr(index)
        message = f"{path} is not in {payload.config[0].display}" if payload.config else f"key {index!r} missing"
        raise raised("KeyError", message, ev, frame, node, src | (frozenset({missing}) if missing else frozenset()))
    if isinstance(payload, ClassRef) and isinstance(index, str) and ev.is_enum(payload.info):
        if index not in payload.info.attributes or index.startswith("_"):
            raise raised("KeyError", repr(index), ev, frame, node, src)
        return Val(EnumMember(payload.info, index), src)
    if isinstance(payload, str) and isinstance(index, (int, slice)):
        try:
            return Val(payload[index], src)
        except IndexError:
            raise raised("IndexError", "string index out of range", ev, frame, node, src) from None
    return None


_OPS = {
    "Add": lambda a, b: a + b,
    "Subtract": lambda a, b: a - b,
    "Multiply": lambda a, b: a * b,
    "Divide": lambda a, b: a / b,
    "FloorDivide": lambda a, b: a // b,
    "Modulo": lambda a, b: a % b,
    "Power": lambda a, b: a**b,
    "BitOr": lambda a, b: a | b,
    "BitAnd": lambda a, b: a & b,
    "BitXor": lambda a, b: a ^ b,
    "LeftShift": lambda a, b: a << b,
    "RightShift": lambda a, b: a >> b,
}


# The largest values arithmetic computes: layer arithmetic never comes near, and past them a program
# such as `2 ** 10 ** 10` or `"a" * 10 ** 9` takes minutes or gigabytes (and an integer of more than
# 4300 digits cannot even be printed).
MAX_INT_BITS = 4096
MAX_ITEMS = 100_000


# A width or precision of six digits or more in a %-format or a format spec ("%999999999d",
# "{:>999999999}"): formatting would build a string of that many characters.
_WIDE_PERCENT = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(?:\d{6,}|\*|\d*\.(?:\d{6,}|\*))")
_WIDE_SPEC = re.compile(r"\{[^{}]*:[^{}]*\d{6,}")


def _too_large(operator: str, a: Any, b: Any) -> bool:
    """Whether `a <operator> b` would exceed MAX_INT_BITS or MAX_ITEMS (estimated, not computed)."""
    if operator == "Modulo" and isinstance(a, str):
        return bool(_WIDE_PERCENT.search(a))
    if isinstance(a, int) and isinstance(b, int):
        bits = {
            "Add": max(a.bit_length(), b.bit_length()) + 1,
            "Subtract": max(a.bit_length(), b.bit_length()) + 1,
            "Multiply": a.bit_length() + b.bit_length(),
            "Power": b * a.bit_length() if abs(a) > 1 else 0,
            "LeftShift": a.bit_length() + b if a else 0,
        }.get(operator, 0)
        return bits > MAX_INT_BITS
    lengths = [len(v.items if isinstance(v, MutList) else v) for v in (a, b) if isinstance(v, (str, MutList))]
    if operator == "Add":
        return sum(lengths) > MAX_ITEMS
    count = b if isinstance(b, int) else a
    return operator == "Multiply" and len(lengths) == 1 and isinstance(count, int) and lengths[0] * count > MAX_ITEMS


def _weight(value: Any) -> int:
    """About how large a plain value is, a number counting as its size (a width, a repeat count):
    what a method of a string or number may multiply."""
    if isinstance(value, int):
        return abs(value) + 1
    if isinstance(value, str):
        return len(value) + 1
    if isinstance(value, (list, tuple)):
        return sum(_weight(item) for item in value) + 1
    if isinstance(value, dict):
        return sum(_weight(key) + _weight(item) for key, item in value.items()) + 1
    return 1


def binary(
    ev: Interpreter,
    operator: str,
    a: Any,
    b: Any,
    src: frozenset[NodeKey],
    frame: Frame | None,
    node: cst.CSTNode | None,
) -> Val:
    """Arithmetic on plain values, lists and sets; unknown when an operand is, or the result too large."""
    if _too_large(operator, a, b):
        return Val(Opaque("arithmetic", "", "result too large to compute"), src)
    if isinstance(a, MutList) and isinstance(b, MutList) and operator == "Add":
        return Val(MutList(a.items + b.items, a.tuple_like), src)
    if isinstance(a, MutList) and isinstance(b, int) and operator == "Multiply":
        return Val(MutList(a.items * b, a.tuple_like), src)
    if isinstance(a, SetVal) and isinstance(b, SetVal) and operator in ("BitOr", "BitAnd", "Subtract"):
        return Val(SetVal(_OPS[operator](a.items, b.items)), src)
    if isinstance(a, (int, float, str)) and isinstance(b, (int, float, str)) and operator in _OPS:
        try:
            return Val(_OPS[operator](a, b), src)
        except ZeroDivisionError:
            raise raised("ZeroDivisionError", "division by zero", ev, frame, node, src) from None
        except (TypeError, ValueError, OverflowError) as error:  # 1 << -1, 2.0 ** 5000: Python raises too
            raise raised(type(error).__name__, str(error), ev, frame, node, src) from None
    if a is None or b is None:
        if not isinstance(a, Opaque) and not isinstance(b, Opaque):
            raise raised(
                "TypeError", f"unsupported operand type(s) for {operator}: involving None", ev, frame, node, src
            )
    return Val(Opaque("arithmetic", "", "operand unknown"), src)


def compare(ev: Interpreter, operator: str, left: Val, right: Val) -> Any:
    a, b = left.v, right.v
    if operator in ("In", "NotIn"):
        if isinstance(a, Opaque):
            a = ev.concrete(left, None, None).v
        if isinstance(a, Opaque):
            return Opaque("in", "", "membership of an unknown value")
        found = _contains(b, a)
        if isinstance(found, Opaque):
            return found
        return found if operator == "In" else not found
    if operator in ("Is", "IsNot"):
        if isinstance(a, Opaque) or isinstance(b, Opaque):
            if a is None or b is None or (isinstance(a, Opaque) and isinstance(b, Opaque)):
                return Opaque("is", "", "identity of an unknown value")
            same = False
        elif a is None or b is None or isinstance(a, (bool,)) or isinstance(b, bool):
            same = a is b
        else:
            same = a is b or (isinstance(a, (int, str)) and a == b and type(a) is type(b))
        return same if operator == "Is" else not same
    if isinstance(a, Opaque):
        a = ev.concrete(left, None, None).v
    if isinstance(b, Opaque):
        b = ev.concrete(right, None, None).v
    if isinstance(a, Opaque) or isinstance(b, Opaque):
        return Opaque("compare", "", "comparison with an unknown value")
    try:
        a_py = to_python(Val(a)) if isinstance(a, (MutList, MutDict, SetVal)) else a
        b_py = to_python(Val(b)) if isinstance(b, (MutList, MutDict, SetVal)) else b
    except ValueError:
        return Opaque("compare", "", "comparison of unknown containers")
    if operator == "Equal":
        return a_py == b_py
    if operator == "NotEqual":
        return a_py != b_py
    if isinstance(a_py, (MutList, MutDict, SetVal, TensorVal)) or isinstance(
        b_py, (MutList, MutDict, SetVal, TensorVal)
    ):
        return Opaque("compare", "", "ordering of unknown values")
    try:
        return {
            "LessThan": a_py < b_py,
            "LessThanEqual": a_py <= b_py,
            "GreaterThan": a_py > b_py,
            "GreaterThanEqual": a_py >= b_py,
        }[operator]
    except TypeError:
        return Opaque("compare", "", "incomparable values")


def _contains(container: Any, item: Any) -> Any:
    if isinstance(container, SetVal):
        return item in container.items
    if isinstance(container, MutList):
        values = [element.v for element in container.items]
        if any(isinstance(value, Opaque) for value in values) and item not in values:
            return Opaque("in", "", "membership in a list with unknown items")
        return item in values
    if isinstance(container, MutDict):
        return item in container.items
    if isinstance(container, str) and isinstance(item, str):
        return item in container
    if isinstance(container, ConfigObj):
        data = container.data
        return isinstance(data, dict) and item in data
    return Opaque("in", "", "membership in an unknown collection")


def length(value: Val) -> int:
    """How many items iterating a plain container or string gives, without making them (0 for others)."""
    payload = value.v
    if isinstance(payload, (MutList, MutDict, SetVal)):
        return len(payload.items)
    return len(payload) if isinstance(payload, str) else 0


def iterate(value: Val) -> list[Val] | None:
    """The items of a container, a string, or what a collector holds; None for other payloads."""
    payload = value.v
    src = value.src
    if isinstance(payload, ObjRef) and payload.backing is not None:
        payload = payload.backing
    if isinstance(payload, MutList):
        return [item.with_src(src) for item in payload.items]
    if isinstance(payload, MutDict):
        return [Val(key, src) for key in payload.items]
    if isinstance(payload, SetVal):
        return [Val(item, src) for item in sorted(payload.items, key=lambda x: (str(type(x)), x))]
    if isinstance(payload, str):
        return [Val(char, src) for char in payload]
    return None


def builtin(name: str) -> BuiltinFn | None:
    return BuiltinFn(name) if name in _BUILTIN_NAMES else None


def call_builtin(
    ev: Interpreter,
    fn: BuiltinFn,
    fn_val: Val,
    args: list[Val],
    kwargs: dict[str, Val],
    node: cst.CSTNode | None,
    frame: Frame | None,
) -> Val:
    name = fn.name
    src = sources_of(args) | sources_of(list(kwargs.values()))
    handler = _BUILTIN_HANDLERS.get(name)
    if handler is not None:
        return handler(ev, args, kwargs, node, frame, src)
    receiver = fn.bound
    kind, _, method = name.partition(".")
    if receiver is not None:
        if kind == "list":
            return _list_method(ev, receiver, method, args, kwargs, node, frame)
        if kind == "dict":
            return _dict_method(ev, receiver, method, args, kwargs, node, frame)
        if kind == "set":
            return _set_method(receiver, method, args)
        if kind == "tensor":
            return tensors.call_method(receiver, method, args, src)
        if kind == "config":
            return configs.call_method(receiver, method)
        if kind == "py":
            try:
                plain = [to_python(arg) for arg in args]
                if (
                    method.startswith("_")
                    or _weight(receiver.v) * _weight(plain) > 100 * MAX_ITEMS
                    or (method in ("format", "format_map") and _WIDE_SPEC.search(receiver.v))
                ):
                    raise ValueError("too large to compute")  # "a".center(10 ** 9), "{:>999999999}".format(1)
                result = getattr(receiver.v, method)(*plain)
            except Exception:
                return Val(Opaque(method, f"str.{method}", "method of a plain value"), src | receiver.src)
            return python_to_val(result, src | receiver.src)
    return Val(Opaque(name, name, "built-in not modeled"), src)


def _list_method(
    ev: Interpreter, receiver: Val, method: str, args: list[Val], kwargs: dict[str, Val], node: Any, frame: Any
) -> Val:
    target: MutList = receiver.v
    if method == "append" and args:
        value = args[0]
        if isinstance(value.v, TensorVal):
            value = ev.record_append(target, value, frame, node)
        target.items.append(value)
        return NONE
    if method == "extend" and args:
        if len(target.items) + length(args[0]) > MAX_ITEMS:  # `x.extend(x)` in a loop doubles it
            ev.assume(frame, node, f"a list grown past {MAX_ITEMS} items is not extended")
            return NONE
        items = ev.iterate(args[0], frame, node)
        for item in items or []:
            target.items.append(ev.record_append(target, item, frame, node) if isinstance(item.v, TensorVal) else item)
        return NONE
    try:  # an index out of range, or past 2**63: Python raises too
        if method == "insert" and len(args) == 2 and isinstance(args[0].v, int):
            target.items.insert(args[0].v, args[1])
            return NONE
        if method == "pop" and target.items:
            position = args[0].v if args and isinstance(args[0].v, int) else -1
            return target.items.pop(position)
    except (IndexError, OverflowError) as error:
        raise raised(type(error).__name__, str(error), ev, frame, node) from None
    if method in ("index", "count") and args:
        values = [item.v for item in target.items]
        try:
            return Val(getattr(values, method)(args[0].v), receiver.src)
        except ValueError:
            raise raised("ValueError", "not in list", ev, frame, node) from None
    if method == "copy":
        return Val(MutList(list(target.items)), receiver.src)
    if method == "sort":
        plain = target.python()
        if plain is not None:
            try:
                order = sorted(range(len(plain)), key=lambda i: plain[i], reverse=bool(kwargs.get("reverse", NONE).v))
            except TypeError as error:  # numbers and strings together: Python raises too
                raise raised("TypeError", str(error), ev, frame, node) from None
            target.items[:] = [target.items[i] for i in order]
        return NONE
    if method == "reverse":
        target.items.reverse()
        return NONE
    return Val(Opaque(method, f"list.{method}", "list method not modeled"))


def _dict_method(
    ev: Interpreter, receiver: Val, method: str, args: list[Val], kwargs: dict[str, Val], node: Any, frame: Any
) -> Val:
    target: MutDict = receiver.v
    if method == "get" and args:
        key = args[0].v
        if isinstance(key, (int, str, float, bool, tuple, type(None))) and key in target.items:
            item = target.items[key]
            return Val(item.v, item.src | receiver.src)
        if target.config is not None and isinstance(key, str):
            file, path = target.config
            missing = configs.missing_node(ev, file, (*path, key))
            default = args[1] if len(args) > 1 else kwargs.get("default", NONE)
            return default.with_src(frozenset({missing}))
        return args[1] if len(args) > 1 else NONE
    if method == "keys":
        return Val(MutList([Val(key) for key in target.items], tuple_like=True), receiver.src)
    if method == "values":
        return Val(MutList(list(target.items.values()), tuple_like=True), receiver.src)
    if method == "items":
        return Val(
            MutList(
                [Val(MutList([Val(key), value], tuple_like=True)) for key, value in target.items.items()],
                tuple_like=True,
            ),
            receiver.src,
        )
    if method == "setdefault" and args and isinstance(args[0].v, (int, str)):
        return target.items.setdefault(args[0].v, args[1] if len(args) > 1 else NONE)
    if method == "update" and args and isinstance(args[0].v, MutDict):
        target.items.update(args[0].v.items)
        return NONE
    if method == "pop" and args and isinstance(args[0].v, (int, str)):
        return target.items.pop(args[0].v, args[1] if len(args) > 1 else NONE)
    if method == "copy":
        return Val(MutDict(dict(target.items), target.config), receiver.src)
    return Val(Opaque(method, f"dict.{method}", "dict method not modeled"))


def _set_method(receiver: Val, method: str, args: list[Val]) -> Val:
    target: SetVal = receiver.v
    others = [arg.v.items for arg in args if isinstance(arg.v, SetVal)]
    if method == "add" and args and isinstance(args[0].v, (int, str)):
        target.items = target.items | {args[0].v}
        return NONE
    if method in ("union", "intersection", "difference") and len(others) == len(args):
        return Val(SetVal(getattr(target.items, method)(*others)), receiver.src)
    if method == "issubset" and len(others) == 1:
        return Val(target.items <= others[0])
    return Val(Opaque(method, f"set.{method}", "set method not modeled"))


def _b_len(ev, args, kwargs, node, frame, src):
    if not args:
        return Val(Opaque("len"), src)
    payload = args[0].v
    if isinstance(payload, ObjRef) and payload.backing is not None:
        payload = payload.backing
    if isinstance(payload, (MutList,)):
        return Val(len(payload.items), src)
    if isinstance(payload, (MutDict, SetVal)):
        return Val(len(payload.items), src)
    if isinstance(payload, str):
        return Val(len(payload), src)
    stack = layers.layer_stack(ev, args[0], frame, node)
    if stack is not None:
        return Val(stack.count, src)
    return Val(Opaque("len", "", "length of an unknown value"), src)


def _ints(ev, args, frame, node):
    values = []
    for arg in args:
        arg = ev.concrete(arg, frame, node) if isinstance(arg.v, Opaque) else arg
        if isinstance(arg.v, bool) or not isinstance(arg.v, int):
            return None
        values.append(arg.v)
    return values


def _b_range(ev, args, kwargs, node, frame, src):
    bounds = _ints(ev, args, frame, node)
    if bounds is None:
        return Val(Opaque("range", "", "range bounds unknown"), src)
    try:
        values = range(*bounds)
    except (TypeError, ValueError) as error:  # range(0, 9, 0), or four arguments: Python raises too
        raise raised(type(error).__name__, str(error), ev, frame, node, src) from None
    if values[100_000:]:  # not len(values), which overflows past 2**63
        return Val(Opaque("range", "", "range too long to unroll"), src)
    resolved = src | sources_of([ev.concrete(arg, frame, node) for arg in args])
    return Val(MutList([Val(i, resolved) for i in values], tuple_like=True), resolved)


def _b_enumerate(ev, args, kwargs, node, frame, src):
    items = ev.iterate(args[0], frame, node) if args else None
    if items is None:
        return Val(Opaque("enumerate"), src)
    given = args[1] if len(args) > 1 else kwargs.get("start", Val(0))
    start = ev.concrete(given, frame, node)
    if not isinstance(start.v, int):
        return Val(Opaque("enumerate", "", "start unknown"), src)
    return Val(
        MutList(
            [
                Val(MutList([Val(start.v + i, args[0].src | start.src), item], tuple_like=True))
                for i, item in enumerate(items)
            ],
            tuple_like=True,
        ),
        src,
    )


def _b_zip(ev, args, kwargs, node, frame, src):
    columns = [ev.iterate(arg, frame, node) for arg in args]
    if any(column is None for column in columns):
        return Val(Opaque("zip"), src)
    return Val(
        MutList([Val(MutList(list(row), tuple_like=True)) for row in zip(*columns, strict=False)], tuple_like=True), src
    )


def _b_sequence(tuple_like: bool):
    def handler(ev, args, kwargs, node, frame, src):
        if not args:
            return Val(MutList([], tuple_like), src)
        items = ev.iterate(args[0], frame, node)
        if items is None:
            return Val(Opaque("list" if not tuple_like else "tuple", "", "items unknown"), src)
        return Val(MutList(items, tuple_like), src)

    return handler


def _b_set(frozen: bool):
    def handler(ev, args, kwargs, node, frame, src):
        if not args:
            return Val(SetVal(frozenset(), frozen), src)
        items = ev.iterate(args[0], frame, node)
        if items is None:
            return Val(Opaque("set", "", "items unknown"), src)
        value = make_set(items, frozen)
        return Val(value.v, value.src | src)

    return handler


def _b_sorted(ev, args, kwargs, node, frame, src):
    items = ev.iterate(args[0], frame, node) if args else None
    plain = [item.v for item in items] if items is not None else None
    if plain is None or not all(isinstance(value, (int, float, str)) for value in plain) or "key" in kwargs:
        return Val(Opaque("sorted", "", "items unknown"), src)
    try:
        order = sorted(range(len(plain)), key=lambda i: plain[i], reverse=bool(kwargs.get("reverse", NONE).v))
    except TypeError as error:  # numbers and strings together: Python raises too
        raise raised("TypeError", str(error), ev, frame, node, src) from None
    return Val(MutList([items[i] for i in order]), src)


def _b_reversed(ev, args, kwargs, node, frame, src):
    items = ev.iterate(args[0], frame, node) if args else None
    return (
        Val(MutList(list(reversed(items)), tuple_like=True), src) if items is not None else Val(Opaque("reversed"), src)
    )


def _b_minmax(name):
    def handler(ev, args, kwargs, node, frame, src):
        values = ev.iterate(args[0], frame, node) if len(args) == 1 else args
        plain = [ev.concrete(value, frame, node).v for value in values] if values is not None else None
        if not plain or not all(isinstance(value, (int, float)) for value in plain):
            if values is not None and not plain and "default" in kwargs:
                return kwargs["default"]
            return Val(Opaque(name, "", "values unknown"), src)
        return Val(min(plain) if name == "min" else max(plain), src)

    return handler


def _b_sum(ev, args, kwargs, node, frame, src):
    items = ev.iterate(args[0], frame, node) if args else None
    plain = [item.v for item in items] if items is not None else None
    if plain is None or not all(isinstance(value, (int, float)) for value in plain):
        return Val(Opaque("sum"), src)
    return Val(sum(plain), src)


def _b_convert(kind):
    def handler(ev, args, kwargs, node, frame, src):
        if not args:
            return Val({"int": 0, "float": 0.0, "str": "", "bool": False}[kind], src)
        value = ev.concrete(args[0], frame, node).v
        if kind == "bool":
            return Val(ev.truth(args[0], frame, node), src)
        if isinstance(value, (int, float, str, bool)):
            try:
                return Val({"int": int, "float": float, "str": str}[kind](value), src)
            except (ValueError, OverflowError) as error:  # int("a"), int(float("inf")): Python raises too
                raise raised(type(error).__name__, str(error), ev, frame, node, src) from None
        if kind == "str":
            return Val(describe(value), src)
        return Val(Opaque(kind, "", "conversion of an unknown value"), src)

    return handler


_TYPE_CHECKS = {
    "list": lambda v: isinstance(v, MutList) and not v.tuple_like,
    "tuple": lambda v: isinstance(v, MutList) and v.tuple_like,
    "dict": lambda v: isinstance(v, MutDict),
    "set": lambda v: isinstance(v, SetVal) and not v.frozen,
    "frozenset": lambda v: isinstance(v, SetVal) and v.frozen,
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, float),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "Tensor": lambda v: isinstance(v, TensorVal),
    # the `numbers` ABCs, as Python answers them (a bool is an Integral)
    "Integral": lambda v: isinstance(v, int),
    "Rational": lambda v: isinstance(v, int),
    "Real": lambda v: isinstance(v, (int, float)),
    "Number": lambda v: isinstance(v, (int, float)),
}


def _b_isinstance(ev, args, kwargs, node, frame, src):
    if len(args) != 2:
        return Val(Opaque("isinstance"), src)
    payload = args[0].v
    kinds = ev.iterate(args[1], frame, node) if isinstance(args[1].v, MutList) else [args[1]]
    if isinstance(payload, Opaque):
        return Val(Opaque("isinstance", "", "type of an unknown value"), src)
    for kind in kinds or []:
        name = (
            kind.v.name
            if isinstance(kind.v, BuiltinFn)
            else kind.v.origin.split(".")[-1]
            if isinstance(kind.v, Opaque)
            else None
        )
        if isinstance(kind.v, ClassRef):
            if isinstance(payload, ObjRef) and kind.v.info in ev.mro(payload.cls):
                return Val(True, src)
            continue
        check = _TYPE_CHECKS.get(name or "")
        if check is not None and check(payload):
            return Val(True, src)
        if name in ("Sequence", "Iterable") and isinstance(payload, MutList):
            return Val(True, src)
        if name in ("Mapping", "MutableMapping") and isinstance(payload, MutDict):
            return Val(True, src)
        if check is None and isinstance(payload, ObjRef):
            return Val(Opaque("isinstance", "", "class of an unmodeled kind"), src)
    return Val(False, src)


def _b_hasattr(ev, args, kwargs, node, frame, src):
    if len(args) != 2 or not isinstance(args[1].v, str):
        return Val(Opaque("hasattr"), src)
    owner, name = args[0], args[1].v
    if isinstance(owner.v, ConfigObj):
        return configs.has_attribute(ev, owner, name, frame, node)
    if isinstance(owner.v, ObjRef):
        value = ev.field(owner, name)
        if isinstance(value.v, Opaque) and value.v.reason.startswith(("field never assigned", "no such attribute")):
            return Val(False, src)
        return Val(True, src | value.src)
    if owner.v is None:
        return Val(False, src)
    if isinstance(owner.v, (Opaque, TensorVal)):
        if ev.has_link(name):
            return Val(True, src)
        if isinstance(owner.v, Opaque) and configs.reads_draft_config(ev, owner.v, name):
            assert ev.draft is not None
            return _b_hasattr(ev, [Val(ConfigObj(ev.draft)), args[1]], kwargs, node, frame, src)
        return Val(Opaque("hasattr", "", "attribute of an unknown object"), src)
    try:
        ev.attribute(owner, name, frame, node)
        return Val(True, src)
    except EvalRaise:
        return Val(False, src)


def _b_getattr(ev, args, kwargs, node, frame, src):
    if len(args) < 2 or not isinstance(args[1].v, str):
        return Val(Opaque("getattr"), src)
    owner, name = args[0], args[1].v
    default = args[2] if len(args) > 2 else None
    if isinstance(owner.v, ConfigObj):
        return configs.attribute(ev, owner, name, frame, node, default, missing_raises=default is None)
    if owner.v is None and default is not None:
        return default
    try:
        value = ev.attribute(owner, name, frame, node)
    except EvalRaise as error:
        if default is not None:
            return default.with_src(error.src)
        raise
    if (
        default is not None
        and isinstance(value.v, Opaque)
        and isinstance(owner.v, ObjRef)
        and value.v.reason.startswith(("field never assigned", "no such attribute"))
    ):
        return default
    return value


def _b_setattr(ev, args, kwargs, node, frame, src):
    if len(args) == 3 and isinstance(args[1].v, str):
        ev.set_attribute(args[0], args[1].v, args[2])
    return NONE


def _b_dict(ev, args, kwargs, node, frame, src):
    items: dict[Any, Val] = {}
    if args and isinstance(args[0].v, MutDict):
        items.update(args[0].v.items)
    items.update(kwargs)
    return Val(MutDict(items), src)


def _b_anyall(name):
    def handler(ev, args, kwargs, node, frame, src):
        items = ev.iterate(args[0], frame, node) if args else None
        if items is None or any(isinstance(item.v, Opaque) for item in items):
            return Val(Opaque(name), src)
        truths = [ev.truth(item, frame, node) for item in items]
        return Val(any(truths) if name == "any" else all(truths), src)

    return handler


def _b_abs(ev, args, kwargs, node, frame, src):
    value = args[0].v if args else None
    return Val(abs(value), src) if isinstance(value, (int, float)) else Val(Opaque("abs"), src)


def _b_super(ev, args, kwargs, node, frame, src):
    if frame is None or frame.self_val is None or frame.owner is None:
        return Val(Opaque("super", "", "super() outside a method"))
    return Val(SuperRef(frame.self_val, frame.owner), frame.self_val.src)


def _b_none(ev, args, kwargs, node, frame, src):
    return NONE


def _b_iter(ev, args, kwargs, node, frame, src):
    return args[0] if args else Val(Opaque("iter"), src)


def _b_next(ev, args, kwargs, node, frame, src):
    items = ev.iterate(args[0], frame, node) if args else None
    if items:
        return items[0]
    if len(args) > 1:
        return args[1]
    return Val(Opaque("next", "", "next of an unknown iterator"), src)


def _b_map(ev, args, kwargs, node, frame, src):
    if len(args) != 2:
        return Val(Opaque("map"), src)
    items = ev.iterate(args[1], frame, node)
    if items is None:
        return Val(Opaque("map"), src)
    return Val(MutList([ev.call(args[0], [item], {}, node, frame) for item in items], tuple_like=True), src)


def _b_filter(ev, args, kwargs, node, frame, src):
    if len(args) != 2:
        return Val(Opaque("filter"), src)
    items = ev.iterate(args[1], frame, node)
    if items is None:
        return Val(Opaque("filter"), src)
    keep = [
        item
        for item in items
        if ev.truth(ev.call(args[0], [item], {}, node, frame) if args[0].v is not None else item, frame, node)
    ]
    return Val(MutList(keep, tuple_like=True), src)


_BUILTIN_HANDLERS = {
    "len": _b_len,
    "range": _b_range,
    "enumerate": _b_enumerate,
    "zip": _b_zip,
    "list": _b_sequence(False),
    "tuple": _b_sequence(True),
    "set": _b_set(False),
    "frozenset": _b_set(True),
    "sorted": _b_sorted,
    "reversed": _b_reversed,
    "min": _b_minmax("min"),
    "max": _b_minmax("max"),
    "sum": _b_sum,
    "int": _b_convert("int"),
    "float": _b_convert("float"),
    "str": _b_convert("str"),
    "bool": _b_convert("bool"),
    "isinstance": _b_isinstance,
    "hasattr": _b_hasattr,
    "getattr": _b_getattr,
    "setattr": _b_setattr,
    "dict": _b_dict,
    "any": _b_anyall("any"),
    "all": _b_anyall("all"),
    "abs": _b_abs,
    "super": _b_super,
    "print": _b_none,
    "iter": _b_iter,
    "next": _b_next,
    "map": _b_map,
    "filter": _b_filter,
}

_BUILTIN_NAMES = frozenset(_BUILTIN_HANDLERS)

# -- the standard library ----------------------------------------------------------------------------


def islice(ev, args, kwargs, node, frame, src):
    if not args:
        return None
    items = ev.iterate(args[0], frame, node)
    bounds = _ints(ev, args[1:], frame, node)
    if items is None or bounds is None:
        return None
    return Val(
        MutList(items[slice(*bounds)], tuple_like=True),
        src | sources_of([ev.concrete(a, frame, node) for a in args[1:]]),
    )


def method_type(ev, args, kwargs, node, frame, src):
    if len(args) == 2 and isinstance(args[0].v, FuncRef):
        return Val(FuncRef(args[0].v.info, bound=args[1]), src)
    return None


def identity(ev, args, kwargs, node, frame, src):
    return args[0] if args else None


def cast(ev, args, kwargs, node, frame, src):
    """`typing.cast(T, value)`: the value itself."""
    return args[1] if len(args) == 2 else None


def context(ev, args, kwargs, node, frame, src):
    return Val(Opaque("context"), src)
