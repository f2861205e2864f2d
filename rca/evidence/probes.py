"""Probes: evidence from tensors, for the agent loop to choose from.

A probe observes something about the training dumps (which slots are the embedding, which tap
each slot is) at a cost. For the agent to choose among probes, each one also predicts what it
would observe if a candidate training wiring were true; a probe is worth running when candidates
the agent still believes in predict different observations. Probes live in `analyzers/` beside
the static analyzers and are discovered the same way; torch is imported only when one runs.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rca.discovery import concrete_subclasses
from rca.model import Evidence, Location, Step, StepKind, Tap, TemplateUse, Wiring

if TYPE_CHECKING:
    from rca.inputs.dumps import DumpSet


@dataclass(frozen=True)
class ProbeInputs:
    """What probes may read: the dumps, the target (a config file or a model directory with
    weights), the device, and how many tokens to use."""

    dumps: Path | None
    target: Path | None
    device: str = "auto"
    max_tokens: int = 1024
    base: Path | None = None
    draft: Path | None = None  # the draft's config or directory, for probes of its checkpoint
    parent_draft: Path | None = None  # the draft it was fine-tuned from (--parent-draft)
    served_template: TemplateUse | None = None  # how the server renders conversations, where read
    trained_template: TemplateUse | None = None  # how the trainer rendered them, where read
    capture: Path | None = None  # what the engine fed the draft (rca capture --output DIR)

    def open_dumps(self) -> DumpSet:
        assert self.dumps is not None
        return open_target_dumps(self.dumps, self.target, self.base)

    @property
    def key(self) -> dict[str, Any]:
        """What an observation depends on, to reuse it when a case is run again on the same inputs."""
        return {
            "dumps": str(self.dumps),
            "target": str(self.model_directory),
            "max_tokens": self.max_tokens,
            **({"draft": str(self.draft)} if self.draft is not None else {}),
            **({"parent_draft": str(self.parent_draft)} if self.parent_draft is not None else {}),
            **({"capture": str(self.capture)} if self.capture is not None else {}),
            **{
                name: [use.digest, dict(use.kwargs)]
                for name, use in (
                    ("served_template", self.served_template),
                    ("trained_template", self.trained_template),
                )
                if use is not None
            },
        }

    @property
    def model_directory(self) -> Path | None:
        """The target as a directory holding weights (a bare config.json has none)."""
        if self.target is None:
            return None
        directory = self.target if self.target.is_dir() else self.target.parent
        return directory if any(directory.glob("*.safetensors")) else None


@dataclass(frozen=True)
class Observation:
    """What a probe saw: a value comparable with the probe's predictions, a one-line summary, the
    data behind it (for JSON reports), and the dump files it read."""

    probe: str
    value: Hashable
    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    citations: tuple[Step, ...] = ()
    reliability: float = 0.98  # how often the probe observes the truth (the likelihood of a matching prediction)


@dataclass(frozen=True)
class ProbeExample:
    """Dumps holding `slots` (taps of a tiny target), and what the probe must observe in them;
    collected by the tests, which also check that `predict` agrees."""

    slots: tuple[str, ...]
    observed: Hashable
    verifier_last: str | None = None
    why: str = ""


class Probe:
    """One kind of tensor evidence. Subclasses set the class variables and implement `unavailable`,
    `predict` and `run`; `cost` is in seconds on a CPU for a small model, relative figures are what
    matter."""

    name: ClassVar[str]
    cost: ClassVar[float]
    command: ClassVar[str]  # the `rca probe` sub-command that runs it alone
    arguments: ClassVar[str] = "--dumps DUMPS --target MODEL_DIR"  # what that command needs
    # Contract hypotheses it bears on: such a probe says nothing about the training wiring, and the
    # agent runs it once the wiring is settled, whenever its inputs are there.
    settles: ClassVar[tuple[str, ...]] = ()
    EXAMPLES: ClassVar[tuple[ProbeExample, ...]] = ()

    def applies(self, inputs: ProbeInputs) -> bool:
        """Whether the probe concerns these inputs at all (a probe of the draft's checkpoint, when the
        draft has none, does not; it is then not listed as evidence missing)."""
        return True

    def unavailable(self, inputs: ProbeInputs) -> str | None:
        """Why this probe cannot run on these inputs (None when it can)."""
        raise NotImplementedError

    def predict(self, slots: tuple[Tap, ...]) -> Hashable:
        """The value this probe would observe if the dumps held `slots`."""
        raise NotImplementedError

    def run(self, inputs: ProbeInputs, progress: Any = None) -> Observation:
        raise NotImplementedError

    def bearing(self, observation: Observation, serving: Wiring) -> dict[str, Evidence]:
        """What the observation says about the catalog's hypotheses, given what serving feeds
        (hypothesis id -> evidence with its likelihood ratio); by default nothing beyond the
        training wiring it helps establish."""
        return {}

    def served(self, observation: Observation, serving: Wiring, training: Wiring) -> Wiring | None:
        """For a probe of what the engine fed the draft: the serving wiring it observed, where it
        contradicts the code's; None (by default) when it observed no serving wiring."""
        return None

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip().splitlines()
        return doc[0] if doc else cls.name


def open_target_dumps(dumps: Path, target: Path | None, base: Path | None) -> DumpSet:
    """The training dumps as the target reads them: split with its hidden size where a format
    needs it (SpecForge files without their last state), each token id checked against its
    vocabulary (where its config is readable)."""
    from rca.errors import InputError
    from rca.inputs.configs import TargetConfig, load_config
    from rca.inputs.dumps import open_dumps

    try:
        config = TargetConfig(load_config("target", target)) if target is not None else None
    except InputError:
        config = None
    return open_dumps(
        dumps, base, config.hidden_size if config else None, vocabulary=config.vocab_size if config else None
    )


def mean_cosine(torch: Any, left: Any, right: Any) -> float:
    """The mean cosine similarity of two stacks of rows, row by row."""
    return float(torch.nn.functional.cosine_similarity(left.float(), right.float(), dim=-1).mean())


def needs_dumps_and_weights(inputs: ProbeInputs) -> str | None:
    """Why a probe that reads the dumps and the target's weights cannot run (None when it can)."""
    if inputs.dumps is None:
        return "no training dumps (--dumps)"
    if inputs.model_directory is None:
        return "the target has no safetensors weights (--target is a config only)"
    return None


def encode_value(value: Hashable) -> Any:
    """An observed value as JSON (sets and tuples tagged, so that they come back as they were)."""
    if isinstance(value, frozenset):
        return {"set": sorted(value)}
    if isinstance(value, tuple):
        return {"tuple": list(value)}
    return value


def decode_value(data: Any) -> Hashable:
    if isinstance(data, dict) and "set" in data:
        return frozenset(data["set"])
    if isinstance(data, dict) and "tuple" in data:
        return tuple(data["tuple"])
    return data


def dump_citation(path: str, note: str) -> Step:
    return Step(Location("dumps", path, 1, 1), note, kind=StepKind.DUMP)


def cosine_table(tensor: Any, references: dict[str, Any]) -> dict[str, float]:
    """Mean per-token cosine similarity of `tensor` [S, H] with each reference [S, H]."""
    import torch.nn.functional as F

    if not references:
        return {}
    tensor = tensor.to(next(iter(references.values())).device).float()
    return {
        name: float(F.cosine_similarity(tensor, reference.float(), dim=-1).mean())
        for name, reference in references.items()
    }


def registered_probes() -> dict[str, type[Probe]]:
    """Every probe of the plugin package, by name, cheapest first."""
    probes: list[type[Probe]] = sorted(concrete_subclasses(Probe), key=lambda probe: probe.cost)
    return {probe.name: probe for probe in probes}
