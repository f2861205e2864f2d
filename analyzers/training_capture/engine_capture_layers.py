"""Which layers a trainer asks an inference engine, running inside it, to capture."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from rca.sdk import (
    Analyzer,
    CapturedTaps,
    CaptureSet,
    DraftInput,
    Example,
    Fact,
    Finding,
    IdsOrigin,
    SideContext,
    Step,
    StepKind,
    Tap,
)
from rca.sdk.code import FunctionInfo, ModuleInfo, call_step, calls_named, walk
from rca.sdk.engines import HANDOFFS
from rca.sdk.examples import DEFAULTS_MODEL, LLAMA_8B_TARGET
from rca.sdk.sides import capture_by_engine, dump_ids
from rca.sdk.values import NONE, ConfigObj, FuncRef, MutList, Opaque, Val, describe, ints, tap_tensor

KEY = "eagle_aux_hidden_state_layer_ids"
AUX_RECORD = "aux_hidden_state"  # the pre-concatenated capture in an SGLang-engine dump
LAST_RECORD = "hidden_state"  # the engine's last hidden state (after its final norm)
_CONVENTION = (
    "SGLang's numbering is assumed: id k is h(k+1), captured at the entry of layer k+1 (DeepSeek-family "
    "models from SGLang 0.5.13 add 1 only when the first id is 1)"
)

_BACKEND = """
class CaptureBackend:
    def __init__(self, model_runner):
        self.model_runner = model_runner

    def set_capture_layers(self, layer_ids):
        self.model_runner.model.set_eagle3_layers_to_capture(layer_ids)
"""

_PROVIDERS = """
def resolve_capture_layers(cfg, draft_config, target_config):
    layers = cfg.model.aux_hidden_state_layer_ids
    if layers is None:
        eagle_config = getattr(draft_config, "eagle_config", {}) or {}
        layers = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    if layers is None:
        num_layers = int(target_config.num_hidden_layers)
        layers = [1, num_layers // 2 - 1, num_layers - 4]
    return list(layers)
"""

_DATASET = """
def process_sample(raw, max_len):
    hidden_state = raw["aux_hidden_state"][:max_len]
    target = raw["hidden_state"][:max_len]
    return {"hidden_state": hidden_state, "target": target, "input_ids": raw["input_ids"][:max_len]}
"""

_FILES = {"capture/backend.py": _BACKEND, "algorithms/providers.py": _PROVIDERS, "data/preprocessing.py": _DATASET}

# An engine in SGLang's shape whose model adds one only when the first id is 1 (DeepSeek, 0.5.13+).
_ENGINE_RUNNER = """
class ModelRunner:
    def init_aux_hidden_state_capture(self):
        self.model.set_eagle3_layers_to_capture(self.draft_config.eagle_config["eagle_aux_hidden_state_layer_ids"])
"""
_ENGINE_MODEL = DEFAULTS_MODEL.replace("class Model(", "class LlamaForCausalLM(").replace(
    "        if layer_ids is None:\n"
    "            num_layers = self.config.num_hidden_layers\n"
    "            self.layers_to_capture = [2, num_layers // 2, num_layers - 3]\n"
    "        else:\n"
    "            self.layers_to_capture = [val + 1 for val in layer_ids]\n",
    "        if layer_ids and layer_ids[0] == 1:\n"
    "            self.layers_to_capture = [val + 1 for val in layer_ids]\n"
    "        else:\n"
    "            self.layers_to_capture = list(layer_ids)\n",
)
_ENGINE = {"engine/model_runner.py": _ENGINE_RUNNER, "engine/models/llama.py": _ENGINE_MODEL}


class EngineCaptureLayers(Analyzer):
    """Reads the layers a trainer has an in-process engine capture (SpecForge 0.2's SGLang runner).

    ## What it reads
    A call of the engine's capture hand-off (`model.set_eagle3_layers_to_capture(ids)`) on a model
    the training source does not define, and the function that decides the ids: one that reads the
    draft config's `eagle_aux_hidden_state_layer_ids` and falls back on the target's layer count,
    evaluated with the given draft and target configs (a run setting that would override them is
    not an input: it is taken as unset). The dump's own record wins when given. The engine is not
    in the training source, so its numbering is stated as an assumption; the captures reach the
    trainer concatenated in layer order (`aux_hidden_state`), beside the engine's final state.

    ## Why it matters
    Such a trainer writes ids in the engine's numbering (SGLang's k is h(k+1)) and often records
    none in the exported config: served on an engine with another numbering, every slot shifts.
    """

    code = "RCA-T106"
    name = "engine-capture-layers"
    sides = frozenset({"training"})
    anchors = (*HANDOFFS, KEY)
    provides = (CaptureSet, CapturedTaps, DraftInput)
    precedence = 30

    VALID = (
        Example(
            files=_FILES,
            target=LLAMA_8B_TARGET,
            slots=("h2", "h16", "h29"),
            verifier_last="h32+norm",
            why="the trainer's fallback [1, L//2-1, L-4], in SGLang's numbering",
        ),
        Example(
            files=_FILES,
            target=LLAMA_8B_TARGET,
            draft={"eagle_config": {KEY: [2, 16, 29]}},
            slots=("h3", "h17", "h30"),
            verifier_last="h32+norm",
            why="the draft config's nested ids come first",
        ),
        Example(
            files=_FILES,
            target=LLAMA_8B_TARGET,
            draft={"eagle_config": {KEY: [2, 16, 29]}},
            engine=_ENGINE,
            slots=("h2", "h16", "h29"),
            verifier_last="h32+norm",
            why="with the engine's source given, its numbering is read, not assumed: no +1 unless the first id is 1",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        site = self._handoff(ctx)
        if site is None:
            return
        function, call = site
        found = self._ids(ctx)
        if found is None:
            ctx.note(
                f"the layer ids handed to the engine at {function.module.location(call, function.node)} could not "
                f"be resolved"
            )
            return
        ids, origin = found
        step, handoff = call_step(
            ctx, function.module, function, call, "hands the layer ids to the engine the trainer runs", ids
        )
        ctx.graph.observe(handoff, describe(ids))
        listed = ints(ids) or []
        engine = capture_by_engine(ctx, listed)
        if engine is None:
            ctx.note(f"the engine is not in {ctx.tree.label}; {_CONVENTION} (pass --training-engine to read it)")
        layers = ctx.target.num_layers
        taps = (
            list(engine.taps)
            if engine is not None
            else [Tap(k + 1) for k in sorted(set(listed)) if 0 <= k + 1 <= layers]
        )
        stored = Val(MutList([Val(tap.layer, frozenset({handoff})) for tap in taps]), frozenset({handoff}))
        yield CaptureSet(
            "training",
            self.name,
            step.location,
            f"the engine captures {', '.join(map(str, taps))}",
            ids=ids,
            ids_origin=origin,
            owner=Val(Opaque("engine", "", "the inference engine the trainer runs")),
            attribute="",
            value=stored,
            delivery=step,
        )
        yield CapturedTaps(
            "training",
            self.name,
            step.location,
            f"the engine captures {', '.join(map(str, taps))} in layer order",
            tensors=tuple(tap_tensor(tap) for tap in taps),
            sinks=(handoff,),
            steps=engine.steps if engine else (),
        )
        reader = _record_reads(ctx)
        steps = tuple(step for step in reader if step is not None)
        yield DraftInput(
            "training",
            self.name,
            steps[0].location if steps else step.location,
            "the engine's concatenated captures feed fc; its final state trains the verifier head",
            slots=tuple(taps),
            verifier_last=Tap(layers, norm=True) if reader[1] is not None else None,
            sinks=(handoff,),
            steps=steps,
        )

    def _handoff(self, ctx: SideContext) -> tuple[FunctionInfo, cst.Call] | None:
        """The hand-off call on an engine model this source does not define."""
        for name in HANDOFFS:
            for function, call in calls_named(ctx, name, outside_definitions=True):
                if call.args and not ctx.evaluator.find_methods(name):
                    return function, call
        return None

    def _ids(self, ctx: SideContext) -> tuple[Val, IdsOrigin] | None:
        recorded = dump_ids(ctx)
        if recorded is not None:
            return recorded, IdsOrigin.DUMP_METADATA
        for resolver in self._resolvers(ctx):
            bindings = []
            for param in resolver.node.params.params:
                name = param.name.value
                if "draft" in name:
                    bindings.append(Val(ConfigObj(ctx.draft.config)) if ctx.draft is not None else NONE)
                elif "target" in name:
                    bindings.append(Val(ConfigObj(ctx.target.config)))
                else:
                    bindings.append(Val(Opaque(name, "", "a run setting that is not an input")))
            result = ctx.evaluator.call(Val(FuncRef(resolver)), bindings, {})
            if ints(result):
                return result, IdsOrigin.CONFIG if ctx.graph.derives_from(
                    result.src, StepKind.CONFIG
                ) and ctx.draft is not None and ctx.draft.declared_ids() else IdsOrigin.DEFAULT
        return None

    def _resolvers(self, ctx: SideContext) -> list[FunctionInfo]:
        """Module functions that read the draft's ids key and fall back on the target's layer count."""
        assert ctx.index is not None
        found = []
        for relpath in ctx.anchor_files(KEY):
            module = ctx.index.load(relpath)
            if module is None:
                continue
            for function in module.all_functions:
                if function.owner is None and KEY in function.text and "num_hidden_layers" in function.text:
                    found.append(function)
        return found


def _record_reads(ctx: SideContext) -> tuple[Step | None, Step | None]:
    """Where the trainer reads the dump's concatenated captures and its final state."""
    assert ctx.index is not None
    found: dict[str, Step] = {}
    for relpath in ctx.tree.grep([f'["{AUX_RECORD}"]'])[f'["{AUX_RECORD}"]']:
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if f'"{AUX_RECORD}"' not in function.text:
                continue
            for record, node in _record_subscripts(module, function):
                note = (
                    "the engine's concatenated captures become the draft's input"
                    if record == AUX_RECORD
                    else "the engine's final state (after its norm) trains the verifier head"
                )
                found.setdefault(record, module.step(node, function.node, note))
            if AUX_RECORD in found:
                return found.get(AUX_RECORD), found.get(LAST_RECORD)
    return None, None


def _record_subscripts(module: ModuleInfo, function: FunctionInfo) -> Iterator[tuple[str, cst.Subscript]]:
    for node in walk(function.node.body):
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            index = node.slice[0].slice.value
            if isinstance(index, cst.SimpleString) and index.evaluated_value in (AUX_RECORD, LAST_RECORD):
                yield index.evaluated_value, node
