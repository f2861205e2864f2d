"""The analyzer contract: one module, one class, a fixed contract, discovered automatically.

An analyzer reads one piece of the wiring (where the layer ids are read, where they are
captured, how the captures become the draft input) from the code in front of it and yields
facts and findings with source locations. It declares:

* `code` and `name`: a stable code (`RCA-S101`) and a kebab-case name for what it reads;
* `sides`: which side's source it reads ("serving", "training");
* `anchors`: identifiers whose presence marks a file worth parsing (a cheap text search);
* `requires` / `provides`: the fact types it consumes and produces (the run order follows);
* `VALID` / `INVALID`: small examples in the shape of real code, collected by the tests.
  A VALID example resolves to the expected taps with no finding from this analyzer; an
  INVALID one makes it report the finding named in the example, at the given line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Mapping

from rca.discovery import concrete_subclasses

if TYPE_CHECKING:
    from rca.static.context import SideContext
    from rca.static.facts import Fact, Finding


@dataclass(frozen=True)
class Example:
    """A small source tree (and configs) with what the analyzer must conclude from it."""

    files: Mapping[str, str]
    target: Mapping[str, Any]
    draft: Mapping[str, Any] | None = None
    dumps: Mapping[str, Any] | None = None  # file name -> JSON content in a dump directory
    engine: Mapping[str, str] | None = None  # training: the capturing engine's source (--training-engine)
    settings: str | None = None  # serving: the launch flags (--serving-args)
    slots: tuple[str, ...] | None = None  # expected draft-input taps of the side
    captured: tuple[str, ...] | None = None  # expected captured taps, when there is no draft input
    verifier_last: str | None = None
    fc_slots: int | None = None  # expected width of the draft's fc, in target hidden sizes
    finding: str | None = None  # INVALID: the finding name this analyzer must report
    line: int | None = None  # ... at this line of `path`
    path: str | None = None
    why: str = ""


class Analyzer:
    code: ClassVar[str]
    name: ClassVar[str]
    sides: ClassVar[frozenset[str]]
    anchors: ClassVar[tuple[str, ...]] = ()
    requires: ClassVar[tuple[type, ...]] = ()
    provides: ClassVar[tuple[type, ...]] = ()
    reports: ClassVar[tuple[str, ...]] = ()  # findings of an analyzer that establishes no fact (a hazard check)
    VALID: ClassVar[tuple[Example, ...]] = ()
    INVALID: ClassVar[tuple[Example, ...]] = ()

    def applies_to(self, ctx: SideContext) -> bool:
        """By default: the side's source contains one of the anchors."""
        return not self.anchors or any(ctx.anchor_files(anchor) for anchor in self.anchors)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        raise NotImplementedError

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
        duplicated = {item for item in codes + names if codes.count(item) > 1 or names.count(item) > 1}
        if duplicated:
            raise RuntimeError(f"duplicate analyzer codes or names: {sorted(duplicated)}")
        _REGISTRY = Registry(sorted(found, key=lambda analyzer: analyzer.code))
    return _REGISTRY
