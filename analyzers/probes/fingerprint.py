"""Probe: which tap each dump slot is, by running the target on the dump's tokens."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rca.sdk import Confidence, Evidence, Observation, Probe, ProbeExample, ProbeInputs, Tap, Wiring
from rca.sdk.evidence import ReferenceModel, cosine_table, dump_citation, needs_dumps_and_weights
from rca.sdk.inputs import DumpSet

CLEAR_MARGIN = 0.01  # cosine between a slot's match and the runner-up that leaves no doubt


class Fingerprint(Probe):
    """Names each dump slot's tap (h0..hN, hN+norm) by cosine similarity with the target's own taps.

    ## Why it matters
    The dump is what the draft was trained on, whatever the training code says. Running the target
    on the dump's tokens and matching every slot against every tap settles the training wiring,
    with the runner-up and the margin showing how clear each match is.
    """

    name = "fingerprint"
    cost = 20.0
    command = "rca probe fingerprint"

    EXAMPLES = (
        ProbeExample(
            ("h3", "h5", "h7"), ("h3", "h5", "h7"), "h8", why="speculators 0.3-style captures after layers 2, 4 and 6"
        ),
        ProbeExample(("h6", "h2", "h0"), ("h6", "h2", "h0"), "h8+norm", why="any order, the embedding included"),
    )

    def unavailable(self, inputs: ProbeInputs) -> str | None:
        return needs_dumps_and_weights(inputs)

    def predict(self, slots: tuple[Tap, ...]) -> Hashable:
        return tuple(str(tap) for tap in slots)

    def bearing(self, observation: Observation, serving: Wiring) -> dict[str, Evidence]:
        found = _teacher_state(observation)
        if not isinstance(observation.value, tuple) or not serving.resolved:
            return found
        served = tuple(str(tap) for tap in serving.slots)
        trained = "[" + ", ".join(observation.value) + "]"
        if served == observation.value:
            found["wiring-consistent"] = Evidence(
                f"the dumps hold {trained}, what serving feeds", Confidence.OBSERVED, 5.0, observation.citations[:1]
            )
        else:
            found["wiring-consistent"] = Evidence(
                f"the dumps hold {trained}, not what serving feeds",
                Confidence.OBSERVED,
                0.05,
                observation.citations[:1],
            )
        return found

    def run(self, inputs: ProbeInputs, progress: Any = None) -> Observation:
        assert inputs.dumps is not None and inputs.model_directory is not None
        dumps = inputs.open_dumps()
        if progress:
            progress(f"loading the target from {inputs.model_directory}")
        return self.observe(
            ReferenceModel.load(inputs.model_directory, inputs.device, inputs.base), dumps, inputs.max_tokens, progress
        )

    def observe(
        self, reference: ReferenceModel, dumps: DumpSet, max_tokens: int | None, progress: Any = None
    ) -> Observation:
        """Fingerprint `dumps` against a loaded target."""
        slot_sums: list[dict[str, float]] = []
        last_sums: dict[str, float] = {}
        tokens, files = 0, []
        for sample in dumps.samples(max_tokens):
            taps = reference.taps(sample.token_ids, on_device=True, source=sample.path)
            weight = len(sample.token_ids)
            tables = [cosine_table(slot, taps) for slot in sample.slots]
            slot_sums = (
                [_add(total, table, weight) for total, table in zip(slot_sums, tables, strict=False)]
                if slot_sums
                else [_add({}, table, weight) for table in tables]
            )
            if sample.verifier_last is not None:
                last_sums = _add(last_sums, cosine_table(sample.verifier_last, taps), weight)
            tokens += weight
            files.append(sample.path)
            if progress:
                progress(f"fingerprint: {tokens} tokens through {reference.label}")
        slots = [
            _match(index, {tap: total / tokens for tap, total in sums.items()}) for index, sums in enumerate(slot_sums)
        ]
        last = _match(None, {tap: total / tokens for tap, total in last_sums.items()}) if last_sums else None
        names = tuple(slot["tap"] for slot in slots)
        margin = min((slot["margin"] for slot in slots), default=0.0)
        described = ", ".join(
            f"slot {slot['slot']} = {slot['tap']} ({slot['cosine']:.4f}, "
            f"next {slot['runner_up']['tap']} {slot['runner_up']['cosine']:.4f})"
            for slot in slots
        )
        return Observation(
            self.name,
            names,
            f"the dumps hold [{', '.join(names)}]"
            + (f", verifier-last {last['tap']}" if last else "")
            + f": {described}",
            {
                "schema": "rca.fingerprint/1",
                "model": reference.label,
                "device": reference.device,
                "tokens": tokens,
                "slots": slots,
                "verifier_last": last,
            },
            tuple(dump_citation(path, "fingerprinted against the target's taps") for path in files[:3]),
            reliability=0.999 if margin >= CLEAR_MARGIN else 0.9,
        )


def _teacher_state(observation: Observation) -> dict[str, Evidence]:
    """What the dumps' observed last state says of a teacher computed from it without the final
    norm: a pre-norm hN bears it out, a state already after the norm rules it out."""
    last = observation.data.get("verifier_last") if isinstance(observation.data, dict) else None
    if not last:
        return {}
    tap = Tap.parse(last["tap"])
    where = "after" if tap.norm else "before"
    return {
        "teacher-unnormed": Evidence(
            f"the dumps' last state is {tap} ({last['cosine']:.4f}), {where} the target's final norm",
            Confidence.OBSERVED,
            0.1 if tap.norm else 3.0,
            observation.citations[:1],
        )
    }


def _add(total: dict[str, float], table: dict[str, float], weight: int) -> dict[str, float]:
    return {tap: total.get(tap, 0.0) + cosine * weight for tap, cosine in table.items()}


def _match(slot: int | None, cosines: dict[str, float]) -> dict[str, Any]:
    ranked = sorted(cosines.items(), key=lambda item: -item[1])
    (tap, cosine), (runner, runner_cosine) = ranked[0], ranked[1]
    return {
        **({"slot": slot} if slot is not None else {}),
        "tap": tap,
        "cosine": round(cosine, 6),
        "runner_up": {"tap": runner, "cosine": round(runner_cosine, 6)},
        "margin": round(cosine - runner_cosine, 6),
    }
