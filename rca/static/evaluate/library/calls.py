"""Calls of functions and classes the analyzed files do not define: torch and transformers (by
qualified name), logging, `collective_rpc` by method name, constructors of unanalyzed classes, and
what a model's forward does with tensors it hands to code the analysis cannot read (norms,
embeddings, capture hooks, row moves)."""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst

from rca.model import Tap
from rca.static.evaluate.interface import Frame, Interpreter
from rca.static.evaluate.library import builtins, configs, layers, tensors
from rca.static.evaluate.values import (
    EMBED_RE,
    NONE,
    NORM_RE,
    FuncRef,
    MutDict,
    Opaque,
    TensorVal,
    Val,
    sources_of,
    tap_tensor,
)

Model = Callable[
    [Interpreter, list[Val], dict[str, Val], "cst.CSTNode | None", "Frame | None", frozenset], "Val | None"
]

_LOGGING = frozenset(
    {
        "debug",
        "info",
        "warning",
        "warn",
        "warning_once",
        "info_once",
        "error",
        "exception",
        "critical",
        "log",
        "print",
        "print_rank_0",
    }
)
_CLASS_NAME = re.compile(r"^_?[A-Z][A-Za-z0-9]*$")
# torch.nn.Module methods that return the module itself (`model.eval()`, `model.to(device)`).
_RETURNS_MODULE = frozenset({"eval", "train", "to", "cuda", "cpu", "half", "float", "bfloat16", "requires_grad_"})

# Library functions modeled by qualified name (or its last two parts).
LIBRARY: dict[str, Model] = {
    "torch.cat": tensors.cat,
    "torch.concat": tensors.cat,
    "torch.concatenate": tensors.cat,
    "torch.stack": tensors.stack,
    "itertools.islice": builtins.islice,
    "islice": builtins.islice,
    "types.MethodType": builtins.method_type,
    "MethodType": builtins.method_type,
    "AutoConfig.from_pretrained": configs.auto_config,
    "AutoModelForCausalLM.from_pretrained": tensors.hf_model,
    "AutoModel.from_pretrained": tensors.hf_model,
    "copy.deepcopy": builtins.identity,
    "copy.copy": builtins.identity,
    "typing.cast": builtins.cast,
    "contextlib.nullcontext": builtins.context,
}


def call_unknown(
    ev: Interpreter, fn: Val, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None
) -> Val:
    """The result of calling an unknown value (a function or class of an unanalyzed module)."""
    callee: Opaque = fn.v
    origin = callee.origin or callee.hint
    last = origin.split(".")[-1]
    src = fn.src | sources_of(args) | sources_of(list(kwargs.values()))
    model = LIBRARY.get(origin) or LIBRARY.get(".".join(origin.split(".")[-2:]))
    if model is not None:
        result = model(ev, args, kwargs, node, frame, src)
        if result is not None:
            return result
    if last in _LOGGING:
        return NONE
    if last in _RETURNS_MODULE and origin == f"{tensors.HF_TARGET}.{last}":
        return tensors.hf_model(ev, args, kwargs, node, frame, src)
    if last == "collective_rpc" and args and isinstance(args[0].v, str):
        return _rpc(ev, args[0].v, kwargs, node, frame, src)
    if origin.startswith(tensors.HF_TARGET) or "output_hidden_states" in kwargs:
        # A model this code does not define, asked for `output_hidden_states`: the transformers
        # API answers with every layer's state, whatever object holds the model.
        return tensors.hf_forward(ev, kwargs, node, frame, src)
    constructing = bool(_CLASS_NAME.match(last)) and not callee.instance
    if constructing:  # `RMSNorm(...)`, `VocabParallelEmbedding(...)`: a module, not yet a tensor
        return Val(
            Opaque(
                last,
                origin,
                "an instance of a class that is not analyzed",
                True,
                tuple(args),
                dict(kwargs),
                anonymous=True,
            ),
            src,
        )
    tensor_args = [arg for arg in [*args, *kwargs.values()] if isinstance(arg.v, TensorVal)]
    hooks = [arg for arg in kwargs.values() if arg.v is not None and layers.is_capture_hook(arg)]
    if hooks and tensor_args:
        # An unanalyzed step handed a capture hook (a final norm, a boundary) captures the stream
        # it is given, before any norm it applies.
        stream = tensor_args[0].v.as_tap() if isinstance(tensor_args[0].v, TensorVal) else None
        if stream is not None:
            captured = Val(
                tap_tensor(Tap(stream.layer)),
                tensor_args[0].src
                | ev.assume(frame, node, f"`{last}` hands its capture hook the stream it receives ({stream})"),
            )
            for hook in hooks:
                ev.call(hook, [captured], {}, node, frame)
    names = f"{callee.hint} {origin}"
    if NORM_RE.search(names) and tensor_args:
        return tensors.norm(tensor_args, src)
    if EMBED_RE.search(names) and not tensor_args and "norm" not in names.lower():
        return Val(tap_tensor(Tap(0)), ev.call_node(frame, node, src, "embedding output (h0)") or src)
    distinct = {id(arg.v) for arg in tensor_args}
    if len(distinct) == 1 and not callee.instance:
        tensor = tensor_args[0]
        sources = ev.call_node(frame, node, tensor.src, f"`{last}` assumed to move rows only, keeping the tensor")
        return Val(tensor.v, sources or tensor.src)
    return Val(
        Opaque(last, origin, "result of a call that is not analyzed", False, tuple(args), dict(kwargs), anonymous=True),
        src,
    )


def _rpc(
    ev: Interpreter, method: str, kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None, src: frozenset
) -> Val:
    """`executor.collective_rpc("name", args=(...))` calls method `name` on every worker."""
    targets = ev.find_methods(method)
    if not targets:
        return Val(Opaque(method, f"rpc.{method}", "no analyzed class defines the method called by name"), src)
    args_val = kwargs.get("args")
    call_args = ev.iterate(args_val, frame, node) if args_val is not None else []
    call_kwargs = kwargs.get("kwargs")
    named = (
        {str(k): v for k, v in call_kwargs.v.items.items()}
        if call_kwargs is not None and isinstance(call_kwargs.v, MutDict)
        else {}
    )
    result = NONE
    for info in targets:
        receiver = ev.singleton(info.owner) if info.owner is not None else None
        result = ev.call(Val(FuncRef(info, bound=receiver)), list(call_args or []), named, node, frame)
    return result
