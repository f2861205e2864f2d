"""Probe: what the running engine fed the draft (an `rca capture`), as evidence for the diagnosis."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rca.sdk import Confidence, Evidence, Observation, Probe, ProbeInputs, Tap, Wiring
from rca.sdk.evidence import dump_citation

TRANSFORMED = "transformed"  # no serving slot resembles anything it was compared with
FED = "fed"  # the serving slots were named


class ServingCapture(Probe):
    """What a serving capture shows the draft was fed: its slots named, states in another basis, partial sums.

    ## Why it matters
    The code says what the engine should feed the draft; a capture taken inside the running
    engine (`rca capture`) shows what it did feed. Its slots are named by the target's taps (with
    `--target MODEL_DIR` and its weights) or by the training slots they equal (a capture of a
    prompt replayed from the dumps). Where the capture contradicts the serving code, the capture
    is the serving wiring. A capture whose slots resemble no tap of the given target holds states
    in another basis (a rotated or quantized target the draft was not trained on), which raises
    `target-transformed` by itself; captures of several tensor-parallel ranks that disagree hold
    partial sums, taken before the all-reduce. Slots that match rule out the transform.
    """

    name = "serving-capture"
    cost = 1.0
    command = "rca probe compare"
    arguments = "--capture DIR --target MODEL_DIR (or --dumps DUMPS)"
    settles = ("target-transformed", "capture-before-allreduce")

    def applies(self, inputs: ProbeInputs) -> bool:
        return inputs.capture is not None

    def unavailable(self, inputs: ProbeInputs) -> str | None:
        if inputs.capture is None:
            return "no serving capture (--capture DIR, written by rca capture)"
        if inputs.dumps is None and inputs.model_directory is None:
            return "nothing to compare the capture with: --target MODEL_DIR with the weights, or --dumps"
        return None

    def predict(self, slots: tuple[Tap, ...]) -> Hashable:
        return None  # what serving fed says nothing of what training fed

    def run(self, inputs: ProbeInputs, progress: Any = None) -> Observation:
        from rca.sdk.evidence import UNRELATED, compare

        assert inputs.capture is not None
        target = inputs.model_directory
        comparison = compare(
            inputs.capture, inputs.dumps, target, inputs.device, inputs.max_tokens, inputs.base, progress
        )
        best = [match["cosine"] for match in comparison.matches]
        transformed = bool(best) and max(best) < UNRELATED
        files = sorted(path.name for path in inputs.capture.glob("*.safetensors")) or [inputs.capture.name]
        return Observation(
            self.name,
            TRANSFORMED if transformed else FED,
            comparison.summary + (f"; {comparison.ranks['summary']}" if comparison.ranks else ""),
            {
                "serving": comparison.serving,
                "training": comparison.training,
                "matches": comparison.matches,
                "ranks": comparison.ranks,
                "named_by": "the target's taps" if target is not None else "the training slots",
            },
            tuple(
                dump_citation(f"{inputs.capture.name}/{name}", "what the engine fed the draft (rca capture)")
                for name in files[:3]
            ),
            reliability=0.99,
        )

    def bearing(self, observation: Observation, serving: Wiring) -> dict[str, Evidence]:
        cited, said = observation.citations[:1], observation.summary
        found: dict[str, Evidence] = {}
        if observation.value == TRANSFORMED:
            found["target-transformed"] = Evidence(said, Confidence.OBSERVED, 20.0, cited)
        elif "?" not in observation.data.get("serving", ["?"]):
            found["target-transformed"] = Evidence(said, Confidence.OBSERVED, 0.1, cited)
        ranks = observation.data.get("ranks") or {}
        if ranks:
            agree = bool(ranks.get("agree"))
            found["capture-before-allreduce"] = Evidence(
                ranks.get("summary", said), Confidence.OBSERVED, 0.1 if agree else 20.0, cited
            )
        return found

    def served(self, observation: Observation, serving: Wiring, training: Wiring) -> Wiring | None:
        """The serving wiring a capture shows, where it names every slot and contradicts the code's:
        slots named by the target's taps, or by the training slots they equal (then read through the
        training wiring). None when the capture agrees with the code or does not name every slot."""
        names = observation.data.get("serving") or []
        taps: list[Tap] = []
        for name in names:
            if name.startswith("t") and name[1:].isdigit() and int(name[1:]) < len(training.slots):
                taps.append(training.slots[int(name[1:])])
                continue
            try:
                taps.append(Tap.parse(name))
            except ValueError:
                return None
        if not taps or any(not tap.known for tap in taps) or tuple(taps) == serving.slots:
            return None
        shown = "[" + ", ".join(str(tap) for tap in taps) + "]"
        code = "[" + ", ".join(str(tap) for tap in serving.slots) + "]"
        note = f"the serving capture shows the engine fed {shown}" + (
            f"; the serving source resolves to {code}, which the capture contradicts" if serving.resolved else ""
        )
        return Wiring(
            "serving",
            tuple(taps),
            serving.verifier_last,
            steps=(*observation.citations, *serving.steps),
            fc_slots=serving.fc_slots,
            ids=serving.ids,
            notes=(*serving.notes, f"serving: {note}"),
            aspects=serving.aspects,
        )
