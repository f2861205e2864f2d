"""What the draft receives when the serving target captures no layers for it."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
import libcst.matchers as m

from rca.sdk import Analyzer, DraftInput, Example, Fact, Finding, Reports, SideContext, StepKind, Tap
from rca.sdk.code import FunctionInfo, ModuleInfo, call_step, contains, iter_calls, walk
from rca.sdk.examples import LAUNCH_GATED_DRAFT, LAUNCH_GATED_FILES, LAUNCH_GATED_TARGET

from .aux_concat import aux_concatenations


class CaptureOffInput(Analyzer):
    """Reads what the draft is fed when the launch settings leave the target capturing nothing.

    ## What it reads
    Runs only when the capture-layers analyzer found the hand-off of the layer ids closed by the
    launch settings (`--speculative-algorithm EAGLE` with an EAGLE-3 draft). The draft then gets
    what the concatenation's other branch stores (SGLang's logits processor: the target's last
    hidden state, after the final norm), and the draft's own forward decides what to do with it:
    a width guard (`if hidden_states.shape[-1] != embeds.shape[-1]: hidden_states = self.fc(...)`)
    skips `fc` for a single target-width state.

    ## Finding
    `fc-skipped`: the draft applies `fc` only when the input width differs from its hidden size,
    so a single target-width state reaches its layers without the projection it was trained
    with. Evidence for `aux-capture-off`.
    """

    code = "RCA-S106"
    name = "capture-off-input"
    sides = frozenset({"serving"})
    anchors = ("aux_hidden_states",)
    provides = (DraftInput,)
    precedence = 20
    reports = (Reports("fc-skipped", hypothesis="aux-capture-off"),)

    VALID = (
        Example(
            files={
                **LAUNCH_GATED_FILES,
                "srt/models/draft.py": LAUNCH_GATED_FILES["srt/models/draft.py"].replace(
                    "        if hidden_states.shape[-1] != embeds.shape[-1]:\n            hidden_states = "
                    "self.fc(hidden_states)",
                    "        hidden_states = self.fc(hidden_states)",
                ),
            },
            target=LAUNCH_GATED_TARGET,
            draft=LAUNCH_GATED_DRAFT,
            settings="--speculative-algorithm EAGLE",
            slots=("h8+norm",),
            why="launched as EAGLE, the draft is fed the final normed state; a draft that always applies fc skips "
            "nothing",
        ),
    )
    INVALID = (
        Example(
            files=LAUNCH_GATED_FILES,
            target=LAUNCH_GATED_TARGET,
            draft=LAUNCH_GATED_DRAFT,
            settings="--speculative-algorithm EAGLE",
            slots=("h8+norm",),
            finding="fc-skipped",
            path="srt/models/draft.py",
            line=12,
            message=(
                "the draft applies fc only when its input is wider than its hidden size (srt/models/draft.py:12):"
                " fed one target-width state, it skips the projection it was trained with"
            ),
            why="launched as EAGLE: nothing is captured, the draft gets the final normed state and skips fc",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return any(finding.name == "aux-capture-off" for finding in ctx.findings)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        last = Tap(ctx.target.num_layers, norm=True)
        for module, function, call in aux_concatenations(ctx):
            found = _fallback(ctx, function, call)
            if found is None:
                continue
            module, function, fallback = found
            step, key = call_step(
                ctx,
                module,
                function,
                fallback,
                f"with no captured layers the draft is fed the target's last hidden state ({last})",
                kind=StepKind.ASSIGN,
            )
            ctx.graph.observe(key, str(last))
            yield from self._fc_guard(ctx)
            yield DraftInput(
                "serving",
                self.name,
                step.location,
                f"no layers captured: the draft is fed {last}",
                slots=(last,),
                verifier_last=None,
                sinks=(key,),
                steps=(step,),
            )
            return
        ctx.note("the target captures no layers for the draft, and what the draft is fed instead was not found")

    def _fc_guard(self, ctx: SideContext) -> Iterator[Finding]:
        """A width test around the draft's `self.fc(...)` call, in the draft class's file."""
        assert ctx.index is not None
        for name in ctx.draft.architectures if ctx.draft else ():
            cls = ctx.find_class(name)
            if cls is None:
                continue
            for function in cls.module.all_functions:
                if "self.fc(" not in function.text or "shape" not in function.text:
                    continue
                for node in walk(function.node.body):
                    if isinstance(node, cst.If) and _width_test(node.test) and _calls_fc(node.body):
                        location = cls.module.location(node.test, function.node)
                        yield self.finding(
                            ctx,
                            "fc-skipped",
                            f"the draft applies fc only when its input is wider than its hidden size ({location}): "
                            f"fed one "
                            "target-width state, it skips the projection it was trained with",
                            location,
                            likelihood_ratio=2.0,
                            steps=(cls.module.step(node.test, function.node, "fc runs only for a wider input"),),
                        )
                        return
            return


def _fallback(
    ctx: SideContext, function: FunctionInfo, call: cst.Call
) -> tuple[ModuleInfo, FunctionInfo, cst.CSTNode] | None:
    """The other branch of the test around the concatenation, or, when the concatenation is a
    helper (`pack_aux_hidden_states`), around a call of the helper."""
    branch = _other_branch(function.node, call)
    if branch is not None:
        return function.module, function, branch
    for caller, site in ctx.evaluator.callers(function):
        branch = _other_branch(caller.node, site)
        if branch is not None:
            return caller.module, caller, branch
    return None


def _other_branch(function: cst.FunctionDef, call: cst.Call) -> cst.CSTNode | None:
    """The first statement of the `else` of the `if` whose body holds the concatenation."""
    for node in walk(function.body):
        if (
            isinstance(node, cst.If)
            and isinstance(node.orelse, cst.Else)
            and any(inner is call for inner in iter_calls(node.body))
        ):
            return node.orelse.body.body[0] if node.orelse.body.body else None
    return None


# `x.shape[-1]`: the width of the states a draft's input test compares.
_LAST_DIMENSION = m.Subscript(
    value=m.Attribute(attr=m.Name("shape")),
    slice=[m.SubscriptElement(m.Index(m.UnaryOperation(m.Minus(), m.Integer("1"))))],
)


def _width_test(test: cst.BaseExpression) -> bool:
    return (
        isinstance(test, cst.Comparison)
        and any(isinstance(item.operator, cst.NotEqual) for item in test.comparisons)
        and contains(test, _LAST_DIMENSION)
    )


def _calls_fc(body: cst.BaseSuite) -> bool:
    return any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "fc" for call in iter_calls(body))
