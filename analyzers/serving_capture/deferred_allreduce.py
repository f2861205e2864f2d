"""Whether the target captures a layer's output before that layer's tensor-parallel all-reduce ran."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from rca.sdk import (
    Analyzer,
    CapturedTaps,
    Confidence,
    Example,
    Fact,
    Finding,
    Location,
    Reports,
    SideContext,
    StepKind,
    Tap,
)
from rca.sdk.code import FunctionInfo, call_name, walk
from rca.sdk.examples import SMALL_TARGET
from rca.sdk.values import ObjRef, Opaque, Val, layers

_LAYER = """
from communicator import LayerCommunicator


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_id):
        self.layer_id = layer_id
        self.communicator = LayerCommunicator(is_last_layer=layer_id == config.num_hidden_layers - 1)

    def forward(self, positions, hidden_states, residual, forward_batch):
        hidden_states, residual = self.communicator.prepare_attn(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.communicator.prepare_mlp(hidden_states, residual)
        fuse = self.communicator.should_fuse_mlp_allreduce_with_next_layer(forward_batch)
        hidden_states = self.mlp(hidden_states, fuse)
        if fuse:
            hidden_states._needs_allreduce_fusion = True
        else:
            hidden_states, residual = self.communicator.postprocess_layer(hidden_states, residual)
        return hidden_states, residual


class Model(nn.Module):
    def __init__(self, config):
        self.layers = make_layers(config.num_hidden_layers, lambda idx, prefix: DecoderLayer(config, idx))
        self.layers_to_capture = []

    def set_eagle3_layers_to_capture(self, layer_ids):
        self.layers_to_capture = [i + 1 for i in layer_ids]

    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, residual, forward_batch)
        return hidden_states, aux_hidden_states
"""
_COMMUNICATOR = """
from server_args import get_global_server_args

FUSE_MAX_TOKENS = 2048


class LayerCommunicator:
    def __init__(self, is_last_layer):
        self.is_last_layer = is_last_layer

    def should_fuse_mlp_allreduce_with_next_layer(self, forward_batch):
        batch_size = forward_batch.input_ids.shape[0] if hasattr(forward_batch, "input_ids") else 0
        return (
            0 < batch_size <= FUSE_MAX_TOKENS
            and get_global_server_args().enable_flashinfer_allreduce_fusion
            and not self.is_last_layer
        )
"""
_SERVER_ARGS = """
def add_cli_args(parser):
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--enable-flashinfer-allreduce-fusion", action="store_true")
"""
_RUNNER = """
class ModelRunner:
    def init_aux_hidden_state_capture(self):
        self.model.set_eagle3_layers_to_capture(self.draft_config.eagle_config["eagle_aux_hidden_state_layer_ids"])
"""
_FILES = {"runner.py": _RUNNER, "model.py": _LAYER, "communicator.py": _COMMUNICATOR, "server_args.py": _SERVER_ARGS}
# vLLM's shape: the model hands each layer's output to a helper that appends it, and a layer decides
# from the parallel config itself whether it leaves its MLP output for the next layer to reduce.
_HELPER_APPENDS = """
class DecoderLayer(nn.Module):
    def __init__(self, config, parallel_config, layer_id):
        self.defers_allreduce = parallel_config.tensor_parallel_size > 1

    def forward(self, positions, hidden_states, residual):
        if getattr(hidden_states, "_needs_allreduce", False):
            hidden_states = all_reduce(hidden_states)
        hidden_states = self.mlp(hidden_states)
        if self.defers_allreduce:
            hidden_states._needs_allreduce = True
        return hidden_states, residual


class Model(nn.Module):
    def __init__(self, config, parallel_config):
        self.layers = make_layers(
            config.num_hidden_layers, lambda idx, prefix: DecoderLayer(config, parallel_config, idx)
        )
        self.layers_to_capture = []

    def set_eagle3_layers_to_capture(self, layer_ids):
        self.layers_to_capture = [i + 1 for i in layer_ids]

    def _maybe_add_hidden_state(self, aux_hidden_states, layer_idx, hidden_states, residual):
        if layer_idx in self.layers_to_capture:
            aux_hidden_states.append(hidden_states + residual)

    def forward(self, input_ids, positions):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(len(self.layers)):
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
            self._maybe_add_hidden_state(aux_hidden_states, i + 1, hidden_states, residual)
        return hidden_states, aux_hidden_states
"""
_PARALLEL_ARGS = """
def add_cli_args(parser):
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
"""
_DRAFT = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}


class DeferredAllreduce(Analyzer):
    """Finds captures of a decoder layer's output that its tensor-parallel reduction has not reached yet.

    ## What it reads
    Runs where the target captures hidden states computed from what a decoder layer returned to
    its caller (`aux_hidden_states.append(hidden_states + residual)` in the model's layer loop).
    It reads that layer's code for a deferred reduction: a branch that marks the returned
    tensor for an all-reduce fused into the next layer (`hidden_states._sglang_needs_allreduce_fusion
    = True`), and evaluates the branch's condition with the layer's own fields and the launch
    settings. A condition that is false on every path clears the capture; one that the settings
    make true, or that depends on what only the running server knows (the GPU, the batch size),
    leaves it exposed.

    ## Finding
    `capture-before-allreduce`: in batches where the fusion runs (small, decode-sized ones),
    each tensor-parallel rank captures its own partial sum of the layer's MLP output plus the
    residual, not the layer's output: the draft's slots are `hK~partial`.
    """

    code = "RCA-S107"
    name = "deferred-allreduce"
    sides = frozenset({"serving"})
    requires = (CapturedTaps,)
    reports = (Reports("capture-before-allreduce", hypothesis="capture-before-allreduce"),)

    VALID = (
        Example(
            files={
                **_FILES,
                "model.py": _LAYER.replace(
                    "        if fuse:\n            hidden_states._needs_allreduce_fusion = True\n        else:\n    "
                    "        hidden_states",
                    "        hidden_states",
                ),
            },
            target=SMALL_TARGET,
            draft=_DRAFT,
            settings="--tp-size 8 --enable-flashinfer-allreduce-fusion",
            captured=("h2", "h4", "h6"),
            why="a layer that always completes its reduction returns the full sum",
        ),
        Example(
            files={
                **_FILES,
                "communicator.py": _COMMUNICATOR.replace(
                    "and not self.is_last_layer", "and not self.is_last_layer\n            and False"
                ),
            },
            target=SMALL_TARGET,
            draft=_DRAFT,
            settings="--tp-size 8 --enable-flashinfer-allreduce-fusion",
            captured=("h2", "h4", "h6"),
            why="a fusion condition that is false on every path defers nothing",
        ),
    )
    INVALID = (
        Example(
            files=_FILES,
            target=SMALL_TARGET,
            draft=_DRAFT,
            settings="--tp-size 8 --enable-flashinfer-allreduce-fusion",
            captured=("h2", "h4", "h6"),
            finding="capture-before-allreduce",
            path="model.py",
            line=16,
            message=(
                "the target captures h2, h4, h6 from what the previous layer returned, but that layer defers its "
                "tensor-parallel all-reduce under the condition at model.py:16: in the batches where it does, "
                "each rank captures a partial sum (h2~partial, h4~partial, h6~partial); the launch settings turn "
                "it on (launch setting --tp-size: tp_size = 8, enable_flashinfer_allreduce_fusion = True at "
                "--serving-args:1)"
            ),
            why="the model captures `hidden_states + residual` between layers while the layer leaves its MLP output "
            "unreduced",
        ),
        Example(
            files={"runner.py": _RUNNER, "model.py": _HELPER_APPENDS, "server_args.py": _PARALLEL_ARGS},
            target=SMALL_TARGET,
            draft=_DRAFT,
            settings="--tensor-parallel-size 2",
            captured=("h2", "h4", "h6"),
            finding="capture-before-allreduce",
            path="model.py",
            line=10,
            message=(
                "the target captures h2, h4, h6 from what the previous layer returned, but that layer defers its "
                "tensor-parallel all-reduce under the condition at model.py:10: in the batches where it does, each "
                "rank captures a partial sum (h2~partial, h4~partial, h6~partial); the launch settings turn it on "
                "(launch setting tensor_parallel_size = 2 at --serving-args:1)"
            ),
            why="a helper appends what each layer returned, and the layer defers its reduction whenever the launch "
            "splits the model (the tensor parallel size, not a flag)",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        captured = ctx.fact(CapturedTaps)
        assert captured is not None
        ev = ctx.evaluator
        # Captures of what a layer returned, appended by the function that called the layer or by a
        # helper it hands the value to (vLLM's `_maybe_add_hidden_state`), not by code the layer
        # runs after its communicator has reduced its input.
        stacks = set()
        for sink in captured.sinks:
            ancestors = ctx.graph.ancestors(sink)
            appender = _function_at(ctx, sink.location)
            appenders = {appender}
            if appender is not None:  # and the functions that call the one appending (vLLM's helper)
                helper = f"calls {appender[1]}"
                appenders |= {
                    _function_at(ctx, key.location)
                    for key in ancestors
                    if key.kind is StepKind.CALL and ctx.graph.step(key).note == helper
                }
            appenders.discard(None)
            stacks |= {
                ev.events.layer_calls[key]
                for key in ancestors
                if key in ev.events.layer_calls and _function_at(ctx, key.location) in appenders
            }
        if len(stacks) != 1:
            return
        stack = stacks.pop()
        exposed: list[Tap] = []
        deferrals: dict[int, tuple[FunctionInfo, cst.If] | None] = {}  # per layer class
        deferral: tuple[FunctionInfo, cst.If] | None = None
        switches: dict = {}  # what turns the deferral on: each launch setting's node, and what it says
        for tap in captured.taps:
            if tap is None or tap.layer is None or tap.layer < 1 or tap.layer - 1 < stack.start:
                continue
            instance = layers.layer_instance(ev, stack.layer(tap.layer - 1))
            if instance is None:
                continue
            cls = instance.v.cls
            if id(cls) not in deferrals:
                deferrals[id(cls)] = _deferral(ctx, instance)
            found = deferrals[id(cls)]
            if found is None:
                continue
            method, branch = found
            with ev.trace() as trace:
                condition = ev.condition_at(method, branch, instance)
            if not isinstance(condition.v, Opaque) and not condition.v:
                continue
            exposed.append(tap)
            deferral = found
            for read in trace.settings_read:
                if read.value is True:  # a flag read on the way
                    switches.setdefault(read.node, ctx.graph.step(read.node).note)
            if condition.v is True:  # the settings the value came from decided it (`tensor_parallel_size > 1`),
                # read now or when the field was first evaluated: those the layer class reads
                switches.update(
                    (node, said)
                    for node, said in _settings_behind(
                        ctx, condition, "\n".join(m.text for m in cls.methods.values())
                    ).items()
                    if node not in switches
                )
        if deferral is None:
            return
        method, branch = deferral
        marker = method.module.step(
            branch.test, method.node, "marks the layer's output for an all-reduce fused into the next layer"
        )
        partial = tuple(Tap(tap.layer, tap.norm, partial=True) for tap in exposed)
        enabled = [ctx.graph.step(key) for key in switches]
        if enabled:
            said = "; ".join(
                f"{note} at {step.location}" for step, note in zip(enabled, switches.values(), strict=True)
            )
            why = f"the launch settings turn it on ({said})"
        else:
            why = (
                "whether it runs depends on what only the running server knows (its GPUs, the batch size, "
                "settings not given here)"
            )
        yield self.finding(
            ctx,
            "capture-before-allreduce",
            f"the target captures {', '.join(str(tap) for tap in exposed)} from what the previous layer returned, "
            f"but that layer "
            f"defers its tensor-parallel all-reduce under the condition at {marker.location}: in the batches where "
            f"it does, each "
            f"rank captures a partial sum ({', '.join(str(tap) for tap in partial)}); {why}",
            marker.location,
            confidence=Confidence.INFERRED if enabled else Confidence.HEURISTIC,
            likelihood_ratio=20.0 if enabled else 1.0,
            steps=(marker, *enabled, *(ctx.graph.step(sink) for sink in captured.sinks[:1])),
            taps=partial,
        )


def _settings_behind(ctx: SideContext, value: Val, code: str) -> dict:
    """The launch settings a value was computed from (their steps among its sources' ancestors),
    each said as `name = value`, where the code that computed it reads the setting: several
    settings of a one-line launch share its one step."""
    origins = set(value.src).union(*(ctx.graph.ancestors(key) for key in value.src))
    nodes = {key.location: key for key in origins if key.kind is StepKind.SETTING}
    found: dict = {}
    for setting in ctx.settings.settings if ctx.settings is not None else ():
        node = nodes.get(setting.step.location)
        if node is not None and re.search(rf"\.{re.escape(setting.dest)}\b", code):  # read as an attribute
            found[node] = ", ".join(
                filter(None, (found.get(node), f"launch setting {setting.dest} = {setting.value!r}"))
            )
    return found


def _function_at(ctx: SideContext, location: Location) -> tuple[str, str] | None:
    """The innermost function around a line, as (path, qualified name)."""
    assert ctx.index is not None
    module = ctx.index.load(location.path)
    if module is None:
        return None
    around = [f for f in module.all_functions if f.span is not None and f.span[0] <= location.line <= f.span[1]]
    innermost = min(around, key=lambda f: f.span[1] - f.span[0], default=None)  # type: ignore[index]
    return (location.path, innermost.qualname) if innermost is not None else None


def _deferral(ctx: SideContext, instance: Val) -> tuple[FunctionInfo, cst.If] | None:
    """The branch of the layer's code that marks the tensor it returns for a reduction done later
    (`if fuse: hidden_states._needs_allreduce_fusion = True`). The files defining the functions
    the method calls are made readable: the condition is often a local set from one of them."""
    assert ctx.index is not None and isinstance(instance.v, ObjRef)
    for klass in ctx.evaluator.mro(instance.v.cls):
        for method in klass.methods.values():
            if "reduce" not in method.text or "= True" not in method.text:
                continue
            returned = _returned_names(method.node)
            for node in walk(method.node.body, lambda node: not isinstance(node, (cst.FunctionDef, cst.ClassDef))):
                if isinstance(node, cst.If) and _marks_for_reduction(node.body, returned):
                    called = [call_name(call) for call in walk(method.node) if isinstance(call, cst.Call)]
                    needles = [f"def {name}(" for name in dict.fromkeys(called) if name]
                    for relpaths in ctx.tree.grep(needles).values():
                        for relpath in relpaths:
                            ctx.index.allow(relpath)
                    return method, node
    return None


def _returned_names(function: cst.FunctionDef) -> set[str]:
    names: set[str] = set()
    for node in walk(function.body, lambda node: not isinstance(node, (cst.FunctionDef, cst.ClassDef))):
        if isinstance(node, cst.Return) and node.value is not None:
            for item in node.value.elements if isinstance(node.value, cst.Tuple) else [node.value]:
                value = item.value if isinstance(item, cst.Element) else item
                if isinstance(value, cst.Name):
                    names.add(value.value)
    return names


def _marks_for_reduction(block: cst.BaseSuite, returned: set[str]) -> bool:
    """`x.<...reduce...> = True` on a tensor the function returns."""
    for node in walk(block):
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Name) and node.value.value == "True":
            for target in node.targets:
                attribute = target.target
                if (
                    isinstance(attribute, cst.Attribute)
                    and isinstance(attribute.value, cst.Name)
                    and attribute.value.value in returned
                    and "reduce" in attribute.attr.value
                ):
                    return True
    return False
