"""How the serving engine turns a reduced-vocabulary draft's token ids into target ids, and whether
the draft's checkpoint gives it a map that can be right."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from rca.sdk import (
    Analyzer,
    Compares,
    Confidence,
    Example,
    Fact,
    Finding,
    Reports,
    Severity,
    SideContext,
    Step,
    StepKind,
)
from rca.sdk.code import ClassInfo, FunctionInfo, attribute_stores, inherited_method, walk
from rca.sdk.examples import DRAFT_LOADER, SMALL_VOCAB_DRAFT, SMALL_VOCAB_TARGET, TOKENIZER_24, d2t_offsets
from rca.sdk.inputs import DraftTensor, DraftWeights
from rca.sdk.sides import VocabularyRelation, draft_vocabulary

_INTEGER = frozenset({"I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64"})
_LIKELIHOOD = 20.0  # a map that cannot be right, or none where one is needed: rarely seen without the failure


@dataclass(frozen=True)
class EngineMap:
    """Where the serving code loads the draft's `d2t`, what receives it, and how it is used."""

    cls: ClassInfo
    attribute: str | None  # the field d2t is loaded into (`hot_token_id`, `draft_id_to_target_id`)
    load: Step | None  # the test on the checkpoint name `d2t`; None when the loader has none
    initial: Step | None  # the field's value in `__init__`, what stays when d2t is not loaded
    offsets: Step | None  # where draft ids are added to the map (d2t holds offsets)
    loader: Step | None  # the `load_weights` def


class VocabMap(Analyzer):
    """Reads how the serving engine maps a reduced-vocabulary draft's ids to target ids, and checks the map.

    ## What it reads
    From the draft: `draft_vocab_size` (or the rows of its `lm_head`) against the target's
    `vocab_size`, and the checkpoint's `d2t` (for each draft id i, the offset to its target id)
    and `t2d` (which target ids the draft keeps). Fewer rows with no map are a reduced vocabulary
    only where they lack ids the target's tokenizer emits (`tokenizer.json`): rows that hold them
    all are the target's vocabulary padded to another size (a target of 152,576 rows, its draft of
    152,064), which needs no map. From the serving code: the class the draft's
    `architectures` names, the test in its `load_weights` on the checkpoint name `d2t`, the field
    that receives it, that field's value in `__init__` (what stays when the checkpoint has no
    `d2t`) and the line where draft ids are added to it.

    ## Why it matters
    A draft trained on a reduced vocabulary proposes draft ids. Without a map the engine loads,
    or with one that cannot be right (all zeros, target ids out of range or repeated, a `t2d` that
    disagrees), draft token i is read as some other target token: every proposal is rejected and
    nothing errors. A draft without weights at hand (config only) is not checked, and the side's
    notes say so.
    """

    code = "RCA-D102"
    name = "vocab-map"
    formerly = ("RCA-S108",)
    sides = frozenset({"serving"})
    compares = Compares(
        training=(
            "the trainer's map of draft tokens to target tokens: d2t / t2d in the checkpoint, a reduced "
            "draft_vocab_size"
        ),
        serving=(
            "what the engine's loader fills from d2t (and the field's initial value without it), and how it adds "
            "draft ids to it"
        ),
    )
    reports = (
        Reports("vocab-map-absent", hypothesis="vocab-map-missing"),
        Reports("vocab-map-not-loaded", hypothesis="vocab-map-missing"),
        Reports("vocab-map-unusable", hypothesis="vocab-map-invalid"),
        Reports("vocab-map-unsure", hypothesis="vocab-map-missing", severity=Severity.WARNING),
    )
    INVALID = (
        Example(
            files={"draft.py": DRAFT_LOADER},
            target=SMALL_VOCAB_TARGET,
            draft=SMALL_VOCAB_DRAFT,
            weights={"lm_head.weight": ("F16", (8, 4), None)},
            finding="vocab-map-absent",
            path="draft.py",
            line=5,
            message=(
                "the draft's vocabulary is reduced (8 of the target's 32 tokens) but its checkpoint has no d2t: "
                "DraftForCausalLM.hot_token_id keeps its initial value, so draft token i is read as target token i"
            ),
            why="a reduced-vocabulary draft exported without its d2t (written only to a side file)",
        ),
        Example(
            files={"draft.py": DRAFT_LOADER},
            target=SMALL_VOCAB_TARGET,
            draft=SMALL_VOCAB_DRAFT,
            weights={"lm_head.weight": ("F16", (8, 4), None), "d2t": ("I64", (8,), (0,) * 8)},
            finding="vocab-map-unusable",
            path="model.safetensors",
            line=1,
            message=(
                "the draft's d2t cannot be right: all 8 entries are 0, so draft token i is read as target token i "
                "(the identity)"
            ),
            why="an all-zero d2t: the map a loader fills when the real one is missing",
        ),
        Example(
            files={"draft.py": DRAFT_LOADER.replace('"d2t"', '"vocab_map"')},
            target=SMALL_VOCAB_TARGET,
            draft=SMALL_VOCAB_DRAFT,
            weights={"lm_head.weight": ("F16", (8, 4), None), "d2t": ("I64", (8,), d2t_offsets(range(0, 32, 4)))},
            finding="vocab-map-not-loaded",
            path="draft.py",
            line=10,
            message=(
                "the draft's vocabulary is reduced (8 of the target's 32 tokens) but DraftForCausalLM.load_weights "
                "has no branch for d2t: the checkpoint's map is not loaded"
            ),
            why="a patched loader that looks for the map under another name",
        ),
        Example(
            files={"draft.py": DRAFT_LOADER},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 24},
            weights={"lm_head.weight": ("F16", (24, 4), None)},
            finding="vocab-map-unsure",
            path="model.safetensors",
            line=1,
            message=(
                "the draft has 24 rows where the target has 32, and ships no map (d2t): read as the target's "
                "vocabulary padded to another size, draft token i being target token i; a reduced vocabulary would "
                "need its d2t. The target's tokenizer.json would settle it (no tokenizer file beside the target's "
                "config tells which ids its tokenizer emits)"
            ),
            why="a draft of fewer rows and no map, beside a target config without its tokenizer",
        ),
    )
    VALID = (
        Example(
            files={"draft.py": DRAFT_LOADER},
            target=SMALL_VOCAB_TARGET,
            draft=SMALL_VOCAB_DRAFT,
            weights={
                "lm_head.weight": ("F16", (8, 4), None),
                "d2t": ("I64", (8,), d2t_offsets(range(0, 32, 4))),
                "t2d": ("BOOL", (32,), tuple(i % 4 == 0 for i in range(32))),
            },
            why="every fourth target token, mapped by offsets, with a t2d that agrees",
        ),
        Example(
            files={"draft.py": DRAFT_LOADER},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 24},
            weights={"lm_head.weight": ("F16", (24, 4), None)},
            tokenizer=TOKENIZER_24,
            why="the target's vocabulary padded less: its tokenizer emits 24 ids, the draft's 24 rows hold them all",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and bool(ctx.draft.architectures)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        vocabulary = draft_vocabulary(ctx)
        if vocabulary is None or vocabulary.relation is VocabularyRelation.SAME or not _sized_by_draft(ctx):
            return
        if vocabulary.relation is VocabularyRelation.PADDED:
            ctx.note(f"the draft needs no vocab map: {vocabulary.padding}")
            return
        draft_vocab, target_vocab, sized = vocabulary.draft_rows, vocabulary.target_rows, vocabulary.sized
        if vocabulary.relation is VocabularyRelation.UNSURE:
            weights = ctx.draft.weights
            listing = (weights.listing("none named d2t or t2d"),) if weights is not None else ()
            yield self.finding(
                ctx,
                "vocab-map-unsure",
                f"the draft has {draft_vocab:,} rows where the target has {target_vocab:,}, and ships no map (d2t): "
                "read as the target's vocabulary padded to another size, draft token i being target token i; a "
                "reduced vocabulary would need its d2t. The target's tokenizer.json would settle it (no tokenizer "
                "file beside the target's config tells which ids its tokenizer emits)",
                sized.location,
                likelihood_ratio=1.0,
                confidence=Confidence.HEURISTIC,
                steps=(sized, *listing),
                fix="pass --target the model directory with its tokenizer.json; if the draft's vocabulary is "
                "reduced, add the d2t it was trained with to its checkpoint",
            )
            return
        engine = engine_map(ctx)
        if engine is None:
            ctx.note(
                f"the vocab map was not checked: the draft class {', '.join(ctx.draft.architectures)} was not found "
                f"in {ctx.tree.label}"
            )
            return
        label = f"{engine.cls.name}.{engine.attribute or 'load_weights'}"
        if engine.loader is None:
            ctx.note(f"the vocab map was not checked: {engine.cls.name} has no load_weights in {ctx.tree.label}")
            return
        if engine.load is None and "draft_vocab_size" not in engine.cls.module.text:
            ctx.note(
                f"the vocab map was not checked: {engine.cls.name} ({engine.cls.module.relpath}) never reads "
                f"draft_vocab_size, so it is not the class {ctx.tree.label} builds for a reduced-vocabulary draft"
            )
            return
        if engine.load is None:
            where = engine.loader
            yield self.finding(
                ctx,
                "vocab-map-not-loaded",
                f"the draft's vocabulary is reduced ({draft_vocab:,} of the target's {target_vocab:,} tokens) but "
                f"{engine.cls.name}.load_weights has no branch for d2t: the checkpoint's map is not loaded",
                where.location,
                likelihood_ratio=_LIKELIHOOD / 2,
                steps=(sized, where),
                fix=f"load the checkpoint's d2t in {where.location} (draft id i is target id i + d2t[i]), or serve "
                f"the draft on an engine release that does",
            )
            return
        weights = ctx.draft.weights
        if weights is None:
            ctx.note(
                f"the vocab map was not checked: the draft's vocabulary is reduced ({draft_vocab:,} of "
                f"{target_vocab:,}) and no checkpoint is next to its config (pass --draft DIR with the weights)"
            )
            return
        engine_steps = tuple(step for step in (engine.load, engine.initial, engine.offsets) if step is not None)
        if engine.offsets is None:
            ctx.note(f"where {label} is added to the draft ids was not found; d2t was read as offsets")
        d2t = weights.find("d2t")
        if d2t is None:
            where = engine.initial or engine.load
            yield self.finding(
                ctx,
                "vocab-map-absent",
                f"the draft's vocabulary is reduced ({draft_vocab:,} of the target's {target_vocab:,} tokens) but its "
                f"checkpoint has no d2t: {label} keeps its initial value, so draft token i is read as target token i",
                where.location,
                likelihood_ratio=_LIKELIHOOD,
                steps=(sized, weights.listing("none named d2t"), *engine_steps),
                fix=f"add the d2t the draft was trained with to {weights.directory} (trainers write it with the "
                f"weights or beside them, e.g. in a vocab-mapping file); without it no engine can serve the draft",
            )
            return
        problems = _problems(weights, d2t, draft_vocab, target_vocab)
        if problems:
            tensor = weights.step(d2t.name)
            yield self.finding(
                ctx,
                "vocab-map-unusable",
                f"the draft's d2t cannot be right: {'; '.join(problems)}",
                tensor.location,
                likelihood_ratio=_LIKELIHOOD,
                steps=(sized, tensor, *engine_steps),
                fix=f"re-export d2t (and t2d) from the vocabulary the draft was trained on, into {weights.directory}",
            )


# -- the draft's side ---------------------------------------------------------------------------------


def _sized_by_draft(ctx: SideContext) -> bool:
    """Whether the draft says its own vocabulary's size: `draft_vocab_size`, or an `lm_head` of its
    own (a draft without either scores with the target's head, whatever its `vocab_size`)."""
    assert ctx.draft is not None
    declared = ctx.draft.config.data.get("draft_vocab_size")
    weights = ctx.draft.weights
    head = weights.find("lm_head.weight") if weights is not None else None
    return (isinstance(declared, int) and not isinstance(declared, bool)) or (head is not None and bool(head.shape))


def _problems(weights: DraftWeights, d2t: DraftTensor, draft_vocab: int, target_vocab: int) -> list[str]:
    """Why the map cannot be right: its dtype or length, all zeros, target ids out of range or
    repeated, a t2d that disagrees. Empty when nothing is wrong."""
    if d2t.dtype not in _INTEGER:
        return [f"it is stored as {d2t.dtype}, not as integer offsets"]
    if d2t.name in weights.unreadable:
        return [weights.unreadable[d2t.name]]
    offsets = weights.values.get(d2t.name, ())
    if len(offsets) != draft_vocab:
        return [f"it has {len(offsets)} entries for a draft vocabulary of {draft_vocab}"]
    if not any(offsets):
        return [f"all {len(offsets)} entries are 0, so draft token i is read as target token i (the identity)"]
    problems = []
    targets = [i + offset for i, offset in enumerate(offsets)]
    outside = [(i, t) for i, t in enumerate(targets) if not 0 <= t < target_vocab]
    if outside:
        i, t = outside[0]
        problems.append(
            f"{len(outside)} draft ids map outside the target's {target_vocab} tokens (draft id {i} -> {t})"
        )
    repeated = [t for t, count in Counter(targets).items() if count > 1]
    if repeated:
        problems.append(f"{len(repeated)} target ids are mapped more than once (target id {min(repeated)})")
    t2d = weights.find("t2d")
    if t2d is not None and t2d.name in weights.values:
        keep = weights.values[t2d.name]
        if len(keep) != target_vocab:
            problems.append(f"t2d has {len(keep)} entries, the target's vocabulary {target_vocab}")
        else:
            missed = [t for t in targets if 0 <= t < target_vocab and not keep[t]]
            if missed or sum(1 for flag in keep if flag) != draft_vocab:
                problems.append(
                    f"t2d disagrees with d2t ({len(missed)} mapped target ids it does not keep, "
                    f"{sum(1 for flag in keep if flag)} kept for {draft_vocab} draft ids)"
                )
    return problems


# -- the engine's side ---------------------------------------------------------------------------------


def engine_map(ctx: SideContext) -> EngineMap | None:
    """How the class the engine builds for the draft loads and uses `d2t`, read from its code."""
    assert ctx.draft is not None
    built = ctx.draft_model()
    if built is None:
        return None
    cls = built[0]
    order = ctx.evaluator.mro(cls)
    loader = inherited_method(ctx, cls, "load_weights")
    if loader is None:
        return EngineMap(cls, None, None, None, None, None)
    span = loader.module.location(loader.node, loader.node)  # the whole def: a patch anywhere in it is cited
    loader_step = Step(span, f"{cls.name}.load_weights", loader.module.code(span.line), StepKind.CALL)
    load = _d2t_branch(loader)
    if load is None:
        return EngineMap(cls, None, None, None, None, loader_step)
    branch, attribute = load
    step = loader.module.step(branch.test, loader.node, f"the checkpoint's d2t is loaded into .{attribute}")
    load_step = Step(step.location, step.note, step.code, StepKind.TEST, loader.module.patched)
    initial = _initial_value(order, attribute)
    offsets = _offsets(order, attribute, branch)
    return EngineMap(cls, attribute, load_step, initial, offsets, loader_step)


def _mentions_d2t(node: cst.CSTNode) -> bool:
    return any(
        isinstance(item, cst.SimpleString)
        and isinstance(text := item.evaluated_value, str)
        and "d2t" in text
        and "t2d" not in text
        for item in walk(node)
    )


def _d2t_branch(loader: FunctionInfo) -> tuple[cst.If, str] | None:
    """The `if` on the checkpoint name `d2t` and the field it fills: assigned in the branch
    (`self.hot_token_id = ...`) or the name it renames to (`name.replace("d2t", "draft_id_to_target_id")`)."""
    for node in walk(loader.node.body):
        if not isinstance(node, cst.If) or not _mentions_d2t(node.test):
            continue
        for inner in walk(node.body):
            if isinstance(inner, cst.Assign):
                for target in inner.targets:
                    if isinstance(target.target, cst.Attribute) and isinstance(target.target.value, cst.Name):
                        if target.target.value.value == "self":
                            return node, target.target.attr.value
            if (
                isinstance(inner, cst.Call)
                and isinstance(inner.func, cst.Attribute)
                and inner.func.attr.value == "replace"
                and len(inner.args) == 2
                and isinstance(inner.args[1].value, cst.SimpleString)
            ):
                renamed = inner.args[1].value.evaluated_value
                if isinstance(renamed, str):
                    return node, renamed.rsplit(".", 1)[-1]
        return node, "d2t"
    return None


def _self_stores(function: FunctionInfo, attribute: str) -> Iterator[cst.CSTNode]:
    return (statement for statement, target in attribute_stores(function.node.body) if target.attr.value == attribute)


def _initial_value(order: list[ClassInfo], attribute: str) -> Step | None:
    for klass in order:
        init = klass.methods.get("__init__")
        if init is None or not init.may_store(attribute):
            continue
        for node in _self_stores(init, attribute):
            step = init.module.step(node, init.node, f"without d2t, .{attribute} stays as built here")
            return Step(step.location, step.note, step.code, StepKind.ASSIGN, init.module.patched)
    return None


def _offsets(order: list[ClassInfo], attribute: str, branch: cst.If) -> Step | None:
    """Where a range of draft ids is added to the map: `loaded_weight + torch.arange(n)` in the
    load branch, or `base + self.<attribute>` with `base = torch.arange(n)` where logits are mapped."""
    for klass in order:
        for function in klass.methods.values():
            if attribute not in function.text and function.name != "load_weights":
                continue
            ranges = set(re.findall(r"\b(\w+)\s*=\s*[\w.]*arange\(", function.text))
            within = {id(node) for node in walk(branch)} if function.name == "load_weights" else set()
            for node in walk(function.node.body):
                if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add)):
                    continue
                code = function.module.tree.code_for_node
                sides = (code(node.left), code(node.right))
                mapped = id(node) in within or any(f".{attribute}" in side for side in sides)
                counted = any("arange(" in side or side.strip() in ranges for side in sides)
                if mapped and counted:
                    step = function.module.step(node, function.node, "draft id i becomes target id i + d2t[i]")
                    return Step(step.location, step.note, step.code, StepKind.ASSIGN, function.module.patched)
    return None
