"""Turn one side's facts into its wiring: the slots, the verifier-last tap, and every cited step."""

from __future__ import annotations

from dataclasses import replace

from rca.model import DERIVATION_SOURCES, Drafting, Note, Step, StepKind, Wiring
from rca.static.context import SideContext
from rca.static.evaluate.values import MutList, SetVal
from rca.static.facts import (
    Aspect,
    CapturedTaps,
    CaptureSet,
    DraftInput,
    DraftWidth,
)
from rca.static.graph import NodeKey

# How a source names EAGLE-3 anywhere (a class, a flag, a method string): none of them, no EAGLE-3 path.
EAGLE3_NAMES = ("eagle3", "Eagle3", "EAGLE3", "eagle_3")

# Graph nodes not shown as steps: what was assumed is read from the graph (rca graph), not the derivation.
HIDDEN_KINDS = frozenset({StepKind.ASSUMPTION})


def resolve_wiring(ctx: SideContext) -> Wiring:
    draft_input = ctx.fact(DraftInput)
    captured = ctx.fact(CapturedTaps)
    capture = ctx.fact(CaptureSet)
    width = ctx.fact(DraftWidth)
    notes = [str(note) for note in ctx.notes if note.side == ctx.side]
    notes += [str(Note(ctx.side, str(unmodeled))) for unmodeled in ctx.unmodeled()]
    sinks: tuple[NodeKey, ...] = ()
    slots: tuple = ()
    verifier_last = None
    extra: tuple[Step, ...] = ()
    if draft_input is not None:
        slots, verifier_last, sinks, extra = (
            draft_input.slots,
            draft_input.verifier_last,
            draft_input.sinks,
            draft_input.steps,
        )
        extra = (*(captured.steps if captured is not None else ()), *extra)
    elif captured is not None:
        slots, sinks = tuple(tap for tap in captured.taps if tap is not None), captured.sinks
        notes.append(
            str(
                Note(
                    ctx.side, "how the captured states become the draft input was not found; slots are in capture order"
                )
            )
        )
    if not slots and ctx.drafting is Drafting.CAPTURED:  # MTP layers are fed no captured states
        mentions = ctx.tree.grep(EAGLE3_NAMES)
        notes.append(
            str(
                Note(
                    ctx.side,
                    f"no hidden states fed to the draft were found in {ctx.tree.label}"
                    if any(mentions.values())
                    else f"{ctx.tree.label} has no EAGLE-3 path (it never names EAGLE-3): pass a source or release "
                    f"that {'serves' if ctx.side == 'serving' else 'trains'} EAGLE-3 drafts to --{ctx.side}",
                )
            )
        )
    steps = _path_steps(ctx, sinks, capture)
    steps += [_mark_patched(ctx, step) for step in extra if step.location not in {s.location for s in steps}]
    store = [key for key in capture.value.src if key in ctx.graph.g] if capture is not None else []
    ids_steps = _path_steps(ctx, tuple(store), capture) if store else []
    if width is not None:
        steps.append(Step(width.location, width.note, _code(ctx, width.location), StepKind.FC))
    return Wiring(
        ctx.side,
        tuple(slots),
        verifier_last,
        tuple(steps),
        fc_slots=width.slots if width is not None else None,
        ids=_ids(capture),
        notes=tuple(dict.fromkeys(notes)),
        ids_steps=tuple(ids_steps),
        aspects={fact.key: fact.value for fact in ctx.facts if isinstance(fact, Aspect)},
    )


def _sources(ctx: SideContext, sinks: tuple[NodeKey, ...], capture: CaptureSet | None) -> list[NodeKey]:
    """Where the derivation starts: the config keys and dump records that decided the capture
    set (not every config value the forward pass happened to touch)."""
    graph = ctx.graph
    if capture is not None:
        store = [key for key in capture.value.src if key in graph.g]
        upstream = {node for key in store for node in graph.ancestors(key)} | set(store)
        sources = [key for key in upstream if key.kind in DERIVATION_SOURCES]
        return sources or store
    upstream = {node for sink in sinks for node in graph.ancestors(sink)}
    sources = [key for key in upstream if key.kind in DERIVATION_SOURCES]
    return sources or [key for sink in sinks for key in graph.ancestors_of_kind(sink, StepKind.CALL)[:1]]


def _path_steps(ctx: SideContext, sinks: tuple[NodeKey, ...], capture: CaptureSet | None) -> list[Step]:
    graph = ctx.graph
    sources = _sources(ctx, sinks, capture)
    seen: dict = {}
    for sink in sinks:
        for key in graph.path(sources, sink):
            if key.kind not in HIDDEN_KINDS:
                seen.setdefault(key, None)
    for key in list(seen):  # a capture made in a helper: cite the call that handed it the layer index
        if key.kind in (StepKind.TEST, StepKind.APPEND):
            for caller in graph.g.predecessors(key):
                if caller.kind == StepKind.CALL and graph.g.edges[caller, key]["kind"] == "data":
                    seen.setdefault(caller, None)
    ordered = sorted(seen, key=lambda key: graph.g.nodes[key]["order"])
    return [_mark_patched(ctx, graph.step(key)) for key in ordered]


def _mark_patched(ctx: SideContext, step: Step) -> Step:
    lines = ctx.tree.patched_lines(step.location.path) if step.location.input == ctx.side else set()
    if lines and any(line in lines for line in range(step.location.line, step.location.end_line + 1)):
        return replace(step, patched=True)
    return step


def _ids(capture: CaptureSet | None) -> tuple[int, ...] | None:
    if capture is None:
        return None
    payload = capture.ids.v
    if isinstance(payload, (MutList, SetVal)):
        items = [item.v for item in payload.items] if isinstance(payload, MutList) else sorted(payload.items)
        if all(isinstance(item, int) for item in items):
            return tuple(items)
    return None


def _code(ctx: SideContext, location) -> str:
    assert ctx.index is not None
    module = ctx.index.modules.get(location.path)
    return module.code(location.line, location.end_line) if module is not None else ""
