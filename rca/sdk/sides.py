"""What one side holds beyond its code, as analyzers ask for it: the layer ids its dumps record,
what its capturing engine captures for some ids, whether a value comes from the draft's config,
its trainer's draft module, and the pipeline stages its launch serves."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from rca.inputs.configs import ConfigFile, DraftConfig
from rca.inputs.dumps import read_dump_metadata
from rca.inputs.provenance import draft_families
from rca.inputs.vocabulary import TokenIds, tokenizer_ids
from rca.model import Step, StepKind, Tap
from rca.sdk.engines import PIPELINE_SETTINGS
from rca.static.analyzer import registry
from rca.static.codeindex import ClassInfo, walk
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.evaluate.values import ConfigObj, MutList, Val
from rca.static.facts import CapturedTaps, CaptureSet
from rca.static.wiring import resolve_wiring

__all__ = [
    "IDS_KEY",
    "DraftVocabulary",
    "EngineCapture",
    "VocabularyRelation",
    "capture_by_engine",
    "draft_vocabulary",
    "dump_ids",
    "pipeline_stages",
    "reads_draft",
    "trainer_draft_module",
]

IDS_KEY = "eagle_aux_hidden_state_layer_ids"


_HEAD_CALL = re.compile(r"\.lm_head\(")


@dataclass(frozen=True)
class EngineCapture:
    """What an engine's code captures for some ids: the taps in capture order, and its steps."""

    taps: tuple[Tap, ...]
    steps: tuple[Step, ...]


def capture_by_engine(ctx: SideContext, ids: list[int]) -> EngineCapture | None:
    """Read what the training side's engine (`--training-engine`) captures for `ids`: its serving
    analysis, run on a draft config that declares them where any engine reads them."""
    if ctx.engine is None:
        return None
    data = {IDS_KEY: ids, "eagle_config": {IDS_KEY: ids}}
    handed = ConfigFile.from_data("draft", Path("handed-ids.json"), f"the ids handed to {ctx.engine.label}", data)
    engine = SideContext("serving", ctx.engine, ctx.target, DraftConfig(handed))
    wanted = {CaptureSet, CapturedTaps}
    run_side(
        engine, only={analyzer.name for analyzer in registry().for_side("serving") if wanted & set(analyzer.provides)}
    )
    captured = engine.fact(CapturedTaps)
    taps = captured.taps if captured is not None else ()
    if not taps or any(tap is None for tap in taps):
        for note in engine.notes:
            ctx.note(f"{ctx.engine.label}: {note.text}")
        ctx.note(f"what {ctx.engine.label} captures for {ids} could not be read")
        return None
    steps = tuple(step for step in resolve_wiring(engine).steps if step.location.input == ctx.engine.input)
    return EngineCapture(tuple(tap for tap in taps if tap is not None), steps)


def dump_ids(ctx: SideContext) -> Val | None:
    """The layer ids the dump directory records (`--dumps`), as a value citing that record."""
    metadata = read_dump_metadata(ctx.dumps, None) if ctx.dumps is not None else None
    if metadata is None:
        return None
    key = ctx.graph.from_step(StepKind.DUMP, metadata.step)
    ctx.graph.observe(key, str(list(metadata.ids)))
    return Val(MutList([Val(i, frozenset({key})) for i in metadata.ids]), frozenset({key}))


def reads_draft(ctx: SideContext, value: Val, *, looked_for: bool = False) -> bool:
    """Whether the value flows from a key of the draft's config (or, with `looked_for`, from a
    lookup of one it lacks)."""
    kinds = (StepKind.CONFIG, StepKind.CONFIG_MISSING) if looked_for else (StepKind.CONFIG,)
    return any(
        node.kind in kinds and node.location.input == "draft"
        for key in value.src
        for node in (ctx.graph.ancestors(key) | {key})
    )


def of_another_family(ctx: SideContext, relpath: str) -> bool:
    """Whether a trainer's file is another draft family's: for a draft whose config is of a family
    other than EAGLE-3 (DFlash), a file whose path does not name that family. A trainer package
    holds several families' modules; what one family's code does says nothing of another's."""
    families = draft_families(ctx.draft) - {"eagle3"} if ctx.draft is not None else set()
    return bool(families) and not any(family in relpath.lower() for family in families)


def trainer_draft_module(ctx: SideContext, flag: str | None = None) -> tuple[ClassInfo, Val] | None:
    """A trainer's draft class that its config does not name (speculators' `Eagle3DraftModel`),
    found by what it does, not where it is: a class that builds an `fc` over the target's states
    (its own `self.fc`, or a base's) and whose method computes the head, the one reading `flag` (a
    draft config key) first; built with the draft's config."""
    assert ctx.index is not None and ctx.draft is not None
    named = {value for value in ctx.draft.config.data.values() if isinstance(value, str)}
    named |= set(ctx.draft.architectures) | draft_families(ctx.draft)
    found: list[tuple[bool, bool, str, ClassInfo]] = []
    heads = set(ctx.anchor_files(".lm_head("))
    for relpath in sorted(heads & set(ctx.anchor_files(_BUILDS_FC))):
        if of_another_family(ctx, relpath):
            continue
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        for cls in module.classes.values() if module is not None else ():
            computing = [method for method in cls.methods.values() if _HEAD_CALL.search(method.text)]
            if computing:
                reads = flag is not None and any(flag in method.text for method in computing)
                found.append((not reads, not _named_by(cls, named), relpath, cls))
    if not found:
        return None
    cls = min(found, key=lambda item: item[:3])[3]
    return cls, ctx.evaluator.new_object(cls, [], {"config": Val(ConfigObj(ctx.draft.config))})


_BUILDS_FC = "self.fc = "  # a draft's projection of the target's concatenated states (in its module)


def _named_by(cls: ClassInfo, names: set[str]) -> bool:
    """Whether the draft config names the class: its name, or a registration decorator's key
    (speculators' `@SpeculatorModel.register("eagle3")`, for a config of the EAGLE-3 family)."""
    if cls.name in names:
        return True
    return any(
        isinstance(node, cst.SimpleString) and node.evaluated_value in names
        for decorator in cls.node.decorators
        for node in walk(decorator)
    )


def pipeline_stages(ctx: SideContext) -> tuple[int, Step] | None:
    """The pipeline stages the launch serves, where it sets more than one, with the setting's line."""
    for dest in PIPELINE_SETTINGS:
        setting = ctx.settings.get(dest) if ctx.settings is not None else None
        value = setting.value if setting is not None else None
        stages = int(value) if isinstance(value, (int, str)) and str(value).strip().isdigit() else None
        if setting is not None and stages is not None and stages > 1:
            return stages, setting.step
    return None


class VocabularyRelation(enum.Enum):
    """What a draft's vocabulary is to its target's, by their rows and the tokenizer's ids."""

    SAME = "same"  # as many rows as the target's, or more
    PADDED = "padded"  # fewer rows, but every id the tokenizer emits among them: the target's, padded otherwise
    REDUCED = "reduced"  # a subset of the target's tokens (it ships a map, or lacks ids the tokenizer emits)
    UNSURE = "unsure"  # fewer rows, no map, and no tokenizer.json to tell padding from a reduction


@dataclass(frozen=True)
class DraftVocabulary:
    """The draft's vocabulary against its target's: their rows, the tokenizer's ids where they are
    known, and the relation they make."""

    relation: VocabularyRelation
    draft_rows: int
    target_rows: int
    sized: Step  # where the draft's rows were read: draft_vocab_size, its lm_head, or its vocab_size
    tokenizer: TokenIds | None
    mapped: bool  # the checkpoint ships a d2t or a t2d

    @property
    def reduced(self) -> bool:
        return self.relation is VocabularyRelation.REDUCED

    @property
    def padding(self) -> str:
        """Why fewer rows are not fewer tokens, said (for a PADDED vocabulary)."""
        assert self.tokenizer is not None
        return (
            f"the draft's {self.draft_rows:,} rows hold every id the target's tokenizer emits "
            f"({self.tokenizer.said}); the target's {self.target_rows:,} rows are the same vocabulary padded further, "
            "so draft token i is target token i"
        )


def draft_vocabulary(ctx: SideContext) -> DraftVocabulary | None:
    """The draft's vocabulary against the target's; None where either size is unknown. Rows are the
    draft config's draft_vocab_size, else its checkpoint's lm_head's, else its vocab_size. Fewer rows
    than the target's make a reduced vocabulary where the checkpoint ships a map (d2t, t2d) or the
    rows lack ids the target's tokenizer emits; where they hold them all it is the same vocabulary
    padded to another size, and without tokenizer.json it cannot be told (UNSURE)."""
    if ctx.draft is None or ctx.target.vocab_size is None:
        return None
    target_rows, data, weights = ctx.target.vocab_size, ctx.draft.config.data, ctx.draft.weights
    declared = data.get("draft_vocab_size")
    head = weights.find("lm_head.weight") if weights is not None else None
    rows: int | None
    if isinstance(declared, int) and not isinstance(declared, bool):
        rows = declared
        sized = ctx.draft.config.step(
            ("draft_vocab_size",), f"draft_vocab_size {declared}, the target's vocab_size is {target_rows}"
        )
    elif weights is not None and head is not None and head.shape:
        rows, sized = head.shape[0], weights.step(head.name)
    else:
        rows = data.get("vocab_size") if isinstance(data.get("vocab_size"), int) else None
        sized = ctx.draft.config.step(("vocab_size",), f"vocab_size {rows}, the target's vocab_size is {target_rows}")
    if rows is None or isinstance(rows, bool):
        return None
    mapped = weights is not None and any(weights.find(name) is not None for name in ("d2t", "t2d"))
    tokenizer = tokenizer_ids(ctx.target.config.file, ctx.base) if rows < target_rows and not mapped else None
    if rows >= target_rows:
        relation = VocabularyRelation.SAME
    elif mapped or (tokenizer is not None and rows < tokenizer.count):
        relation = VocabularyRelation.REDUCED
    elif tokenizer is not None and tokenizer.exact:
        relation = VocabularyRelation.PADDED
    elif isinstance(declared, int):  # a reduction the config declares, with no tokenizer to tell otherwise
        relation = VocabularyRelation.REDUCED
    else:
        relation = VocabularyRelation.UNSURE
    return DraftVocabulary(relation, rows, target_rows, sized, tokenizer, mapped)
