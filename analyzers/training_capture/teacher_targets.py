"""Which state a trainer's teacher logits come from, and whether the final norm is applied first."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from rca.sdk import (
    Analyzer,
    Compares,
    DraftInput,
    Example,
    Fact,
    Finding,
    Location,
    Reports,
    SideContext,
    Step,
    StepKind,
    Tap,
    Wiring,
)
from rca.sdk.code import FunctionInfo, ModuleInfo, dotted_name, iter_calls
from rca.sdk.examples import DATA_GENERATOR_FILES, DUMP_READER, LLAMA_8B_TARGET

HEAD = "lm_head("
# How a trainer names the dumped last state it computes the teacher from.
_LAST_STATE = ("verifier_last", "last_hidden")

_TRAINER = """
import torch


class Eagle3DraftModel(torch.nn.Module):
    def forward(self, hidden_states, input_ids, verifier_last_hidden_states=None):
        hidden_states = self.fc(hidden_states)
        with torch.no_grad():
            targets = self.verifier_lm_head({teacher})
        return self.loss(hidden_states, targets)
"""


def _files(teacher: str) -> dict[str, str]:
    return {
        **DATA_GENERATOR_FILES,
        "train/data.py": DUMP_READER,
        "models/eagle3/core.py": _TRAINER.format(teacher=teacher),
    }


class TeacherTargets(Analyzer):
    """Reads which state the trainer's teacher logits come from, and whether it is normalized first.

    ## What it reads
    The training wiring's verifier-last state (what the dump reader hands the trainer as the last
    state) and the call of the verifier's `lm_head` on it in the trainer's code
    (`self.verifier_lm_head(verifier_last_hidden_states)`), with or without the verifier's norm
    around its argument (`self.verifier_norm(...)`).

    ## Why it matters
    The verifier scores drafts with `lm_head(norm(hN))`. A teacher computed from the pre-norm hN
    without the norm (speculators before 0.4.0 on its own vLLM dumps), or from another layer than
    the last, trains the draft toward distributions serving never uses: acceptance drops while
    training metrics look fine.
    """

    code = "RCA-T108"
    name = "teacher-targets"
    sides = frozenset({"training"})
    anchors = (HEAD,)
    requires = (DraftInput,)
    compares = Compares(
        training="what the trainer's teacher logits come from: which state, normed or not",
        serving="the target's final, normed state, whose tokens the verifier accepts",
    )
    reports = (
        Reports("teacher-from-unnormed-state", hypothesis="teacher-unnormed"),
        Reports("teacher-state-not-last", hypothesis="verifier-last-offset"),
    )
    VALID = (
        Example(
            files=_files("self.verifier_norm(verifier_last_hidden_states)"),
            target=LLAMA_8B_TARGET,
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            why="the verifier's norm before its lm_head: the teacher is the target's own distribution",
        ),
    )
    INVALID = (
        Example(
            files=_files("verifier_last_hidden_states"),
            target=LLAMA_8B_TARGET,
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            finding="teacher-from-unnormed-state",
            path="models/eagle3/core.py",
            line=9,
            message=(
                "the teacher's logits are the verifier's lm_head applied to h32, the last state before the final "
                "norm, with no norm in between: the draft is trained against logits the target never produces"
            ),
            why="a pre-norm dump read as if it were post-norm",
        ),
        Example(
            files=_files("self.verifier_norm(verifier_last_hidden_states)"),
            target=LLAMA_8B_TARGET,
            dumps={"data_config.json": {"hidden_states": {"layer_ids": [2, 16, 29, 30]}}},
            slots=("h3", "h17", "h30"),
            verifier_last="h31",
            finding="teacher-state-not-last",
            path="dumps/data_config.json",
            line=3,
            message=(
                "the state the teacher is computed from is h31, the stream after 31 of the target's 32 layers, "
                "not after its last: the draft learns what an intermediate layer predicts"
            ),
            why="the verifier-last id written one layer early",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        draft_input = ctx.fact(DraftInput)
        assert draft_input is not None
        origin = _origin(ctx, draft_input)
        yield from self._teacher(ctx, draft_input.verifier_last, origin, draft_input.location)

    def settled(self, ctx: SideContext, wiring: Wiring) -> Iterator[Finding]:
        """The teacher's state as the dumps show it (the fingerprint's verifier-last), cited there."""
        draft_input = ctx.fact(DraftInput)
        observed = next((step for step in reversed(wiring.steps) if step.kind == StepKind.DUMP), None)
        if draft_input is None:
            return iter(())
        origin = observed if observed is not None else _origin(ctx, draft_input)
        return self._teacher(ctx, wiring.verifier_last, origin, draft_input.location)

    def _teacher(
        self, ctx: SideContext, last: Tap | None, origin: Step | None, fallback: Location
    ) -> Iterator[Finding]:
        layers = ctx.target.num_layers
        if last is None or last.layer is None:
            return
        if last.layer != layers:
            yield self.finding(
                ctx,
                "teacher-state-not-last",
                f"the state the teacher is computed from is {last}, the stream after {last.layer} of the target's "
                f"{layers} layers, not after its last: the draft learns what an intermediate layer predicts",
                origin.location if origin is not None else fallback,
                likelihood_ratio=10.0,
                steps=(origin,) if origin is not None else (),
                taps=(last,),
            )
        if last.norm:
            return
        found = _teacher_call(ctx)
        if found is None:
            return
        module, function, call = found
        argument = call.args[0].value
        if _normalizes(argument):
            return
        step = module.step(call, function.node, "the teacher's logits: the verifier's lm_head on the last state")
        yield self.finding(
            ctx,
            "teacher-from-unnormed-state",
            f"the teacher's logits are the verifier's lm_head applied to {Tap(last.layer)}, the last state before the "
            "final norm, with no norm in between: the draft is trained against logits the target never produces",
            step.location,
            likelihood_ratio=10.0,
            steps=(step, *((origin,) if origin is not None else ())),
            taps=(last,),
        )


def _teacher_call(ctx: SideContext) -> tuple[ModuleInfo, FunctionInfo, cst.Call] | None:
    """The trainer's call of an lm_head on the dumped last state."""
    assert ctx.index is not None
    for relpath in sorted(ctx.anchor_files(HEAD)):
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if HEAD not in function.text:
                continue
            for call in iter_calls(function.node.body):
                callee = (dotted_name(call.func) or "").rsplit(".", 1)[-1]
                if "lm_head" not in callee or not call.args:
                    continue
                text = module.tree.code_for_node(call.args[0].value)
                if any(name in text for name in _LAST_STATE):
                    return module, function, call
    return None


def _normalizes(argument: cst.BaseExpression) -> bool:
    """Whether the lm_head's argument is a norm's output (`self.verifier_norm(h)`)."""
    if not isinstance(argument, cst.Call):
        return False
    return "norm" in (dotted_name(argument.func) or "").rsplit(".", 1)[-1].lower()


def _origin(ctx: SideContext, draft_input: DraftInput) -> Step | None:
    """Where the verifier-last state's layer id comes from: the dump record or config key that set it."""
    found = [
        node
        for key in draft_input.sinks
        if key in ctx.graph.g
        for node in ctx.graph.ancestors(key)
        if node.kind in (StepKind.DUMP, StepKind.CONFIG)
    ]
    # a dump's record first, else the most specific config key (`text_config.num_hidden_layers`)
    best = min(found, key=lambda node: (node.kind != StepKind.DUMP, -len(node.detail)), default=None)
    return ctx.graph.step(best) if best is not None else None
