"""Probe: how many slots the dumps hold, from the first dump file."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rca.sdk import Observation, Probe, ProbeExample, ProbeInputs, Tap
from rca.sdk.evidence import dump_citation


class DumpShape(Probe):
    """Counts the draft-input slots in the dumps, as the dump format's trainer splits them.

    ## Why it matters
    A wiring with another slot count cannot be what training fed; reading one file's shapes rules
    such candidates out for almost nothing, and checks that the dumps are readable at all.
    """

    name = "dump-shape"
    cost = 0.05
    command = "rca probe shape"

    EXAMPLES = (
        ProbeExample(("h3", "h5"), 2, "h8", why="two slots beside the verifier's last state"),
        ProbeExample(("h2", "h4", "h5", "h6"), 4, why="four slots, no verifier state"),
    )

    def unavailable(self, inputs: ProbeInputs) -> str | None:
        return None if inputs.dumps is not None else "no training dumps (--dumps)"

    def predict(self, slots: tuple[Tap, ...]) -> Hashable:
        return len(slots)

    def run(self, inputs: ProbeInputs, progress: Any = None) -> Observation:
        assert inputs.dumps is not None
        dumps = inputs.open_dumps()
        sample = next(dumps.samples(inputs.max_tokens))
        width = int(sample.slots[0].shape[-1]) if sample.slots else 0
        return Observation(
            self.name,
            len(sample.slots),
            f"{len(dumps.files)} {dumps.format} file(s); each holds {len(sample.slots)} slot(s) of width {width}"
            + (" and the verifier's last state" if sample.verifier_last is not None else ""),
            {"format": dumps.format, "files": len(dumps.files), "slots": len(sample.slots), "width": width},
            (dump_citation(sample.path, f"{len(sample.slots)} slots of width {width}"),),
            reliability=0.999,
        )
