"""Whether the serving engine finds the mask token a DFlash draft fills its block with."""

from __future__ import annotations

from collections.abc import Iterator

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Reports, Severity, SideContext, Step, StepKind
from rca.sdk.code import FunctionInfo
from rca.sdk.engines import spec_method
from rca.sdk.examples import SMALL_TARGET
from rca.sdk.values import BudgetExceeded, ConfigObj, EvalRaise, FuncRef, Opaque, Val

_KEY = "mask_token_id"
_READER = """
class Proposer:
    def init_parallel_drafting(self):
        hf_config = self.draft_model_config.hf_config
        dflash_config = getattr(hf_config, "dflash_config", None)
        if dflash_config and "mask_token_id" in dflash_config:
            self.mask_token_id = dflash_config["mask_token_id"]
        elif getattr(hf_config, "mask_token_id", None) is not None:
            self.mask_token_id = hf_config.mask_token_id
        else:
            raise ValueError("the draft model config must have `dflash_config.mask_token_id` or `mask_token_id`")
"""
_DRAFT = {"architectures": ["DFlashDraftModel"], "dflash_config": {"target_layer_ids": [1, 3, 5], "mask_token_id": 7}}


class DraftMaskToken(Analyzer):
    """Whether the serving engine finds the mask token a DFlash draft fills its block with.

    ## What it reads
    For a draft served as DFlash (the launch's method, else its config's layout): where the draft
    config names no mask token (`dflash_config.mask_token_id`, `mask_token_id`), each function of
    the serving source that reads `mask_token_id` and can raise, evaluated with the draft's config
    as the engine hands it over (`draft_model_config.hf_config`, or the config as its argument).

    ## Why it matters
    A DFlash draft proposes a block at once: the slots after the last verified token are fed the
    embedding of its mask token, the one it was trained with. vLLM has no fallback: without the id
    it refuses to start the engine. SGLang looks the token up in the tokenizer, or adds it (a row
    of the embedding the draft never saw in training, unless its trainer added it the same way).
    """

    code = "RCA-D111"
    name = "draft-mask-token"
    sides = frozenset({"serving"})
    anchors = ('"mask_token_id"',)
    compares = Compares(
        training="the mask token id the draft config records (its trainer writes it under dflash_config)",
        serving="where the engine's reader looks for it, and what it does when it finds none",
    )
    reports = (Reports("mask-token-missing", hypothesis="mask-token-missing", severity=Severity.CAUSE),)
    VALID = (
        Example(
            files={"spec_decode/proposer.py": _READER},
            target=SMALL_TARGET,
            draft=_DRAFT,
            why="the draft config records its mask token where the engine reads it",
        ),
    )
    INVALID = (
        Example(
            files={"spec_decode/proposer.py": _READER},
            target=SMALL_TARGET,
            draft={"architectures": ["DFlashDraftModel"], "dflash_config": {"target_layer_ids": [1, 3, 5]}},
            finding="mask-token-missing",
            path="draft.json",
            key=("dflash_config",),
            message=(
                "the draft config names no mask token (dflash_config.mask_token_id, mask_token_id), and "
                "Proposer.init_parallel_drafting refuses to start without one: it raises ValueError at "
                "spec_decode/proposer.py:11"
            ),
            why="a DFlash config exported without its mask token id, served by an engine with no fallback",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and spec_method(ctx) == "dflash" and not _recorded(ctx)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None and ctx.index is not None
        ev = ctx.evaluator
        for relpath in sorted(ctx.anchor_files(self.anchors[0])):
            module = ctx.index.load(relpath)
            if module is None:
                continue
            for function in module.all_functions:
                if _KEY not in function.text or "raise " not in function.text:
                    continue
                try:
                    with ev.isolated():
                        ev.call(Val(FuncRef(function, bound=_receiver(function))), *_arguments(ctx, function))
                except EvalRaise as error:
                    if _KEY.removesuffix("_id") not in error.message or error.location is None:
                        continue  # refused for another reason than the mask token
                    yield self._refused(ctx, function, error)
                    return
                except (BudgetExceeded, RecursionError):  # a reader too deep to follow says nothing either way
                    continue

    def _refused(self, ctx: SideContext, function: FunctionInfo, error: EvalRaise) -> Finding:
        assert ctx.draft is not None and error.location is not None
        keypath = ("dflash_config",) if isinstance(ctx.draft.config.data.get("dflash_config"), dict) else ()
        declared = (
            ctx.draft.config.step(keypath, "dflash_config, without mask_token_id")
            if keypath
            else ctx.draft.config.step(("architectures",), f"architectures {list(ctx.draft.architectures)}")
        )
        raised = Step(
            error.location,
            f"raises {error.kind}: the engine does not start",
            function.module.code(error.location.line, error.location.line),
            StepKind.TEST,
            ctx.tree.is_patched(error.location.path),
        )
        return self.finding(
            ctx,
            "mask-token-missing",
            f"the draft config names no mask token (dflash_config.mask_token_id, mask_token_id), and "
            f"{function.qualname} refuses to start without one: it raises {error.kind} at {error.location}",
            declared.location,
            likelihood_ratio=50.0,
            steps=(declared, raised),
            fix=f"add dflash_config.mask_token_id to the draft config ({declared.location}): the id of the token the "
            "draft was trained to fill its block with (its trainer's config or export records it)",
        )


def _recorded(ctx: SideContext) -> bool:
    """Whether the draft config names a mask token anywhere an engine reads one."""
    assert ctx.draft is not None
    data = ctx.draft.config.data
    nested = data.get("dflash_config")
    return data.get(_KEY) is not None or (isinstance(nested, dict) and nested.get(_KEY) is not None)


def _receiver(function: FunctionInfo) -> Val | None:
    """The object a method runs on: the engine's proposer, known by what it holds (its draft model config)."""
    if function.owner is None:
        return None
    return Val(Opaque("proposer", function.owner.name, "the engine object that reads the draft's mask token"))


def _arguments(ctx: SideContext, function: FunctionInfo) -> tuple[list[Val], dict[str, Val]]:
    """A free function's config argument (`get_parallel_drafting_token_id(hf_config)`): the draft's config."""
    assert ctx.draft is not None
    params = [param.name.value for param in function.node.params.params]
    if function.owner is not None:
        params = params[1:]
    if len(params) == 1:
        return [Val(ConfigObj(ctx.draft.config))], {}
    return [], {}
