"""Whether the serving engine applies the norms the draft was trained with before its `fc`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from rca.sdk import (
    Analyzer,
    Compares,
    ConfigEdit,
    Example,
    Fact,
    Finding,
    Location,
    Reports,
    SideContext,
    Step,
    StepKind,
)
from rca.sdk.code import ClassInfo, inherited_method, store_location, walk
from rca.sdk.examples import NORM_DRAFT, NORM_MODEL, NORM_READ, SMALL_VOCAB_TARGET
from rca.sdk.inputs import DraftWeights
from rca.sdk.values import ObjRef, Opaque, Val

_NEVER_ASSIGNED = "field never assigned in the analyzed code"


@dataclass(frozen=True)
class Norm:
    """A norm a draft can be trained with: its config flag, the draft module's field, its weights."""

    flag: str
    field: str
    weights: str  # a tensor-name fragment of its trained weights
    what: str


NORMS = (
    Norm("norm_before_fc", "norm_before_fc", "input_norm.", "one RMSNorm over the concatenated states before fc"),
    Norm("fc_norm", "fc_norm", "fc_norm.", "an RMSNorm on each state before fc"),
)


class DraftNorms(Analyzer):
    """Reads whether the draft module the serving engine builds applies the norms the draft was trained with.

    ## What it reads
    From the draft: the flags `norm_before_fc` and `fc_norm` (at the top level of its config or in
    `eagle_config`), and tensors of those norms in its checkpoint (`input_norm.weight`,
    `fc_norm.*`). From the serving code: the draft class built with the draft's config, evaluated,
    and the field that decides each norm (`norm_before_fc`, `fc_norm`) on it or on its `model`:
    never assigned (the engine does not know the norm), false or None (the flag was not found
    where the engine reads it), or set.

    ## Why it matters
    A draft trained with a norm before `fc` and served without it sees states of another scale in
    every slot: acceptance stays low, nothing errors, and engines skip checkpoint tensors they
    have no parameter for, or drop them on purpose when the flag is off.
    """

    code = "RCA-D103"
    name = "draft-norms"
    formerly = ("RCA-S109",)
    sides = frozenset({"serving"})
    compares = Compares(
        training=(
            "norm_before_fc / fc_norm in the draft config as its trainer wrote it (before the engine's conversion "
            "or a later edit), or the norm weights its checkpoint holds"
        ),
        serving="whether the engine's draft module, built with the config as the engine converts it, applies that norm",
    )
    reports = (
        Reports("norm-flag-unread", hypothesis="norm-flag-dropped"),
        Reports("norm-weights-unused", hypothesis="norm-flag-dropped"),
    )
    INVALID = (
        Example(
            files={"draft.py": NORM_MODEL.format(reads="")},
            target=SMALL_VOCAB_TARGET,
            draft={**NORM_DRAFT, "norm_before_fc": True},
            finding="norm-flag-unread",
            path="draft.json",
            key=("norm_before_fc",),
            message=(
                "the draft was trained with norm_before_fc (one RMSNorm over the concatenated states before fc), but "
                "DraftModel never reads the flag: the norm is not applied"
            ),
            why="an engine release that predates the flag",
        ),
        Example(
            files={"draft.py": NORM_MODEL.format(reads=NORM_READ)},
            target=SMALL_VOCAB_TARGET,
            draft=NORM_DRAFT,
            weights={"input_norm.weight": ("F16", (12,), None), "fc.weight": ("F16", (4, 12), None)},
            finding="norm-weights-unused",
            path="draft.py",
            line=6,
            message=(
                "the draft's checkpoint has input_norm.weight (trained with norm_before_fc: one RMSNorm over the "
                "concatenated states before fc), but its config does not set the flag, so DraftModel builds no "
                "norm: the weights are skipped"
            ),
            why="a converter that kept the norm's weights and lost its flag",
        ),
    )
    VALID = (
        Example(
            files={"draft.py": NORM_MODEL.format(reads=NORM_READ)},
            target=SMALL_VOCAB_TARGET,
            draft={**NORM_DRAFT, "eagle_config": {"norm_before_fc": True}},
            weights={"input_norm.weight": ("F16", (12,), None)},
            why="the flag read from eagle_config, where the draft declares it",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and bool(ctx.draft.architectures)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        trained = [(norm, *found) for norm in NORMS if (found := _trained_with(ctx, norm)) is not None]
        if not trained:
            return
        built = ctx.draft_model()
        if built is None:
            ctx.note(f"the draft's norms were not checked: no draft class {', '.join(ctx.draft.architectures)}")
            return
        cls, draft = built
        for norm, declared, weights_step in trained:
            served = _served(ctx, draft, norm)
            if served is None or served[0]:
                continue
            holder, step = served[1], served[2]
            skip = _loader_skip(ctx, cls, norm)
            engine = tuple(item for item in (step, skip) if item is not None)
            if declared is not None:
                unread = step is not None and "never assigns" in step.note
                conversion = ctx.conversion
                dropped = conversion is not None and not any(
                    ctx.draft.config.lookup(path)[1] for path in (("eagle_config", norm.flag), (norm.flag,))
                )
                if dropped:
                    assert conversion is not None
                    why = (
                        f"{conversion.converter} ({conversion.location}) drops the flag when it converts the draft "
                        f"config, so {holder} builds no norm"
                    )
                    fix = f"serve on an engine release whose conversion of the draft config keeps {norm.flag}"
                elif unread:
                    why, fix = f"{holder} never reads the flag", f"serve on an engine release that reads {norm.flag}"
                else:
                    why = f"{holder} reads it as off, from another place than the draft sets it"
                    fix = f"declare {norm.flag} where {holder} reads it ({step.location if step else ''})"
                yield self.finding(
                    ctx,
                    "norm-flag-unread",
                    f"the draft was trained with {norm.flag} ({norm.what}), but {why}: the norm is not applied",
                    declared.location,
                    likelihood_ratio=10.0,
                    steps=(declared, *((weights_step,) if weights_step else ()), *engine),
                    fix=fix,
                )
            else:
                assert weights_step is not None
                where = step.location if step is not None else weights_step.location
                yield self.finding(
                    ctx,
                    "norm-weights-unused",
                    f"the draft's checkpoint has {weights_step.note.split(':')[0].removeprefix('tensor ')} (trained "
                    f"with {norm.flag}: {norm.what}), but its config does not set the flag, so {holder} builds no "
                    "norm: the weights are skipped",
                    where,
                    likelihood_ratio=10.0,
                    steps=(weights_step, *engine),
                    fix=f"set {norm.flag}: true in the draft config ({ctx.draft.config.display}), where {holder} "
                    "reads it",
                    edit=ConfigEdit((norm.flag,), True),
                )


def _trained_with(ctx: SideContext, norm: Norm) -> tuple[Step | None, Step | None] | None:
    """The config step declaring the norm, and the tensor step implying it; None when neither does."""
    assert ctx.draft is not None
    declared = None
    written = ctx.as_trained.config  # as trained: before an engine's conversion (or an edit) may drop the flag
    for path in (("eagle_config", norm.flag), (norm.flag,)):
        present, value = written.lookup(path)
        if present and value:
            declared = written.step(path, f"{'.'.join(path)} = {value}")
            break
    weights = ctx.draft.weights
    tensor = _norm_tensor(weights, norm) if weights is not None else None
    if declared is None and tensor is None:
        return None
    return declared, tensor


def _norm_tensor(weights: DraftWeights, norm: Norm) -> Step | None:
    names = sorted(name for name in weights.tensors if name.startswith(norm.weights) or f".{norm.weights}" in name)
    return weights.step(names[0]) if names else None


def _served(ctx: SideContext, draft: Val, norm: Norm) -> tuple[bool, str, Step | None] | None:
    """Whether the built draft applies the norm, the class that decides, and the line that set it
    (or, when the field is never assigned, that class's `__init__`); None when the analysis cannot tell."""
    ev = ctx.evaluator
    unassigned: ClassInfo | None = None
    for holder in (draft, ev.field(draft, "model")):
        if not isinstance(holder.v, ObjRef):
            continue
        value = ev.field(holder, norm.field)
        cls = holder.v.cls
        if isinstance(value.v, Opaque) and value.v.reason == _NEVER_ASSIGNED:
            unassigned = cls  # the innermost: the module that would hold the norm
            continue
        location = store_location(ctx, value, norm.field)
        step = (
            Step(location, f".{norm.field} = {_shown(value)}", cls.module.code(location.line), StepKind.ASSIGN)
            if location is not None
            else None
        )
        if isinstance(value.v, bool):
            return value.v, cls.name, step
        if value.v is None:
            return False, cls.name, step
        if isinstance(value.v, Opaque) and value.v.instance:
            return True, cls.name, step
        return None
    if unassigned is None:
        return None
    init = inherited_method(ctx, unassigned, "__init__")
    if init is None:
        return False, unassigned.name, None
    first = init.module.location(init.node, init.node).line
    location = Location(init.module.input, init.module.relpath, first, first)
    note = f"{unassigned.name}.__init__ never assigns .{norm.field}"
    return False, unassigned.name, Step(location, note, init.module.code(first), StepKind.ASSIGN, init.module.patched)


def _shown(value: Val) -> str:
    return repr(value.v) if isinstance(value.v, (bool, type(None))) else "a module"


def _loader_skip(ctx: SideContext, cls: ClassInfo, norm: Norm) -> Step | None:
    """A line of the draft's `load_weights` that names the norm's weights (where they are dropped)."""
    loader = inherited_method(ctx, cls, "load_weights")
    if loader is None or norm.weights not in loader.text:
        return None
    for node in walk(loader.node.body):
        if isinstance(node, cst.SimpleString) and norm.weights in str(node.evaluated_value):
            step = loader.module.step(node, loader.node, f"{norm.weights}* weights are dropped when the flag is off")
            return Step(step.location, step.note, step.code, StepKind.TEST, loader.module.patched)
    return None
