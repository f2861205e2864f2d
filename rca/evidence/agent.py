"""The agent loop: gather the tensor evidence that best separates what training may have fed.

Static analysis gives a training wiring when the training code is at hand; when it is not, or
when the dumps may not come from that code, several wirings stay plausible: the one the code
says, the serving wiring (training and serving agree), the ids the draft config or the dump
metadata records under each id convention, and the engines' defaults. Each is a candidate with a
prior. Every probe predicts what it would observe under each candidate; the loop runs the probe
whose predicted observations split the current belief most (expected information, in bits) per
unit of cost, updates the belief by the likelihood of what it saw, and stops once one candidate
is believed beyond `CONFIDENT` or no probe left separates the rest. Each step records why it was
chosen, for the case file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rca.errors import RcaError
from rca.evidence.probes import (
    Observation,
    Probe,
    ProbeInputs,
    decode_value,
    encode_value,
    needs_dumps_and_weights,
    registered_probes,
)
from rca.model import Evidence, Step, Tap, Wiring

CONFIDENT = 0.95
UNFORESEEN = 0.05  # prior mass of a wiring no source suggests, given to one when a probe observes it
Progress = Callable[[str], None]


@dataclass(frozen=True)
class CandidateWiring:
    """A training wiring the agent considers, and where the idea comes from."""

    slots: tuple[Tap, ...]
    origins: tuple[str, ...]
    prior: float

    @property
    def label(self) -> str:
        return "[" + ", ".join(str(tap) for tap in self.slots) + "]"


@dataclass(frozen=True)
class AgentStep:
    """One probe run: why it was chosen, what it saw, and the belief afterwards."""

    probe: str
    reason: str
    observation: Observation
    belief: tuple[tuple[str, float], ...]  # candidate label -> posterior, highest first
    key: dict[str, Any] = field(default_factory=dict)  # the inputs the observation depends on
    remembered: bool = False  # observed in an earlier run of the case, not run again

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "reason": self.reason,
            "observed": self.observation.summary,
            "value": encode_value(self.observation.value),
            "reliability": self.observation.reliability,
            "key": self.key,
            "remembered": self.remembered,
            "data": self.observation.data,
            "belief": [{"training": label, "posterior": round(score, 4)} for label, score in self.belief],
            "citations": [step.citation() for step in self.observation.citations],
        }

    @staticmethod
    def observation_from_json(data: dict[str, Any]) -> Observation:
        return Observation(
            data["probe"],
            decode_value(data["value"]),
            data["observed"],
            data.get("data", {}),
            tuple(Step.from_citation(item) for item in data.get("citations", ())),
            float(data.get("reliability", 0.98)),
        )


@dataclass(frozen=True)
class Missing:
    """Evidence no probe could gather here, and the command that would."""

    probe: str
    reason: str
    command: str

    def to_json(self) -> dict[str, str]:
        return {"probe": self.probe, "reason": self.reason, "command": self.command}


@dataclass(frozen=True)
class Investigation:
    candidates: tuple[tuple[CandidateWiring, float], ...]  # by posterior, highest first
    steps: tuple[AgentStep, ...] = ()
    missing: tuple[Missing, ...] = ()
    verifier_last: Tap | None = None  # as the fingerprint observed it
    stopped: str = ""

    @property
    def best(self) -> CandidateWiring | None:
        return self.candidates[0][0] if self.candidates else None

    @property
    def confident(self) -> bool:
        return bool(self.candidates) and self.candidates[0][1] >= CONFIDENT

    def wiring(self, static: Wiring) -> Wiring | None:
        """The training wiring the evidence established (None when it did not settle one)."""
        best = self.best
        if best is None or not self.confident or not self.steps:
            return None
        citations = tuple(step for agent_step in self.steps for step in agent_step.observation.citations)
        note = f"the dumps hold {best.label} ({', '.join(agent_step.probe for agent_step in self.steps)})"
        if static.resolved and static.slots != best.slots:
            note += f"; the training source resolves to {_label(static.slots)}, which the dumps contradict"
        return Wiring(
            "training",
            best.slots,
            self.verifier_last or static.verifier_last,
            steps=(*static.steps, *_dedupe(citations))
            if static.resolved and static.slots == best.slots
            else _dedupe(citations),
            fc_slots=static.fc_slots,
            ids=static.ids if static.slots == best.slots else None,
            notes=(note,),
            aspects=static.aspects,
        )

    def served(self, serving: Wiring, training: Wiring) -> Wiring | None:
        """The serving wiring an observation of what the engine fed showed, where it contradicts the
        code's (None otherwise)."""
        kinds = registered_probes()
        shown = (kinds[step.probe]().served(step.observation, serving, training) for step in self.steps)
        return next((wiring for wiring in shown if wiring is not None), None)

    def evidence(self, serving: Wiring) -> dict[str, list[Evidence]]:
        """What the observations say about the catalog's hypotheses (hypothesis id -> evidence)."""
        found: dict[str, list[Evidence]] = {}
        kinds = registered_probes()
        for step in self.steps:
            for hypothesis_id, item in kinds[step.probe]().bearing(step.observation, serving).items():
                found.setdefault(hypothesis_id, []).append(item)
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "candidates": [
                {
                    "training": candidate.label,
                    "origins": list(candidate.origins),
                    "prior": round(candidate.prior, 4),
                    "posterior": round(score, 4),
                }
                for candidate, score in self.candidates
            ],
            "steps": [step.to_json() for step in self.steps],
            "missing": [item.to_json() for item in self.missing],
            "stopped": self.stopped,
        }


def candidates(
    static: Wiring, serving: Wiring, recorded_ids: Iterable[tuple[str, tuple[int, ...]]], num_layers: int
) -> list[CandidateWiring]:
    """The training wirings worth telling apart, with priors: the training source's own reading
    first, then agreement with serving, then recorded ids under each convention, then defaults."""
    found: dict[tuple[Tap, ...], tuple[list[str], float]] = {}

    def add(slots: Iterable[Tap], origin: str, weight: float) -> None:
        slots = tuple(slots)
        if not slots or any(tap.layer is None or not 0 <= tap.layer <= num_layers for tap in slots):
            return
        origins, prior = found.get(slots, ([], 0.0))
        found[slots] = ([*origins, origin], prior + weight)

    if static.resolved:
        add(static.slots, "the training source", 4.0)
    if serving.resolved:
        add(serving.slots, "the serving wiring (training and serving agree)", 2.0)
    for where, ids in recorded_ids:
        add((Tap(k + 1) for k in ids), f"{where} {list(ids)} read as k -> h(k+1)", 1.0)
        add((Tap(k) for k in ids), f"{where} {list(ids)} read as k -> hk", 1.0)
    n = num_layers
    add((Tap(k) for k in (2, n // 2, n - 3)), f"the engines' default taps [2, N//2, N-3] (N={n})", 0.5)
    add(
        (Tap(k + 1) for k in (2, n // 2, n - 3)),
        f"the default ids [2, N//2, N-3] captured after their layer (N={n})",
        0.5,
    )
    total = sum(prior for _, prior in found.values())
    return [CandidateWiring(slots, tuple(origins), prior / total) for slots, (origins, prior) in found.items()]


def investigate(
    pool: list[CandidateWiring],
    inputs: ProbeInputs,
    progress: Progress | None = None,
    remembered: Iterable[dict[str, Any]] = (),
) -> Investigation:
    """Run probes until one candidate is believed or nothing left separates the candidates. An
    observation `remembered` from an earlier run on the same inputs is used instead of running
    its probe again (and counts even where the probe cannot run here)."""
    belief = {candidate.slots: candidate.prior for candidate in pool}
    by_slots = {candidate.slots: candidate for candidate in pool}
    kept = {
        item["probe"]: AgentStep.observation_from_json(item) for item in remembered if item.get("key") == inputs.key
    }
    runnable: dict[str, Probe] = {}
    missing: list[Missing] = []
    for name, kind in registered_probes().items():
        probe = kind()
        if not probe.applies(inputs) and name not in kept:
            continue
        reason = probe.unavailable(inputs)
        if reason is None or name in kept:
            runnable[name] = probe
        else:
            missing.append(Missing(name, reason, _command(probe)))
    steps: list[AgentStep] = []
    verifier_last: Tap | None = None
    stopped = ""
    while True:
        if max(belief.values(), default=0.0) >= CONFIDENT:
            stopped = f"{_top(belief)} is believed at {max(belief.values()):.2f}"
            break
        choice = _choose(runnable.values(), belief)
        if choice is None:
            stopped = (
                "no probe left that separates the candidates" if runnable or not missing else "no probe can run here"
            )
            break
        probe, reason = choice
        del runnable[probe.name]
        observation = _observe(probe, reason, inputs, kept, missing, progress)
        if observation is None:
            continue
        observed_slots = _as_slots(observation)
        if (
            observed_slots is not None and observed_slots not in belief
        ):  # the dumps hold a wiring no candidate predicted
            by_slots[observed_slots] = CandidateWiring(observed_slots, (f"observed by {probe.name}",), 0.0)
            belief[observed_slots] = UNFORESEEN * sum(belief.values())
        belief = _update(belief, probe, observation)
        if observation.data.get("verifier_last"):
            verifier_last = Tap.parse(observation.data["verifier_last"]["tap"])
        steps.append(
            AgentStep(
                probe.name,
                reason,
                observation,
                tuple((_label(slots), score) for slots, score in _ranked(belief)),
                inputs.key,
                probe.name in kept,
            )
        )
    for probe in [probe for probe in runnable.values() if probe.settles]:  # the draft's contract, once
        reason = f"bears on {', '.join(probe.settles)} whatever training fed, for cost {probe.cost:g}"
        observation = _observe(probe, reason, inputs, kept, missing, progress)
        if observation is None:
            continue
        believed = tuple((_label(slots), score) for slots, score in _ranked(belief))
        steps.append(AgentStep(probe.name, reason, observation, believed, inputs.key, probe.name in kept))
    ranked = tuple((by_slots[slots], score) for slots, score in _ranked(belief))
    return Investigation(ranked, tuple(steps), tuple(missing), verifier_last, stopped)


def _observe(
    probe: Probe,
    reason: str,
    inputs: ProbeInputs,
    kept: dict[str, Observation],
    missing: list[Missing],
    progress: Progress | None,
) -> Observation | None:
    """What the probe observes (or observed in an earlier run); None, with the evidence listed as
    missing, when it could not run or saw nothing usable."""
    if progress:
        progress(f"agent: {'using the remembered' if probe.name in kept else 'running'} {probe.name}: {reason}")
    try:
        observation = kept[probe.name] if probe.name in kept else probe.run(inputs, progress)
    except RcaError as error:
        missing.append(Missing(probe.name, str(error), _command(probe)))
        return None
    if observation.value is None:
        missing.append(Missing(probe.name, observation.summary, _command(probe)))
        return None
    return observation


def _choose(runnable: Iterable[Probe], belief: dict[tuple[Tap, ...], float]) -> tuple[Probe, str] | None:
    """The probe with the most expected information per unit cost, and why."""
    best: tuple[float, Probe, str] | None = None
    for probe in runnable:
        outcomes: dict[Hashable, float] = {}
        for slots, score in belief.items():
            outcomes[probe.predict(slots)] = outcomes.get(probe.predict(slots), 0.0) + score
        bits = -sum(p * math.log2(p) for p in outcomes.values() if p > 0)
        if bits < 1e-3:
            continue
        value = bits / probe.cost
        if best is None or value > best[0]:
            groups = sorted(outcomes.items(), key=lambda item: -item[1])[:3]
            split = " vs ".join(f"{_predicted(probe, outcome, belief)} ({share:.2f})" for outcome, share in groups)
            best = (value, probe, f"separates {split}: {bits:.2f} bits for cost {probe.cost:g}")
    return (best[1], best[2]) if best else None


def _predicted(probe: Probe, outcome: Hashable, belief: dict[tuple[Tap, ...], float]) -> str:
    """The most believed candidate behind a predicted outcome."""
    slots = max((slots for slots in belief if probe.predict(slots) == outcome), key=lambda slots: belief[slots])
    return _label(slots)


def _update(
    belief: dict[tuple[Tap, ...], float], probe: Probe, observation: Observation
) -> dict[tuple[Tap, ...], float]:
    updated = {slots: score * _likelihood(probe.predict(slots), observation) for slots, score in belief.items()}
    total = sum(updated.values())
    return {slots: score / total for slots, score in updated.items()} if total else belief


def _likelihood(predicted: Hashable, observation: Observation) -> float:
    """How likely the observation is under a prediction. A per-slot observation (a tuple of taps)
    is judged slot by slot, so a wiring off in one slot stays likelier than one off in all."""
    right, wrong = observation.reliability, 1 - observation.reliability
    observed = observation.value
    if isinstance(predicted, tuple) and isinstance(observed, tuple) and len(predicted) == len(observed):
        return math.prod(right if a == b else wrong for a, b in zip(predicted, observed, strict=False))
    return right if predicted == observed else wrong


def _as_slots(observation: Observation) -> tuple[Tap, ...] | None:
    """The wiring an observation names outright (the fingerprint's taps), if it names one."""
    if (
        isinstance(observation.value, tuple)
        and observation.value
        and all(isinstance(item, str) for item in observation.value)
    ):
        return tuple(Tap.parse(item) for item in observation.value)
    return None


def _ranked(belief: dict[tuple[Tap, ...], float]) -> list[tuple[tuple[Tap, ...], float]]:
    return sorted(belief.items(), key=lambda item: -item[1])


def _top(belief: dict[tuple[Tap, ...], float]) -> str:
    return _label(_ranked(belief)[0][0])


def _label(slots: Iterable[Tap]) -> str:
    return "[" + ", ".join(str(tap) for tap in slots) + "]"


def _command(probe: Probe) -> str:
    return f"{probe.command} {probe.arguments}"


def _dedupe(steps: Iterable[Step]) -> tuple[Step, ...]:
    return tuple(dict.fromkeys(steps))


def measure_impact(
    inputs: ProbeInputs, draft: Path | None, serving: Wiring, training: Wiring, progress: Progress | None = None
) -> dict[str, Any]:
    """What a diagnosed mismatch costs: the draft checkpoint's first-token acceptance on the dump's
    prompts as served and with the wiring it was trained on (which the fix restores). Returns
    the measurement, or why it could not be taken and the command that would take it."""
    directory = draft if draft is None or draft.is_dir() else draft.parent
    served, trained = tuple(str(tap) for tap in serving.slots), tuple(str(tap) for tap in training.slots)
    command = f"rca probe acceptance --draft DRAFT_DIR --dumps DUMPS --target MODEL_DIR --wiring {','.join(served)}"
    reason = needs_dumps_and_weights(inputs)
    if reason is None and (directory is None or not any(directory.glob("*.safetensors"))):
        reason = "the draft has no safetensors weights (--draft is a config only)"
    if reason is None and any(tap.partial or tap.residual_missing for tap in serving.slots):
        reason = f"serving feeds {_label(serving.slots)}, which no target pass reproduces"
    if reason is None and len(served) != len(trained):
        reason = f"serving feeds {len(served)} states, the draft takes {len(trained)}: it cannot run on them at all"
    if reason is not None:
        return {"measured": False, "reason": reason, "command": command}
    from rca.evidence.acceptance import measure_acceptance

    if progress:
        progress("measuring what the mismatch costs: the draft's acceptance as served and as trained")
    try:
        assert inputs.dumps is not None and inputs.model_directory is not None and directory is not None
        report = measure_acceptance(
            inputs.dumps,
            inputs.model_directory,
            [served, trained],
            inputs.device,
            inputs.max_tokens,
            base=inputs.base,
            progress=progress,
            draft=directory,
        )
    except RcaError as error:
        return {"measured": False, "reason": str(error), "command": command}
    rates = dict(report.results)
    return {
        "measured": True,
        "served": {"wiring": list(served), "acceptance": round(rates[served], 4)},
        "trained": {"wiring": list(trained), "acceptance": round(rates[trained], 4)},
        "tokens": report.test_tokens,
        "summary": f"the draft's first-token acceptance is {rates[served]:.3f} as served ({_label(serving.slots)}) "
        f"and {rates[trained]:.3f} with the wiring it was trained on ({_label(training.slots)})",
    }
