"""Which trainer taught a published draft, read from the keys its exporter wrote into the draft's
config.json (speculators' `speculators_config` and version, ModelOpt's nested `eagle_config`
settings, NeMo Automodel's architecture name), for a diagnosis given no `--training`."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from rca.errors import InputError
from rca.inputs.configs import DraftConfig
from rca.knowledge import Marker, Trainer, trainers
from rca.model import Step

# A release as a package index names it, with an optional development suffix (`0.9.0.dev12`).
_VERSION = re.compile(r"^(\d+(?:\.\d+){1,3})(?:\.?(?:dev|rc|a|b|post)\d*)?(?:\+[\w.]+)?$")


@dataclass(frozen=True)
class Provenance:
    """The trainer a draft config names, the release of it to analyze, and the lines that say so."""

    trainer: Trainer
    version: str
    recorded: bool  # the config records this release (else it is the newest its keys allow)
    steps: tuple[Step, ...]  # the config lines the inference rests on
    how: str  # how the release was chosen, in words

    @property
    def spec(self) -> str:
        return f"{self.trainer.package}=={self.version}"

    @property
    def summary(self) -> str:
        return f"{self.trainer.name} {self.version}"


def infer_trainer(draft: DraftConfig) -> tuple[Provenance | None, str]:
    """The trainer the draft config identifies, or None and why none could be named. A config
    that two trainers' exports claim, or whose recorded release is no release, is bad input."""
    config = draft.config
    claims = {trainer.id: _matched(draft, trainer.markers) for trainer in trainers().values()}
    claimed = {trainer_id: steps for trainer_id, steps in claims.items() if steps}
    if len(claimed) > 1:
        said = "; ".join(
            f"{', '.join(step.note for step in steps)} ({steps[0].location}) names {trainers()[trainer_id].name}"
            for trainer_id, steps in claimed.items()
        )
        raise InputError(
            f"the draft config's provenance is contradictory: {said}",
            where=config.display,
            fix="pass --training SRC with the trainer that taught the draft",
        )
    if not claimed:
        return None, "the draft config names no trainer (no key that one trainer's export alone writes)"
    [(trainer_id, markers)] = claimed.items()
    trainer = trainers()[trainer_id]
    steps = tuple(replace(step, note=f"{step.note}: written by {trainer.name}'s export") for step in markers)
    converted = _matched(draft, trainer.converted)
    if converted:
        return None, (
            f"the draft config was converted to {trainer.name}'s format ({converted[0].note}, "
            f"{converted[0].location}), which does not record the trainer that taught it"
        )
    if trainer.version_key:
        present, value = config.lookup(tuple(trainer.version_key.split(".")))
        if present:
            where = config.step(
                tuple(trainer.version_key.split(".")), f"{trainer.version_key} {value!r}: the release that wrote it"
            )
            match = _VERSION.match(value) if isinstance(value, str) else None
            if match is None:
                raise InputError(
                    f"{trainer.version_key} is {value!r}, which names no release of {trainer.name}",
                    where=str(where.location),
                    fix="pass --training SRC with the trainer that taught the draft",
                )
            version = match.group(1)
            how = f"its {trainer.version_key} is {value}" + (
                f", a development build: the release {version} is analyzed" if version != value else ""
            )
            return Provenance(trainer, version, version == value, (*steps, where), how), ""
    for release in trainer.releases:
        shown = _matched(draft, tuple(Marker(key) for key in release.requires))
        if len(shown) == len(release.requires):
            how = (
                f"its keys are those of {release.range}"
                + (f" ({', '.join(step.note for step in shown)})" if shown else "")
                + f" and it records no release: {release.analyze} is analyzed"
            )
            dated = {step.location: step for step in shown}
            steps = tuple(
                replace(step, note=f"{step.note}, from {release.range}") if step.location in dated else step
                for step in steps
            ) + tuple(step for step in shown if step.location not in {s.location for s in steps})
            return Provenance(trainer, release.analyze, False, steps, how), ""
    raise AssertionError("the oldest release of a trainer requires no key")  # checked when the data is loaded


def _matched(draft: DraftConfig, markers: tuple[Marker, ...]) -> tuple[Step, ...]:
    """The config lines of the markers the draft config carries."""
    steps = []
    for marker in markers:
        present, value = draft.config.lookup(marker.path)
        if present and (marker.equals is None or value == marker.equals):
            shown = marker.key if marker.equals is None else f"{marker.key} {value}"
            steps.append(draft.config.step(marker.path, shown))
    return tuple(steps)
