"""Whether a DFlash draft's block attends causally or bidirectionally as it was trained to."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import libcst as cst
import libcst.matchers as m

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Reports, SideContext, Step, StepKind
from rca.sdk.code import (
    ClassInfo,
    FunctionInfo,
    classes_built_with,
    code_steps,
    constructor_kwargs,
    iter_calls,
    submodules,
)
from rca.sdk.engines import spec_method
from rca.sdk.examples import SMALL_TARGET
from rca.sdk.inputs import ConfigFile, declared_layers
from rca.sdk.values import BudgetExceeded, EnumMember, EvalRaise, FuncRef, MutList, Val

_KEYS = (("is_causal",), ("dflash_config", "causal"))  # where a config says how its block attends
_METADATA = "causal="  # the keyword a runner builds the draft's attention metadata with
# SGLang's attention types: a decoder attends causally, an encoder-only one bidirectionally
_ATTENTION_TYPES = {"DECODER": True, "ENCODER_ONLY": False}
_PROPOSER = """
class DFlashProposer:
    def __init__(self, vllm_config):
        self.draft_model_config = vllm_config.speculative_config.draft_model_config

    def build_metadata(self, builder):
        return builder.build(query_len=16, causal={causal})
"""
_READ = 'self.draft_model_config.hf_config.dflash_config.get("causal", False)'
_IDS = {"target_layer_ids": [1, 3, 5], "mask_token_id": 7}
_DRAFT = {"architectures": ["DFlashDraftModel"], "num_hidden_layers": 1, "dflash_config": _IDS}
_CAUSAL_DRAFT = {**_DRAFT, "dflash_config": {**_IDS, "causal": True}}


@dataclass(frozen=True)
class Trained:
    """How the draft config says one of its layers attends within the block."""

    layer: int
    causal: bool
    step: Step
    how: str


@dataclass(frozen=True)
class Served:
    """How an engine builds the draft's attention: for every layer (a runner's metadata) or per layer."""

    causal: tuple[bool | None, ...] | bool
    step: Step
    by: str
    said: str  # what the cited code says, in short

    def layer(self, index: int) -> bool | None:
        return self.causal if isinstance(self.causal, bool) else self.causal[index]


class DraftCausality(Analyzer):
    """Whether a DFlash draft's block attends causally or bidirectionally as it was trained to.

    ## What it reads
    The draft config's statement of how its block attends: `is_causal`, else
    `dflash_config.causal` (NVIDIA ModelOpt writes it for every draft it exports; speculators'
    conversion derives it), for every layer; without either, each full-attention layer (all of them
    without `layer_types`) as DFlash trains it, bidirectionally within the block (the z-lab
    reference's, SpecForge's, speculators' and NeMo Automodel's default); a windowed layer's
    causality without a key differs by trainer and is not judged. Then the serving engine's code:
    each DFlash runner's attention metadata built with `causal=...`, evaluated with the draft's
    config (vLLM), else the attention type each draft layer's attention module is built with
    (SGLang's `attn_type`: a decoder attends causally, an encoder-only one bidirectionally).

    ## Why it matters
    A block position trained to see the positions after it and served causally (or the reverse)
    predicts from a context it never saw in training: every position past the first loses
    acceptance, and the engine logs nothing. vLLM 0.20-0.22 built every DFlash draft
    bidirectionally, whatever its config said; SGLang 0.5.23 reads `is_causal` only for layers its
    `layer_types` name, never `dflash_config.causal`
    (https://github.com/NVIDIA/Model-Optimizer/blob/main/modelopt/torch/export/plugins/hf_spec_export.py
    writes the key because engines default differently per layer type).
    """

    code = "RCA-D115"
    name = "draft-causality"
    sides = frozenset({"serving"})
    anchors = (_METADATA, "attn_type")
    compares = Compares(
        training="how the draft config says its block attends (is_causal, dflash_config.causal, else DFlash's mask)",
        serving="the causality the engine builds the draft's attention with",
    )
    reports = (Reports("draft-causality-differs", hypothesis="causality-differs"),)
    VALID = (
        Example(
            files={"spec_decode/dflash.py": _PROPOSER.format(causal=_READ)},
            target=SMALL_TARGET,
            draft=_CAUSAL_DRAFT,
            why="the runner builds the draft's metadata with the causality its config records",
        ),
        Example(
            files={"spec_decode/dflash.py": _PROPOSER.format(causal="False")},
            target=SMALL_TARGET,
            draft=_DRAFT,
            why="a draft that records nothing was trained with DFlash's bidirectional block, as it is served",
        ),
    )
    INVALID = (
        Example(
            files={"spec_decode/dflash.py": _PROPOSER.format(causal="False")},
            target=SMALL_TARGET,
            draft=_CAUSAL_DRAFT,
            finding="draft-causality-differs",
            path="draft.json",
            key=("dflash_config", "causal"),
            message=(
                "the draft config says its layer 0 attends causally within the block (dflash_config.causal true), "
                "but DFlashProposer.build_metadata builds the draft's attention bidirectionally "
                "(spec_decode/dflash.py:7: causal=False): each block position sees the positions after it, "
                "which it never saw in training"
            ),
            why="a draft trained with a causal block, served by a runner that builds every DFlash draft "
            "bidirectionally (vLLM 0.20-0.22)",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and spec_method(ctx) == "dflash" and bool(_trained(ctx.draft.config))

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        trained = _trained(ctx.draft.config)
        served = _metadata(ctx) or _told_by_model(ctx) or _module_types(ctx)
        if not served:
            ctx.note(
                f"the draft's block causality ({trained[0].how}) was not checked: no attention metadata or "
                f"attention type of {ctx.tree.label}'s DFlash draft was read"
            )
            return
        for reading in served:
            for item in trained:
                causal = reading.layer(item.layer)
                if causal is None or causal == item.causal:
                    continue
                yield self._differs(ctx, item, reading, causal)
                return

    def _differs(self, ctx: SideContext, item: Trained, reading: Served, causal: bool) -> Finding:
        said = "causally" if item.causal else "bidirectionally"
        built = "causally" if causal else "bidirectionally"
        sees = (
            "sees only the positions before it, where it was trained to see the whole block"
            if causal
            else "sees the positions after it, which it never saw in training"
        )
        return self.finding(
            ctx,
            "draft-causality-differs",
            f"the draft config says its layer {item.layer} attends {said} within the block ({item.how}), but "
            f"{reading.by} builds the draft's attention {built} ({reading.step.location}: {reading.said}): "
            f"each block position {sees}",
            item.step.location,
            likelihood_ratio=10.0,
            steps=(item.step, reading.step),
            fix=f"serve the draft where the engine builds its block attention {said}, as it was trained: an engine "
            f"release whose {reading.by} reads the config's causality, or a config in the layout this one reads",
        )


def _trained(config: ConfigFile) -> list[Trained]:
    """How the config says each layer attends within the block: its key for every layer, else the
    full-attention layers, as DFlash trains them. A speculators-format config (converted by the
    engine) and windowed layers without a key are not judged."""
    layers = declared_layers(config)
    for key in _KEYS:
        present, value = config.lookup(key)
        if present and isinstance(value, bool):
            shown = f"{'.'.join(key)} {str(value).lower()}"
            step = config.step(key, shown)
            return [Trained(i, value, step, shown) for i in range(layers)]
    if config.lookup(("speculators_config",))[0] or config.lookup(("dflash_config", "use_swa"))[1] is True:
        return []
    _, types = config.lookup(("layer_types",))
    if isinstance(types, list):
        step = config.step(("layer_types",), f"layer_types {types}")
        full = [i for i, kind in enumerate(types[:layers]) if kind == "full_attention"]
    else:
        step = config.step(("architectures",), "no layer_types: every layer attends over the full context")
        full = list(range(layers))
    how = "a full-attention layer, with no key saying otherwise: DFlash's bidirectional block"
    return [Trained(i, False, step, how) for i in full]


def _metadata(ctx: SideContext) -> list[Served]:
    """Each DFlash runner's attention metadata built with a causality its code fixes or derives from
    the draft's config (a value passed in from elsewhere is read where it is made, not here)."""
    assert ctx.index is not None
    ev = ctx.evaluator
    found: list[Served] = []
    for relpath in sorted(ctx.anchor_files(_METADATA)):
        # a DFlash runner's file; a model file builds modules, not the runner's metadata
        if "dflash" not in relpath.lower() or "/models/" in f"/{relpath}":
            continue
        module = ctx.index.load(relpath)
        for cls in module.classes.values() if module is not None else ():
            for method in cls.methods.values():
                for call, expression in _causal_arguments(method):
                    with ev.isolated():
                        value = ev.evaluate(method, expression, {}, ev.singleton(cls))
                    if type(value.v) is not bool or _passed_in(cls, method, expression):
                        continue
                    said = f"causal={cst.Module([]).code_for_node(expression)}"
                    step = method.module.step(call, method.node, f"the draft's attention metadata: {said} ({value.v})")
                    found.append(Served(value.v, step, f"{cls.name}.{method.name}", said))
    return found


def _causal_arguments(method: FunctionInfo) -> Iterator[tuple[cst.Call, cst.BaseExpression]]:
    for call in iter_calls(method.node):
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "causal":
                yield call, arg.value


def _passed_in(cls: ClassInfo, method: FunctionInfo, expression: cst.BaseExpression) -> bool:
    """Whether the causality is handed in from elsewhere (the method's parameter, or a field its
    class's constructor stores from one): it is read where it is made, not here."""
    if isinstance(expression, cst.Name):
        return expression.value in _parameters(method)
    if not (isinstance(expression, cst.Attribute) and m.matches(expression.value, m.Name("self"))):
        return False
    init = cls.methods.get("__init__")
    if init is None:
        return False
    stored = re.compile(rf"^\s*self\.{expression.attr.value}\s*(?::[^=]*)?=\s*(\w+)\s*$", re.MULTILINE)
    return any(match[1] in _parameters(init) for match in stored.finditer(init.text))


def _parameters(function: FunctionInfo) -> set[str]:
    params = function.node.params
    return {param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)}


def _told_by_model(ctx: SideContext) -> list[Served]:
    """Each layer's causality as the draft model tells its runner (vLLM's `get_draft_attn_causal`:
    a method of the draft class, taking no argument, whose name says causal), called on the draft
    built with its config."""
    built = ctx.draft_model()
    if built is None or ctx.draft is None:
        return []
    cls, model = built
    layers = declared_layers(ctx.draft.config)
    for klass in ctx.evaluator.mro(cls):
        for name, method in klass.methods.items():
            if "causal" not in name or len(method.node.params.params) != 1:
                continue
            with ctx.evaluator.isolated():
                try:
                    value = ctx.evaluator.call(Val(FuncRef(method, bound=model)), [])
                except (EvalRaise, BudgetExceeded, RecursionError):
                    continue
            listed = [item.v for item in value.v.items] if isinstance(value.v, MutList) else []
            # the draft's layers, each known; past them, what a layer stack leaves unknown
            items, rest = listed[:layers], listed[layers:]
            if len(items) != layers or not all(type(item) is bool for item in items):
                continue
            if any(type(item) is bool for item in rest):
                continue
            shown = ", ".join("causal" if item else "bidirectional" for item in items)
            step = klass.module.step(method.node, method.node, f"tells the runner each layer's causality: {shown}")
            return [Served(tuple(items), step, f"{klass.name}.{name}", f"{name}() -> {shown}")]
    return []


def _module_types(ctx: SideContext) -> list[Served]:
    """The attention type each draft layer's attention module is built with (SGLang's `attn_type`),
    where no runner builds metadata with a causality of its own."""
    built = ctx.draft_model()
    if built is None or ctx.draft is None:
        return []
    names = classes_built_with(ctx, "sliding_window_size: int", "attn_type")
    modules = submodules(ctx, built[1], names) if names else []
    if len(modules) != declared_layers(ctx.draft.config):
        return []
    causal: list[bool | None] = []
    cited: list[Step] = []
    for _, module, _ in modules:
        kwargs = constructor_kwargs(module) or {}
        value = kwargs.get("attn_type")
        member = value.v if value is not None else None
        causal.append(_ATTENTION_TYPES.get(member.name) if isinstance(member, EnumMember) else None)
        cited += code_steps(ctx, value) if value else []
    name, _, layer = modules[0]
    owner: ClassInfo = layer if layer is not None else built[0]
    shown = ", ".join("?" if c is None else ("causal" if c else "bidirectional") for c in causal)
    if cited:  # where the attention type is decided
        step = replace(cited[-1], note=f"each layer's {name} attention type: {shown}")
    else:
        init = owner.methods.get("__init__")
        node = init.node if init is not None else owner.node
        step = Step(owner.module.location(node, node), f"builds each layer's {name}: {shown}", "", StepKind.ASSIGN)
    return [Served(tuple(causal), step, owner.name, f"{name}(attn_type=...): {shown}")]
