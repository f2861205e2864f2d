"""Tensors whose identity the analysis tracks: taps of the residual stream, a decoder layer's output
pair, concatenations and stacks, and what torch and transformers calls do to them (cat, stack,
norms, the `output_hidden_states` of a transformers forward)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from rca.model import Tap
from rca.static.evaluate.interface import Frame, Interpreter, raised
from rca.static.evaluate.library import configs
from rca.static.evaluate.values import NONE, BuiltinFn, MutDict, MutList, Opaque, TensorVal, Val, tap_tensor
from rca.static.graph import NodeKey

# Tensor methods that keep the tensor's identity (casts, views, moves).
SAME_TENSOR = frozenset(
    {
        "clone",
        "contiguous",
        "detach",
        "to",
        "float",
        "half",
        "bfloat16",
        "cuda",
        "cpu",
        "type",
        "type_as",
        "view",
        "view_as",
        "reshape",
        "squeeze",
        "unsqueeze",
        "requires_grad_",
        "narrow",
        "index_select",
    }
)

# The target model loaded with transformers (its forward is transformers', not analyzed code).
HF_TARGET = "transformers:target-model"


def attribute(owner: Val, name: str) -> Val:
    if name in SAME_TENSOR or name in ("flatten", "add", "__add__", "chunk", "split"):
        return Val(BuiltinFn(f"tensor.{name}", owner))
    return Val(Opaque(name, f"tensor.{name}", "tensor attribute"), owner.src)


def subscript(tensor: TensorVal, index: Any) -> TensorVal:
    """An element of a layer's output pair, a slot of a stack; row selections keep the tap."""
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
    if tensor.whole:  # a layer that adds its residual itself and returns the stream in a 1-tuple
        return tap_tensor(Tap(tensor.layer + 1)) if index == 0 else TensorVal("unknown", reason="past the stream")
    if index == 0:
        return TensorVal("part", layer=tensor.layer + 1, part="hidden")
    if index == 1:
        return TensorVal("part", layer=tensor.layer + 1, part="residual")
    if 2 <= index < 2 + len(tensor.extra) and isinstance(tensor.extra[index - 2], TensorVal):
        return tensor.extra[index - 2]
    return TensorVal("unknown", reason=f"element {index} of a decoder layer's output")


def iterate(tensor: TensorVal, src: frozenset[NodeKey], count: int | None) -> list[Val] | None:
    """Unpacking a layer's output pair, or a concatenation into as many names as it has slots."""
    if tensor.kind == "layer_out" and count is not None:
        return [Val(layer_part(tensor, index), src) for index in range(count)]
    if tensor.kind in ("concat", "stack") and count == len(tensor.items):
        return [Val(item, src) for item in tensor.items]
    return None


def add(a: TensorVal, b: TensorVal) -> TensorVal:
    """hidden + residual of the same layer is the residual stream: the tap."""
    if a.kind == "part" and b.kind == "part" and a.layer == b.layer and {a.part, b.part} == {"hidden", "residual"}:
        return tap_tensor(Tap(a.layer))
    return TensorVal("unknown", reason=f"sum of {a.describe()} and {b.describe()}")


def binary(
    ev: Interpreter,
    operator: str,
    a: Any,
    b: Any,
    src: frozenset[NodeKey],
    frame: Frame | None,
    node: cst.CSTNode | None,
) -> Val | None:
    """Arithmetic with a tensor operand; None when neither operand is a tensor."""
    if not isinstance(a, TensorVal) and not isinstance(b, TensorVal):
        return None
    if operator == "Add":
        if a is None or b is None:
            raise raised("TypeError", "unsupported operand type(s) for +: a tensor and None", ev, frame, node, src)
        if isinstance(a, TensorVal) and isinstance(b, TensorVal):
            return Val(add(a, b), src)
    if operator == "MatrixMultiply" or isinstance(a, Opaque) or isinstance(b, Opaque):
        return Val(TensorVal("unknown", reason="tensor arithmetic with an unknown operand"), src)
    return Val(TensorVal("unknown", reason=f"tensor {operator.lower()}"), src)


def call_method(receiver: Val, method: str, args: list[Val], src: frozenset[NodeKey]) -> Val:
    tensor: TensorVal = receiver.v
    if method == "flatten" and tensor.kind == "stack":
        return Val(TensorVal("concat", items=tensor.items, dim=-1), receiver.src)
    if method in ("add", "__add__") and args and isinstance(args[0].v, TensorVal):
        return Val(add(tensor, args[0].v), receiver.src | src)
    if method in ("chunk", "split"):
        return Val(Opaque(method, f"tensor.{method}", "split of a tensor"), receiver.src)
    return Val(tensor, receiver.src)


def norm(tensors: list[Val], src: frozenset[NodeKey]) -> Val:
    """A norm of a tap is the tap `+norm`; a fused add-and-norm returns (normed sum, sum)."""
    first = tensors[0].v
    if len(tensors) >= 2 and isinstance(tensors[1].v, TensorVal):
        summed = add(first, tensors[1].v)
        tap = summed.as_tap()
        normed = tap_tensor(Tap(tap.layer, norm=True)) if tap else TensorVal("unknown", reason="norm of an unknown sum")
        return Val(MutList([Val(normed, src), Val(summed, src)], tuple_like=True), src)
    tap = first.as_tap()
    if tap is not None:
        return Val(tap_tensor(Tap(tap.layer, norm=True, partial=tap.partial)), src)
    return Val(TensorVal("unknown", reason="norm of an untracked tensor"), src)


def cat(
    ev: Interpreter,
    args: list[Val],
    kwargs: dict[str, Val],
    node: cst.CSTNode | None,
    frame: Frame | None,
    src: frozenset,
) -> Val | None:
    """`torch.cat(tensors, dim)`: the slots in this order (nested concatenations flattened)."""
    sequence = args[0] if args else kwargs.get("tensors")
    items = ev.iterate(sequence, frame, node) if sequence is not None else None
    if not items or not all(isinstance(item.v, TensorVal) for item in items):
        return None
    flat: list[TensorVal] = []
    for item in items:
        flat.extend(item.v.items if item.v.kind == "concat" else [item.v])
    sources = ev.call_node(frame, node, src, "concatenated in this order")
    result = Val(TensorVal("concat", items=tuple(flat), dim=_dim(args, kwargs)), sources or src)
    for key in sources:
        ev.graph.observe(key, result.v.describe())
    ev.events.concats.append(result)
    return result


def stack(
    ev: Interpreter,
    args: list[Val],
    kwargs: dict[str, Val],
    node: cst.CSTNode | None,
    frame: Frame | None,
    src: frozenset,
) -> Val | None:
    """`torch.stack(tensors, dim)`: a stack of the slots, in this order."""
    sequence = args[0] if args else kwargs.get("tensors")
    items = ev.iterate(sequence, frame, node) if sequence is not None else None
    if not items or not all(isinstance(item.v, TensorVal) for item in items):
        return None
    sources = ev.call_node(frame, node, src, "stacked in this order")
    return Val(TensorVal("stack", items=tuple(item.v for item in items), dim=_dim(args, kwargs)), sources or src)


def _dim(args: list[Val], kwargs: dict[str, Val]) -> Any:
    if len(args) > 1 and isinstance(args[1].v, int):
        return args[1].v
    value = kwargs.get("dim")
    return value.v if value is not None else 0


def hf_model(
    ev: Interpreter,
    args: list[Val],
    kwargs: dict[str, Val],
    node: cst.CSTNode | None,
    frame: Frame | None,
    src: frozenset,
) -> Val:
    """`AutoModelForCausalLM.from_pretrained(...)`: the target model, as transformers runs it."""
    return Val(Opaque("model", HF_TARGET, "the target model loaded with transformers", instance=True), src)


def hf_forward(
    ev: Interpreter, kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None, src: frozenset
) -> Val:
    """A transformers forward: with `output_hidden_states`, HF returns (h0, ..., hN-1, hN+norm)."""
    wanted = kwargs.get("output_hidden_states")
    items: dict[Any, Val] = {"logits": Val(Opaque("logits", "transformers.logits")), "hidden_states": NONE}
    layers = ev.num_layers
    if wanted is not None and ev.truth(wanted, frame, node) and layers:
        counted = src | wanted.src | configs.layer_count_node(ev)
        sources = ev.call_node(
            frame, node, counted, f"transformers returns {layers + 1} hidden states; the last is after the final norm"
        )
        taps = [Val(tap_tensor(Tap(j)), sources) for j in range(layers)] + [
            Val(tap_tensor(Tap(layers, norm=True)), sources)
        ]
        items["hidden_states"] = Val(MutList(taps, tuple_like=True), sources)
        items["last_hidden_state"] = taps[-1]
    return Val(MutDict(items, attrs=True), src)
