"""How many target hidden states the serving engine's draft `fc` takes."""

from __future__ import annotations

from collections.abc import Iterator

from rca.analyzers._examples import SMALL_TARGET
from rca.analyzers._support import store_location

from rca.model import Location, Step, StepKind
from rca.static.analyzer import Analyzer, Example, Reports
from rca.static.context import SideContext
from rca.static.evaluate.values import ObjRef, Opaque
from rca.static.facts import DraftWidth, Fact, Finding

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

    code = "RCA-S104"
    name = "draft-fc-width"
    sides = frozenset({"serving"})
    anchors = ("self.fc",)
    provides = (DraftWidth,)
    reports = (Reports("target-width-mismatch", hypothesis="aux-count-mismatch"),)
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
            line=6,
            message=(
                "the draft config's target_hidden_size is 128 but the target's hidden size is 64: fc is built for"
                " 384 inputs, 6 states of the target's width"
            ),
            why="a draft config copied from a wider target: fc takes 3 x 128 inputs, six states of the target's "
            "width 64",
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

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        ev = ctx.evaluator
        built = ctx.draft_model()
        if built is not None:
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
                hidden = ctx.target.hidden_size or ctx.draft.config.data.get(
                    "target_hidden_size"
                )  # each captured state is the target's width
                slots = (
                    width // hidden
                    if isinstance(width, int) and isinstance(hidden, int) and hidden and width % hidden == 0
                    else None
                )
                location = store_location(ctx, fc, "fc") or cls.module.location(cls.node, cls.node)
                shown = (
                    f"{slots} x {hidden} = {width}"
                    if slots is not None
                    else (str(width) if isinstance(width, int) else "?")
                )
                yield from self._declared_width(ctx, width, location)
                yield DraftWidth(
                    "serving",
                    self.name,
                    location,
                    f"{cls.name}: fc takes {shown} inputs ({slots if slots is not None else '?'} slots)",
                    slots=slots,
                )
                return
        ctx.note(f"the draft class {', '.join(ctx.draft.architectures)} or its fc was not found in {ctx.tree.label}")
