"""How many target hidden states the serving engine's draft `fc` takes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rca.sdk import (
    Analyzer,
    Compares,
    ConfigEdit,
    DraftWidth,
    Example,
    Fact,
    Finding,
    Location,
    Reports,
    SideContext,
    Step,
    StepKind,
)
from rca.sdk.code import ClassInfo, store_location
from rca.sdk.examples import SMALL_TARGET
from rca.sdk.sides import IDS_KEY
from rca.sdk.values import ObjRef, Opaque, Val

_DRAFT_MODEL = """
import torch


class Eagle3Model(nn.Module):
    def __init__(self, config):
        self.hidden_size_in = getattr(config, "target_hidden_size", config.hidden_size)
        eagle_config = getattr(config, "eagle_config", None) or {}
        layer_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
        self.num_aux = len(layer_ids) if layer_ids else 3
        self.fc = torch.nn.Linear(self.hidden_size_in * self.num_aux, config.hidden_size, bias=False)


class DraftForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None):
        self.model = Eagle3Model(config)
"""


class DraftFcWidth(Analyzer):
    """Reads the draft model class the serving engine builds, and the input width of its `fc`.

    ## What it reads
    The class named by the draft config's `architectures`, constructed with that config, and the
    `fc` layer of it (or of its `model`): `Linear(target_hidden * k, hidden)` means the draft
    expects k concatenated hidden states.

    ## Why it matters
    A draft whose `fc` width does not match the number of captured states crashes in the matmul,
    or, where a width guard skips `fc`, silently drafts from the wrong representation.
    """

    code = "RCA-D101"
    name = "draft-fc-width"
    formerly = ("RCA-S104",)
    sides = frozenset({"serving"})
    anchors = ("self.fc",)
    provides = (DraftWidth,)
    compares = Compares(
        training="the states the draft's fc was trained on: their count in the draft config as its trainer wrote it",
        serving="the width the engine's draft class sizes fc with, from the draft config as the engine reads it",
    )
    reports = (
        Reports("target-width-mismatch", hypothesis="aux-count-mismatch"),
        Reports("checkpoint-fc-width-differs", hypothesis="fc-width-mismatch"),
    )
    INVALID = (
        Example(
            files={"draft.py": _DRAFT_MODEL},
            target=SMALL_TARGET,
            draft={
                "architectures": ["DraftForCausalLM"],
                "hidden_size": 64,
                "target_hidden_size": 128,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]},
            },
            fc_slots=6,
            finding="target-width-mismatch",
            path="draft.json",
            key=("target_hidden_size",),
            message=(
                "the draft config's target_hidden_size is 128 but the target's hidden size is 64: fc is built for"
                " 384 inputs, 6 states of the target's width"
            ),
            why="a draft config copied from a wider target: fc takes 3 x 128 inputs, six states of the target's "
            "width 64",
        ),
        Example(
            files={"draft.py": _DRAFT_MODEL},
            target=SMALL_TARGET,
            draft={"architectures": ["DraftForCausalLM"], "hidden_size": 64},
            weights={"fc.weight": ("F16", (64, 320), None)},
            fc_slots=3,
            finding="checkpoint-fc-width-differs",
            path="model.safetensors",
            line=1,
            message=(
                "the draft's checkpoint has fc.weight [64, 320]: it was trained on 5 states of the target's width 64, "
                "but DraftForCausalLM builds its fc for 3 x 64 = 192 inputs from the draft config"
            ),
            why="a draft trained on 5 layers whose config declares no ids: the engine assumes 3 and cannot load it",
        ),
    )

    VALID = (
        Example(
            files={"draft.py": _DRAFT_MODEL},
            target=SMALL_TARGET,
            draft={
                "architectures": ["DraftForCausalLM"],
                "hidden_size": 64,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5, 6]},
            },
            fc_slots=4,
            why="the fc width follows the number of configured ids: 4 slots",
        ),
        Example(
            files={"draft.py": _DRAFT_MODEL},
            target=SMALL_TARGET,
            draft={
                "architectures": ["DraftForCausalLM"],
                "hidden_size": 64,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5, 6, 7]},
            },
            weights={"fc.weight": ("F16", (64, 320), None)},
            fc_slots=5,
            why="the checkpoint's fc takes the 5 states the config declares",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and bool(ctx.draft.architectures)

    def _declared_width(self, ctx: SideContext, width: object, location: Location) -> Iterator[Finding]:
        """A draft config whose `target_hidden_size` is not the target's: fc is built for states
        of another model's width (a config copied from a draft for a larger target)."""
        assert ctx.draft is not None
        declared, actual = ctx.draft.config.data.get("target_hidden_size"), ctx.target.hidden_size
        if not isinstance(declared, int) or not isinstance(actual, int) or declared == actual:
            return
        step = ctx.draft.config.step(
            ("target_hidden_size",), f"target_hidden_size {declared}, the target's hidden size is {actual}"
        )
        yield self.finding(
            ctx,
            "target-width-mismatch",
            f"the draft config's target_hidden_size is {declared} but the target's hidden size is {actual}: fc is "
            f"built for {width} inputs, "
            f"{width // actual if isinstance(width, int) and width % actual == 0 else '?'} "
            "states of the target's width",
            step.location,
            likelihood_ratio=10.0,
            steps=(step, Step(location, "fc is built here", kind=StepKind.FC)),
            fix=f"set target_hidden_size to {actual} (the target's hidden size) in the draft config ({step.location})",
        )

    def _checkpoint_width(self, ctx: SideContext, built: _BuiltFc) -> Iterator[Finding]:
        """A checkpoint whose `fc.weight` takes another width than the fc the engine builds: the
        draft was trained on another number of states (or of another width) than the config says."""
        assert ctx.draft is not None
        weights = ctx.draft.weights
        fc = weights.find("fc.weight") if weights is not None else None
        if weights is None or fc is None or len(fc.shape) != 2 or not isinstance(built.width, int):
            return
        trained, hidden = fc.shape[1], ctx.target.hidden_size
        if trained == built.width:
            return
        states_trained = trained // hidden if isinstance(hidden, int) and hidden > 0 and trained % hidden == 0 else None
        whole = states_trained is not None
        states = (
            f"{states_trained} states of the target's width {hidden}"
            if whole
            else f"{trained} inputs, not a whole number of the target's states ({hidden})"
        )
        step = weights.step(fc.name)
        edit = _sizing_edit(ctx, built, trained) if whole else None
        if edit is not None:
            keypath, value, checked = edit
            fix = (
                f"set {'.'.join(keypath)} to {value} in the draft config ({ctx.draft.config.display}): "
                f"{built.cls.name} then builds its fc for {checked.shown} inputs, as the checkpoint's takes"
            )
        elif whole:
            fix = (
                f"serve on an engine release that sizes fc for the {states_trained} states the draft was trained "
                "on, or declare them in the draft config where this engine reads them"
            )
        else:
            fix = f"serve a draft trained for this target (its states are {hidden} wide)"
        yield self.finding(
            ctx,
            "checkpoint-fc-width-differs",
            f"the draft's checkpoint has fc.weight {list(fc.shape)}: it was trained on {states}, but "
            f"{built.cls.name} builds its fc for {built.shown} inputs from the draft config",
            step.location,
            likelihood_ratio=10.0,
            steps=(step, Step(built.location, "fc is built here", kind=StepKind.FC)),
            fix=fix,
            edit=ConfigEdit(edit[0], edit[1]) if edit is not None else None,
        )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        built = _built_fc(ctx)
        if built is not None:
            yield from self._declared_width(ctx, built.width, built.location)
            yield from self._checkpoint_width(ctx, built)
            yield DraftWidth(
                "serving",
                self.name,
                built.location,
                f"{built.cls.name}: fc takes {built.shown} inputs ({built.slots if built.slots is not None else '?'} "
                "slots)",
                slots=built.slots,
            )
            return
        ctx.note(f"the draft class {', '.join(ctx.draft.architectures)} or its fc was not found in {ctx.tree.label}")


@dataclass(frozen=True)
class _BuiltFc:
    """The fc the engine's draft class builds with the draft config: its input width and where."""

    cls: ClassInfo
    width: object  # the input width, an int where the evaluation settled it
    given: Val  # that width as evaluated, with the config keys it derives from
    slots: int | None  # how many target-width states it takes
    hidden: object
    location: Location

    @property
    def shown(self) -> str:
        if self.slots is not None:
            return f"{self.slots} x {self.hidden} = {self.width}"
        return str(self.width) if isinstance(self.width, int) else "?"


def _built_fc(ctx: SideContext) -> _BuiltFc | None:
    """The draft class's `fc` (on the draft module or its `model`), evaluated with the side's draft config."""
    assert ctx.draft is not None
    ev = ctx.evaluator
    built = ctx.draft_model()
    if built is None:
        return None
    cls, draft = built
    for holder in (draft, ev.field(draft, "model")):
        if not isinstance(holder.v, ObjRef):
            continue
        fc = ev.field(holder, "fc")
        if not isinstance(fc.v, Opaque):
            continue
        given = fc.v.args[0] if fc.v.args else fc.v.kwargs.get("in_features") or fc.v.kwargs.get("input_size")
        if given is None:
            continue
        width = given.v
        hidden = ctx.target.hidden_size or ctx.draft.config.data.get("target_hidden_size")  # each state's width
        slots = (
            width // hidden
            if isinstance(width, int) and isinstance(hidden, int) and hidden and width % hidden == 0
            else None
        )
        location = store_location(ctx, fc, "fc") or cls.module.location(cls.node, cls.node)
        return _BuiltFc(cls, width, given, slots, hidden, location)
    return None


def _sizing_edit(ctx: SideContext, built: _BuiltFc, trained: int) -> tuple[tuple, object, _BuiltFc] | None:
    """The draft-config edit that makes the engine build fc for `trained` inputs, checked by building
    the draft again with it: a key the engine looked for while sizing fc and did not find, given the
    number of states, or (for a mapping such as `eagle_config`) the layer ids the config declares."""
    assert ctx.draft is not None
    hidden = built.hidden if isinstance(built.hidden, int) and built.hidden else None
    if hidden is None:
        return None
    count = trained // hidden
    ids = next(
        (value for _, value in ctx.draft.declared_ids() if isinstance(value, list) and len(value) == count), None
    )
    looked_for = ctx.graph.keypaths(built.given.src, frozenset({StepKind.CONFIG_MISSING}))
    candidates: list[tuple[tuple, object]] = [(path, count) for path in looked_for]
    candidates += [((*path, IDS_KEY), ids) for path in looked_for if ids is not None]
    for keypath, value in candidates:
        rebuilt = _built_fc(ctx.trial(keypath, value))
        if rebuilt is not None and rebuilt.width == trained:
            return keypath, value, rebuilt
    return None
