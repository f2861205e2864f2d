"""Models of the Python built-ins, containers, configs, tensors and libraries analyzed code uses.

Each model says what a call or operation does to abstract values. Unknown library calls return
`Opaque`; tensors passed through an unknown call keep their identity (such calls in a model's
forward are splits, gathers and casts, which move rows, not meaning) and the call is cited.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import libcst as cst

from rca.inputs.configs import TEXT_CONFIG_KEYS, TargetConfig
from rca.errors import InputError
from rca.model import Tap
from rca.static.evaluate.values import (
    EMBED_RE,
    NO_SRC,
    NONE,
    NORM_RE,
    BuiltinFn,
    ClassRef,
    ConfigObj,
    EnumMember,
    EvalRaise,
    FuncRef,
    LayerStack,
    MutDict,
    MutList,
    ObjRef,
    Opaque,
    SetVal,
    SuperRef,
    TensorVal,
    Val,
    describe,
    tap_tensor,
)

if TYPE_CHECKING:
    from rca.static.evaluate.interp import Evaluator, Frame

SUB_CONFIGS = frozenset({*TEXT_CONFIG_KEYS, "vision_config", "audio_config"})
_LOGGING = frozenset({"debug", "info", "warning", "warn", "warning_once", "info_once", "error", "exception", "critical", "log", "print", "print_rank_0"})
_TENSOR_SAME = frozenset({
    "clone", "contiguous", "detach", "to", "float", "half", "bfloat16", "cuda", "cpu", "type", "type_as",
    "view", "view_as", "reshape", "squeeze", "unsqueeze", "requires_grad_", "narrow", "index_select",
})
_CLASS_NAME = re.compile(r"^_?[A-Z][A-Za-z0-9]*$")
_EXCEPTION_PARENTS = {
    "KeyError": "LookupError",
    "IndexError": "LookupError",
    "LookupError": "Exception",
    "ZeroDivisionError": "ArithmeticError",
    "ArithmeticError": "Exception",
}


def _union(values: list[Val]) -> frozenset:
    return frozenset().union(*(value.src for value in values)) if values else NO_SRC


def raise_(kind: str, message: str, ev: Evaluator, frame: Frame | None, node: cst.CSTNode | None, src: frozenset = NO_SRC) -> EvalRaise:
    error = EvalRaise(kind, message, node, src)
    if frame is not None and node is not None:
        error.location = ev.loc(frame, node)
    return error


def exception_matches(kind: str, handler: str) -> bool:
    if handler in ("Exception", "BaseException", kind):
        return True
    parent = _EXCEPTION_PARENTS.get(kind)
    while parent is not None:
        if parent == handler:
            return True
        parent = _EXCEPTION_PARENTS.get(parent)
    return False


# -- construction helpers ---------------------------------------------------------------------------


def make_set(values: list[Val], frozen: bool = True) -> Val:
    items = [value.v for value in values]
    if not all(isinstance(item, (int, float, str, bool, type(None), tuple)) for item in items):
        return Val(Opaque("set", "", "set of unknown values"), _union(values))
    return Val(SetVal(frozenset(items), frozen), _union(values))


def python_to_val(value: Any, src: frozenset) -> Val:
    if isinstance(value, list):
        return Val(MutList([python_to_val(item, src) for item in value]), src)
    if isinstance(value, tuple):
        return Val(MutList([python_to_val(item, src) for item in value], tuple_like=True), src)
    if isinstance(value, dict):
        return Val(MutDict({key: python_to_val(item, src) for key, item in value.items()}), src)
    return Val(value, src)


def to_python(value: Val) -> Any:
    """A plain Python value for a fully concrete abstract value, else raises ValueError."""
    payload = value.v
    if isinstance(payload, MutList):
        items = [to_python(item) for item in payload.items]
        return tuple(items) if payload.tuple_like else items
    if isinstance(payload, SetVal):
        return payload.items if payload.frozen else set(payload.items)
    if isinstance(payload, MutDict):
        return {key: to_python(item) for key, item in payload.items.items()}
    if isinstance(payload, (int, float, str, bool, type(None))):
        return payload
    raise ValueError("not concrete")


# -- configs ---------------------------------------------------------------------------------------


def config_attr(ev: Evaluator, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None, default: Val | None, missing_raises: bool = False, kind: str = "AttributeError") -> Val:
    config: ConfigObj = owner.v
    data = config.data
    path = config.path + (name,)
    if isinstance(data, dict) and name in data:
        key = _config_key_node(ev, config, path)
        src = frozenset({key}) | owner.src
        value = data[name]
        if isinstance(value, dict):
            if name in SUB_CONFIGS:
                return Val(ConfigObj(config.file, path), src)
            inner = {k: python_to_val(v, frozenset({_config_key_node(ev, config, path + (k,))})) for k, v in value.items()}
            return Val(MutDict(inner, config=(config.file, path)), src)
        return python_to_val(value, src)
    if name in ("get_text_config", "to_dict", "to_diff_dict"):
        return Val(BuiltinFn(f"config.{name}", owner))
    missing = _missing_node(ev, config.file, path)
    if default is not None:
        return default.with_src(frozenset({missing}))
    if missing_raises:
        raise raise_(kind, f"{'.'.join(map(str, path))} is not in {config.file.display}", ev, frame, node, frozenset({missing}))
    return Val(Opaque(name, f"config.{name}", f"{name} is not in {config.file.display}; the config class may define a default"), frozenset({missing}))


def _config_key_node(ev: Evaluator, config: ConfigObj, path: tuple) -> Any:
    """The dataflow node of one config key, showing its value (`eagle_config.ids = [2, 30, 58]`)."""
    location = config.file.location(path)
    key = ev.graph.node("config", location, f"{'.'.join(map(str, path))} =", config.file.doc.source_line(location.line), path)
    found, value = config.file.lookup(path)
    if found:
        shown = repr(value)
        ev.graph.observe(key, shown if len(shown) <= 60 else "{...}" if isinstance(value, dict) else shown[:57] + "...")
    return key


def _missing_node(ev: Evaluator, file: Any, path: tuple) -> Any:
    location = file.location(path)
    return ev.graph.node("config-missing", location, f"{'.'.join(map(str, path))} is not in {file.display}", file.doc.source_line(location.line), path)


# -- attributes of modeled payloads ----------------------------------------------------------------


def attribute(ev: Evaluator, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None) -> Val:
    payload = owner.v
    if payload is None:
        raise raise_("AttributeError", f"'NoneType' object has no attribute '{name}'", ev, frame, node, owner.src)
    if isinstance(payload, TensorVal):
        if name in _TENSOR_SAME or name in ("flatten", "add", "__add__", "chunk", "split"):
            return Val(BuiltinFn(f"tensor.{name}", owner))
        return Val(Opaque(name, f"tensor.{name}", "tensor attribute"), owner.src)
    if isinstance(payload, MutList):
        return Val(BuiltinFn(f"list.{name}", owner))
    if isinstance(payload, MutDict):
        if payload.attrs:
            item = payload.items.get(name, NONE)
            return Val(item.v, item.src | owner.src)
        return Val(BuiltinFn(f"dict.{name}", owner))
    if isinstance(payload, SetVal):
        return Val(BuiltinFn(f"set.{name}", owner))
    if isinstance(payload, (str, int, float, bool)):
        if not hasattr(payload, name):
            raise raise_("AttributeError", f"'{type(payload).__name__}' object has no attribute '{name}'", ev, frame, node, owner.src)
        return Val(BuiltinFn(f"py.{name}", owner))
    if isinstance(payload, LayerStack):
        return Val(Opaque(name, f"layers.{name}", "attribute of the decoder-layer stack"), owner.src)
    return Val(Opaque(name, "", "attribute of an unmodeled value"), owner.src)


# -- subscripts ------------------------------------------------------------------------------------


def subscript(ev: Evaluator, owner: Val, key: Val, frame: Frame | None, node: cst.CSTNode | None) -> Val:
    payload = owner.v
    index = key.v
    src = owner.src | key.src
    if isinstance(index, Opaque):
        key = ev.concrete(key, frame, node)
        index = key.v
    if payload is None:
        # None from a missing config key: the key the code then asked for is missing too.
        parent = ev.graph.nearest(owner.src, "config-missing")
        config = ev.draft if parent is not None and parent.location.input == "draft" else ev.target
        if parent is not None and config is not None and isinstance(index, str):
            path = ev.graph.g.nodes[parent]["keypath"] + (index,)
            src = src | {_missing_node(ev, config, path)}
        raise raise_("TypeError", "'NoneType' object is not subscriptable", ev, frame, node, src)
    if isinstance(payload, MutList):
        if isinstance(index, bool) or not isinstance(index, (int, slice)):
            return Val(Opaque("item", "", "index unknown"), src)
        if isinstance(index, slice):
            return Val(MutList(payload.items[index], payload.tuple_like), src)
        if not -len(payload.items) <= index < len(payload.items):
            raise raise_("IndexError", f"index {index} out of range for a sequence of {len(payload.items)}", ev, frame, node, src)
        item = payload.items[index]
        return Val(item.v, item.src | src)
    if isinstance(payload, MutDict):
        if isinstance(index, (int, float, str, bool, type(None), tuple)) and index in payload.items:
            item = payload.items[index]
            return Val(item.v, item.src | src)
        if isinstance(index, Opaque):
            return Val(Opaque("item", "", "key unknown"), src)
        missing = _missing_node(ev, payload.config[0], payload.config[1] + (index,)) if payload.config else None
        path = ".".join(map(str, payload.config[1] + (index,))) if payload.config else repr(index)
        raise raise_("KeyError", f"{path} is not in {payload.config[0].display}" if payload.config else f"key {index!r} missing", ev, frame, node, src | (frozenset({missing}) if missing else NO_SRC))
    if isinstance(payload, ClassRef) and isinstance(index, str) and ev.is_enum(payload.info):
        if index not in payload.info.attributes or index.startswith("_"):
            raise raise_("KeyError", repr(index), ev, frame, node, src)
        return Val(EnumMember(payload.info, index), src)
    if isinstance(payload, ConfigObj) and isinstance(index, str):
        return config_attr(ev, owner, index, frame, node, default=None, missing_raises=True, kind="KeyError")
    if isinstance(payload, str) and isinstance(index, (int, slice)):
        try:
            return Val(payload[index], src)
        except IndexError:
            raise raise_("IndexError", "string index out of range", ev, frame, node, src) from None
    stack = ev.layer_stack(owner, frame, node)
    if stack is not None:
        if isinstance(index, int):
            position = index if index >= 0 else stack.count + index
            if not 0 <= position < stack.count:
                raise raise_("IndexError", f"layer {index} out of range for {stack.count} layers", ev, frame, node, src)
            return Val(stack.layer(position), src)
        if isinstance(index, slice):
            return Val(MutList([Val(stack.layer(i), src) for i in range(stack.count)[index]]), src)
    if isinstance(payload, TensorVal):
        return Val(tensor_subscript(payload, index), src)
    return Val(Opaque("item", "", "subscript of an unknown value"), src)


def tensor_subscript(tensor: TensorVal, index: Any) -> TensorVal:
    if tensor.kind == "layer_out" and isinstance(index, int):
        return layer_part(tensor, index)
    if tensor.kind == "stack" and isinstance(index, MutList) and len(index.items) == 2:
        rows, layers = (item.v for item in index.items)
        if rows == slice(None):
            if isinstance(layers, int) and -len(tensor.items) <= layers < len(tensor.items):
                return tensor.items[layers]
            if isinstance(layers, slice):
                return TensorVal("stack", items=tensor.items[layers], dim=tensor.dim)
    return tensor  # row selection keeps the tap


def layer_part(tensor: TensorVal, index: int) -> TensorVal:
    assert tensor.layer is not None
    if index == 0:
        return TensorVal("part", layer=tensor.layer + 1, part="hidden")
    if index == 1:
        return TensorVal("part", layer=tensor.layer + 1, part="residual")
    return TensorVal("unknown", reason=f"element {index} of a decoder layer's output")


# -- arithmetic and comparison ---------------------------------------------------------------------

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


def binary(ev: Evaluator, operator: str, left: Val, right: Val, frame: Frame | None, node: cst.CSTNode | None) -> Val:
    src = left.src | right.src
    if isinstance(left.v, Opaque):
        left = ev.concrete(left, frame, node)
    if isinstance(right.v, Opaque):
        right = ev.concrete(right, frame, node)
    src = src | left.src | right.src
    a, b = left.v, right.v
    if isinstance(a, TensorVal) or isinstance(b, TensorVal):
        if operator == "Add":
            if a is None or b is None:
                raise raise_("TypeError", "unsupported operand type(s) for +: a tensor and None", ev, frame, node, src)
            if isinstance(a, TensorVal) and isinstance(b, TensorVal):
                return Val(add_tensors(a, b), src)
        if operator == "MatrixMultiply" or isinstance(a, Opaque) or isinstance(b, Opaque):
            return Val(TensorVal("unknown", reason="tensor arithmetic with an unknown operand"), src)
        return Val(TensorVal("unknown", reason=f"tensor {operator.lower()}"), src)
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
            raise raise_("ZeroDivisionError", "division by zero", ev, frame, node, src) from None
        except TypeError as error:
            raise raise_("TypeError", str(error), ev, frame, node, src) from None
    if a is None or b is None:
        if not isinstance(a, Opaque) and not isinstance(b, Opaque):
            raise raise_("TypeError", f"unsupported operand type(s) for {operator}: involving None", ev, frame, node, src)
    return Val(Opaque("arithmetic", "", "operand unknown"), src)


def add_tensors(a: TensorVal, b: TensorVal) -> TensorVal:
    if a.kind == "part" and b.kind == "part" and a.layer == b.layer and {a.part, b.part} == {"hidden", "residual"}:
        return tap_tensor(Tap(a.layer))
    return TensorVal("unknown", reason=f"sum of {a.describe()} and {b.describe()}")


def compare(ev: Evaluator, operator: str, left: Val, right: Val) -> Any:
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
            if a is None or b is None or isinstance(a, Opaque) and isinstance(b, Opaque):
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
    if isinstance(a_py, (MutList, MutDict, SetVal, TensorVal)) or isinstance(b_py, (MutList, MutDict, SetVal, TensorVal)):
        return Opaque("compare", "", "ordering of unknown values")
    try:
        return {"LessThan": a_py < b_py, "LessThanEqual": a_py <= b_py, "GreaterThan": a_py > b_py, "GreaterThanEqual": a_py >= b_py}[operator]
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


# -- iteration -------------------------------------------------------------------------------------


def iterate(ev: Evaluator, value: Val, frame: Frame | None, node: cst.CSTNode | None, count: int | None = None) -> list[Val] | None:
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
    if isinstance(payload, TensorVal) and payload.kind == "layer_out" and count is not None:
        return [Val(layer_part(payload, index), src) for index in range(count)]
    if isinstance(payload, TensorVal) and payload.kind in ("concat", "stack") and count == len(payload.items):
        return [Val(item, src) for item in payload.items]
    stack = ev.layer_stack(value, frame, node)
    if stack is not None:
        return [Val(stack.layer(i), src) for i in range(stack.start, stack.count)]
    return None


# -- calls -----------------------------------------------------------------------------------------


def builtin(name: str) -> BuiltinFn | None:
    return BuiltinFn(name) if name in _BUILTIN_NAMES else None


def call_builtin(ev: Evaluator, fn: BuiltinFn, fn_val: Val, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None) -> Val:
    name = fn.name
    src = _union(args) | _union(list(kwargs.values()))
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
            return _tensor_method(receiver, method, args, kwargs, src)
        if kind == "config":
            config: ConfigObj = receiver.v
            if method == "get_text_config":
                for nest in TEXT_CONFIG_KEYS:
                    if isinstance(config.data, dict) and isinstance(config.data.get(nest), dict):
                        return Val(ConfigObj(config.file, config.path + (nest,)), receiver.src)
                return receiver
            return python_to_val(config.data, receiver.src)
        if kind == "py":
            try:
                plain = [to_python(arg) for arg in args]
                result = getattr(receiver.v, method)(*plain)
            except Exception:  # noqa: BLE001 - a method of a plain value we cannot compute
                return Val(Opaque(method, f"str.{method}", "method of a plain value"), src | receiver.src)
            return python_to_val(result, src | receiver.src)
    return Val(Opaque(name, name, "built-in not modeled"), src)


def _list_method(ev: Evaluator, receiver: Val, method: str, args: list[Val], kwargs: dict[str, Val], node: Any, frame: Any) -> Val:
    target: MutList = receiver.v
    if method == "append" and args:
        value = args[0]
        if isinstance(value.v, TensorVal):
            value = ev.record_append(target, value, frame, node)
        target.items.append(value)
        return NONE
    if method == "extend" and args:
        items = iterate(ev, args[0], frame, node)
        for item in items or []:
            target.items.append(ev.record_append(target, item, frame, node) if isinstance(item.v, TensorVal) else item)
        return NONE
    if method == "insert" and len(args) == 2 and isinstance(args[0].v, int):
        target.items.insert(args[0].v, args[1])
        return NONE
    if method == "pop" and target.items:
        position = args[0].v if args and isinstance(args[0].v, int) else -1
        return target.items.pop(position)
    if method in ("index", "count") and args:
        values = [item.v for item in target.items]
        try:
            return Val(getattr(values, method)(args[0].v), receiver.src)
        except ValueError:
            raise raise_("ValueError", "not in list", ev, frame, node) from None
    if method == "copy":
        return Val(MutList(list(target.items)), receiver.src)
    if method == "sort":
        plain = target.python()
        if plain is not None:
            order = sorted(range(len(plain)), key=lambda i: plain[i], reverse=bool(kwargs.get("reverse", NONE).v))
            target.items[:] = [target.items[i] for i in order]
        return NONE
    if method == "reverse":
        target.items.reverse()
        return NONE
    return Val(Opaque(method, f"list.{method}", "list method not modeled"))


def _dict_method(ev: Evaluator, receiver: Val, method: str, args: list[Val], kwargs: dict[str, Val], node: Any, frame: Any) -> Val:
    target: MutDict = receiver.v
    if method == "get" and args:
        key = args[0].v
        if isinstance(key, (int, str, float, bool, tuple, type(None))) and key in target.items:
            item = target.items[key]
            return Val(item.v, item.src | receiver.src)
        if target.config is not None and isinstance(key, str):
            file, path = target.config
            missing = _missing_node(ev, file, path + (key,))
            default = args[1] if len(args) > 1 else kwargs.get("default", NONE)
            return default.with_src(frozenset({missing}))
        return args[1] if len(args) > 1 else NONE
    if method == "keys":
        return Val(MutList([Val(key) for key in target.items], tuple_like=True), receiver.src)
    if method == "values":
        return Val(MutList(list(target.items.values()), tuple_like=True), receiver.src)
    if method == "items":
        return Val(MutList([Val(MutList([Val(key), value], tuple_like=True)) for key, value in target.items.items()], tuple_like=True), receiver.src)
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


def _tensor_method(receiver: Val, method: str, args: list[Val], kwargs: dict[str, Val], src: frozenset) -> Val:
    tensor: TensorVal = receiver.v
    if method == "flatten" and tensor.kind == "stack":
        return Val(TensorVal("concat", items=tensor.items, dim=-1), receiver.src)
    if method in ("add", "__add__") and args and isinstance(args[0].v, TensorVal):
        return Val(add_tensors(tensor, args[0].v), receiver.src | src)
    if method in ("chunk", "split"):
        return Val(Opaque(method, f"tensor.{method}", "split of a tensor"), receiver.src)
    return Val(tensor, receiver.src)


def call_opaque(ev: Evaluator, fn: Val, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None) -> Val:
    callee: Opaque = fn.v
    origin = callee.origin or callee.hint
    last = origin.split(".")[-1]
    src = fn.src | _union(args) | _union(list(kwargs.values()))
    model = _LIBRARY.get(origin) or _LIBRARY.get(".".join(origin.split(".")[-2:]))
    if model is not None:
        result = model(ev, args, kwargs, node, frame, src)
        if result is not None:
            return result
    if last in _LOGGING:
        return NONE
    if last == "collective_rpc" and args and isinstance(args[0].v, str):
        return _rpc(ev, args[0].v, kwargs, node, frame, src)
    if origin.startswith(HF_TARGET) or "output_hidden_states" in kwargs:
        # A model this code does not define, asked for `output_hidden_states`: the transformers
        # API answers with every layer's state, whatever object holds the model.
        return _hf_forward(ev, kwargs, node, frame, src)
    constructing = bool(_CLASS_NAME.match(last)) and not callee.instance
    if constructing:  # `RMSNorm(...)`, `VocabParallelEmbedding(...)`: a module, not yet a tensor
        return Val(Opaque(last, origin, "an instance of a class that is not analyzed", True, tuple(args), dict(kwargs), anonymous=True), src)
    tensors = [arg for arg in [*args, *kwargs.values()] if isinstance(arg.v, TensorVal)]
    hooks = [arg for arg in kwargs.values() if arg.v is not None and ev.is_capture_hook(arg)]
    if hooks and tensors:
        # An unanalyzed step handed a capture hook (a final norm, a boundary) captures the stream
        # it is given, before any norm it applies.
        stream = tensors[0].v.as_tap() if isinstance(tensors[0].v, TensorVal) else None
        if stream is not None:
            captured = Val(tap_tensor(Tap(stream.layer)), tensors[0].src | ev.assume(frame, node, f"`{last}` hands its capture hook the stream it receives ({stream})"))
            for hook in hooks:
                ev.call(hook, [captured], {}, node, frame)
    names = f"{callee.hint} {origin}"
    if NORM_RE.search(names) and tensors:
        return _norm(tensors, src)
    if EMBED_RE.search(names) and not tensors and "norm" not in names.lower():
        return Val(tap_tensor(Tap(0)), ev._call_node(frame, node, src, "embedding output (h0)") or src)
    distinct = {id(arg.v) for arg in tensors}
    if len(distinct) == 1 and not callee.instance:
        tensor = tensors[0]
        sources = ev._call_node(frame, node, tensor.src, f"`{last}` assumed to move rows only, keeping the tensor")
        return Val(tensor.v, sources or tensor.src)
    return Val(Opaque(last, origin, "result of a call that is not analyzed", False, tuple(args), dict(kwargs), anonymous=True), src)


def _norm(tensors: list[Val], src: frozenset) -> Val:
    first = tensors[0].v
    if len(tensors) >= 2 and isinstance(tensors[1].v, TensorVal):
        summed = add_tensors(first, tensors[1].v)
        tap = summed.as_tap()
        normed = tap_tensor(Tap(tap.layer, norm=True)) if tap else TensorVal("unknown", reason="norm of an unknown sum")
        return Val(MutList([Val(normed, src), Val(summed, src)], tuple_like=True), src)
    tap = first.as_tap()
    if tap is not None:
        return Val(tap_tensor(Tap(tap.layer, norm=True, partial=tap.partial)), src)
    return Val(TensorVal("unknown", reason="norm of an untracked tensor"), src)


def _rpc(ev: Evaluator, method: str, kwargs: dict[str, Val], node: Any, frame: Any, src: frozenset) -> Val:
    """`executor.collective_rpc("name", args=(...))` calls method `name` on every worker."""
    targets = ev.find_methods(method)
    if not targets:
        return Val(Opaque(method, f"rpc.{method}", "no analyzed class defines the method called by name"), src)
    args_val = kwargs.get("args")
    call_args = iterate(ev, args_val, frame, node) if args_val is not None else []
    call_kwargs = kwargs.get("kwargs")
    named = {str(k): v for k, v in call_kwargs.v.items.items()} if call_kwargs is not None and isinstance(call_kwargs.v, MutDict) else {}
    result = NONE
    for info in targets:
        receiver = ev.singleton(info.owner) if info.owner is not None else None
        result = ev.call(Val(FuncRef(info, bound=receiver)), list(call_args or []), named, node, frame)
    return result


# -- built-in functions ----------------------------------------------------------------------------


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
    stack = ev.layer_stack(args[0], frame, node)
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
    values = range(*bounds)
    if len(values) > 100_000:
        return Val(Opaque("range", "", "range too long to unroll"), src)
    resolved = src | _union([ev.concrete(arg, frame, node) for arg in args])
    return Val(MutList([Val(i, resolved) for i in values], tuple_like=True), resolved)


def _b_enumerate(ev, args, kwargs, node, frame, src):
    items = iterate(ev, args[0], frame, node) if args else None
    if items is None:
        return Val(Opaque("enumerate"), src)
    given = args[1] if len(args) > 1 else kwargs.get("start", Val(0))
    start = ev.concrete(given, frame, node)
    if not isinstance(start.v, int):
        return Val(Opaque("enumerate", "", "start unknown"), src)
    return Val(MutList([Val(MutList([Val(start.v + i, args[0].src | start.src), item], tuple_like=True)) for i, item in enumerate(items)], tuple_like=True), src)


def _b_zip(ev, args, kwargs, node, frame, src):
    columns = [iterate(ev, arg, frame, node) for arg in args]
    if any(column is None for column in columns):
        return Val(Opaque("zip"), src)
    return Val(MutList([Val(MutList(list(row), tuple_like=True)) for row in zip(*columns, strict=False)], tuple_like=True), src)


def _b_sequence(tuple_like: bool):
    def handler(ev, args, kwargs, node, frame, src):
        if not args:
            return Val(MutList([], tuple_like), src)
        items = iterate(ev, args[0], frame, node)
        if items is None:
            return Val(Opaque("list" if not tuple_like else "tuple", "", "items unknown"), src)
        return Val(MutList(items, tuple_like), src)

    return handler


def _b_set(frozen: bool):
    def handler(ev, args, kwargs, node, frame, src):
        if not args:
            return Val(SetVal(frozenset(), frozen), src)
        items = iterate(ev, args[0], frame, node)
        if items is None:
            return Val(Opaque("set", "", "items unknown"), src)
        value = make_set(items, frozen)
        return Val(value.v, value.src | src)

    return handler


def _b_sorted(ev, args, kwargs, node, frame, src):
    items = iterate(ev, args[0], frame, node) if args else None
    plain = [item.v for item in items] if items is not None else None
    if plain is None or not all(isinstance(value, (int, float, str)) for value in plain) or "key" in kwargs:
        return Val(Opaque("sorted", "", "items unknown"), src)
    order = sorted(range(len(plain)), key=lambda i: plain[i], reverse=bool(kwargs.get("reverse", NONE).v))
    return Val(MutList([items[i] for i in order]), src)


def _b_reversed(ev, args, kwargs, node, frame, src):
    items = iterate(ev, args[0], frame, node) if args else None
    return Val(MutList(list(reversed(items)), tuple_like=True), src) if items is not None else Val(Opaque("reversed"), src)


def _b_minmax(name):
    def handler(ev, args, kwargs, node, frame, src):
        values = iterate(ev, args[0], frame, node) if len(args) == 1 else args
        plain = [ev.concrete(value, frame, node).v for value in values] if values is not None else None
        if not plain or not all(isinstance(value, (int, float)) for value in plain):
            if values is not None and not plain and "default" in kwargs:
                return kwargs["default"]
            return Val(Opaque(name, "", "values unknown"), src)
        return Val(min(plain) if name == "min" else max(plain), src)

    return handler


def _b_sum(ev, args, kwargs, node, frame, src):
    items = iterate(ev, args[0], frame, node) if args else None
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
            return Val(ev._truth(args[0], frame, node), src)
        if isinstance(value, (int, float, str, bool)):
            try:
                return Val({"int": int, "float": float, "str": str}[kind](value), src)
            except ValueError:
                raise raise_("ValueError", f"invalid literal for {kind}()", ev, frame, node, src) from None
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
}


def _b_isinstance(ev, args, kwargs, node, frame, src):
    if len(args) != 2:
        return Val(Opaque("isinstance"), src)
    payload = args[0].v
    kinds = iterate(ev, args[1], frame, node) if isinstance(args[1].v, MutList) else [args[1]]
    if isinstance(payload, Opaque):
        return Val(Opaque("isinstance", "", "type of an unknown value"), src)
    for kind in kinds or []:
        name = kind.v.name if isinstance(kind.v, BuiltinFn) else kind.v.origin.split(".")[-1] if isinstance(kind.v, Opaque) else None
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
        data = owner.v.data
        present = isinstance(data, dict) and name in data
        if present:
            return Val(True, config_attr(ev, owner, name, frame, node, None).src)
        return Val(False, frozenset({_missing_node(ev, owner.v.file, owner.v.path + (name,))}))
    if isinstance(owner.v, ObjRef):
        value = ev.field(owner, name)
        if isinstance(value.v, Opaque) and value.v.reason.startswith(("field never assigned", "no such attribute")):
            return Val(False, src)
        return Val(True, src | value.src)
    if owner.v is None:
        return Val(False, src)
    if isinstance(owner.v, (Opaque, TensorVal)):
        if name in ev.links:
            return Val(True, src)
        if isinstance(owner.v, Opaque) and ev.reads_draft_config(owner.v, name):
            assert ev.draft is not None
            return _b_hasattr(ev, [Val(ConfigObj(ev.draft)), args[1]], kwargs, node, frame, src)
        return Val(Opaque("hasattr", "", "attribute of an unknown object"), src)
    try:
        ev._getattr(owner, name, frame, node)
        return Val(True, src)
    except EvalRaise:
        return Val(False, src)


def _b_getattr(ev, args, kwargs, node, frame, src):
    if len(args) < 2 or not isinstance(args[1].v, str):
        return Val(Opaque("getattr"), src)
    owner, name = args[0], args[1].v
    default = args[2] if len(args) > 2 else None
    if isinstance(owner.v, ConfigObj):
        return config_attr(ev, owner, name, frame, node, default, missing_raises=default is None)
    if owner.v is None and default is not None:
        return default
    try:
        value = ev._getattr(owner, name, frame, node)
    except EvalRaise as error:
        if default is not None:
            return default.with_src(error.src)
        raise
    if default is not None and isinstance(value.v, Opaque) and isinstance(owner.v, ObjRef) and value.v.reason.startswith(("field never assigned", "no such attribute")):
        return default
    return value


def _b_setattr(ev, args, kwargs, node, frame, src):
    if len(args) == 3 and isinstance(args[1].v, str):
        ev._setattr(args[0], args[1].v, args[2])
    return NONE


def _b_dict(ev, args, kwargs, node, frame, src):
    items: dict[Any, Val] = {}
    if args and isinstance(args[0].v, MutDict):
        items.update(args[0].v.items)
    items.update(kwargs)
    return Val(MutDict(items), src)


def _b_anyall(name):
    def handler(ev, args, kwargs, node, frame, src):
        items = iterate(ev, args[0], frame, node) if args else None
        if items is None or any(isinstance(item.v, Opaque) for item in items):
            return Val(Opaque(name), src)
        truths = [ev._truth(item, frame, node) for item in items]
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
    items = iterate(ev, args[0], frame, node) if args else None
    if items:
        return items[0]
    if len(args) > 1:
        return args[1]
    return Val(Opaque("next", "", "next of an unknown iterator"), src)


def _b_map(ev, args, kwargs, node, frame, src):
    if len(args) != 2:
        return Val(Opaque("map"), src)
    items = iterate(ev, args[1], frame, node)
    if items is None:
        return Val(Opaque("map"), src)
    return Val(MutList([ev.call(args[0], [item], {}, node, frame) for item in items], tuple_like=True), src)


def _b_filter(ev, args, kwargs, node, frame, src):
    if len(args) != 2:
        return Val(Opaque("filter"), src)
    items = iterate(ev, args[1], frame, node)
    if items is None:
        return Val(Opaque("filter"), src)
    keep = [item for item in items if ev._truth(ev.call(args[0], [item], {}, node, frame) if args[0].v is not None else item, frame, node)]
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


# -- library models, by qualified name --------------------------------------------------------------


def _m_cat(ev, args, kwargs, node, frame, src):
    sequence = args[0] if args else kwargs.get("tensors")
    items = iterate(ev, sequence, frame, node) if sequence is not None else None
    if not items or not all(isinstance(item.v, TensorVal) for item in items):
        return None
    flat: list[TensorVal] = []
    for item in items:
        flat.extend(item.v.items if item.v.kind == "concat" else [item.v])
    sources = ev._call_node(frame, node, src, "concatenated in this order")
    result = Val(TensorVal("concat", items=tuple(flat), dim=_dim(args, kwargs)), sources or src)
    for key in sources:
        ev.graph.observe(key, result.v.describe())
    ev.concats.append(result)
    return result


def _m_stack(ev, args, kwargs, node, frame, src):
    sequence = args[0] if args else kwargs.get("tensors")
    items = iterate(ev, sequence, frame, node) if sequence is not None else None
    if not items or not all(isinstance(item.v, TensorVal) for item in items):
        return None
    sources = ev._call_node(frame, node, src, "stacked in this order")
    return Val(TensorVal("stack", items=tuple(item.v for item in items), dim=_dim(args, kwargs)), sources or src)


def _dim(args, kwargs):
    if len(args) > 1 and isinstance(args[1].v, int):
        return args[1].v
    value = kwargs.get("dim")
    return value.v if value is not None else 0


def _m_islice(ev, args, kwargs, node, frame, src):
    if not args:
        return None
    items = iterate(ev, args[0], frame, node)
    bounds = _ints(ev, args[1:], frame, node)
    if items is None or bounds is None:
        return None
    return Val(MutList(items[slice(*bounds)], tuple_like=True), src | _union([ev.concrete(a, frame, node) for a in args[1:]]))


def _m_method_type(ev, args, kwargs, node, frame, src):
    if len(args) == 2 and isinstance(args[0].v, FuncRef):
        return Val(FuncRef(args[0].v.info, bound=args[1]), src)
    return None


def _m_auto_config(ev, args, kwargs, node, frame, src):
    if ev.target is None:
        return None
    key = ev._call_node(frame, node, src | frozenset({ev.graph.node("config", ev.target.location(()), f"target config {ev.target.display}")}), "loads the target model's config")
    return Val(ConfigObj(ev.target), key)


HF_TARGET = "transformers:target-model"


def _m_hf_model(ev, args, kwargs, node, frame, src):
    """`AutoModelForCausalLM.from_pretrained(...)`: the target model, as transformers runs it."""
    return Val(Opaque("model", HF_TARGET, "the target model loaded with transformers", instance=True), src)


def _hf_forward(ev, kwargs, node, frame, src):
    """A transformers forward: with `output_hidden_states`, HF returns (h0, ..., hN-1, hN+norm)."""
    wanted = kwargs.get("output_hidden_states")
    items: dict[Any, Val] = {"logits": Val(Opaque("logits", "transformers.logits")), "hidden_states": NONE}
    layers = ev.num_layers
    if wanted is not None and ev._truth(wanted, frame, node) and layers:
        counted = src | wanted.src | _layer_count_node(ev)
        sources = ev._call_node(frame, node, counted, f"transformers returns {layers + 1} hidden states; the last is after the final norm")
        taps = [Val(tap_tensor(Tap(j)), sources) for j in range(layers)] + [Val(tap_tensor(Tap(layers, norm=True)), sources)]
        items["hidden_states"] = Val(MutList(taps, tuple_like=True), sources)
        items["last_hidden_state"] = taps[-1]
    return Val(MutDict(items, attrs=True), src)


def _layer_count_node(ev) -> frozenset:
    """The target config's layer count, as the source of how many states transformers returns."""
    if ev.target is None:
        return frozenset()
    target = TargetConfig(ev.target)
    try:
        path = target.num_layers_path
    except InputError:
        return frozenset()
    return frozenset({ev.graph.from_step("config", ev.target.step(path, f"{'.'.join(path)} = {target.num_layers}"), path)})


def _m_identity(ev, args, kwargs, node, frame, src):
    return args[0] if args else None


def _m_opaque(ev, args, kwargs, node, frame, src):
    return Val(Opaque("context"), src)


_LIBRARY = {
    "torch.cat": _m_cat,
    "torch.concat": _m_cat,
    "torch.concatenate": _m_cat,
    "torch.stack": _m_stack,
    "itertools.islice": _m_islice,
    "islice": _m_islice,
    "types.MethodType": _m_method_type,
    "MethodType": _m_method_type,
    "AutoConfig.from_pretrained": _m_auto_config,
    "AutoModelForCausalLM.from_pretrained": _m_hf_model,
    "AutoModel.from_pretrained": _m_hf_model,
    "copy.deepcopy": _m_identity,
    "copy.copy": _m_identity,
    "contextlib.nullcontext": _m_opaque,
}

