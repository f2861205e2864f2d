"""The analyzer contract: one module, one class, a fixed contract, discovered automatically.

An analyzer reads one piece of the wiring (where the layer ids are read, where they are
captured, how the captures become the draft input) from the code in front of it and yields
facts and findings with source locations. It declares:

* `code` and `name`: a stable code with its family's prefix (`RCA-S101`: serving capture, `RCA-T`:
  training capture, `RCA-D`: the draft's contract, `RCA-X`: across the sides) and a kebab-case
  name for what it reads, which is also its module's name; `formerly`: codes it had before (a
  code once given is never given to another analyzer);
* `sides`: which side's source it reads ("serving", "training");
* `anchors`: identifiers whose presence marks a file worth parsing (a cheap text search);
* `drafting`: what the launches it reads draft with (`Drafting.CAPTURED`, a draft fed captured
  hidden states, by default; `Drafting.OWN_LAYERS` for a launch drafting with MTP layers): it
  does not run on the others, where nothing it checks exists;
* `requires` / `provides`: the fact types it consumes and produces (the run order follows);
* `precedence`: when analyzers of one side provide the same fact, the one with the lower
  precedence runs first and its fact stands (the others are skipped);
* `reports`: the findings it can report, each the evidence for one catalog hypothesis;
* `compares`: for an analyzer of the draft's contract, which fact stands for training and which for
  serving (docs/contracts.md is generated from them);
* `establishes`: for an analyzer that compares the sides, what it establishes on each (an `Aspect`
  made with `self.aspect(...)`): the key it has on the side's wiring and in its JSON, and what it is;
* `across`: for an analyzer that reads both sides, the findings that compare what it established
  on each (`self.established(wiring)`, from the two wirings once both sides are analyzed and the
  evidence has settled them);
* `settled`: for an analyzer whose findings depend on its side's wiring, those findings again on
  the wiring the tensor evidence settled;
* `VALID` / `INVALID`: small examples in the shape of real code, collected by the tests.
  A VALID example resolves to the expected taps with no finding from this analyzer; an
  INVALID one makes it report the finding named in the example, with the given message, at
  the given path and line.

Its docstring is its documentation page (docs/analyzers.md is generated from it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from rca.discovery import concrete_subclasses
from rca.model import CheckpointEdit, Confidence, ConfigEdit, Drafting, Location, Severity, Step, Tap, Wiring
from rca.static.facts import Aspect, Finding

if TYPE_CHECKING:
    from rca.static.context import SideContext
    from rca.static.facts import Fact


# The analyzer families (packages of rca.analyzers) and their code prefixes, in the order a reader
# follows the wiring and in which analyzers free to run do run: what each side captures, then the
# draft's contract, then what compares the sides. Probes (`probes/`) report no findings: no code.
# The keys of a wiring's JSON that are the wiring's own: no analyzer's aspect may take one.
WIRING_KEYS = frozenset(Wiring("", (), None).to_json())

FAMILIES = {
    "serving_capture": "RCA-S",
    "training_capture": "RCA-T",
    "draft_contract": "RCA-D",
    "across": "RCA-X",
}


@dataclass(frozen=True)
class Reports:
    """A finding an analyzer can report, the catalog hypothesis it is evidence for, and how much it
    matters: a cause (acceptance falls on this launch), a warning (what the code makes possible and
    only tensors settle: a candidate that never outranks a consistent wiring until an observation
    raises it, and no difference of the contract) or a note (context)."""

    name: str  # kebab-case, naming the problem (`layer-ids-not-read`)
    hypothesis: str  # a catalog entry (knowledge/hypotheses/<id>.toml)
    severity: Severity = Severity.CAUSE


@dataclass(frozen=True)
class Compares:
    """What an analyzer of the draft's contract compares: the fact that stands for what the draft
    learned in training, the fact that stands for what serving gives it, and why those two (a
    difference between the draft and its target is evidence only where one of them makes it one)."""

    training: str
    serving: str


@dataclass(frozen=True)
class Establishes:
    """What an analyzer establishes on each side for its comparison across the sides: the key it
    has on the side's wiring and in the wiring's JSON (`draft_norm`), and what it is."""

    key: str  # snake case, unique among analyzers and apart from the wiring's own keys
    description: str


@dataclass(frozen=True)
class Example:
    """A small source tree (and configs) with what the analyzer must conclude from it."""

    files: Mapping[str, str]
    target: Mapping[str, Any]
    draft: Mapping[str, Any] | None = None
    weights: Mapping[str, tuple[str, tuple[int, ...], tuple | None]] | None = None  # the draft's checkpoint:
    # tensor name -> (safetensors dtype, shape, values or None for zeros)
    target_weights: Mapping[str, tuple[str, tuple[int, ...], tuple | None]] | None = None  # the target's, likewise
    parent_weights: Mapping[str, tuple[str, tuple[int, ...], tuple | None]] | None = None  # the draft it was
    # fine-tuned from (--parent-draft, with the draft's config), likewise
    draft_files: Mapping[str, bytes] | None = None  # files beside the draft's config, by name: a sidecar
    # an engine reads by its name (DFlash's mask_embedding.pt)
    dumps: Mapping[str, Any] | None = None  # file name -> JSON content in a dump directory
    engine: Mapping[str, str] | None = None  # training: the capturing engine's source (--training-engine)
    settings: str | None = None  # serving: the launch flags (--serving-args)
    training_args: str | None = None  # training: the trainer's flags (--training-args)
    tokenizer_config: Mapping[str, Any] | None = None  # the target's tokenizer_config.json, written beside its config
    tokenizer: Mapping[str, Any] | None = None  # the target's tokenizer.json, likewise
    serving_files: Mapping[str, str] | None = None  # an analyzer of both sides: `files` is the training
    # source and this the serving one; the example's finding comes from `across`
    slots: tuple[str, ...] | None = None  # expected draft-input taps of the side
    captured: tuple[str, ...] | None = None  # expected captured taps, when there is no draft input
    verifier_last: str | None = None
    fc_slots: int | None = None  # expected width of the draft's fc, in target hidden sizes
    finding: str | None = None  # INVALID: the finding name this analyzer must report
    message: str | None = None  # ... with this message
    path: str | None = None  # ... located in this file
    line: int | None = None  # ... at this line, given outright; or computed (rca.sdk.testing):
    key: tuple[str | int, ...] | None = None  # ... at this key of the config `path` names; else at the line
    # of the source file `path` that ends with the marker `# finding: NAME`
    why: str = ""


class Analyzer:
    code: ClassVar[str]
    name: ClassVar[str]
    formerly: ClassVar[tuple[str, ...]] = ()
    sides: ClassVar[frozenset[str]]
    anchors: ClassVar[tuple[str, ...]] = ()
    drafting: ClassVar[frozenset[Drafting]] = frozenset({Drafting.CAPTURED})
    requires: ClassVar[tuple[type, ...]] = ()
    provides: ClassVar[tuple[type, ...]] = ()
    precedence: ClassVar[int] = 50
    reports: ClassVar[tuple[Reports, ...]] = ()
    compares: ClassVar[Compares | None] = None  # for an analyzer of the contract: training against serving
    establishes: ClassVar[Establishes | None] = None  # for an analyzer with `across`: what it reads per side
    VALID: ClassVar[tuple[Example, ...]] = ()
    INVALID: ClassVar[tuple[Example, ...]] = ()

    def applies_to(self, ctx: SideContext) -> bool:
        """By default: the side's source contains one of the anchors."""
        return not self.anchors or any(ctx.anchor_files(anchor) for anchor in self.anchors)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        raise NotImplementedError

    def across(self, training: Wiring, serving: Wiring) -> Iterator[Finding]:
        """Findings that compare what this analyzer established on each side (none by default)."""
        return iter(())

    def settled(self, ctx: SideContext, wiring: Wiring) -> Iterator[Finding] | None:
        """For an analyzer whose findings depend on the side's wiring: its findings again on the
        wiring tensors settled (the dumps' states, where they contradict the code). None: its
        findings stand as the code gave them."""
        return None

    def finding(
        self,
        ctx: SideContext | str,
        name: str,
        message: str,
        location: Location,
        *,
        likelihood_ratio: float,
        confidence: Confidence = Confidence.INFERRED,
        steps: tuple[Step, ...] = (),
        taps: tuple[Tap, ...] = (),
        fix: str = "",
        edit: ConfigEdit | CheckpointEdit | None = None,
    ) -> Finding:
        """A finding this analyzer declared in `reports`, as evidence for its hypothesis with the
        severity declared there, on the side of `ctx` (or the side named, for a finding of `across`)."""
        declared = {report.name: report for report in self.reports}
        if name not in declared:
            raise RuntimeError(f"{self.name} reports {name!r}, which it does not declare in `reports`")
        return Finding(
            self.code,
            name,
            ctx if isinstance(ctx, str) else ctx.side,
            message,
            location,
            confidence,
            declared[name].hypothesis,
            likelihood_ratio,
            steps,
            taps,
            fix,
            edit,
            declared[name].severity,
        )

    def aspect(self, ctx: SideContext, location: Location, note: str, value: Any) -> Aspect:
        """What this analyzer established on the side of `ctx`, under the key it declares in `establishes`."""
        if self.establishes is None:
            raise RuntimeError(f"{self.name} yields an aspect but declares no `establishes`")
        return Aspect(ctx.side, self.name, location, note, self.establishes.key, value)

    def established(self, wiring: Wiring) -> Any | None:
        """What this analyzer established on the side of `wiring` (None where it established nothing)."""
        return wiring.aspect(self.establishes.key) if self.establishes is not None else None

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip().splitlines()
        return doc[0] if doc else cls.name


@dataclass
class Registry:
    analyzers: list[type[Analyzer]] = field(default_factory=list)

    def for_side(self, side: str) -> list[type[Analyzer]]:
        return [analyzer for analyzer in self.analyzers if side in analyzer.sides]

    def anchors(self, side: str) -> set[str]:
        return {anchor for analyzer in self.for_side(side) for anchor in analyzer.anchors}


_REGISTRY: Registry | None = None


def registry() -> Registry:
    """Every analyzer of the plugin package, checked for unique codes and names."""
    global _REGISTRY
    if _REGISTRY is None:
        found: list[type[Analyzer]] = concrete_subclasses(Analyzer)
        codes = [analyzer.code for analyzer in found]
        names = [analyzer.name for analyzer in found]
        keys = [analyzer.establishes.key for analyzer in found if analyzer.establishes is not None]
        keys += sorted(WIRING_KEYS)
        duplicated = {item for item in codes + names + keys if (codes + names + keys).count(item) > 1}
        if duplicated:
            raise RuntimeError(f"duplicate analyzer codes, names or wiring keys: {sorted(duplicated)}")
        _REGISTRY = Registry(sorted(found, key=lambda analyzer: analyzer.code))
    return _REGISTRY
