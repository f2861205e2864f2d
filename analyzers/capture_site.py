"""Where the target's forward captures hidden states, and which taps it captures."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from rca.analyzers._examples import (
    CAPTURE_AFTER,
    CAPTURE_BEFORE,
    DRAFT_IDS_0_3_5,
    LOOP_MODEL,
    SGLANG_RUNNER,
    SMALL_TARGET,
)
from rca.analyzers._support import has_loop, ints, reads_attribute

from rca.static.analyzer import Analyzer, Example, Reports
from rca.static.codeindex import FunctionInfo
from rca.static.context import SideContext
from rca.static.evaluate.values import (
    EvalRaise,
    FuncRef,
    ObjRef,
    Opaque,
    TensorVal,
    Val,
    describe,
)
from rca.static.facts import CapturedTaps, CaptureSet, Fact, Finding


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
    anchors = ("captured_last_layer_outputs",)
    requires = (CaptureSet,)
    provides = (CapturedTaps,)
    reports = (Reports("ids-out-of-layer-order", hypothesis="slot-order"),)

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
            line=3,
            why="the ids are listed [5, 0, 3]; the loop captures h1, h4, h6 in layer order",
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
            ctx.memo[(self.name, capture.attribute, describe(capture.value))] = captured_taps
            yield captured_taps
            return
        ctx.note(
            f"the capture set `{capture.attribute}` is stored at {capture.location}, but no forward pass "
            "that tests it and captures hidden states was found"
        )

    def _listing_order(
        self, ctx: SideContext, capture: CaptureSet, tensors: tuple[TensorVal, ...]
    ) -> Iterator[Finding]:
        """Config ids listed out of layer order, captured by a loop over the layers: the slots
        follow the layers, not the list."""
        listed = ints(capture.ids)
        taps = [tensor.as_tap() for tensor in tensors]
        if (
            capture.ids_origin != "config"
            or not listed
            or listed == sorted(listed)
            or any(tap is None or tap.layer is None for tap in taps)
        ):
            return
        layers = [tap.layer for tap in taps]  # type: ignore[union-attr]
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
