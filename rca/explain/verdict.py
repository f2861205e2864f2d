"""The verdict: consistent, a mismatch with its root cause, or inconclusive, in one sentence, with
the causes, the warnings, and what the checks that decided rested on.

A cause is what makes acceptance fall on the launch diagnosed; a warning is a risk that launch does
not meet, or evidence too weak to call a cause; neither a warning nor a note changes the status.
`consistent` says every check that decides passed, and lists the assumptions it rested on;
`inconclusive` is kept for a deciding check that could not run, and names the input that would
settle it. Two causes that explain the same differences within `TIE` of each other are not an
answer: the verdict names both and the evidence that separates them.
"""

from __future__ import annotations

from rca.inputs.configs import TargetConfig
from rca.inputs.launch import LaunchSettings
from rca.knowledge import catalog
from rca.model import Hypothesis, Severity, Status, Tap, Verdict, Wiring

TIE = 0.15  # two competing causes scored closer than this are a tie, not an answer

# What settles a side the diagnosis could not resolve.
SETTLED_BY = {
    "training": "the trainer's code (--training SRC) or its hidden-state dumps probed (--dumps DIR --target MODEL_DIR "
    "--probe)",
    "serving": "the serving engine's code (--serving SRC: a directory, an installed package or pkg==version)",
}


def mtp_weights_index(source: str | None) -> str:
    """What settles whether the checkpoint an MTP launch loads its layers from holds them: the
    target's (or the named `source`'s) weights index."""
    if source is None:
        return "the target checkpoint's weights index (model.safetensors.index.json beside its config.json)"
    return f"a local copy of {source}'s weights index (model.safetensors.index.json beside its config.json)"


def verdict_of(
    training: Wiring,
    serving: Wiring,
    hypotheses: tuple[Hypothesis, ...],
    assumptions: tuple[str, ...] = (),
    drafting: str | None = None,
) -> Verdict:
    """The verdict; `drafting` says a launch drafts with the target's own MTP layers (no wiring applies)."""
    missing = [wiring for wiring in (training, serving) if not wiring.resolved]
    reasons = "; ".join(note for wiring in missing for note in wiring.notes[-1:]) or "unresolved"
    causes = [h for h in hypotheses if h.severity is Severity.CAUSE and h.id != "wiring-consistent"]
    warnings = tuple(h.id for h in hypotheses if h.severity is Severity.WARNING)
    if causes:
        top = causes[0]
        rival = _rival(top, causes[1:])
        summary = _cause_summary(top, training, serving, missing, reasons, drafting)
        settled_by = ""
        if rival is not None:
            settled_by = _separating(top, rival)
            summary += (
                f"; as likely: {_named(rival)} ({rival.score:.2f}), which explains the same difference: "
                f"what separates them is {settled_by}"
            )
        independent = [h for h in causes[1:] if not set(h.explains) & set(top.explains)]
        if independent:
            summary += "; also a cause: " + ", ".join(f"{h.id} ({h.score:.2f})" for h in independent)
        if warnings:
            summary += f"; {_counted(warnings)}"
        named = (top.id, *(h.id for h in independent))
        return Verdict(Status.MISMATCH, top.id, summary, named, warnings, assumptions, settled_by)
    if missing:
        sides = [w.side for w in missing]
        settled_by = "; ".join(SETTLED_BY[side] for side in sides)
        summary = f"the {' and '.join(sides)} wiring could not be resolved: {reasons}; {settled_by} would settle it"
        return Verdict(Status.INCONCLUSIVE, None, summary, (), warnings, assumptions, settled_by)
    summary = (
        f"serving feeds the draft what it was trained on ({_taps(serving.slots)}), and every check of its contract "
        "that could run passed"
    )
    if warnings:
        summary += f"; {_counted(warnings)}"
    if assumptions:
        summary += f" (under {len(assumptions)} assumption{'s' if len(assumptions) > 1 else ''}, listed)"
    return Verdict(Status.CONSISTENT, None, summary, (), warnings, assumptions)


def own_layers_drafting(launched: LaunchSettings | None, target: TargetConfig) -> str | None:
    """What a launch that drafts with multi-token-prediction layers serves (SGLang's NEXTN, vLLM's
    MTP methods, SGLang's EAGLE with no draft for a target that declares them), the target
    checkpoint's own or a checkpoint's it names for them, said; None for any other launch. No draft
    is fed captured hidden states there, so no wiring applies."""
    layers = target.mtp_layers()
    method = launched.drafts_with_mtp_layers(declared=layers is not None) if launched is not None else None
    if launched is None or method is None:
        return None
    declared = (
        f"{layers[0]} = {layers[1]} in the target's config"
        if layers is not None
        else "the target's config declares no MTP layers for it to draft with"
    )
    source = launched.mtp_source()
    if source is not None:
        return f"the launch drafts with multi-token-prediction layers loaded from {source} ({method}; {declared})"
    return f"the launch drafts with the target's own multi-token-prediction layers ({method}; {declared})"


def own_layers_unjudged(drafting: str) -> str:
    """The summary of an MTP launch where no check found a cause: what rca checks of it, and what not."""
    return (
        f"{drafting}, not with a separate draft fed captured hidden states: rca checks that the checkpoint "
        "they are loaded from holds their weights and that each later draft step is handed a state normalized "
        "as the first, not the model state they share with the target nor the quantization of their layers, so "
        "nothing else of this launch's speculation was judged"
    )


def _cause_summary(
    top: Hypothesis, training: Wiring, serving: Wiring, missing: list[Wiring], reasons: str, drafting: str | None
) -> str:
    broken = f"{_named(top)} ({top.score:.2f})"
    if catalog()[top.id].contract:
        party = "its training" if catalog()[top.id].scope == "training" else "the serving engine"
        if not missing and training.slots == serving.slots:
            return (
                f"the wiring is consistent (serving feeds {_taps(serving.slots)}, as trained), but the draft's "
                f"contract with {party} is not: {broken}"
            )
        wiring = (
            f"{drafting}: no captured hidden states, no wiring to check"
            if drafting is not None and missing
            else f"the wiring was not checked ({reasons})"
            if missing
            else f"the wiring differs too (serving feeds {_taps(serving.slots)} where training fed "
            f"{_taps(training.slots)})"
        )
        return f"the draft's contract with {party} is broken: {broken}; {wiring}"
    graph, partial = top.params.get("graph_taps"), top.params.get("partial_taps")
    if graph:
        fed = f"serving feeds [{', '.join(graph)}] in graph-replayed batches"
    elif partial:
        fed = f"serving feeds [{', '.join(partial)}] in batches whose all-reduce is fused into the next layer"
    else:
        fed = f"serving feeds {_taps(serving.slots)}"
    if training in missing:  # a contradiction of serving alone (its fc against what it feeds)
        return f"{fed}: {broken}; the training wiring was not resolved ({reasons})"
    return f"{fed} where training fed {_taps(training.slots)}: {broken}"


def _rival(top: Hypothesis, others: list[Hypothesis]) -> Hypothesis | None:
    """A cause that explains a difference the top one explains, scored within `TIE` of it."""
    return next(
        (h for h in others if set(h.explains) & set(top.explains) and top.score - h.score < TIE),
        None,
    )


def _separating(top: Hypothesis, rival: Hypothesis) -> str:
    """The evidence the catalog names for each of two rivals and not for the other."""
    entries = catalog()
    first = [item for item in entries[top.id].evidence_for if item not in entries[rival.id].evidence_for]
    second = [item for item in entries[rival.id].evidence_for if item not in entries[top.id].evidence_for]
    pairs = ((top.id, first), (rival.id, second))
    parts = [f"{items[0]} (for {hypothesis})" for hypothesis, items in pairs if items]
    return " against ".join(parts) or "a probe of what each side feeds (rca capture, --dumps DIR --probe)"


def _named(hypothesis: Hypothesis) -> str:
    return hypothesis.title[:1].lower() + hypothesis.title[1:]


def _counted(warnings: tuple[str, ...]) -> str:
    return f"{len(warnings)} warning{'s' if len(warnings) > 1 else ''} ({', '.join(warnings)})"


def _taps(slots: tuple[Tap, ...]) -> str:
    return "[" + ", ".join(str(tap) for tap in slots) + "]"
