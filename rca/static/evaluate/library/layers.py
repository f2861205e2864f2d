"""The target's decoder layers: the stack (`self.layers`), one object per layer so that flags set on
a layer are seen by the forward pass, what calling a layer returns (the stream after it), and what
a layer does with a capture list, collector or hook it is handed (read from its own code where it
can be, else the capture at its entry that layers which take one make)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from rca.model import Tap
from rca.static.codeindex import walk
from rca.static.evaluate.interface import BudgetExceeded, Frame, Interpreter, raised
from rca.static.evaluate.values import (
    NONE,
    BuiltinFn,
    ClassRef,
    DecoderLayer,
    EvalRaise,
    FuncRef,
    LambdaRef,
    LayerStack,
    MutList,
    ObjRef,
    Opaque,
    TensorVal,
    Val,
    sources_of,
    tap_tensor,
)
from rca.static.graph import NodeKey

# Names whose unknown value is a stack of the target's decoder layers.
LAYER_STACKS = frozenset({"layers", "h", "blocks", "decoder_layers"})

# Methods by which a collector object is handed what it captures.
COLLECTOR_METHODS = ("capture", "append")


def layer_stack(ev: Interpreter, value: Val, frame: Frame | None, node: cst.CSTNode | None) -> LayerStack | None:
    """The decoder-layer stack a value stands for: a stack already made, or an unknown value named
    like one (`self.layers`), taken as the target's decoder layers."""
    if isinstance(value.v, LayerStack):
        return value.v
    opaque = value.v
    if isinstance(opaque, Opaque) and opaque.hint in LAYER_STACKS and ev.num_layers:
        ev.assume(frame, node, f"`{opaque.hint}` taken as the target's {ev.num_layers} decoder layers")
        if opaque.stack is None:
            factory = next(
                (arg for arg in opaque.call_args() if isinstance(arg.v, (LambdaRef, FuncRef, ClassRef))), None
            )
            opaque.stack = LayerStack(ev.num_layers, factory=factory)
            built = next(  # `nn.ModuleList([Layer(config, i) for i in ...])`: the layer objects themselves
                (
                    arg.v.items
                    for arg in opaque.call_args()
                    if isinstance(arg.v, MutList) and arg.v.items and all(isinstance(i.v, ObjRef) for i in arg.v.items)
                ),
                None,
            )
            for index, item in enumerate(built[: ev.num_layers] if factory is None and built else []):
                opaque.stack.layer(index).instance = item
        return opaque.stack
    return None


def subscript(
    ev: Interpreter, owner: Val, index: Any, src: frozenset[NodeKey], frame: Frame | None, node: cst.CSTNode | None
) -> Val | None:
    """`layers[i]` and `layers[a:b]`; None when `owner` is not a layer stack."""
    stack = layer_stack(ev, owner, frame, node)
    if stack is None:
        return None
    if isinstance(index, int):
        position = index if index >= 0 else stack.count + index
        if not 0 <= position < stack.count:
            raise raised("IndexError", f"layer {index} out of range for {stack.count} layers", ev, frame, node, src)
        return Val(stack.layer(position), src)
    if isinstance(index, slice):
        return Val(MutList([Val(stack.layer(i), src) for i in range(stack.count)[index]]), src)
    return None


def iterate(ev: Interpreter, value: Val, frame: Frame | None, node: cst.CSTNode | None) -> list[Val] | None:
    stack = layer_stack(ev, value, frame, node)
    if stack is None:
        return None
    return [Val(stack.layer(i), value.src) for i in range(stack.start, stack.count)]


def attribute(ev: Interpreter, owner: Val, name: str) -> Val:
    """A field of a decoder layer (set on it, or its analyzed object's), or of the stack."""
    payload = owner.v
    if isinstance(payload, LayerStack):
        return Val(Opaque(name, f"layers.{name}", "attribute of the decoder-layer stack"), owner.src)
    if name in payload.fields:
        return payload.fields[name]
    instance = layer_instance(ev, payload)
    if instance is not None:
        return ev.object_attribute(instance, name)
    return Val(Opaque(name, f"layer.{name}", "field never assigned: attribute of a decoder layer"), owner.src)


def layer_instance(ev: Interpreter, layer: DecoderLayer) -> Val | None:
    """The analyzed object of a decoder layer, built by the stack's factory (once)."""
    if layer.instance is None and layer.stack is not None and layer.stack.factory is not None:
        with ev.isolated():
            try:
                built = ev.call(layer.stack.factory, [Val(layer.index), Val(f"layers.{layer.index}")])
            except (EvalRaise, BudgetExceeded, RecursionError):
                built = NONE
        layer.instance = built if isinstance(built.v, ObjRef) else NONE
    return layer.instance if layer.instance is not None and isinstance(layer.instance.v, ObjRef) else None


def call_layer(
    ev: Interpreter, fn: Val, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None
) -> Val:
    """Calling decoder layer i yields the stream after it, h(i+1), as its (hidden, residual) pair;
    its own code runs for what it does with a capture target it is handed."""
    layer: DecoderLayer = fn.v
    sources = fn.src | sources_of([*args, *kwargs.values()])
    extra: tuple[TensorVal, ...] = ()
    if any(is_capture_target(arg) for arg in [*args, *kwargs.values()]):
        _run_layer_code(ev, layer, args, kwargs, node, frame)
    elif any(value.v is True for value in kwargs.values()):
        extra = _returned_extras(ev, layer, args, kwargs, node, frame)
        sources = sources | sources_of([item for item in kwargs.values() if item.v is True])
    call_node = ev.call_node(frame, node, sources, f"decoder layer {layer.index}")
    if layer.stack is not None:
        ev.events.layer_calls.update(dict.fromkeys(call_node, layer.stack))
    whole = not extra and _returns_stream_alone(ev, layer)
    return Val(TensorVal("layer_out", layer=layer.index, extra=extra, whole=whole), call_node)


def _returns_stream_alone(ev: Interpreter, layer: DecoderLayer) -> bool:
    """Whether the stack's layers return the stream after them alone, in a 1-tuple (`outputs =
    (hidden_states,)`, having added their residual themselves), rather than a (hidden, residual)
    pair: read once per stack from the analyzed forward of the layer."""
    stack = layer.stack
    if stack is None:
        return False
    if stack.whole is None:
        forward = _layer_forward(ev, layer)
        stack.whole = forward is not None and _one_element_returns(forward.info.node)
    return stack.whole


def _one_element_returns(function: cst.FunctionDef) -> bool:
    """Every `return` of the function gives a 1-tuple, written there or assigned to the name it returns."""
    nested = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
    nodes = list(walk(function, into=lambda node: node is function or not isinstance(node, nested)))
    singles = {
        target.target.value
        for node in nodes
        if isinstance(node, cst.Assign) and _single(node.value)
        for target in node.targets
        if isinstance(target.target, cst.Name)
    }
    returns = [node for node in nodes if isinstance(node, cst.Return)]
    return bool(returns) and all(
        node.value is not None
        and (_single(node.value) or (isinstance(node.value, cst.Name) and node.value.value in singles))
        for node in returns
    )


def _single(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Tuple) and len(value.elements) == 1


def _returned_extras(
    ev: Interpreter,
    layer: DecoderLayer,
    args: list[Val],
    kwargs: dict[str, Val],
    node: cst.CSTNode | None,
    frame: Frame | None,
) -> tuple[TensorVal, ...]:
    """A layer handed a true flag (`capture_input_residual=True`) may return more than its pair:
    run its own forward and keep the tensors it returns after the first two."""
    forward = _layer_forward(ev, layer)
    if forward is None:
        return ()
    try:
        returned = ev.call_function(forward, args, kwargs, node, frame)
    except (EvalRaise, BudgetExceeded, RecursionError):
        return ()
    items = returned.v.items if isinstance(returned.v, MutList) else []
    return tuple(item.v for item in items[2:] if isinstance(item.v, TensorVal))


def _layer_forward(ev: Interpreter, layer: DecoderLayer) -> FuncRef | None:
    """The analyzed `forward` of the layer's module, when its class is in the analyzed code."""
    instance = layer_instance(ev, layer)
    forward = ev.object_attribute(instance, "forward") if instance is not None else None
    return forward.v if forward is not None and isinstance(forward.v, FuncRef) else None


def _run_layer_code(
    ev: Interpreter,
    layer: DecoderLayer,
    args: list[Val],
    kwargs: dict[str, Val],
    node: cst.CSTNode | None,
    frame: Frame | None,
) -> None:
    """Run a layer's own forward for what it does with the capture list (or callback) it is
    handed; the stream it returns is the modeled one, h(index+1)."""
    entry = Val(tap_tensor(Tap(layer.index)))
    appends_before = len(ev.events.appends)
    forward = _layer_forward(ev, layer)
    if forward is not None:
        with ev.linked("residual", entry):  # `stream.residual` inside layer i: the stream entering it
            try:
                ev.call_function(forward, args, kwargs, node, frame)
            except EvalRaise:
                pass
    if len(ev.events.appends) > appends_before:
        return
    # The layer's code could not be followed to what it hands its capture hook: layers that
    # take one capture at their entry boundary, so the hook receives the stream entering it.
    for target in [*args, *kwargs.values()]:
        if is_capture_target(target):
            src = ev.assume(frame, node, f"decoder layer {layer.index} takes its capture at its entry: h{layer.index}")
            _deliver(ev, target, Val(entry.v, src | target.src), node, frame)


def is_capture_target(value: Val) -> bool:
    """A list or collector a layer may append to, or a callback it may call with a tensor."""
    payload = value.v
    if isinstance(payload, MutList):
        return not payload.tuple_like
    if isinstance(payload, ObjRef):
        return payload.backing is not None or any(name in payload.cls.methods for name in COLLECTOR_METHODS)
    if isinstance(payload, BuiltinFn):
        return payload.bound is not None and isinstance(payload.bound.v, MutList)
    return isinstance(payload, FuncRef) and payload.bound is not None and isinstance(payload.bound.v, ObjRef)


def is_capture_hook(value: Val) -> bool:
    """A callable that captures what it is called with (a collector's bound method)."""
    return is_capture_target(value) and not isinstance(value.v, MutList)


def _deliver(ev: Interpreter, target: Val, value: Val, node: cst.CSTNode | None, frame: Frame | None) -> None:
    if isinstance(target.v, MutList):
        target.v.items.append(ev.record_append(target.v, value, frame, node))
    elif isinstance(target.v, ObjRef):
        method = "capture" if "capture" in target.v.cls.methods else "append"
        ev.call(ev.object_attribute(target, method), [value], {}, node, frame)
    else:
        ev.call(target, [value], {}, node, frame)


def is_collector_call(ref: FuncRef) -> bool:
    """A collector's `append`/`capture` method, bound to an analyzed object."""
    return ref.info.name in COLLECTOR_METHODS and ref.bound is not None and isinstance(ref.bound.v, ObjRef)


def collect(ev: Interpreter, ref: FuncRef, args: list[Val], node: cst.CSTNode | None, frame: Frame | None) -> None:
    """A collector's `append`/`capture` holds what it is handed, even when its body writes into a
    buffer the analysis cannot follow (a packed tensor, a preallocated slot). Called when its body
    appended nothing."""
    receiver: ObjRef = ref.bound.v  # type: ignore[union-attr]
    tensor = next((arg for arg in args if isinstance(arg.v, TensorVal)), None)
    if tensor is None:
        return
    if receiver.backing is None:
        receiver.backing = MutList([])
    receiver.backing.items.append(ev.record_append(receiver.backing, tensor, frame, node))
