"""Which layers the serving target captures for the draft, read from the runner and the model file."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import libcst as cst

from rca.sdk import (
    Analyzer,
    CaptureSet,
    Compares,
    Example,
    Fact,
    Finding,
    IdsOrigin,
    Location,
    Reports,
    SideContext,
    Step,
    StepKind,
)
from rca.sdk.code import ClassInfo, FunctionInfo, call_step, calls_named, store_location, walk
from rca.sdk.engines import ALL_HANDOFFS, handoffs, spec_method
from rca.sdk.examples import LAUNCH_GATED_DRAFT, LAUNCH_GATED_FILES, LAUNCH_GATED_TARGET, LLAMA_8B_TARGET
from rca.sdk.sides import reads_draft
from rca.sdk.values import ConfigObj, EvalRaise, ObjRef, Opaque, Val, describe, ints

_RUNNER = """
class ModelRunner:
    def __init__(self, server_args):
        self.eagle_aux_hidden_state_layer_ids = None
        if self.spec_algorithm.is_eagle3():
            draft_model_config = self._build_model_config(server_args, is_draft_model=True)
            try:
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                self.eagle_aux_hidden_state_layer_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                self.eagle_aux_hidden_state_layer_ids = None

    def init_aux_hidden_state_capture(self):
        self.model.set_eagle3_layers_to_capture(self.eagle_aux_hidden_state_layer_ids)
"""

_MIXTRAL = """
class MixtralForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        self.config = config
"""

_LLAMA = """
class LlamaModel(nn.Module):
    def __init__(self, config):
        self.layers = make_layers(config.num_hidden_layers)
        self.layers_to_capture = []

    def forward(self, input_ids, positions, input_embeds=None):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            layer = self.layers[i]
            hidden_states, residual = layer(positions, hidden_states, residual)
        return hidden_states, aux_hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        self.config = config
        self.model = LlamaModel(config)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
"""


_DEFAULTS_RUNNER = """
class GPUModelRunner:
    def load_model(self):
        if self.use_aux_hidden_state_outputs:
            self.model.set_eagle3_layers_to_capture(self.model.get_eagle3_aux_hidden_state_layers())
"""

# The same model with a default of its own that a runner may hand over (vLLM before 0.13).
_DEFAULTS_LLAMA = (
    _LLAMA
    + """
    def get_eagle3_aux_hidden_state_layers(self):
        num_layers = self.config.num_hidden_layers
        return (2, num_layers // 2, num_layers - 3)
"""
)


class CaptureLayers(Analyzer):
    """Reads where the serving runner takes the layer ids and what the target model makes of them.

    ## What it reads
    The call that hands the layer ids to the target (SGLang's
    `model.set_eagle3_layers_to_capture(ids)`, vLLM's `model.set_aux_hidden_state_layers(ids)`),
    the code that produced `ids` (the draft-config read, its fallback, the model's default), followed
    through callers where the ids arrive as a parameter, and the target class's method that turns
    them into the capture set (default list, `+1` transform, any special case a user added).

    ## Why it matters
    SGLang reads only `eagle_config.eagle_aux_hidden_state_layer_ids`, inside an `except` that
    silently falls back to the model's defaults; vLLM reads the top-level key. The `+1` (conditional
    in some model files) shifts every id by one layer relative to other engines.

    ## Findings
    `layer-ids-not-read`: the draft config's ids are not where the runner reads them, so the
    target captures its default layers. `draft-ids-never-read`: the runner hands over ids its code
    chooses and reads no draft-config key on the way (vLLM before 0.13's `get_eagle3_aux_hidden_state_layers()`),
    while the draft config declares its own. Both are evidence for `config-ignored`.
    """

    code = "RCA-S101"
    name = "capture-layers"
    sides = frozenset({"serving"})
    anchors = (*ALL_HANDOFFS, "eagle_aux_hidden_state_layer_ids")  # the hand-offs, and the readers of the key
    provides = (CaptureSet,)
    compares = Compares(
        training="the layers the draft was trained on (the training wiring)",
        serving=(
            "whether the target class the engine builds defines the capture method its runner hands the layer ids to"
        ),
    )
    reports = (
        Reports("layer-ids-not-read", hypothesis="config-ignored"),
        Reports("draft-ids-never-read", hypothesis="config-ignored"),
        Reports("aux-capture-off", hypothesis="aux-capture-off"),
        Reports("capture-unsupported", hypothesis="capture-unsupported"),
    )

    VALID = (
        Example(
            files={"sglang/srt/model_executor/model_runner.py": _RUNNER, "sglang/srt/models/llama.py": _LLAMA},
            target=LLAMA_8B_TARGET,
            draft={
                "architectures": ["LlamaForCausalLMEagle3"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]},
            },
            captured=("h2", "h16", "h29"),
            why="config ids k are captured at the entry of layer k+1: h(k+1)",
        ),
        Example(
            files={
                "sglang/srt/model_executor/model_runner.py": _RUNNER,
                "sglang/srt/models/llama.py": _LLAMA.replace(
                    "self.model.layers_to_capture = [val + 1 for val in layer_ids]",
                    "self.model.layers_to_capture = shift(layer_ids)",
                )
                + "\n\ndef shift(ids):\n    out = []\n    for i in ids:\n        out.append(i + 1)\n    return out\n",
            },
            target=LLAMA_8B_TARGET,
            draft={
                "architectures": ["LlamaForCausalLMEagle3"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]},
            },
            captured=("h2", "h16", "h29"),
            why="the +1 moved into a helper function reads the same",
        ),
    )
    INVALID = (
        Example(
            files={
                "sglang/srt/model_executor/model_runner.py": _RUNNER,
                "sglang/srt/models/llama.py": _LLAMA,
                "sglang/srt/models/mixtral.py": _MIXTRAL,
            },
            target={**LLAMA_8B_TARGET, "architectures": ["MixtralForCausalLM"]},
            draft={
                "architectures": ["LlamaForCausalLMEagle3"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]},
            },
            finding="capture-unsupported",
            message=(
                "example hands the layer ids to the target through set_eagle3_layers_to_capture "
                "(sglang/srt/model_executor/model_runner.py:14), which MixtralForCausalLM neither defines nor "
                "inherits: it captures no hidden states for the draft (the model files that define it: llama)"
            ),
            path="sglang/srt/models/mixtral.py",
            line=2,
            why="a target model file of the release without the capture method the runner calls",
        ),
        Example(
            files={"sglang/srt/model_executor/model_runner.py": _RUNNER, "sglang/srt/models/llama.py": _LLAMA},
            target=LLAMA_8B_TARGET,
            draft={"architectures": ["LlamaForCausalLMEagle3"], "eagle_aux_hidden_state_layer_ids": [2, 16, 29]},
            captured=("h2", "h16", "h29"),
            finding="layer-ids-not-read",
            message=(
                "the runner's read of the layer ids failed (TypeError: 'NoneType' object is not subscriptable) "
                "and the except at sglang/srt/model_executor/model_runner.py:10-11 swallowed it, so the target "
                "captures its default layers; the draft config declares them at eagle_aux_hidden_state_layer_ids"
            ),
            path="sglang/srt/model_executor/model_runner.py",
            line=10,
            why="ids at the top level are not read; the bare except falls back to the defaults",
        ),
        Example(
            files={"vllm/worker/runner.py": _DEFAULTS_RUNNER, "vllm/models/llama.py": _DEFAULTS_LLAMA},
            target=LLAMA_8B_TARGET,
            draft={"architectures": ["Eagle3LlamaForCausalLM"], "eagle_aux_hidden_state_layer_ids": [1, 15, 28]},
            captured=("h3", "h17", "h30"),
            finding="draft-ids-never-read",
            message=(
                "the runner hands the target the ids its code chooses, (2, 16, 29), at vllm/worker/runner.py:5 "
                "(captured as [3, 17, 30]) and reads no key of the draft config on the way: the draft config's "
                "eagle_aux_hidden_state_layer_ids [1, 15, 28] never reach the target"
            ),
            path="vllm/worker/runner.py",
            line=5,
            why="a runner that hands over the model's own default layers (vLLM 0.9.2) whatever the draft declares",
        ),
        Example(
            files=LAUNCH_GATED_FILES,
            target=LAUNCH_GATED_TARGET,
            draft=LAUNCH_GATED_DRAFT,
            settings="--speculative-algorithm EAGLE",
            finding="aux-capture-off",
            message=(
                "with the launch settings read on the way (speculative_algorithm = 'EAGLE' (--serving-args:1)) "
                "the condition at srt/model_runner.py:13 is false: the hand-off at srt/model_runner.py:14 never "
                "runs, so the target captures no layers for the draft"
            ),
            path="srt/model_runner.py",
            line=13,
            why="launched as EAGLE: the runner hands over no ids, so the target captures nothing for the draft",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        ev = ctx.evaluator
        model_class = target_class(ctx)
        if model_class is None:
            ctx.note(
                f"no class for the target architecture {', '.join(ctx.target.architectures) or '(none declared)'} "
                f"in {ctx.tree.label}"
            )
            return
        found: list[tuple[CaptureSet, list[Finding]]] = []
        problems: list[str] = []
        closed: list[Finding] = []
        for method_name in handoffs(spec_method(ctx)):
            for function, call in calls_named(ctx, method_name, outside_definitions=True):
                if call.args:  # each runner hands its ids to a target of its own: no state leaks between them
                    target = ev.new_object(model_class, [], {"config": Val(ConfigObj(ctx.target.config))})
                    result = self._handoff(ctx, target, model_class, method_name, function, call, problems, closed)
                    if result is not None:
                        found.append(result)
        if not found:
            for problem in problems:  # only when no hand-off resolved: the others are alternatives
                ctx.note(problem)
            yield from closed[:1]
            return
        # Several runners (vLLM's v1 and v2) may hand over ids: the one that reads the draft's
        # config is the one its ids reach; the others are noted.
        found.sort(key=lambda item: item[0].ids_origin is not IdsOrigin.CONFIG)
        chosen, findings = found[0]
        for other, _ in found[1:]:
            if describe(other.value) != describe(chosen.value):
                ctx.note(
                    f"another runner hands over different ids at {_where(other)}: {describe(other.ids)} -> "
                    f"{describe(other.value)}, where the one analyzed ({_where(chosen)}) hands over "
                    f"{describe(chosen.ids)} -> {describe(chosen.value)}"
                )
        yield from findings or self._never_read(ctx, chosen)
        yield chosen

    def _unsupported(self, ctx: SideContext, model_class: ClassInfo, method_name: str, delivery: Step) -> Finding:
        """The target class the engine builds has no capture method for the runner's hand-off."""
        where = model_class.module.location(model_class.node, model_class.node)
        defined = Step(
            replace(where, end_line=where.line),
            f"{model_class.name}, built for the target, defines no {method_name} (nor do its bases)",
            model_class.module.code(where.line, where.line),
            StepKind.ASSIGN,
            ctx.tree.is_patched(where.path),
        )
        others = sorted(
            relpath.rsplit("/", 1)[-1].removesuffix(".py")
            for relpath in ctx.anchor_files(f"def {method_name}(")
            if relpath != model_class.module.relpath
        )
        return self.finding(
            ctx,
            "capture-unsupported",
            f"{ctx.tree.label} hands the layer ids to the target through {method_name} ({delivery.location}), which "
            f"{model_class.name} neither defines nor inherits: it captures no hidden states for the draft"
            + (
                f" (the model files that define it: {', '.join(others[:6])}{', ...' if len(others) > 6 else ''})"
                if others
                else ""
            ),
            defined.location,
            likelihood_ratio=20.0,
            steps=(delivery, defined),
            fix=f"serve the draft on a release whose {model_class.name} defines {method_name}, or add it to "
            f"{model_class.module.relpath} as the release's other model files define it",
        )

    def _never_read(self, ctx: SideContext, chosen: CaptureSet) -> Iterator[Finding]:
        """The ids handed over come from the engine's code alone, with no draft-config key read or
        looked for on the way, while the draft declares its own: the draft's ids never reach the target."""
        declared = ctx.draft.declared_ids() if ctx.draft is not None else []
        if not declared or reads_draft(ctx, chosen.ids, looked_for=True):
            return
        assert ctx.draft is not None
        keypath, ids = declared[0]
        delivery = chosen.delivery or Step(chosen.location, "hands the layer ids to the target model")
        where = ctx.draft.config.location(keypath)
        chosen_ids = describe(chosen.ids)
        handed = "no ids (its default layers)" if chosen.ids.v is None else f"the ids its code chooses, {chosen_ids},"
        yield self.finding(
            ctx,
            "draft-ids-never-read",
            f"the runner hands the target {handed} at {delivery.location} (captured as {describe(chosen.value)}) and "
            f"reads no key of the draft config on the way: the draft config's {'.'.join(keypath)} {ids} never reach "
            "the target",
            delivery.location,
            likelihood_ratio=20.0,
            steps=(Step(where, f"declared, never read: {ids}", kind=StepKind.CONFIG), delivery),
            fix=(
                "serve the draft on an engine release whose runner reads the draft config's layer ids, or retrain it "
                f"on the layers this one captures ({describe(chosen.value).strip('()')})"
            ),
        )

    def _handoff(
        self,
        ctx: SideContext,
        target: Val,
        model_class,
        method_name: str,
        function,
        call: cst.Call,
        problems: list[str],
        closed: list[Finding],
    ) -> tuple[CaptureSet, list[Finding]] | None:
        """Evaluate one hand-off call: the ids it passes and the capture set the target makes."""
        ev = ctx.evaluator
        receiver = Val(ObjRef(function.owner)) if function.owner else None
        _seed_target(receiver, call, target)
        parameter = _receiver_parameter(function, call)
        with ev.trace() as trace:
            if parameter is not None:  # `set_...(model, spec_config)`: the model handed in is the target
                result = ev.run_to(function, call, receiver, {parameter: target})
            else:
                result = ev.run_to_call(function, call, receiver)
        if not result.reached or result.args is None or not result.args[0]:
            where = function.module.location(call, function.node)
            problems.append(f"the call at {where} was not reached: {result.reason}")
            settings = list(dict.fromkeys(read.node for read in trace.settings_read))
            if settings and result.location is not None:
                closed.append(self._capture_off(ctx, where, result.location, settings))
            return None
        ids = result.args[0][0]
        delivery, delivery_key = call_step(
            ctx, function.module, function, call, "hands the layer ids to the target model", ids
        )
        ids = Val(ids.v, frozenset({delivery_key}))
        handled = trace.handled
        keys = ctx.graph.keypaths(ids.src) + [path for event in handled for path in ctx.graph.keypaths(event.sources)]
        method = ev.field(target, method_name)
        if isinstance(method.v, Opaque):
            problems.append(
                f"{model_class.name} has no {method_name}: this engine cannot capture hidden states for an EAGLE-3 "
                f"draft on this target"
            )
            closed.append(self._unsupported(ctx, model_class, method_name, delivery))
            return None
        with ev.trace() as stored:
            try:
                ev.call(method, [ids], {}, call, None)
            except EvalRaise as error:  # the target refuses these ids: it captures nothing for them
                problems.append(
                    f"{model_class.name}.{method_name} raises {error.kind} at {error.location} when given the ids "
                    f"from {delivery.location}: {error.message[:120]}"
                )
                return None
        capture = _capture_store(stored.stores)
        if capture is None:
            problems.append(
                f"{model_class.name}.{method_name} stored no list of layer indices for the ids from {delivery.location}"
            )
            return None
        owner, attribute, value = capture
        origin = (
            IdsOrigin.DEFAULT if ids.v is None else (IdsOrigin.CONFIG if _from_config(ctx, ids) else IdsOrigin.CODE)
        )
        location = store_location(ctx, value, attribute) or delivery.location
        fact = CaptureSet(
            "serving",
            self.name,
            location,
            f"{owner.cls.name}.{attribute} = {describe(value)}",
            ids=ids,
            ids_origin=origin,
            owner=Val(owner),
            attribute=attribute,
            value=value,
            delivery=delivery,
            config_keys=tuple(sorted(dict.fromkeys(keys), key=len, reverse=True)),
        )
        return fact, list(self._fallbacks(ctx, handled))

    def _capture_off(self, ctx: SideContext, handoff: Location, condition: Location, settings: list) -> Finding:
        """The launch settings close the path to the hand-off: the target captures nothing."""
        read = "; ".join(f"{', '.join(ctx.graph.g.nodes[key]['values'])} ({key.location})" for key in settings)
        assert ctx.index is not None
        module = ctx.index.load(condition.path)
        test = module.code(condition.line, condition.end_line) if module is not None else ""
        return self.finding(
            ctx,
            "aux-capture-off",
            f"with the launch settings read on the way ({read}) the condition at {condition} is false: the hand-off at "
            f"{handoff} never runs, so the target captures no layers for the draft",
            condition,
            likelihood_ratio=50.0,
            steps=(
                *(ctx.graph.step(key) for key in settings),
                Step(condition, "false with these launch settings", test, kind=StepKind.TEST),
                Step(handoff, "never reached: no layers are captured", kind=StepKind.CALL),
            ),
        )

    def _fallbacks(self, ctx: SideContext, handled: list) -> Iterator[Finding]:
        for event in handled:
            if event.kind not in ("KeyError", "AttributeError", "TypeError") or event.handled_at is None:
                continue
            if not any(
                ctx.graph.derives_from(event.sources, kind) for kind in (StepKind.CONFIG, StepKind.CONFIG_MISSING)
            ):
                continue  # a failure that is not a read of the draft config (a lookup by a launch setting)
            declared = [".".join(path) for path, _ in (ctx.draft.declared_ids() if ctx.draft else [])]
            where = f"; the draft config declares them at {', '.join(declared)}" if declared else ""
            yield self.finding(
                ctx,
                "layer-ids-not-read",
                f"the runner's read of the layer ids failed ({event.kind}: {event.message}) and the except at "
                f"{event.handled_at} swallowed it, so the target captures its default layers{where}",
                event.handled_at,
                likelihood_ratio=20.0,
            )


def _where(capture: CaptureSet) -> str:
    """Where a runner hands its ids over (the capture's own step where the hand-off is not known)."""
    return str(capture.delivery.location if capture.delivery else capture.location)


def target_class(ctx: SideContext):
    for name in (*ctx.target.architectures, *ctx.target.text_architectures()):
        cls = ctx.find_class(name)
        if cls is not None:
            return cls
    return None


def _seed_target(receiver: Val | None, call: cst.Call, target: Val) -> None:
    """`self.model.<hand-off>(...)`: the runner's `self.model` is the target model."""
    func = call.func
    if receiver is None or not isinstance(func, cst.Attribute):
        return
    holder = func.value
    if isinstance(holder, cst.Attribute) and isinstance(holder.value, cst.Name) and holder.value.value == "self":
        receiver.v.fields[holder.attr.value] = target


def _receiver_parameter(function: FunctionInfo, call: cst.Call) -> str | None:
    """The parameter the hand-off's receiver is (`model.<hand-off>(...)`) or is made from
    (`eagle3_model = cast(SupportsEagle3, model)`): a helper handed the target model (vLLM 0.34's
    `set_eagle3_aux_hidden_state_layers(model, spec_config)`)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)) or func.value.value == "self":
        return None
    parameters = [param.name.value for param in function.node.params.params]
    name = func.value.value
    if name in parameters:
        return name
    for node in walk(function.node.body):
        if isinstance(node, cst.Assign) and any(
            isinstance(target.target, cst.Name) and target.target.value == name for target in node.targets
        ):
            used = [item.value for item in walk(node.value) if isinstance(item, cst.Name)]
            return next((item for item in used if item in parameters), None)
    return None


def _capture_store(stores: list) -> tuple | None:
    """The field store that holds layer indices (a list, tuple or set of ints)."""
    for owner, attribute, value in stores:
        if ints(value) is not None and ints(value):
            return owner, attribute, value
    return None


def _from_config(ctx: SideContext, value: Val) -> bool:
    return ctx.graph.derives_from(value.src, StepKind.CONFIG)
