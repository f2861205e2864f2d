"""Where the served draft's embedding and `lm_head` come from: its own checkpoint, or the target's."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import libcst.matchers as m

from rca.sdk import (
    Analyzer,
    CheckpointEdit,
    Compares,
    Example,
    Fact,
    Finding,
    Location,
    Reports,
    SideContext,
    Step,
    StepKind,
)
from rca.sdk.code import ClassInfo, FunctionInfo, Guards, contains, dotted_name, guarded_statements, names_in
from rca.sdk.examples import EMBED_WORKER, HEAD_WORKER, SMALL_VOCAB_TARGET
from rca.sdk.inputs import Checkpoint, weights_directory
from rca.sdk.sides import VocabularyRelation, draft_vocabulary, pipeline_stages

from .vocab_map import engine_map

PARTS = {"embed_tokens": "embed_tokens.weight", "lm_head": "lm_head.weight"}
_DRAFT_FIELD = re.compile(r"\bmodel\.(\w+)[\s)]*$")  # a test on a field of the draft module the worker holds
_WORKER = re.compile(r"^(Eagle|EAGLE)\w*(Proposer|Worker)$")
_ASSIGNED = re.compile(r"\.(lm_head|embed_tokens)\s*=\s*(?=[^=])(.*target.*)")
SAME_SHAPE = "self.model.lm_head.weight.shape == target_language_model.lm_head.weight.shape"
_SETTERS = {"set_embed_and_head": ("embed_tokens", "lm_head"), "set_embed": ("embed_tokens",)}


@dataclass(frozen=True)
class Site:
    """A statement that gives the draft the target's embedding or head, and when it runs."""

    parts: tuple[str, ...]
    step: Step
    when: frozenset[str]  # alternatives among _ORDER: "always", "lacking" (only when the draft has none), ...
    guards: tuple[str, ...] = ()  # the tests around it, as written


class DraftHead(Analyzer):
    """Reads where the serving engine takes the draft's embedding and `lm_head` from, against what its checkpoint holds.

    ## What it reads
    The engine's EAGLE worker or proposer classes (`EAGLEWorker`, `EagleProposer`, with what they
    inherit), for the statements that give the draft the target's `embed_tokens` or `lm_head`
    (`set_embed_and_head`, `set_embed`, `draft.lm_head = target.lm_head`) and the conditions
    around them: whether the method is EAGLE-3, a field of the draft module built with its config
    (`load_lm_head_from_target`), the draft lacking its own (`has_own_lm_head`), identical
    weights, equal shapes (computed from both configs), or a single pipeline stage (the launch's
    `--pipeline-parallel-size`), each part of a conjunction read on its own. Then the draft
    checkpoint's tensors: an `lm_head` or `embed_tokens` it lacks that no hand-over fills, and, with
    the target's weights, eight rows of its own against the target's, as bytes (a copy) and as
    values (direction and size): trainers freeze the target's embedding, so an own `embed_tokens`
    unlike it was never trained.

    ## Why it matters
    An engine that replaces a draft's own trained head or embedding with the target's serves
    another draft than the one trained (gpt-oss-20b's speculator: 1.32 accepted tokens, 2.49 with
    its own head kept); a draft checkpoint without an `lm_head` that nothing fills is served with
    an uninitialized head; an exporter that re-initializes the model writes a random embedding,
    which vLLM keeps because it differs from the target's. All load without an error.
    """

    code = "RCA-D105"
    name = "draft-head"
    formerly = ("RCA-S113",)
    sides = frozenset({"serving"})
    compares = Compares(
        training="the draft's own lm_head and embed_tokens in its checkpoint (a few rows compared with the target's)",
        serving=(
            "the engine's hand-over of the target's head or embedding, and the tests that decide it for this draft "
            "and launch"
        ),
    )
    reports = (
        Reports("draft-head-replaced", hypothesis="head-overwritten"),
        Reports("draft-embedding-untrained", hypothesis="embed-untrained"),
        Reports("draft-head-unfilled", hypothesis="head-missing"),
        Reports("draft-head-other-vocabulary", hypothesis="head-missing"),
    )
    INVALID = (
        Example(
            files={"worker.py": HEAD_WORKER.format(test=SAME_SHAPE)},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32, "draft_vocab_size": 32},
            weights={"lm_head.weight": ("F16", (32, 4), tuple(range(128)))},
            target_weights={"lm_head.weight": ("F16", (32, 4), None)},
            finding="draft-head-replaced",
            path="worker.py",
            line=5,
            message=(
                "the draft's checkpoint has its own lm_head, but EagleProposer gives it the target's when their "
                "shapes match, as they do ([32, 4]): the head the draft was trained with is not served (8 rows "
                "compared with the target's lm_head.weight: they differ)"
            ),
            why="an engine release that shares any same-shaped head (vLLM before it kept drafters' own)",
        ),
        Example(
            files={"worker.py": HEAD_WORKER.format(test=SAME_SHAPE)},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32, "draft_vocab_size": 8},
            weights={"fc.weight": ("F16", (4, 12), None), "d2t": ("I64", (8,), None)},
            finding="draft-head-unfilled",
            path="model.safetensors",
            line=1,
            message=(
                "the draft's checkpoint has no lm_head, and nothing in EagleProposer gives it one for this draft "
                "(the target's is shared only when the shapes match: [8, 4] and [32, 4]): it is served uninitialized"
            ),
            why="a reduced-vocabulary draft exported without its head",
        ),
        Example(
            files={"worker.py": EMBED_WORKER},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32},
            weights={
                "embed_tokens.weight": ("F16", (32, 4), (0.0, 0.7, 0.0, 0.0) * 32),
                "lm_head.weight": ("F16", (32, 4), None),
            },
            target_weights={"model.embed_tokens.weight": ("F16", (32, 4), (0.03, 0.0, -0.02, 0.01) * 32)},
            finding="draft-embedding-untrained",
            path="model.safetensors",
            line=1,
            message=(
                "the draft's checkpoint has its own embed_tokens, which EagleProposer keeps (it gives the target's "
                "only to a draft without one), but it is not the target's embedding the draft was trained with (8 rows "
                "compared with the target's model.embed_tokens.weight: they differ (mean cosine 0.00, norm ratio "
                "18.71)): trainers freeze the target's, so this one was never trained, and the draft reads its tokens "
                "through it"
            ),
            why="an exporter that saved a freshly initialized embedding, which the engine keeps since it differs",
        ),
        Example(
            files={"worker.py": HEAD_WORKER.format(test="not self.model.has_own_lm_head")},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32, "draft_vocab_size": 8},
            weights={"fc.weight": ("F16", (4, 12), None), "d2t": ("I64", (8,), None)},
            finding="draft-head-other-vocabulary",
            path="worker.py",
            line=5,
            message=(
                "the draft's checkpoint has no lm_head, so EagleProposer gives it the target's, whose 32 rows score "
                "the target's vocabulary where the draft's 8 tokens (draft_vocab_size) are expected: draft token i "
                "is scored by the target's row i, not by the row of the target token its d2t names"
            ),
            why="vLLM shares the target's whole head with a reduced-vocabulary draft exported without its own",
        ),
        Example(
            files={"worker.py": EMBED_WORKER},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32},
            weights={"fc.weight": ("F16", (4, 12), None), "lm_head.weight": ("F16", (32, 4), None)},
            settings="--pipeline-parallel-size 2",
            finding="draft-head-unfilled",
            path="model.safetensors",
            line=1,
            message=(
                "the draft's checkpoint has no embed_tokens, and nothing in EagleProposer gives it one for this draft "
                "(the target's is shared only with a single pipeline stage, and the launch serves 2): it is served "
                "uninitialized"
            ),
            why="a draft exported without the embedding it shares with its target, served on two pipeline stages",
        ),
    )
    VALID = (
        Example(
            files={"worker.py": HEAD_WORKER.format(test=SAME_SHAPE)},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32, "draft_vocab_size": 32},
            weights={"lm_head.weight": ("F16", (32, 4), None)},
            target_weights={"lm_head.weight": ("F16", (32, 4), None)},
            why="the draft's own head is a copy of the target's: sharing it loses nothing",
        ),
        Example(
            files={"worker.py": HEAD_WORKER.format(test="not self.model.has_own_lm_head")},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32, "draft_vocab_size": 32},
            weights={"lm_head.weight": ("F16", (32, 4), None)},
            why="the engine shares the target's head only with a draft that has none",
        ),
        Example(
            files={"worker.py": HEAD_WORKER.format(test="not self.model.has_own_lm_head")},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 24},
            weights={"fc.weight": ("F16", (4, 12), None)},
            why="a draft of the target's tokenizer padded less, with no head and no d2t: the target's head's first "
            "24 rows score its tokens i, as they are",
        ),
        Example(
            files={"worker.py": EMBED_WORKER},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32},
            weights={"fc.weight": ("F16", (4, 12), None), "lm_head.weight": ("F16", (32, 4), None)},
            why="on one pipeline stage the engine gives a draft without embed_tokens the target's",
        ),
        Example(
            files={"worker.py": EMBED_WORKER},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32},
            weights={"embed_tokens.weight": ("F16", (32, 4), (0.03, 0.0, -0.02, 0.01) * 32)},
            target_weights={"model.embed_tokens.weight": ("F16", (32, 4), (0.03, 0.0, -0.02, 0.01) * 32)},
            why="the draft's own embedding, kept, is the target's: what trainers freeze",
        ),
        Example(
            files={"worker.py": HEAD_WORKER.format(test="True").replace("lm_head", "model.embed_tokens")},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 4, "vocab_size": 32},
            weights={"embed_tokens.weight": ("F16", (32, 4), (0.0, 0.7, 0.0, 0.0) * 32)},
            target_weights={"model.embed_tokens.weight": ("F16", (32, 4), (0.03, 0.0, -0.02, 0.01) * 32)},
            why="an untrained embedding the engine replaces with the target's, as SGLang does: served right",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and ctx.draft.weights is not None and bool(ctx.draft.weights.tensors)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None and ctx.draft.weights is not None
        weights = ctx.draft.weights
        workers = _workers(ctx)
        if not workers:
            ctx.note(f"where the draft's head comes from was not checked: no EAGLE worker class in {ctx.tree.label}")
            return
        label = workers[0].name
        sites = [site for worker in workers for site in _sites(ctx, worker)]
        for part, tensor in PARTS.items():
            own = weights.find(tensor)
            shapes = _shapes(ctx, part)
            served = [(site, _runs(site, own is not None, shapes)) for site in sites if part in site.parts]
            replacing = [site for site, runs in served if runs]
            if own is not None and replacing:
                site = replacing[0]
                compared = _compare_rows(ctx, own.name, tensor)
                if compared is None or compared.same or _untrained(part, compared):
                    ctx.note(
                        f"{label} gives the draft the target's {part} ({site.step.location}); "
                        + (
                            compared.said
                            if compared is not None
                            else "whether the draft's own differs was not checked (pass --target MODEL_DIR with the "
                            "weights)"
                        )
                        + (
                            ": the draft's own was never trained, and the target's is what it learned with"
                            if compared is not None and _untrained(part, compared)
                            else ""
                        )
                    )
                    continue
                yield self.finding(
                    ctx,
                    "draft-head-replaced",
                    f"the draft's checkpoint has its own {part}, but {label} gives it the target's"
                    f"{_why(site, shapes)}: the {'head' if part == 'lm_head' else 'embedding'} the draft was "
                    f"trained with is not served ({compared.said})",
                    site.step.location,
                    likelihood_ratio=10.0,
                    steps=(weights.step(own.name), site.step, *compared.steps),
                    fix=f"serve on an engine release that keeps a drafter's own {part}",
                )
            if own is not None and not replacing and part == "embed_tokens":
                compared = _compare_rows(ctx, own.name, tensor)
                if compared is not None and _untrained(part, compared):
                    conditions = sorted({_GIVEN_WHEN[c] for site, _ in served for c in site.when if c in _GIVEN_WHEN})
                    kept = f" (it gives the target's only {' or '.join(conditions)})" if conditions else ""
                    yield self.finding(
                        ctx,
                        "draft-embedding-untrained",
                        f"the draft's checkpoint has its own embed_tokens, which {label} keeps{kept}, but it is not "
                        f"the target's embedding the draft was trained with ({compared.said}): trainers freeze the "
                        "target's, so this one was never trained, and the draft reads its tokens through it",
                        weights.step(own.name).location,
                        likelihood_ratio=10.0,
                        steps=(weights.step(own.name), *(site.step for site, _ in served[:1]), *compared.steps),
                        fix="drop embed_tokens from the draft's checkpoint, so that the engine gives the draft the "
                        "target's (or write the target's into it)",
                        edit=CheckpointEdit({}, dropped=(own.name,)),
                    )
            if own is None and part == "lm_head" and replacing and None not in shapes[0] and shapes[0] != shapes[1]:
                yield from self._other_vocabulary(ctx, label, replacing[0], shapes)
            if own is None and served and not replacing:
                shown = next((_why(site, shapes) for site, _ in served if "shape" in site.when), "")
                stages = pipeline_stages(ctx)
                if stages is not None and any(_PIPELINE.search(test) for site, _ in served for test in site.guards):
                    shown = f" with a single pipeline stage, and the launch serves {stages[0]}"
                where = weights.listing(f"none named {part}")
                yield self.finding(
                    ctx,
                    "draft-head-unfilled",
                    f"the draft's checkpoint has no {part}, and nothing in {label} gives it one for this draft"
                    + (f" (the target's is shared only{shown.replace(', as they do', '')})" if shown else "")
                    + ": it is served uninitialized",
                    where.location,
                    likelihood_ratio=10.0,
                    steps=(where, *(site.step for site, _ in served[:2]), *(stages[1:] if stages else ())),
                    fix=f"add the {part} the draft was trained with to its checkpoint"
                    + (" (the target's, where the trainer froze it)" if part == "embed_tokens" else ""),
                )

    def _other_vocabulary(
        self, ctx: SideContext, label: str, site: Site, shapes: tuple[list, list]
    ) -> Iterator[Finding]:
        """A draft without a head handed the target's, of another number of rows: right for the same
        vocabulary padded otherwise (a note), a cause for a reduced one whose d2t names other rows."""
        assert ctx.draft is not None and ctx.draft.weights is not None
        unmapped = _unmapped_prefix(ctx)
        if unmapped is not None:
            ctx.note(f"{label} gives the draft the target's lm_head ({site.step.location}): {unmapped}")
            return
        mapped = engine_map(ctx)
        scoring = (_column_cut(ctx), mapped.offsets if mapped is not None else None)
        yield self.finding(
            ctx,
            "draft-head-other-vocabulary",
            f"the draft's checkpoint has no lm_head, so {label} gives it the target's, whose "
            f"{shapes[1][0]:,} rows score the target's vocabulary where the draft's {shapes[0][0]:,} tokens "
            "(draft_vocab_size) are expected: draft token i is scored by the target's row i, not by the row "
            "of the target token its d2t names",
            site.step.location,
            likelihood_ratio=10.0,
            steps=(ctx.draft.weights.listing("none named lm_head"), site.step, *(step for step in scoring if step)),
            fix="add the lm_head the draft was trained with (its rows for the draft vocabulary) to its checkpoint",
        )


def _unmapped_prefix(ctx: SideContext) -> str | None:
    """Why the target's whole head scores a draft of fewer rows that ships no d2t right, said; None
    for any other draft. With no map, draft token i is target token i, and the engine keeps the
    head's first rows: the draft's vocabulary is the target's, padded (or cut) to another size."""
    vocabulary = draft_vocabulary(ctx)
    if vocabulary is None or vocabulary.mapped or vocabulary.draft_rows >= vocabulary.target_rows:
        return None
    if vocabulary.relation is VocabularyRelation.PADDED:
        return vocabulary.padding
    said = (
        f"with no d2t, draft token i is target token i, and its first {vocabulary.draft_rows:,} rows of the target's "
        f"{vocabulary.target_rows:,} score the draft's tokens"
    )
    if vocabulary.tokenizer is not None and vocabulary.draft_rows < vocabulary.tokenizer.count:
        return f"{said}; the target's tokenizer emits {vocabulary.tokenizer.said}, which the draft cannot propose past"
    return said


def _workers(ctx: SideContext) -> list[ClassInfo]:
    """The engine's EAGLE worker or proposer classes (what builds the draft next to the target)."""
    assert ctx.index is not None
    found: list[ClassInfo] = []
    for relpath in ctx.tree.grep(["class Eagle", "class EAGLE"]).values():
        for path in relpath:
            ctx.index.allow(path)
            module = ctx.index.load(path)
            if module is not None:
                found += [cls for name, cls in module.classes.items() if _WORKER.match(name)]
    for cls in found:  # what they inherit may live elsewhere (vLLM 0.2x's SpecDecodeBaseProposer)
        _allow_bases(ctx, cls)
    unique = {id(cls): cls for cls in found}.values()
    return sorted(unique, key=lambda cls: (cls.module.relpath, cls.name))  # the same label on every run


def _allow_bases(ctx: SideContext, cls: ClassInfo, depth: int = 4) -> None:
    """Let the evaluation read the modules `cls`'s base classes are imported from, and theirs."""
    assert ctx.index is not None
    for base in cls.base_expressions:
        name = (dotted_name(base) or "").split(".")[0]
        binding = cls.module.imports.get(name)
        imported = ctx.index.resolve(binding.module) if binding is not None else None
        if binding is None or imported is None or depth == 0:
            continue
        ctx.index.allow(imported)
        module = ctx.index.load(imported)
        inherited = module.classes.get(binding.attr or "") if module is not None else None
        if inherited is not None:
            _allow_bases(ctx, inherited, depth - 1)


def _sites(ctx: SideContext, worker: ClassInfo) -> Iterator[Site]:
    for klass in ctx.evaluator.mro(worker):
        for function in klass.methods.values():
            text = function.text
            if "target" not in text and "set_embed" not in text:
                continue
            yield from _function_sites(ctx, function)


_FLAG = re.compile(r"^\s*(\w+)\s*(?:$|and\b)")
_FLAG_SET = re.compile(r"^(\w+)\s*=\s*True$")
# What a condition lets through, most restrictive first; a conjunction keeps the more restrictive.
_ORDER = ("never", "identical", "lacking", "own", "shape", "shape-differs", "always")
_NEGATED = {"lacking": "own", "own": "lacking", "identical": "own", "shape": "shape-differs", "shape-differs": "shape"}


def _function_sites(ctx: SideContext, function: FunctionInfo) -> Iterator[Site]:
    """Statements of `function` that hand the draft the target's parts, with when they run: the tests
    around them, and those around each `flag = True` of a flag a test reads (`if share_lm_head:`)."""
    statements = guarded_statements(function)
    flags: dict[str, list[Guards]] = {}
    for _, text, guards in statements:
        if (match := _FLAG_SET.match(text)) is not None:
            flags.setdefault(match[1], []).append(guards)
    for node, text, guards in statements:
        parts = _parts(text)
        if parts:
            step = function.module.step(node, function.node, f"the draft is given the target's {' and '.join(parts)}")
            located = Step(step.location, step.note, step.code, StepKind.ASSIGN, function.module.patched)
            yield Site(parts, located, _when(ctx, guards, flags), tuple(test for test, _ in guards))


def _parts(text: str) -> tuple[str, ...]:
    for setter, parts in _SETTERS.items():
        if f".{setter}(" in text and "draft" in text.split(f".{setter}(")[0]:
            return parts
    assigned = _ASSIGNED.search(text)
    return (assigned[1],) if assigned and not text.startswith("del ") else ()


def _when(ctx: SideContext, guards: Guards, flags: dict[str, list[Guards]]) -> frozenset[str]:
    """When the guarded statement runs for an EAGLE-3 draft, as alternatives: each test read for
    what it decides, a flag for the conditions under which it was set."""
    alternatives = frozenset({"always"})
    for test, taken in guards:
        flag = _FLAG.match(test)
        if flag is not None and flag[1] in flags and taken:
            inner = frozenset().union(*(_when(ctx, set_under, {}) for set_under in flags[flag[1]]))
            alternatives = frozenset(_both(a, b) for a in alternatives for b in inner)
            continue
        decided = [_decide(ctx, part) for part in _CONJUNCTS.split(test)]
        conditions = [part for part in decided if isinstance(part, str)]
        if False in decided:  # the conjunction is false: its body never runs, its else always may
            if taken:
                return frozenset({"never"})
        elif taken:  # every part holds: each condition narrows when it runs
            for condition in conditions:
                alternatives = frozenset(_both(a, condition) for a in alternatives)
        elif all(part is True for part in decided):  # the test holds here: its else branch never runs
            return frozenset({"never"})
        elif conditions:  # one of the conditions fails (an undecided part is assumed true)
            alternatives = frozenset(
                _both(a, _NEGATED.get(condition, "always")) for a in alternatives for condition in conditions
            )
    return alternatives


_CONJUNCTS = re.compile(r"\s+and\s+")  # the parts of a test `a and b`, each read for what it decides


def _both(first: str, second: str) -> str:
    if {first, second} in ({"lacking", "own"}, {"shape", "shape-differs"}):
        return "never"
    return min(first, second, key=_ORDER.index)


def _decide(ctx: SideContext, test: str) -> bool | str | None:
    """What a test decides: True/False where the deployment settles it, a condition on the draft
    ("lacking", "identical", "shape"), a flag of the draft module read with its config, or None
    (assumed true, like the rest of the analysis)."""
    pipeline = _PIPELINE.search(test)
    if pipeline is not None:
        stages = (pipeline_stages(ctx) or (1,))[0]
        return {"==": stages == 1, "!=": stages != 1, ">": stages > 1}[pipeline[1]]
    if "eagle3" in test.lower():
        negated = "!=" in test or test.lstrip().startswith("not ")
        return not negated
    if "has_own_" in test and "hasattr" not in test:
        return "lacking" if test.lstrip().startswith("not ") else "own"
    if "equal(" in test:
        return "identical"
    if "shape" in test:
        return "shape" if "==" in test else "shape-differs" if "!=" in test else None
    read = _DRAFT_FIELD.search(test)
    return _draft_field(ctx, read[1]) if read is not None else None


# `self.logits_processor = ...` (or with an annotation)
_SETS_LOGITS_PROCESSOR = m.OneOf(
    m.Assign(
        targets=[m.ZeroOrMore(), m.AssignTarget(target=m.Attribute(attr=m.Name("logits_processor"))), m.ZeroOrMore()]
    ),
    m.AnnAssign(target=m.Attribute(attr=m.Name("logits_processor"))),
)
_PIPELINE = re.compile(r"pp_group\(\)\.world_size\s*(==|!=|>)\s*1\b")  # a test on the pipeline stages


def _column_cut(ctx: SideContext) -> Step | None:
    """Where the draft class builds its logits for its own vocabulary's columns only
    (`LogitsProcessor(config.draft_vocab_size)`): the first rows of a wider head it is given."""
    built = ctx.draft_model()
    if built is None:
        return None
    for klass in ctx.evaluator.mro(built[0]):
        init = klass.methods.get("__init__")
        if init is None:
            continue
        for node, _text, _ in guarded_statements(init):
            if contains(node, _SETS_LOGITS_PROCESSOR) and "draft_vocab_size" in names_in(node):
                step = init.module.step(node, init.node, "the draft's logits keep the first draft_vocab_size columns")
                return replace(step, kind=StepKind.CALL)
    return None


def _draft_field(ctx: SideContext, name: str) -> bool | None:
    """A flag of the draft module (SGLang's `load_lm_head_from_target`), evaluated with its config."""
    built = ctx.draft_model()
    if built is None:
        return None
    value = ctx.evaluator.field(built[1], name)
    return value.v if isinstance(value.v, bool) else None


def _shapes(ctx: SideContext, part: str) -> tuple[list, list]:
    """The draft's and the target's shapes of `part`, from their configs ([rows, width])."""
    assert ctx.draft is not None
    data = ctx.draft.config.data
    rows = data.get("draft_vocab_size") if part == "lm_head" else None
    rows = rows or data.get("vocab_size")
    return [rows, data.get("hidden_size")], [ctx.target.vocab_size, ctx.target.hidden_size]


def _runs(site: Site, own: bool, shapes: tuple[list, list]) -> bool:
    """Whether the statement replaces (or fills) the part for this draft."""
    same = None not in shapes[0] and shapes[0] == shapes[1]
    decided = {"always": True, "lacking": not own, "own": own, "shape": same, "shape-differs": not same}
    return any(decided.get(condition, False) for condition in site.when)  # "identical" loses nothing; "never"


def _why(site: Site, shapes: tuple[list, list]) -> str:
    if "shape" in site.when:
        if shapes[0] == shapes[1]:
            return f" when their shapes match, as they do ({shapes[0]})"
        return f" when the shapes match: {shapes[0]} and {shapes[1]}"
    return ""


ROWS_COMPARED = 8
# When an engine gives a draft the target's part instead of its own, as a reader is told.
_GIVEN_WHEN = {
    "lacking": "to a draft without one",
    "identical": "to a draft whose own is identical",
    "shape": "when the shapes match",
}
UNRELATED = 0.5  # mean cosine under which a draft's embedding rows are not the target's (trained or not)


def _untrained(part: str, compared: _Rows) -> bool:
    """A draft embedding unlike the target's: trainers freeze the target's, so this one was never
    trained (an exporter's fresh initialization). Heads are trained, and may differ in any way."""
    return part == "embed_tokens" and compared.cosine is not None and compared.cosine < UNRELATED


@dataclass(frozen=True)
class _Rows:
    """A few rows of the draft's tensor against the target's: whether they are an exact copy, and
    else how alike they are in direction (mean cosine) and size (mean norm ratio)."""

    same: bool
    said: str
    steps: tuple[Step, ...]
    cosine: float | None = None
    ratio: float | None = None


def _compare_rows(ctx: SideContext, name: str, tensor: str) -> _Rows | None:
    """The draft's `name` against the target's `tensor`, from a few rows of each (raw bytes for a
    copy, decoded values otherwise); None when the target's weights are not at hand."""
    assert ctx.draft is not None and ctx.draft.weights is not None
    target_dir = ctx.target.config.file.parent
    if not any(target_dir.glob("*.safetensors")):
        return None
    draft = Checkpoint.open(weights_directory(ctx.draft.config.file), None, flag="--draft")
    target = Checkpoint.open(target_dir, None)
    theirs = target.find([tensor, tensor.replace("lm_head", "embed_tokens")])
    if theirs is None:
        return None
    mine, other = draft.entry(name), target.entry(theirs)
    cited = (_cited(ctx, target, theirs),)
    if mine.shape != other.shape or mine.dtype != other.dtype:
        said = f"shaped {list(mine.shape)} {mine.dtype}, the target's {list(other.shape)} {other.dtype}"
        return _Rows(False, f"the draft's own is {said}", cited)
    rows = sorted({round(i * (mine.shape[0] - 1) / (ROWS_COMPARED - 1)) for i in range(ROWS_COMPARED)})
    compared = f"{len(rows)} rows compared with the target's {theirs}"
    if all(draft.row_bytes(name, row) == target.row_bytes(theirs, row) for row in rows):
        return _Rows(True, f"{compared}: identical", cited)
    if not mine.dtype.startswith(("F", "BF")):
        return _Rows(False, f"{compared}: they differ", cited)
    pairs = [(draft.row_values(name, row), target.row_values(theirs, row)) for row in rows]
    if any(_norm(a) == 0 or _norm(b) == 0 for a, b in pairs):  # a zero row has no direction to compare
        return _Rows(False, f"{compared}: they differ", cited)
    cosine = sum(_cosine(a, b) for a, b in pairs) / len(pairs)
    ratio = sum(_norm(a) for a, _ in pairs) / max(sum(_norm(b) for _, b in pairs), 1e-30)
    said = f"{compared}: they differ (mean cosine {cosine:.2f}, norm ratio {ratio:.2f})"
    return _Rows(False, said, cited, cosine, ratio)


def _norm(values: list[float]) -> float:
    return math.sqrt(sum(value * value for value in values))


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / max(_norm(a) * _norm(b), 1e-30)


def _cited(ctx: SideContext, checkpoint: Checkpoint, name: str) -> Step:
    entry = checkpoint.entry(name)
    location = Location("target", f"{Path(ctx.target.config.display).parent}/{entry.file.name}", 1, 1)
    return Step(location, f"tensor {name}: {entry.dtype} {list(entry.shape)}", kind=StepKind.TENSOR)
