"""Where the target's forward captures hidden states, and which taps it captures."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from rca.sdk import Analyzer, CapturedTaps, CaptureSet, Example, Fact, Finding, IdsOrigin, Reports, SideContext, Step
from rca.sdk.code import FunctionInfo, has_loop, reads_attribute
from rca.sdk.examples import (
    CAPTURE_AFTER,
    CAPTURE_BEFORE,
    DRAFT_IDS_0_3_5,
    LOOP_MODEL,
    PP_FILES,
    PP_MODEL,
    PP_RELAY,
    SGLANG_RUNNER,
    SMALL_TARGET,
)
from rca.sdk.sides import pipeline_stages
from rca.sdk.values import (
    Assumption,
    EvalRaise,
    FuncRef,
    MutDict,
    MutList,
    ObjRef,
    Opaque,
    TensorVal,
    Val,
    describe,
    ints,
)

_PARTITION = "get_pp_indices"  # vLLM's split of the decoder layers into pipeline stages


class CaptureSite(Analyzer):
    """Evaluates the forward pass that tests the capture set and collects the captured tensors.

    ## What it reads
    Functions that read the capture set's field (found by the analyzer that established the set)
    and loop over the decoder layers. The loop is evaluated layer by layer: whether a tensor is
    taken before or after the layer call, whether the residual is added, helper calls and
    accumulators, and the order of capture all follow from the code.

    ## Why it matters
    A capture moved after the layer call, or taken without `+ residual`, changes every tap by one
    layer or drops the residual stream, silently.

    ## Finding
    `ids-out-of-layer-order`: the config lists the ids out of layer order, but the loop captures
    in layer order, so a draft trained in the listed order sees its slots permuted. Evidence for
    `slot-order`.
    """

    code = "RCA-S102"
    name = "capture-site"
    sides = frozenset({"serving", "training"})
    # Files where a layer's own code captures what it is handed (SGLang's layer communicator).
    # and the function that splits the layers into pipeline stages.
    anchors = ("captured_last_layer_outputs", f"def {_PARTITION}(")
    requires = (CaptureSet,)
    provides = (CapturedTaps,)
    reports = (
        Reports("ids-out-of-layer-order", hypothesis="slot-order"),
        Reports("stage-local-layers", hypothesis="pp-stage-local-layers"),
    )

    VALID = (
        Example(
            files={
                "runner.py": SGLANG_RUNNER,
                "model.py": LOOP_MODEL.format(capture_before=CAPTURE_BEFORE, capture_after="pass"),
            },
            target=SMALL_TARGET,
            draft=DRAFT_IDS_0_3_5,
            captured=("h1", "h4", "h6"),
            why="captured at the entry of layer i: h(i)",
        ),
        Example(
            files={
                "runner.py": SGLANG_RUNNER,
                "model.py": LOOP_MODEL.format(capture_before="pass", capture_after=CAPTURE_AFTER),
            },
            target=SMALL_TARGET,
            draft=DRAFT_IDS_0_3_5,
            captured=("h1", "h4", "h6"),
            why="the same taps captured after the layer call with the index moved by one",
        ),
        Example(
            files={
                "runner.py": SGLANG_RUNNER,
                "model.py": LOOP_MODEL.format(capture_before="pass", capture_after=CAPTURE_BEFORE),
            },
            target=SMALL_TARGET,
            draft=DRAFT_IDS_0_3_5,
            captured=("h2", "h5", "h7"),
            why="the capture moved after the layer call without changing the index: one layer later",
        ),
        Example(
            files={**PP_FILES, "model.py": PP_MODEL.format(start=", start=self.start_layer", relay=PP_RELAY)},
            target=SMALL_TARGET,
            draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}},
            settings="--pipeline-parallel-size 2",
            captured=("h1", "h3", "h6"),
            why="two stages that number their layers globally, the first handing its captures on: as one stage",
        ),
        Example(
            files={**PP_FILES, "model.py": PP_MODEL.format(start="", relay="")},
            target=SMALL_TARGET,
            draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}},
            captured=("h1", "h3", "h6"),
            why="the loop that counts within a stage, served on one stage: every id is a global layer",
        ),
    )
    INVALID = (
        Example(
            files={
                "runner.py": SGLANG_RUNNER,
                "model.py": LOOP_MODEL.format(capture_before=CAPTURE_BEFORE, capture_after="pass"),
            },
            target=SMALL_TARGET,
            draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [5, 0, 3]}},
            captured=("h1", "h4", "h6"),
            finding="ids-out-of-layer-order",
            message=(
                "the draft config lists the layer ids as [5, 0, 3], but the capture loop takes layers in order, "
                "so the slots are h1, h4, h6: slot i is not the i-th listed id"
            ),
            path="draft.json",
            key=("eagle_config", "eagle_aux_hidden_state_layer_ids"),
            why="the ids are listed [5, 0, 3]; the loop captures h1, h4, h6 in layer order",
        ),
        Example(
            files={**PP_FILES, "model.py": PP_MODEL.format(start="", relay="")},
            target=SMALL_TARGET,
            draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}},
            settings="--pipeline-parallel-size 2",
            captured=("h5", "h7"),
            finding="stage-local-layers",
            message=(
                "the launch serves 2 pipeline stages (--serving-args:1), split at utils.py:2-6: stage 0 (layers 0-3) "
                "captures h1, h3, which it does not hand on; stage 1 (layers 4-7) captures h5, h7. The draft on the "
                "last stage is fed h5, h7, where one stage captures h1, h3, h6: the last stage matches the ids "
                "against layers counted from its own first layer (4)"
            ),
            path="model.py",
            line=14,
            why="each stage numbers its layers from 0 and hands on only its hidden states (vLLM 0.22's models)",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return True  # wherever a capture set was established; the anchor only marks extra files to read

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        capture = ctx.fact(CaptureSet)
        assert capture is not None
        remembered = ctx.memo.get((self.name, capture.attribute, describe(capture.value)))
        if remembered is not None:  # a fix trial whose ids make the same capture set: same forward, same taps
            yield replace(remembered, sinks=())
            return
        ev = ctx.evaluator
        for function, receiver in self._readers(ctx, capture):
            if receiver is None:
                ev.link(capture.attribute, capture.value)
                receiver = Val(Opaque("model", "", "the target model whose forward is replaced"))
            with ev.trace() as trace:
                try:
                    ev.call(Val(FuncRef(function, bound=receiver)), [], {})
                except EvalRaise as error:  # what was captured before it still counts
                    ctx.note(
                        f"evaluating {function.qualname} stopped "
                        f"at {error.location}: {error.kind}: {error.message[:120]}"
                    )
            decided = _decided_by(ctx, capture)
            captured = [
                event for event in trace.appends if any(key in decided for key in (*event.controls, *event.value.src))
            ]
            if not captured:
                continue
            list_id = captured[0].list_id
            events = [event for event in trace.appends if event.list_id == list_id]
            tensors = tuple(event.value.v for event in events if isinstance(event.value.v, TensorVal))
            sinks = tuple(dict.fromkeys(event.node for event in events))
            yield from self._listing_order(ctx, capture, tensors)
            captured_taps = CapturedTaps(
                ctx.side,
                self.name,
                function.module.location(function.node, function.node),
                f"{function.qualname} captures {', '.join(tensor.describe() for tensor in tensors)}",
                tensors=tensors,
                sinks=sinks,
            )
            staged = self._staged(ctx, capture, function, receiver, tensors) if pipeline_stages(ctx) else None
            if staged is not None:
                served, served_sinks, finding = staged
                yield finding
                captured_taps = replace(
                    captured_taps,
                    note=f"{function.qualname} feeds the draft {', '.join(t.describe() for t in served)} "
                    f"across the launch's pipeline stages",
                    tensors=served,
                    sinks=served_sinks,
                )
            ctx.memo[(self.name, capture.attribute, describe(capture.value))] = captured_taps
            yield captured_taps
            return
        ctx.note(
            f"the capture set `{capture.attribute}` is stored at {capture.location}, but no forward pass "
            "that tests it and captures hidden states was found"
        )

    def _staged(
        self,
        ctx: SideContext,
        capture: CaptureSet,
        function: FunctionInfo,
        receiver: Val,
        single: tuple[TensorVal, ...],
    ) -> tuple[tuple[TensorVal, ...], tuple, Finding] | None:
        """With more than one pipeline stage, each stage runs this forward over its own layers: what
        each captures, and what reaches the draft on the last stage (its own captures, and an earlier
        stage's where what that stage hands on carries them). A finding where that is not what one
        stage captures."""
        stages = pipeline_stages(ctx)
        assert stages is not None
        count, setting = stages
        bounds = _stage_bounds(ctx, count)
        if bounds is None:
            ctx.note(
                f"the launch serves {count} pipeline stages, but no partition of the layers (get_pp_indices) was "
                "found: the taps are those of a single stage"
            )
            return None
        partition, parts = bounds
        received = [param.name.value for param in function.node.params.params if param.name.value in _STAGE_INPUTS]
        if not received:
            ctx.note(
                f"the launch serves {count} pipeline stages, but {function.qualname} takes what an earlier stage hands "
                f"on in no parameter read here ({', '.join(_STAGE_INPUTS)}): the taps are those of a single stage"
            )
            return None
        ev = ctx.evaluator
        served: list[TensorVal] = []
        sinks: list = []
        views: list[str] = []
        for rank, (start, end) in enumerate(parts):
            first, last = rank == 0, rank == count - 1
            why = f"pipeline stage {rank} of {count} (layers {start}-{end - 1})"
            view = {
                "start_layer": Assumption(start, why),
                "end_layer": Assumption(end, why),
                "is_first_rank": Assumption(first, why),
                "is_last_rank": Assumption(last, why),
            }
            handed = {} if first else {received[0]: _stage_input(start)}
            returned: Val | None = None
            with ev.policy.stage(view), ev.trace() as trace:
                try:
                    returned = ev.call(Val(FuncRef(function, bound=receiver)), [], handed)
                except EvalRaise as error:  # a stage not read to its end: no claim about what reaches the draft
                    ctx.note(
                        f"evaluating {function.qualname} for {why} stopped at {error.location}: {error.kind}; the taps "
                        "are those of a single stage"
                    )
                    return None
            decided = _decided_by(ctx, capture)
            events = [
                event for event in trace.appends if any(key in decided for key in (*event.controls, *event.value.src))
            ]
            events = [event for event in trace.appends if events and event.list_id == events[0].list_id]
            taps = [event.value.v for event in events if isinstance(event.value.v, TensorVal)]
            passed = last or (returned is not None and bool(taps) and _carries(returned, taps))
            if passed:
                served += taps
                sinks += [event.node for event in events]
            shown = ", ".join(tap.describe() for tap in taps) or "nothing"
            views.append(
                f"stage {rank} (layers {start}-{end - 1}) captures {shown}"
                + ("" if last or not taps else " and hands them on" if passed else ", which it does not hand on")
            )
        if [t.describe() for t in served] == [t.describe() for t in single]:
            ctx.note(
                f"the launch serves {count} pipeline stages ({setting.location}), split at {partition.location}: "
                + "; ".join(views)
                + ", as one stage does"
            )
            return None
        message = (
            f"the launch serves {count} pipeline stages ({setting.location}), split at {partition.location}: "
            + "; ".join(views)
            + f". The draft on the last stage is fed {', '.join(t.describe() for t in served) or 'nothing'}, "
            f"where one stage captures {', '.join(t.describe() for t in single)}"
        )
        last_start = parts[-1][0]
        local = [t.as_tap() for t in served]
        if all(tap is not None and tap.layer is not None for tap in local) and {
            tap.layer - last_start for tap in local if tap is not None and tap.layer is not None
        } <= {tap.layer for t in single if (tap := t.as_tap()) is not None}:
            message += (
                f": the last stage matches the ids against layers counted from its own first layer ({last_start})"
            )
        finding = self.finding(
            ctx,
            "stage-local-layers",
            message,
            function.module.location(function.node, function.node),
            likelihood_ratio=50.0,
            steps=(setting, partition),
            taps=tuple(tap for tap in (t.as_tap() for t in served) if tap is not None),
        )
        return tuple(served), tuple(dict.fromkeys(sinks)), finding

    def _listing_order(
        self, ctx: SideContext, capture: CaptureSet, tensors: tuple[TensorVal, ...]
    ) -> Iterator[Finding]:
        """Config ids listed out of layer order, captured by a loop over the layers: the slots
        follow the layers, not the list."""
        listed = ints(capture.ids)
        taps = [tensor.as_tap() for tensor in tensors]
        if (
            capture.ids_origin is not IdsOrigin.CONFIG
            or not listed
            or listed == sorted(listed)
            or any(tap is None or tap.layer is None for tap in taps)
        ):
            return
        layers = [tap.layer for tap in taps if tap is not None and tap.layer is not None]  # all are (checked above)
        if layers != sorted(layers):
            return  # the capture follows the list after all
        config = ctx.draft.config if ctx.draft is not None else None
        keypath = next((path for path in capture.config_keys if config is not None and config.lookup(path)[0]), None)
        location = config.location(keypath) if config is not None and keypath is not None else capture.location
        yield self.finding(
            ctx,
            "ids-out-of-layer-order",
            f"the draft config lists the layer ids as {listed}, but the capture loop takes layers in order, so the "
            f"slots are "
            f"{', '.join(str(tap) for tap in taps)}: slot i is not the i-th listed id",
            location,
            likelihood_ratio=10.0,
        )

    def _readers(self, ctx: SideContext, capture: CaptureSet) -> Iterator[tuple[FunctionInfo, Val | None]]:
        """Functions that read the capture field and loop (methods of its owner first, then its
        `forward`, which may read per-layer flags instead), then functions elsewhere."""
        assert ctx.index is not None
        owner = capture.owner.v
        seen: set[int] = set()
        if isinstance(owner, ObjRef):
            methods = [
                method
                for klass in ctx.evaluator.mro(owner.cls)
                for method in klass.methods.values()
                if method.name != "__init__"
            ]
            reading = [
                m
                for m in methods
                if capture.attribute in m.text and has_loop(m) and reads_attribute(m, capture.attribute)
            ]
            ranked = reading + [m for m in methods if m.name == "forward" and has_loop(m)]
            for method in ranked:
                if id(method.node) not in seen:
                    seen.add(id(method.node))
                    yield method, capture.owner
        needle = f".{capture.attribute}"
        for relpath in ctx.tree.grep([needle])[needle]:
            if not ctx.index.loadable(relpath):
                continue
            module = ctx.index.load(relpath)
            if module is None:
                continue
            for function in module.all_functions:
                if function.owner is not None or needle not in function.text or id(function.node) in seen:
                    continue
                if reads_attribute(function, capture.attribute) and has_loop(function):
                    yield function, None


def _decided_by(ctx: SideContext, capture: CaptureSet) -> set:
    """Graph nodes that follow from the delivered ids: a condition among them decides captures."""
    roots = [key for key in (*capture.ids.src, *capture.value.src) if key in ctx.graph.g]
    decided: set = set(roots)
    for root in roots:
        decided |= ctx.graph.descendants(root)
    return decided


def _stage_bounds(ctx: SideContext, count: int) -> tuple[Step, list[tuple[int, int]]] | None:
    """Each stage's layers, from the engine's partition function evaluated for every rank."""
    assert ctx.index is not None
    layers = ctx.evaluator.num_layers
    if not layers:
        return None
    needle = f"def {_PARTITION}("
    for relpath in ctx.tree.grep([needle])[needle]:
        module = ctx.index.load(relpath) if ctx.index.loadable(relpath) else None
        partition = next((f for f in module.all_functions if f.name == _PARTITION), None) if module else None
        if module is None or partition is None:
            continue
        parts = []
        for rank in range(count):
            try:
                value = ctx.evaluator.call(Val(FuncRef(partition)), [Val(layers), Val(rank), Val(count)], {})
            except EvalRaise:
                return None
            bounds = ints(value)
            if bounds is None or len(bounds) != 2:
                return None
            parts.append((bounds[0], bounds[1]))
        step = Step(module.location(partition.node, partition.node), "splits the decoder layers into stages")
        return step, parts
    return None


# The parameter through which a stage's forward receives what the stage before it hands on (vLLM's).
_STAGE_INPUTS = ("intermediate_tensors",)


def _stage_input(start: int) -> Val:
    """What a stage after the first receives: the stream after `start` layers, as (hidden, residual)."""
    return Val(
        MutDict(
            {
                "hidden_states": Val(TensorVal("part", layer=start, part="hidden")),
                "residual": Val(TensorVal("part", layer=start, part="residual")),
            }
        )
    )


def _carries(value: Val, tensors: list[TensorVal], depth: int = 0) -> bool:
    """Whether a returned value holds any of these tensors (in a dict, a list, an object's fields,
    or the arguments of an unknown constructor such as `IntermediateTensors({...})`)."""
    payload = value.v
    if depth > 4:
        return False
    if isinstance(payload, TensorVal):
        return any(payload is tensor for tensor in tensors)
    if isinstance(payload, MutList):
        items = payload.items
    elif isinstance(payload, MutDict):
        items = list(payload.items.values())
    elif isinstance(payload, ObjRef):
        items = list(payload.fields.values())
    elif isinstance(payload, Opaque):
        items = payload.call_args()
    else:
        return False
    return any(_carries(item, tensors, depth + 1) for item in items)
