"""The plugin surface: everything an analyzer or a probe may import from rca, and nothing else.

Analyzers (`rca.analyzers.<family>.<name>`) and probes (`rca.analyzers.probes.<name>`) import rca
only through this package, so the core can change behind it; a codebase test enforces it. This
module holds the contract and the facts and findings it speaks of; the submodules hold the tools:

* `rca.sdk.code`: reading code (the module index, calls, attributes, cited lines);
* `rca.sdk.values`: the symbolic evaluator's values and library;
* `rca.sdk.inputs`: configs, checkpoints, dumps, launch settings and chat templates;
* `rca.sdk.sides`: what one side holds beyond its code (ids, dumps, its engine, its trainer's draft);
* `rca.sdk.engines`: facts about how engines build a draft's config and hand over layer ids;
* `rca.sdk.evidence`: tensor helpers for probes;
* `rca.sdk.examples`: example trees and configs the analyzers' examples share.

docs/adding-an-analyzer.md walks through writing one.
"""

from rca.errors import InputError
from rca.evidence.probes import Observation, Probe, ProbeExample, ProbeInputs
from rca.model import (
    CheckpointEdit,
    Confidence,
    ConfigEdit,
    Drafting,
    Evidence,
    Location,
    Severity,
    Step,
    StepKind,
    Tap,
    TemplateUse,
    Wiring,
)
from rca.static.analyzer import Analyzer, Compares, Establishes, Example, Reports
from rca.static.context import SideContext
from rca.static.facts import (
    Aspect,
    CapturedTaps,
    CaptureSet,
    DraftInput,
    DraftWidth,
    Fact,
    Finding,
    IdsOrigin,
)

__all__ = [
    "Analyzer",
    "Aspect",
    "CaptureSet",
    "CapturedTaps",
    "CheckpointEdit",
    "Compares",
    "Confidence",
    "ConfigEdit",
    "DraftInput",
    "DraftWidth",
    "Drafting",
    "Establishes",
    "Evidence",
    "Example",
    "Fact",
    "Finding",
    "IdsOrigin",
    "InputError",
    "Location",
    "Observation",
    "Probe",
    "ProbeExample",
    "ProbeInputs",
    "Reports",
    "Severity",
    "SideContext",
    "Step",
    "StepKind",
    "Tap",
    "TemplateUse",
    "Wiring",
]
