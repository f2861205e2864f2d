"""Which trainer taught a published draft, read from the keys its exporter wrote into the draft's
config.json (speculators' `speculators_config` and version, ModelOpt's nested `eagle_config`
settings, NeMo Automodel's architecture name), for a diagnosis given no `--training`; and, for a
config that names none, the training its layout implies, stated as an assumption."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from rca.errors import InputError
from rca.inputs.configs import DraftConfig
from rca.knowledge import IdsPlacement, Layout, Marker, Trainer, layouts, trainers
from rca.model import Note, Step, StepKind, Tap, Wiring

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


@dataclass(frozen=True)
class AssumedTraining:
    """What a draft config that names no trainer implies it was trained on: the taps its layout
    implies, the config lines that say so, and the assumption in words for the verdict."""

    layout: Layout
    taps: tuple[Tap, ...]
    ids: tuple[int, ...] | None  # as the config declares them, where it does
    steps: tuple[Step, ...]
    assumption: str
    placement: IdsPlacement | None = None  # where the ids that decided are placed

    def read_by(self, serving: Wiring, engine: str) -> AssumedTraining:
        """The same assumption where the serving engine is the one whose numbering the ids are in
        (`engine`, read from its tree) and it reads them: trained on what that engine captures for
        them, which the serving side derived from its code."""
        placement = self.placement
        if placement is None or placement.engine != engine or serving.ids != self.ids or not serving.resolved:
            return self
        assumption = (
            f"its {placement.key} {list(self.ids or ())} are numbered as {engine} numbers them for this target "
            f"({placement.convention.split(':')[0]}), which the serving release derives: {_shown(serving.slots)}"
        )
        steps = (*self.steps[:-1], replace(self.steps[-1], note=f"assumed {assumption}"))
        return replace(self, taps=serving.slots, steps=steps, assumption=assumption)

    def wiring(self) -> Wiring:
        return Wiring(
            "training",
            self.taps,
            None,
            self.steps,
            ids=self.ids,
            notes=(str(Note("training", f"the trainer is not recorded: {self.assumption}")),),
            ids_steps=self.steps,
        )


def assume_training(draft: DraftConfig, layers: int) -> tuple[AssumedTraining | None, str]:
    """The training wiring a draft config's layout implies when it names no trainer (where it puts
    its ids, and the numbering that placement is written in; the default layers without ids), or
    None and why it implies none: a config of no known draft family, ids that are no layer list,
    or two placements that name different layers."""
    layout = next((layout for layout in layouts().values() if _is_of(draft, layout)), None)
    if layout is None:
        return None, "and its config is of no draft family whose layout implies the layers trained on"
    config = draft.config
    for key in layout.off:
        present, value = config.lookup(tuple(key.split(".")))
        if present and value is False:
            return None, f"and its {key} is false: it was trained on the target's last state, not on layers"
    placed: list[tuple[IdsPlacement, list[int]]] = []
    for placement in layout.ids:
        present, value = config.lookup(placement.path)
        if not present or value is None:
            continue
        if not (isinstance(value, list) and value and all(type(item) is int for item in value)):
            return None, f"and its {placement.key} is no list of layer ids"
        placed.append((placement, value))
    if not placed and not layout.default_taps:
        return None, f"and its {layout.name} config names no layer ids (its trainers pick them by the draft's depth)"
    if not placed:
        taps = tuple(Tap(layer) for layer in layout.default_layers(layers))
        named = config.step(("architectures",), f"architectures {list(draft.architectures)}: an {layout.name} draft")
        assumption = f"trained on {layout.default_convention}: {_shown(taps)} of {layers} layers"
        return AssumedTraining(layout, taps, None, (named, _assumed(named, f"assumed {assumption}")), assumption), ""
    if not any(placement.decides for placement, _ in placed):
        placement, ids = placed[0]
        return None, (
            f"and its {placement.key} {ids} records no numbering (ids there are written in whichever numbering the "
            "draft came with)"
        )
    converted = next((trainer for trainer in trainers().values() if _matched(draft, trainer.converted)), None)
    if converted is not None:
        return None, (
            f"and {converted.name}'s converter wrote it, copying the ids in the numbering of the draft it "
            "converted, which the config does not record"
        )
    readings = {tuple(Tap(k + placement.offset) for k in ids) for placement, ids in placed}
    if len(readings) > 1:
        said = " and ".join(f"{placement.key} {ids}" for placement, ids in placed)
        return None, f"and its {said} name different layers under their own numberings"
    (taps,) = readings
    placement, ids = next((placement, ids) for placement, ids in placed if placement.decides)
    past = [tap for tap in taps if tap.layer is not None and (tap.layer > layers or tap.layer < 0)]
    if past:  # h(layers) is the last state a forward has: no trainer took a later one
        return None, (
            f"and its {placement.key} {ids}, in {placement.convention.split(':')[0]}, name "
            f"{_shown(tuple(past))}: the {layers}-layer target has no such state (h0 to h{layers}), so no trainer "
            "took it; the ids are not in that numbering or name the wrong layers, which the trainer's record settles"
        )
    steps: list[Step] = [config.step(where.path, f"{where.key} = {value}") for where, value in placed]
    assumption = f"its {placement.key} {ids} are written in {placement.convention}: {_shown(taps)}"
    steps.append(_assumed(steps[-1], f"assumed {assumption}"))
    return AssumedTraining(layout, taps, tuple(ids), tuple(steps), assumption, placement), ""


def draft_families(draft: DraftConfig) -> set[str]:
    """The draft families (`eagle3`) whose layout the draft config has."""
    return {layout.id for layout in layouts().values() if _is_of(draft, layout)}


def family_name(draft: DraftConfig | None) -> str:
    """The name of the draft's own family as its config says (`DFlash`), EAGLE-3 by default."""
    found = [layout.name for layout in layouts().values() if draft is not None and _is_of(draft, layout)]
    return found[0] if found else "EAGLE-3"


def _is_of(draft: DraftConfig, layout: Layout) -> bool:
    named = any(name.lower() in arch.lower() for arch in draft.architectures for name in layout.architecture_names)
    return named or any(draft.config.lookup(tuple(key.split(".")))[0] for key in layout.keys)


def _assumed(cited: Step, note: str) -> Step:
    return Step(cited.location, note, cited.code, StepKind.ASSUMPTION)


def _shown(taps: tuple[Tap, ...]) -> str:
    return ", ".join(str(tap) for tap in taps)
