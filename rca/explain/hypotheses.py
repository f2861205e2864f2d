"""Explain the difference between the two wirings: candidate hypotheses, scored and ranked.

Each hypothesis is an explanation of the differences between the training and serving slots, or
of a break of the draft's contract that a finding shows. Scores are posteriors: prior (from the
catalog) x the likelihood ratio of each evidence item, normalized over the hypotheses that compete
for the same differences. The first item is the observed differences themselves: their likelihood
under the hypothesis against the likelihood with no cause that explains any of them. A hypothesis
that leaves a difference unexplained pays `EPSILON` for it (an independent second cause would be
needed), so one edit that explains several differences beats several edits (parsimony).

Hypotheses that explain different differences do not compete: two breaks of the contract, each
shown by its own finding, are two causes, not a tie at 0.5. The wiring's hypotheses compete with
`wiring-consistent`; a break of the contract competes with its own absence (its finding being
wrong), whose weight is one minus its prior.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from rca.explain.fixes import Fix
from rca.knowledge import CONTRACT, CatalogError, Entry, catalog
from rca.model import (
    DERIVATION_SOURCES,
    RULED_OUT,
    CheckpointEdit,
    Confidence,
    ConfigEdit,
    Evidence,
    Hypothesis,
    Severity,
    Step,
    StepKind,
    Tap,
    Wiring,
)
from rca.static.facts import Finding

EPSILON = 0.05  # likelihood of one difference no hypothesis explains
CONSISTENT = "wiring-consistent"
EXPLAINED = 0.95  # likelihood of the observed differences under a hypothesis that explains them all
RAISES = 10.0  # a probe's likelihood ratio that shows a break of the contract with no code finding

# Given ids for the serving config, the serving wiring they produce (None when it cannot tell).
Trial = Callable[[tuple[int, ...]], "Wiring | None"]
# Makes an entry's candidates in a situation, given the wiring's differences.
Generate = Callable[[Entry, "Situation", set[str]], Iterator["Explanation"]]


@dataclass
class Situation:
    training: Wiring
    serving: Wiring
    findings: list[Finding]
    propose: Callable[[tuple[Tap, ...]], Fix | None] = lambda slots: None
    defaults: Callable[[], tuple[Tap, ...] | None] = lambda: None  # serving's slots with the model's default layers
    observed: dict[str, list[Evidence]] = field(default_factory=dict)  # tensor evidence per hypothesis id (probes)

    def graph_slots(self) -> tuple[Tap, ...] | None:
        """What graph-replayed batches feed when graphs were captured before the ids were applied
        (None when they were not, or when that is what training fed)."""
        if not any(finding.hypothesis == "graph-captured-defaults" for finding in self.findings):
            return None
        slots = self.defaults()
        return slots if slots and slots != self.training.slots else None


@dataclass
class Explanation:
    """One hypothesis applied to this situation, before scoring: what it explains, why, its fix."""

    id: str
    params: dict
    explains: frozenset[str]
    reason: str
    citations: list[Step] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    fix: str = ""
    fix_diff: str = ""
    fix_edit: ConfigEdit | CheckpointEdit | None = None
    severity: Severity = Severity.CAUSE


# The differences the serving side shows by itself, whatever training fed: an fc built for another
# number of states than the engine feeds it (a DFlash config without ids: the capture falls back to
# the model's default layers, the fc to the draft's own layer count).
SERVING_ALONE = frozenset({"width"})


def differences(training: Wiring, serving: Wiring) -> set[str]:
    """Labels for what differs: `+hK` (serving only), `-hK` (training only), `order`, `count`, `width`."""
    trained, served = list(training.slots), list(serving.slots)
    found = {f"+{tap}" for tap in served if tap not in trained} | {f"-{tap}" for tap in trained if tap not in served}
    if not found and trained != served:
        found.add("order")
    if len(trained) != len(served):
        found.add("count")
    if serving.fc_slots is not None and serving.fc_slots != len(served):
        found.add("width")
    return found


# -- citations -------------------------------------------------------------------------------------


def _mentions(step: Step, taps: Iterable[Tap]) -> bool:
    return any(re.search(rf"(?<![\w+]){re.escape(str(tap))}(?![\w+])", step.note) for tap in taps)


def derivation(wiring: Wiring) -> list[Step]:
    """The key lines of how a side's ids become its capture set: the config or dump value, the
    calls that hand it on, patched lines, and the statement that stores the capture set."""
    # A key the target config lacks (a feature flag read on the way) decides a branch, not the ids.
    steps = [
        step
        for step in wiring.ids_steps
        if not (step.kind == StepKind.CONFIG_MISSING and step.location.input == "target")
    ]
    if not steps:
        return [step for step in wiring.steps if step.kind in DERIVATION_SOURCES]

    def encloses(outer: Step, inner: Step) -> bool:
        return (
            outer is not inner
            and outer.location.path == inner.location.path
            and outer.location.line <= inner.location.line
            and inner.location.end_line <= outer.location.end_line
        )

    leaves = [
        step
        for step in steps
        if step.kind in DERIVATION_SOURCES
        and not any(other.kind in DERIVATION_SOURCES and encloses(step, other) for other in steps)
    ]
    return [step for step in steps if step in leaves or step.kind == StepKind.CALL or step.patched or step is steps[-1]]


def captures(wiring: Wiring, taps: Iterable[Tap]) -> list[Step]:
    taps = list(taps)
    return [
        step
        for step in wiring.steps
        if step.kind in (StepKind.APPEND, StepKind.CALL, StepKind.TEST) and _mentions(step, taps)
    ]


def _unique(steps: Iterable[Step]) -> list[Step]:
    seen: dict = {}
    for step in steps:
        seen.setdefault((step.location, step.note), step)
    return list(seen.values())


def _fix(situation: Situation, fallback: str) -> dict[str, Any]:
    """The fix (its diff and edit) that makes serving feed what training fed, checked against the
    serving code; the catalog's advice when none was found."""
    fix = situation.propose(situation.training.slots)
    if fix is None:
        return {"fix": fallback}
    return {"fix": fix.text(), "fix_diff": fix.diff, "fix_edit": fix.edit}


def _taps(items: Iterable[Tap]) -> str:
    return "[" + ", ".join(str(tap) for tap in items) + "]"


# -- candidate generators: each catalog entry names its own (`generator` in its TOML) ----------------


def _wiring_consistent(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    training, serving = situation.training, situation.serving
    if not diffs:
        graph = situation.graph_slots()
        yield Explanation(
            entry.id,
            {},
            frozenset(),
            f"both sides feed {_taps(serving.slots)}"
            + (f" (verifier-last {training.verifier_last})" if training.verifier_last else ""),
            citations=_unique(derivation(serving) + derivation(training)),
            evidence=[
                Evidence(f"only in eager batches: graph-replayed batches feed {_taps(graph)}", Confidence.INFERRED, 0.1)
            ]
            if graph
            else [],
            fix=entry.fix,
        )
        return
    premise = ""
    if any(tap.is_embedding for tap in serving.slots) and not any(tap.is_embedding for tap in training.slots):
        premise = "training fed the embedding too (the premise behind a serving h0 slot); "
    from_dumps = bool(training.steps) and all(step.kind == StepKind.DUMP for step in training.steps)
    yield Explanation(
        entry.id,
        {},
        frozenset(),
        f"would mean {premise}the static reading of a side is wrong, yet training resolves to {_taps(training.slots)} "
        f"and serving to {_taps(serving.slots)}",
        citations=_unique(captures(training, training.slots)[:3]),
        evidence=[
            Evidence(
                f"the training {'dumps hold' if from_dumps else 'code captures'} {_taps(training.slots)}"
                + (" with no embedding slot" if premise else ""),
                Confidence.INFERRED,
                0.2 if premise else 1.0,
                tuple(captures(training, training.slots)[:2]),
            )
        ],
    )


def _embed_slot_added(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    training, serving = situation.training, situation.serving
    if "+h0" not in diffs:
        return
    embedding = Tap(0)
    displaced = [tap for tap in training.slots if tap not in serving.slots]
    served_rest = [tap for tap in serving.slots if tap != embedding]
    trained_rest = [tap for tap in training.slots if tap not in displaced]
    explains = {"+h0"}
    if served_rest == trained_rest and len(displaced) <= 1:
        explains |= {f"-{tap}" for tap in displaced} | ({"count"} & diffs)
    reason = "serving feeds the embedding output (h0), which training never saw"
    if displaced and explains >= {f"-{tap}" for tap in displaced}:
        reason += f"; with fc's slots fixed it pushes out {_taps(displaced)}, so one edit explains both differences"
    evidence = [
        Evidence(f"the serving capture appends h0 at {step.location}", Confidence.INFERRED, 1.0, (step,))
        for step in captures(serving, [embedding])[:1]
    ]
    if serving.ids is not None and any(i < 0 for i in serving.ids):
        evidence.append(
            Evidence(
                f"the serving ids {list(serving.ids)} include a negative id, which the serving code maps to the "
                f"embedding",
                Confidence.INFERRED,
                2.0,
                tuple(derivation(serving)[:1]),
            )
        )
    yield Explanation(
        entry.id,
        {"tap": "h0", "displaced": [str(tap) for tap in displaced]},
        frozenset(explains),
        reason,
        citations=_unique(derivation(serving) + captures(serving, [embedding]) + captures(training, displaced)),
        evidence=evidence,
        **_fix(situation, entry.fix),
    )


def _embed_slot_missing(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    training, serving = situation.training, situation.serving
    if "-h0" not in diffs:
        return
    added = [tap for tap in serving.slots if tap not in training.slots]
    explains = {"-h0"} | ({f"+{added[0]}"} if len(added) == 1 else set())
    yield Explanation(
        entry.id,
        {"tap": "h0"},
        frozenset(explains),
        "training fed the embedding output (h0); serving captures decoder layers only",
        citations=_unique(captures(training, [Tap(0)]) + derivation(serving)),
        **_fix(situation, entry.fix),
    )


def _single_layer(sign: str, side: str, what: str) -> Generate:
    """A generator for one tap present on one side only (`-hK` missing, `+hK` extra); h0 has its own."""

    def generate(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
        trained, served = set(situation.training.slots), set(situation.serving.slots)
        for label in sorted(diffs):
            if label.startswith(f"{sign}h") and label != f"{sign}h0":
                tap = Tap.parse(label[1:])
                explains = {label}
                if (served | {tap} == trained if sign == "-" else trained | {tap} == served) and tap not in (
                    trained & served
                ):
                    # the one tap dropped (added) is the whole difference: the slot count, and fc's width
                    # where it follows training, go with it
                    explains |= {"count"} & diffs
                    if situation.serving.fc_slots == len(situation.training.slots):
                        explains |= {"width"} & diffs
                others = sorted(diffs - explains)
                reason = f"{tap} is {what}"
                if others:
                    reason += (
                        f"; this leaves {', '.join(others)} unexplained (each would need another, independent cause)"
                    )
                yield Explanation(
                    entry.id,
                    {"tap": str(tap)},
                    frozenset(explains),
                    reason,
                    citations=_unique(captures(getattr(situation, side), [tap]) + derivation(situation.serving)),
                    **_fix(situation, entry.fix),
                )

    return generate


def _layer_offset(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    trained, served = situation.training.slots, situation.serving.slots
    if not diffs or not served or len(trained) < len(served):
        return
    deltas = {
        s.layer - t.layer
        for t, s in zip(trained[: len(served)], served, strict=True)
        if s.layer is not None and t.layer is not None
    }
    if len(deltas) != 1 or 0 in deltas:
        return
    delta = deltas.pop()
    beyond = _shifted_past_the_last_layer(situation, trained[len(served) :], delta)
    if beyond is None:
        return
    yield Explanation(
        entry.id,
        {"offset": delta},
        frozenset(diffs - {"width"}),
        f"every serving tap is {abs(delta)} "
        f"layer{'s' if abs(delta) > 1 else ''} {'later' if delta > 0 else 'earlier'} than in training "
        f"({_taps(served)} vs {_taps(trained)}): an id-convention shift" + beyond,
        citations=_unique(derivation(situation.serving) + derivation(situation.training)),
        evidence=[Evidence(f"all {len(served)} served slots differ by {delta:+d}", Confidence.INFERRED, 3.0)],
        **_fix(situation, entry.fix),
    )


def _shifted_past_the_last_layer(situation: Situation, unserved: tuple[Tap, ...], delta: int) -> str | None:
    """Why trained taps have no served counterpart: shifted by `delta`, each falls past the target's
    last layer, so the capture loop never meets it ("" when every trained tap is served; None when
    the shift does not account for them)."""
    if not unserved:
        return ""
    last = situation.training.verifier_last or situation.serving.verifier_last
    layers = [tap.layer for tap in unserved]
    if last is None or last.layer is None or None in layers:
        return None
    shifted = [Tap(layer + delta) for layer in layers if layer is not None]
    if any(tap.layer <= last.layer for tap in shifted if tap.layer is not None):
        return None
    return (
        f"; shifted so, {_taps(shifted)} would be past the target's last layer ({last}), so the capture never "
        f"meets {'it' if len(shifted) == 1 else 'them'} and fewer states are served"
    )


def _slot_order(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    if "order" not in diffs:
        return
    evidence = [
        Evidence(f.message, f.confidence, f.likelihood_ratio, (Step(f.location, f.message),))
        for f in situation.findings
        if f.hypothesis == entry.id
    ]
    yield Explanation(
        entry.id,
        {},
        frozenset({"order"}),
        f"the same taps arrive in another order: serving {_taps(situation.serving.slots)}, "
        f"training {_taps(situation.training.slots)}",
        citations=_unique(derivation(situation.serving) + [step for item in evidence for step in item.citations]),
        evidence=evidence,
        fix=entry.fix,
    )


def _config_ignored(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    findings = [f for f in situation.findings if f.hypothesis == entry.id]
    if not findings or not diffs:
        return
    evidence = [
        Evidence(f.message, f.confidence, f.likelihood_ratio, (Step(f.location, f.message, kind=StepKind.HANDLER),))
        for f in findings
    ]
    yield Explanation(
        entry.id,
        {},
        frozenset(diffs),
        "the serving engine chooses the layers it captures itself and never reads the draft config's ids"
        if any(f.name in ("draft-ids-ignored", "draft-ids-never-read") for f in findings)
        else "the draft config's layer ids are not read where the serving engine looks, so the target captures its "
        "default layers",
        citations=_unique([step for item in evidence for step in item.citations] + derivation(situation.serving)),
        evidence=evidence,
        **_fix(situation, next((f.fix for f in findings if f.fix), entry.fix)),
    )


def _pp_stage_local_layers(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    findings = [f for f in situation.findings if f.hypothesis == entry.id]
    if not findings or not diffs:
        return
    evidence = [
        Evidence(f.message, f.confidence, f.likelihood_ratio, f.steps or (Step(f.location, f.message),))
        for f in findings
    ]
    yield Explanation(
        entry.id,
        {},
        frozenset(diffs),
        "; ".join(dict.fromkeys(f.message for f in findings)),
        citations=_unique(
            [step for item in evidence for step in item.citations]
            + [
                Step(f.location, "the capture loop each stage runs over its own layers", kind=StepKind.CALL)
                for f in findings
            ]
            + captures(situation.serving, situation.serving.slots)[:2]
        ),
        evidence=evidence,
        fix=entry.fix,
    )


def _capture_missing_residual(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    """Serving slots that are the trained ones once the residual the capture left out is added back."""
    served = situation.serving.slots
    if not diffs or not any(tap.residual_missing for tap in served):
        return
    restored = tuple(Tap(tap.layer, tap.norm, tap.partial) if tap.residual_missing else tap for tap in served)
    explained = differences(situation.training, replace(situation.serving, slots=restored))
    if explained:
        return
    missing = tuple(tap for tap in served if tap.residual_missing)
    yield Explanation(
        entry.id,
        {"taps": [str(tap) for tap in missing]},
        frozenset(diffs),
        f"the serving target saves the hidden states its layers return without the residual they carry apart: "
        f"the draft is fed {_taps(served)} where training fed the residual stream {_taps(situation.training.slots)}",
        citations=_unique(captures(situation.serving, missing)),
        fix=entry.fix,
    )


def _graph_captured_defaults(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    graph = situation.graph_slots()
    if graph is None:
        return
    findings = [f for f in situation.findings if f.hypothesis == entry.id]
    evidence = [
        Evidence(
            f.message, f.confidence, f.likelihood_ratio, f.steps or (Step(f.location, f.message, kind=StepKind.CALL),)
        )
        for f in findings
    ]
    yield Explanation(
        entry.id,
        {"graph_taps": [str(tap) for tap in graph]},
        frozenset(),
        f"graphs were captured with the model's default layers before the ids were applied: graph-replayed batches "
        f"(decode, "
        f"target verify) feed {_taps(graph)}, only eager batches (prefill) feed {_taps(situation.serving.slots)}; "
        f"training fed {_taps(situation.training.slots)}",
        citations=_unique([step for item in evidence for step in item.citations] + derivation(situation.serving)),
        evidence=evidence,
        fix=entry.fix,
    )


def _aux_capture_off(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    findings = [f for f in situation.findings if f.hypothesis == entry.id]
    if not findings or not diffs:
        return
    evidence = [
        Evidence(
            f.message, f.confidence, f.likelihood_ratio, f.steps or (Step(f.location, f.message, kind=StepKind.TEST),)
        )
        for f in findings
    ]
    settings = [step for item in evidence for step in item.citations if step.location.input == "serving-args"]
    where = f" (the setting at {settings[0].location})" if settings else ""
    yield Explanation(
        entry.id,
        {},
        frozenset(diffs),
        f"the launch settings turn the target's layer capture off: the draft is fed {_taps(situation.serving.slots)} "
        f"instead of the {len(situation.training.slots)} layers it was trained on, {_taps(situation.training.slots)}",
        citations=_unique([step for item in evidence for step in item.citations] + list(situation.serving.steps)),
        evidence=evidence,
        fix=entry.fix + where,
    )


def _capture_before_allreduce(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    findings = [f for f in situation.findings if f.hypothesis == entry.id]
    if not findings:
        return
    evidence = [
        Evidence(
            f.message, f.confidence, f.likelihood_ratio, f.steps or (Step(f.location, f.message, kind=StepKind.TEST),)
        )
        for f in findings
    ]
    partial = {tap.layer: tap for f in findings for tap in f.taps}  # the exposed slots, as partial sums
    fed = tuple(partial.get(tap.layer, tap) for tap in situation.serving.slots)
    yield Explanation(
        entry.id,
        {"partial_taps": [str(tap) for tap in fed]},
        frozenset(),
        f"the serving target captures between layers, before a deferred tensor-parallel all-reduce: in batches "
        f"where the "
        f"all-reduce is fused into the next layer, each rank feeds {_taps(fed)}, not the full "
        f"sums {_taps(situation.serving.slots)}",
        citations=_unique([step for item in evidence for step in item.citations]),
        evidence=evidence,
        fix=entry.fix,
    )


def _aux_count_mismatch(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    counted = diffs & {"count", "width"}
    if not counted:
        return
    serving, trained = situation.serving, situation.training
    detail = f"serving feeds {len(serving.slots)} states"
    if serving.ids is not None and len(serving.ids) > len(serving.slots):  # the capture loop never reached some
        detail += f" for the {len(serving.ids)} layer ids it hands the target ({list(serving.ids)})"
    detail += f", training used {len(trained.slots)}" if trained.resolved else ""
    if "width" in counted:
        detail += f", the draft's fc takes {serving.fc_slots}"
    findings = [f for f in situation.findings if f.hypothesis == entry.id]
    evidence = [
        Evidence(
            f.message, f.confidence, f.likelihood_ratio, f.steps or (Step(f.location, f.message, kind=StepKind.CONFIG),)
        )
        for f in findings
    ]
    fix = _fix(situation, entry.fix) if "count" in counted else {"fix": entry.fix}
    fix = next(({"fix": f.fix} for f in findings if f.fix), fix)
    yield Explanation(
        entry.id,
        {
            "serving": len(serving.slots),
            "training": len(trained.slots) if trained.resolved else None,
            "fc": serving.fc_slots,
        },
        frozenset(counted),
        detail,
        citations=_unique(
            [step for item in evidence for step in item.citations]
            + [step for step in serving.steps if step.kind == StepKind.FC]
            + derivation(serving)
        ),
        evidence=evidence,
        **fix,
    )


def _contract(entry: Entry, situation: Situation, diffs: set[str]) -> Iterator[Explanation]:
    """The generator of every break of the draft's contract (with its serving engine or its training:
    a vocab map, a norm, its head): each is its own difference, found by an analyzer, whatever the wiring."""
    findings = [f for f in situation.findings if f.hypothesis == entry.id]
    if not findings:
        observed = raising(situation, entry.id)
        if observed:  # tensors show the break where no code did: the probe's evidence is the finding
            yield Explanation(
                entry.id,
                {"observed": [item.summary for item in observed]},
                frozenset({contract_label(entry.id)}),
                "; ".join(dict.fromkeys(item.summary for item in observed)),
                citations=_unique(step for item in observed for step in item.citations),
                fix=entry.fix,
            )
        return
    suspected = all(f.severity is Severity.WARNING for f in findings) and not raising(situation, entry.id)
    strongest = min((f.severity for f in findings), key=lambda severity: severity.order)
    yield Explanation(
        entry.id,
        {"findings": [f.name for f in findings], **({"suspicion": True} if suspected else {})},
        frozenset({contract_label(entry.id), *entry.explains}),
        "; ".join(dict.fromkeys(f.message for f in findings))
        + (" (a suspicion the code allows: only tensors settle it)" if suspected else ""),
        citations=_unique(step for f in findings for step in f.steps or (Step(f.location, f.message),)),
        evidence=[Evidence(f.message, f.confidence, f.likelihood_ratio, f.steps, f.severity) for f in findings],
        fix=next((f.fix for f in findings if f.fix), entry.fix),
        fix_edit=next((f.edit for f in findings if f.fix and f.edit is not None), None),
        severity=Severity.WARNING if suspected else strongest,
    )


def contract_label(hypothesis_id: str) -> str:
    return f"contract:{hypothesis_id}"


def raising(situation: Situation, hypothesis_id: str) -> list[Evidence]:
    """Probe observations that speak for a break of the contract by themselves."""
    return [item for item in situation.observed.get(hypothesis_id, []) if item.likelihood_ratio >= RAISES]


def contract_differences(findings: Iterable[Finding]) -> set[str]:
    """A label for each break of the draft's contract with the serving engine that a finding shows
    (a warning, what only tensors settle, shows none, nor does a note)."""
    entries = catalog()
    return {
        contract_label(f.hypothesis)
        for f in findings
        if f.hypothesis is not None
        and f.hypothesis in entries
        and entries[f.hypothesis].contract
        and f.severity is Severity.CAUSE
    }


# Every generator by the name a catalog entry declares (`generator = "..."` in its TOML): a wiring
# hypothesis names the one written for it; every break of the contract names `contract`. The order is
# the order candidates are made in (entries sharing a generator follow the catalog's), which breaks
# ties when they are ranked.
GENERATORS: dict[str, Generate] = {
    "wiring_consistent": _wiring_consistent,
    "embed_slot_added": _embed_slot_added,
    "embed_slot_missing": _embed_slot_missing,
    "layer_missing": _single_layer("-", "training", "trained on but not fed at serving time"),
    "layer_extra": _single_layer("+", "serving", "fed at serving time but not trained on"),
    "layer_offset": _layer_offset,
    "slot_order": _slot_order,
    "config_ignored": _config_ignored,
    "aux_count_mismatch": _aux_count_mismatch,
    "graph_captured_defaults": _graph_captured_defaults,
    "pp_stage_local_layers": _pp_stage_local_layers,
    "aux_capture_off": _aux_capture_off,
    "capture_before_allreduce": _capture_before_allreduce,
    "capture_missing_residual": _capture_missing_residual,
    CONTRACT: _contract,
}


def generation(entries: dict[str, Entry]) -> list[tuple[Entry, Generate]]:
    """Each catalog entry with the generator it declares, in the order candidates are made: by
    generator (GENERATORS' order), then by the catalog's. An entry naming no known generator is refused."""
    order = {name: index for index, name in enumerate(GENERATORS)}
    for entry in entries.values():
        if entry.generator not in GENERATORS:
            raise CatalogError(
                f"generator {entry.generator!r} is not one of rca's: {', '.join(GENERATORS)}",
                where=str(entry.path or entry.id),
                fix=f'name one of them, "{CONTRACT}" for a break of the contract an analyzer finds; a new wiring '
                "hypothesis needs its generator added to GENERATORS in rca/explain/hypotheses.py",
            )
    ordered = sorted(entries.values(), key=lambda entry: order[entry.generator])
    return [(entry, GENERATORS[entry.generator]) for entry in ordered]


# -- scoring ---------------------------------------------------------------------------------------


def likelihood(candidate: Explanation, diffs: set[str]) -> float:
    unexplained = len(diffs - candidate.explains)
    return EXPLAINED if unexplained == 0 else EPSILON**unexplained


def differences_ratio(candidate: Explanation, diffs: set[str]) -> float:
    """The likelihood ratio of the observed differences: under the hypothesis, against no cause
    explaining any of them (each its own independent cause; with no difference, nothing to explain)."""
    unexplained_by_anything = EPSILON ** len(diffs) if diffs else EXPLAINED
    return likelihood(candidate, diffs) / unexplained_by_anything


WIRING = "wiring"  # the group of the wiring's hypotheses, whose null is `wiring-consistent`
TOO_WEAK = 0.5  # a break of the contract no likelier than its absence is a warning, not a cause


def _groups(candidates: list[Explanation], wiring: set[str], diffs: set[str]) -> list[int]:
    """Which competing group each candidate belongs to (an index): candidates that explain a
    difference in common compete; every wiring hypothesis, and every candidate that explains a
    difference of the wiring, competes with `wiring-consistent`."""
    entries = catalog()
    parent = list(range(len(candidates) + 1))  # the last element is the wiring's group

    def find(item: int) -> int:
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    owner: dict[str, int] = {label: len(candidates) for label in wiring}
    for index, candidate in enumerate(candidates):
        if not entries[candidate.id].contract:
            parent[find(index)] = find(len(candidates))
        for label in candidate.explains & diffs:
            if label in owner:
                parent[find(index)] = find(owner[label])
            else:
                owner[label] = index
    return [find(index) for index in range(len(candidates))]


def rank(situation: Situation, wiring_known: bool = True) -> tuple[Hypothesis, ...]:
    """Every hypothesis that explains something, scored within the group it competes in and
    ranked: causes first (by score), then `wiring-consistent`, then warnings and notes. Without
    `wiring_known` (a side is missing), only the contract's."""
    entries = catalog()
    wiring = differences(situation.training, situation.serving)
    if not wiring_known:  # what serving contradicts by itself (its fc against what it feeds) stands alone
        wiring = wiring & SERVING_ALONE if situation.serving.resolved else set()
    observed = {
        contract_label(h) for h in situation.observed if h in entries and entries[h].contract and raising(situation, h)
    }
    diffs = wiring | contract_differences(situation.findings) | observed
    candidates: list[Explanation] = []
    for entry, generate in generation(entries):
        if not wiring_known and not entry.contract and not wiring:
            continue
        for candidate in generate(entry, situation, wiring):
            candidate.evidence += situation.observed.get(entry.id, [])
            if not entry.contract and entry.id != CONSISTENT and not candidate.explains & wiring:
                # it predicts the taps a consistent wiring does: what tensors show of the taps bears on both
                candidate.evidence += situation.observed.get(CONSISTENT, [])
            if any(item.likelihood_ratio >= RAISES for item in situation.observed.get(entry.id, [])):
                candidate.severity = Severity.CAUSE  # tensors show the break: no longer a suspicion
            candidates.append(candidate)
    groups = _groups(candidates, wiring, diffs)
    wiring_group = next(
        (group for group, candidate in zip(groups, candidates, strict=True) if not entries[candidate.id].contract),
        None,
    )
    members: dict[int, list[Explanation]] = {}
    for group, candidate in zip(groups, candidates, strict=True):
        members.setdefault(group, []).append(candidate)
    considered = {group: {label for c in found for label in c.explains & diffs} for group, found in members.items()}
    if wiring_group is not None:
        considered[wiring_group] |= wiring
    ratios = [differences_ratio(c, considered[g]) for g, c in zip(groups, candidates, strict=True)]
    weights = [
        entries[c.id].prior * ratio * math.prod(item.likelihood_ratio for item in c.evidence)
        for c, ratio in zip(candidates, ratios, strict=True)
    ]
    # What each group's hypotheses compete with: a consistent wiring (one of the wiring group's
    # weights), or the break's own absence, which weighs one minus its prior.
    consistent = next((w for c, w in zip(candidates, weights, strict=True) if c.id == CONSISTENT), 0.0)
    absent = {group: 1.0 - max(entries[c.id].prior for c in found) for group, found in members.items()}
    totals = {group: 0.0 if group == wiring_group else absent[group] for group in members}
    for group, weight in zip(groups, weights, strict=True):
        totals[group] += weight
    scored = []
    for group, candidate, weight, ratio in zip(groups, candidates, weights, ratios, strict=True):
        score = weight / (totals[group] or 1.0)
        severity = Severity.NOTE if candidate.id == CONSISTENT else candidate.severity
        null = consistent if group == wiring_group else absent[group]
        if severity is Severity.CAUSE and score < TOO_WEAK and weight < null:
            # less likely than no such cause: evidence too weak to call it one; all but ruled out, a note
            severity = Severity.WARNING if score >= RULED_OUT else Severity.NOTE
        scored.append((score, weight, severity, candidate, ratio, considered[group]))

    def order(item: tuple) -> tuple:
        score, weight, severity, candidate = item[:4]
        place = 1 if candidate.id == CONSISTENT else 0 if severity is Severity.CAUSE else 1 + severity.order
        return (place, -score, -weight)

    scored.sort(key=order)
    ranked = []
    for rank_number, (score, _, severity, candidate, ratio, labels) in enumerate(scored, start=1):
        unexplained = sorted(labels - candidate.explains)
        evidence = [
            Evidence(
                f"explains {', '.join(sorted(candidate.explains & labels)) or 'no difference'}"
                + (f"; leaves {', '.join(unexplained)} unexplained" if unexplained else ""),
                Confidence.INFERRED,
                ratio,
            ),
            *candidate.evidence,
        ]
        ranked.append(
            Hypothesis(
                candidate.id,
                entries[candidate.id].title,
                score,
                rank_number,
                candidate.params,
                candidate.reason,
                tuple(candidate.citations),
                tuple(evidence),
                candidate.fix,
                candidate.fix_diff,
                entries[candidate.id].prior,
                candidate.fix_edit,
                severity,
                tuple(sorted(candidate.explains & diffs)),
            )
        )
    return tuple(ranked)
