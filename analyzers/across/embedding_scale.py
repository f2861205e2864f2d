"""How each side's draft takes its token embeddings: their scale, and whether its first layer normalizes them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import libcst as cst

from rca.sdk import (
    Analyzer,
    Compares,
    Establishes,
    Example,
    Fact,
    Finding,
    Reports,
    SideContext,
    Step,
    StepKind,
    Wiring,
)
from rca.sdk.code import FunctionInfo, ModuleInfo, call_name, dotted_name, names_in, walk
from rca.sdk.engines import EAGLE3_NAMES
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.sides import of_another_family


@dataclass(frozen=True, slots=True)
class EmbedUse:
    """How one side's draft takes its token embeddings: where they come from, the factor they are
    multiplied by before the draft sees them (None: none, the embedding's rows as stored), and
    whether its first layer normalizes them before anything else reads them (an RMSNorm: a
    factor on the rows then cancels) or takes them raw."""

    source: str  # what embeds the tokens (`LlamaModel.embed_tokens`, a stand-in's plain `nn.Embedding`)
    scale: str | None  # the factor applied (`config.hidden_size**0.5`), None for the stored rows
    normed: bool  # the first layer normalizes them before use
    steps: tuple[Step, ...] = ()
    target_scale: str | None = None  # the factor the target applies to its own embeddings, where read
    target_steps: tuple[Step, ...] = ()

    @property
    def rows(self) -> str:
        if self.scale == "the target's own":
            return "rows as the target's own embedding module computes them"
        return f"rows scaled by {self.scale}" if self.scale else "rows as stored, unscaled"

    @property
    def seen(self) -> str:
        """What the first layer sees, in words."""
        return "normalizes them first (a factor on the rows cancels)" if self.normed else "takes them raw"

    def describe(self) -> str:
        return f"embeds tokens with {self.source} ({self.rows}); its first layer {self.seen}"

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "scale": self.scale,
            "first_layer": "normalized" if self.normed else "raw",
            "target_scale": self.target_scale,
            "steps": [step.citation() for step in (*self.steps, *self.target_steps)],
        }


# The forward-time scale of an embedding (Gemma's `normalizer = hidden_size**0.5`, `embed_scale=...`).
_SCALE_TEXT = re.compile(r"\bhidden_size\s*\*\*\s*0?\.5\b|sqrt\(\s*[\w.]*\bhidden_size\s*\)")
# What embeds the draft's tokens: its own module, an engine's method, a trainer's base-model accessor.
_EMBEDDERS = ("embed_tokens", "embed_input_ids", "_base_model_embeddings")
_EMBED_CALL = re.compile(r"\b(?:embed_tokens|embed_input_ids|_base_model_embeddings)\s*\(")
_NORM_OF_EMBEDS = re.compile(r"norm\w*\(\s*[\w.]*emb")
# A name for the embeddings concatenated (`torch.cat((input_emb, h))`) or passed on (`h = noise_embedding`).
_RAW_EMBEDS = re.compile(r"cat\(\s*[(\[]\s*\w*emb|=\s*\w*emb\w*\s*$", re.MULTILINE)
_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
# A receiver naming the target (`self.base_model.embed_tokens`, `_base_model_embeddings`): its own module.
_TARGET_RECEIVER = re.compile(r"base_model|target|verifier", re.IGNORECASE)
TARGET_OWN = "the target's own"
# Paths of drafts that are not the HF EAGLE-3 one: other methods (DFlash, DSpark, Medusa, MTP), and
# Megatron's EAGLE, built on Megatron's own embedding rather than the HF base model's, and converters' models.
_TRAINING_NEEDLES = ("class Eagle", "emb", "torch.cat(", "Embedding(", "raise NotImplementedError")
_SCALE_NEEDLES = (
    "hidden_size**0.5",
    "hidden_size ** 0.5",
    "sqrt(config.hidden_size",
    "sqrt(self.config.hidden_size",
    "sqrt(self.hidden_size",
)
_OTHER_DRAFTS = ("dflash", "dspark", "domino", "medusa", "mtp", "megatron", "convert")

_TARGET = {"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 34, "hidden_size": 2560}
_DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 2560, "num_hidden_layers": 1}

# An engine's EAGLE-3 draft (SGLang's and vLLM's shape): its own embedding, normalized in layer 0.
_ENGINE_DRAFT = """
import torch


class LlamaDecoderLayer(torch.nn.Module):
    def forward(self, embeds, hidden_states):
        embeds = self.input_layernorm(embeds)
        hidden_states = self.hidden_norm(hidden_states)
        return self.self_attn(torch.cat([embeds, hidden_states], dim=-1))


class LlamaModel(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.midlayer = LlamaDecoderLayer(config)

    def forward(self, input_ids, hidden_states):
        embeds = self.embed_tokens(input_ids)
        return self.midlayer(embeds, hidden_states)


class LlamaForCausalLMEagle3(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LlamaModel(config)
"""
# The target's model file (both engines' Gemma shape): the embedding scaled in the forward.
_ENGINE_TARGET = """
import torch


class Gemma3TextModel(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        normalizer = config.hidden_size**0.5
        self.register_buffer("normalizer", torch.tensor(normalizer))

    def embed_input_ids(self, input_ids):
        return self.embed_tokens(input_ids) * self.normalizer


class Gemma3ForCausalLM(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = Gemma3TextModel(config)
"""
_SERVING = {"models/llama_eagle3.py": _ENGINE_DRAFT, "models/gemma3.py": _ENGINE_TARGET}
_SERVING_RAW = {
    **_SERVING,
    "models/llama_eagle3.py": _ENGINE_DRAFT.replace("        embeds = self.input_layernorm(embeds)\n", ""),
}

# A trainer in the shape of NVIDIA ModelOpt's offline path: a stand-in base model that keeps only
# the target's embedding and head, rebuilt as plain modules, and the draft's first layer.
_STAND_IN = """
import torch
from torch import nn


class FakeBaseModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("FakeBaseModel forward is not implemented.")
"""
_TRAINER_DRAFT = """
import torch


class EagleModule(torch.nn.Module):
    def first_layer_input(self, inputs_embeds, hidden_states):
        {first}
        return torch.cat((input_embeds, self.hidden_norm(hidden_states)), dim=-1)


class HFEagleModel(torch.nn.Module):
    def prepare(self, input_ids, hidden_states):
        input_embeds = self.base_model.embed_tokens(input_ids){scale}
        return self.eagle_module.first_layer_input(input_embeds, hidden_states)
"""
_NORMED = "input_embeds = self.input_layernorm(inputs_embeds)"
_RAW = "input_embeds = inputs_embeds"


def _trainer(first: str, scale: str = "", stand_in: bool = True) -> dict[str, str]:
    files = {"speculative/eagle/modeling_eagle.py": _TRAINER_DRAFT.format(first=first, scale=scale)}
    return {**files, "speculative/plugins/modeling_fakebase.py": _STAND_IN} if stand_in else files


class EmbeddingScale(Analyzer):
    """Reads how each side's draft takes its token embeddings, and compares the two.

    ## What it reads
    On each side: what embeds the draft's tokens (the engine's draft module's `embed_tokens`; a
    trainer's stand-in base model, a class that keeps only the target's embedding and head and
    whose `forward` raises, rebuilt as a plain `nn.Embedding`), the factor multiplied onto its
    output where the draft's embeddings are computed (`embed_tokens(ids) * self.normalizer`), and
    whether the draft's first layer normalizes the embeddings before anything else reads them
    (`embeds = self.input_layernorm(embeds)`) or takes them raw (into a concatenation or its
    residual stream). On the serving side also the target's own scale, from the engine's model file
    of the target's architecture (`normalizer = config.hidden_size**0.5`).

    ## Why it matters
    Gemma models multiply their embedding output by `sqrt(hidden_size)` in the forward, not in
    the weights. A stand-in that rebuilds the target's embedding as a plain `nn.Embedding` (NVIDIA
    ModelOpt's `FakeBaseModel`) drops that factor, so a draft can be trained on rows some 50x
    smaller than the engine feeds it; cosine similarity cannot see it, a norm ratio can. The factor
    only matters to a draft that takes the embeddings raw: an EAGLE-3 draft whose first layer
    RMS-normalizes them (every engine's and trainer's EAGLE-3 layer reads do) cancels it.
    """

    code = "RCA-X105"
    name = "embedding-scale"
    formerly = ("RCA-T114",)
    sides = frozenset({"serving", "training"})
    establishes = Establishes(
        "draft_embedding",
        "how the side's draft takes its token embeddings: their scale, and whether its first layer normalizes them",
    )
    compares = Compares(
        training=(
            "the factor the trainer's draft applies to its token embeddings and whether its first layer normalizes them"
        ),
        serving="the same, in the engine's draft module",
    )
    reports = (Reports("embed-scale-differs", hypothesis="embed-scale-mismatch"),)
    VALID = (
        Example(
            files=_trainer(_NORMED),
            serving_files=_SERVING,
            target=_TARGET,
            draft=_DRAFT,
            why="a stand-in's plain embedding drops Gemma's scale, but both first layers normalize the embeddings",
        ),
        Example(
            files=_trainer(_RAW, stand_in=False),
            serving_files={"models/llama_eagle3.py": _SERVING_RAW["models/llama_eagle3.py"]},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            why="a target that does not scale its embeddings: both sides take the same unscaled rows raw",
        ),
    )
    INVALID = (
        Example(
            files=_trainer(_RAW),
            serving_files=_SERVING,
            target=_TARGET,
            draft=_DRAFT,
            finding="embed-scale-differs",
            path="speculative/eagle/modeling_eagle.py",
            line=7,
            message=(
                "in training, the draft's first layer takes its token embeddings raw (FakeBaseModel.embed_tokens, a "
                "stand-in's plain nn.Embedding: rows as stored, unscaled); served, it normalizes them first "
                "(LlamaModel.embed_tokens: rows as stored, unscaled): the draft sees its tokens at another scale than "
                "it was trained on (the target scales its own embeddings by config.hidden_size**0.5)"
            ),
            why="a trainer whose first layer never normalized the stand-in's unscaled embeddings",
        ),
        Example(
            files=_trainer(_RAW, " * self.normalizer", stand_in=False),
            serving_files=_SERVING_RAW,
            target=_TARGET,
            draft=_DRAFT,
            finding="embed-scale-differs",
            path="speculative/eagle/modeling_eagle.py",
            line=7,
            message=(
                "both sides' first layer takes the draft's token embeddings raw, but in training they are "
                "HFEagleModel.base_model.embed_tokens's rows scaled by self.normalizer, served "
                "LlamaModel.embed_tokens's rows as stored, unscaled: the draft sees its tokens at another scale than "
                "it was trained on (the target scales its own embeddings by config.hidden_size**0.5)"
            ),
            why="raw embeddings scaled in training and not served",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        # every needle this side asks for, in one pass over the tree (each later search is answered from it)
        if ctx.side == "training":
            ctx.tree.grep(_TRAINING_NEEDLES)
        files = _draft_files(ctx)
        if not files:
            return
        # read once per tree, draft module and target: a fix tried against the engine reads the same code
        key = (self.name, ctx.side, ctx.tree.label, tuple(module.relpath for module in files), ctx.target.architectures)
        if key not in ctx.memo:
            first = _first_layer(ctx, files)
            ctx.memo[key] = (
                first,
                _stand_in(ctx) if ctx.side == "training" and first is not None else None,
                _embedding_call(ctx, files) if first is not None else None,
                _target_scale(ctx, files[0]) if ctx.side == "serving" and first is not None else None,
            )
        first, stand_in, called, target_scale = ctx.memo[key]
        if first is None:
            return
        normed, first_step = first
        loaded: Step | None = None
        if stand_in is not None:
            source, step, loaded = stand_in
            scale = None
            steps = (step, *((loaded,) if loaded else ()), *((called[2],) if called is not None else ()), first_step)
        elif called is not None:
            source, scale, step = called
            steps = (step, first_step)
        else:
            return
        use = EmbedUse(
            source,
            scale,
            normed,
            steps,
            target_scale[0] if target_scale is not None else None,
            (target_scale[1],) if target_scale is not None else (),
        )
        if target_scale is not None and scale is None and normed:
            ctx.note(
                f"the target scales its token embeddings by {target_scale[0]} ({target_scale[1].location}); the "
                f"draft's {source} does not ({step.location}), and its first layer normalizes them first "
                f"({first_step.location}): the factor cancels"
            )
        if stand_in is not None:
            where = f", where the trainer loads it in place of the target ({loaded.location})" if loaded else ""
            ctx.note(
                f"the draft's token embeddings come from {source} ({step.location}{where}): a target that scales its "
                f"embeddings in its forward (Gemma's sqrt(hidden_size)) loses that factor here; the draft's first "
                + (
                    f"layer normalizes them first ({first_step.location}), so it cancels"
                    if normed
                    else f"layer takes them raw ({first_step.location})"
                )
            )
        yield self.aspect(ctx, first_step.location, use.describe(), use)

    def across(self, training: Wiring, serving: Wiring) -> Iterator[Finding]:
        trained, served = self.established(training), self.established(serving)
        if trained is None or served is None:
            return
        if trained.normed and served.normed:
            return  # a factor on the rows cancels in the norm
        # the target's own module applies the factor the engine's model of the target applies
        scale = served.target_scale if trained.scale == TARGET_OWN else trained.scale
        if trained.normed == served.normed and scale == served.scale:
            return
        target = f" (the target scales its own embeddings by {served.target_scale})" if served.target_scale else ""
        if trained.normed != served.normed:
            said = (
                f"in training, the draft's first layer {_first(trained)} ({trained.source}: {trained.rows}); "
                f"served, it {_first(served, again=True)} ({served.source}: {served.rows})"
            )
            fix = (
                "retrain with the token embeddings normalized before the draft's first layer reads them, as the "
                "engine does"
                if served.normed
                else "serve on an engine whose draft takes the token embeddings raw, as training did, or retrain "
                "with them normalized"
            )
        else:
            said = (
                f"both sides' first layer takes the draft's token embeddings raw, but in training they are "
                f"{trained.source}'s {trained.rows}, served {served.source}'s {served.rows}"
            )
            fix = (
                f"retrain on the token embeddings as the engine computes them ({served.rows}), or scale them so "
                "when serving"
            )
        steps = (*trained.steps, *served.steps, *served.target_steps)
        where = trained.steps[-1].location  # the trainer's first layer
        yield self.finding(
            "training",
            "embed-scale-differs",
            f"{said}: the draft sees its tokens at another scale than it was trained on{target}",
            where,
            likelihood_ratio=10.0,
            steps=steps,
            fix=fix,
        )


def _first(use: EmbedUse, again: bool = False) -> str:
    what = "them" if again else "its token embeddings"
    return f"normalizes {what} first" if use.normed else f"takes {what} raw"


def _draft_files(ctx: SideContext) -> list[ModuleInfo]:
    """The modules of the side's draft: the engine's draft class's module, or a trainer's files
    that name EAGLE or a draft and read embeddings."""
    assert ctx.index is not None
    if ctx.side == "serving":
        built = ctx.draft_model()
        return [built[0].module] if built is not None else []
    found: list[ModuleInfo] = []
    hits = ctx.tree.grep(_TRAINING_NEEDLES)
    named = set(hits["class Eagle"])
    candidates = set(hits["emb"]) & set(hits["torch.cat("])
    # the files of an EAGLE-3 module first (speculators' `models/eagle3/` before its EAGLE-1 `models/eagle.py`)
    for relpath in sorted(candidates, key=lambda path: (not any(name in path for name in EAGLE3_NAMES), path)):
        lowered = relpath.lower()
        if "eagle" not in lowered and "draft" not in lowered and relpath not in named:
            continue
        if any(other in lowered for other in _OTHER_DRAFTS) or of_another_family(ctx, relpath):
            continue
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        if module is not None:
            found.append(module)
    return found


def _functions(module: ModuleInfo, pattern: re.Pattern[str]) -> list[FunctionInfo]:
    mentioning = module.functions_mentioning(pattern)
    return mentioning if mentioning is not None else list(module.all_functions)


def _statements(function: FunctionInfo) -> Iterator[cst.CSTNode]:
    top = function.node
    yield from walk(top, into=lambda node: node is top or not isinstance(node, _NESTED))


def _first_layer(ctx: SideContext, files: list[ModuleInfo]) -> tuple[bool, Step] | None:
    """Whether the draft's first layer normalizes its token embeddings (an assignment of a norm's
    output on them: `embeds = self.input_layernorm(embeds)`), or takes them raw (a name for them
    concatenated, or made the residual stream, with no norm on them anywhere in the draft)."""
    for module in files:
        for function in _functions(module, _NORM_OF_EMBEDS):
            for node in _statements(function):
                if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
                    callee = _last_name(node.value.func).lower()
                    argument = node.value.args[0].value if node.value.args else None
                    if "norm" in callee and argument is not None and any("emb" in name for name in names_in(argument)):
                        step = module.step(node, function.node, "the draft's first layer normalizes its embeddings")
                        return True, replace(step, kind=StepKind.CALL)
    for module in files:
        for function in _functions(module, _RAW_EMBEDS):
            # EAGLE-1's fc over [embeds, hidden] (`self.fc(torch.cat((inputs_embeds, hidden_states)))`)
            # is not an EAGLE-3 first layer: its concatenation is not read as one
            nodes = list(_statements(function))
            fused = {
                id(argument.value)
                for node in nodes
                if isinstance(node, cst.Call) and _last_name(node.func) == "fc"
                for argument in node.args
            }
            for node in nodes:
                if id(node) not in fused and _takes_raw(module, node):
                    step = module.step(node, function.node, "the draft's first layer takes its embeddings raw")
                    return False, replace(step, kind=StepKind.ASSIGN)
    return None


def _last_name(func: cst.BaseExpression) -> str:
    """The called name: `input_layernorm` for `self.layers[0].input_layernorm`."""
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def _takes_raw(module: ModuleInfo, node: cst.CSTNode) -> bool:
    """`embeds = inputs_embeds` or `hidden_states = noise_embedding` (a name for the embeddings
    passed on as they are), or `residual = embeds`."""
    if isinstance(node, cst.Call) and call_name(node) == "cat" and node.args:
        parts = node.args[0].value
        elements = parts.elements if isinstance(parts, (cst.List, cst.Tuple)) else []
        return any(isinstance(element.value, cst.Name) and "emb" in element.value.value for element in elements)
    if not (isinstance(node, cst.Assign) and isinstance(node.value, cst.Name)):
        return False
    return "emb" in node.value.value and not _NORM_OF_EMBEDS.search(module.tree.code_for_node(node))


def _embedding_call(ctx: SideContext, files: list[ModuleInfo]) -> tuple[str, str | None, Step] | None:
    """Where the draft's embeddings are computed: the first call of an embedder, with the factor
    multiplied onto it there (`self.embed_tokens(ids) * self.normalizer`)."""
    for module in files:
        for function in _functions(module, _EMBED_CALL):
            products: dict[cst.Call, cst.BaseExpression] = {}
            for node in _statements(function):
                if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
                    if isinstance(node.left, cst.Call):
                        products[node.left] = node.right
                if isinstance(node, cst.Call) and call_name(node) in _EMBEDDERS:
                    factor = products.get(node)
                    scale = module.tree.code_for_node(factor) if factor is not None else None
                    if (
                        scale is None
                        and ctx.side == "training"
                        and _TARGET_RECEIVER.search(dotted_name(node.func) or "")
                    ):
                        scale = TARGET_OWN  # the target's embedding module, whatever factor its forward applies
                    holder = function.owner.name if function.owner is not None else function.name
                    callee = dotted_name(node.func) or call_name(node) or ""
                    source = f"{holder}.{callee.removeprefix('self.')}"
                    note = f"the draft's token embeddings: {source}" + (
                        ", the target's module" if scale == TARGET_OWN else f" * {scale}" if scale else ", unscaled"
                    )
                    return source, scale, replace(module.step(node, function.node, note), kind=StepKind.CALL)
    return None


def _stand_in(ctx: SideContext) -> tuple[str, Step, Step | None] | None:
    """A trainer's stand-in base model: a class keeping the target's embedding as a plain
    `nn.Embedding`, whose forward raises (it never runs the target's layers)."""
    assert ctx.index is not None
    hits = ctx.tree.grep(_TRAINING_NEEDLES)
    for relpath in sorted(set(hits["Embedding("]) & set(hits["raise NotImplementedError"])):
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for cls in module.classes.values():
            forward = cls.methods.get("forward")
            if forward is None or not _only_raises(forward):
                continue
            if any(method.may_store("fc") for method in cls.methods.values()):
                continue  # a draft that is never run itself (a converter's), not a stand-in for the target
            for method in cls.methods.values():
                if "embed_tokens" not in method.text:
                    continue
                for node in _statements(method):
                    if not (isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)):
                        continue
                    target = dotted_name(node.targets[0].target) or ""
                    if target.endswith("embed_tokens") and call_name(node.value) == "Embedding":
                        source = f"{cls.name}.embed_tokens, a stand-in's plain nn.Embedding"
                        note = f"{cls.name} rebuilds the target's embedding as a plain nn.Embedding (no forward scale)"
                        built = replace(module.step(node, method.node, note), kind=StepKind.ASSIGN)
                        return source, built, _loaded(ctx, cls.name)
    return None


def _only_raises(function: FunctionInfo) -> bool:
    """A body that only raises NotImplementedError (after its docstring): a class never run."""
    body = function.node.body
    statements = list(body.body) if isinstance(body, cst.IndentedBlock) else [body]
    lines = [
        line
        for statement in statements
        for line in (statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement])
    ]
    if (
        lines
        and isinstance(lines[0], cst.Expr)
        and isinstance(lines[0].value, cst.SimpleString | cst.ConcatenatedString)
    ):
        lines = lines[1:]
    if len(lines) != 1 or not isinstance(lines[0], cst.Raise) or lines[0].exc is None:
        return False
    raised = lines[0].exc.func if isinstance(lines[0].exc, cst.Call) else lines[0].exc
    return _last_name(raised) == "NotImplementedError"


def _loaded(ctx: SideContext, name: str) -> Step | None:
    """Where the trainer loads the stand-in in place of the target (`FakeBaseModel.from_source(...)`)."""
    assert ctx.index is not None
    for relpath in sorted(ctx.anchor_files(f"{name}.")):
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in _functions(module, re.compile(rf"\b{name}\.\w+\(")):
            for node in _statements(function):
                if isinstance(node, cst.Call) and (dotted_name(node.func) or "").startswith(f"{name}."):
                    step = module.step(node, function.node, f"the trainer loads {name} in place of the target")
                    return replace(step, kind=StepKind.CALL)
    return None


def _target_scale(ctx: SideContext, draft: ModuleInfo) -> tuple[str, Step] | None:
    """The factor the engine's model of the target multiplies its embedding output by, read in the
    module of the target's architecture in the engine's models package (the draft module's), and
    the modules of that package it imports. A search of that package only, not of the tree."""
    assert ctx.index is not None
    package = draft.relpath.rsplit("/", 1)[0] + "/"
    models = [relpath for relpath in ctx.tree.files() if relpath.startswith(package)]
    for name in ctx.target.architectures:
        for relpath in ctx.tree.grep_in(f"class {name}(", models):
            ctx.index.allow(relpath)
            defining = ctx.index.load(relpath)
            if defining is None or name not in defining.classes:
                continue
            modules = [defining]
            for binding in defining.imports.values():
                imported = ctx.index.resolve(binding.module)
                if (
                    imported is not None
                    and imported != relpath
                    and imported.startswith(package)
                    and any(ctx.tree.grep_in(needle, [imported]) for needle in _SCALE_NEEDLES)
                ):
                    ctx.index.allow(imported)
                    loaded = ctx.index.load(imported)
                    if loaded is not None:
                        modules.append(loaded)
            for module in modules:
                found = _scale_in(module)
                if found is not None:
                    return found
    return None


def _scale_in(module: ModuleInfo) -> tuple[str, Step] | None:
    for function in _functions(module, _SCALE_TEXT):
        if "embed" not in function.text or not _SCALE_TEXT.search(function.text):
            continue
        for node in _statements(function):
            if _is_scale(node):
                text = module.tree.code_for_node(node)
                step = module.step(node, function.node, f"the target scales its embeddings by {text}")
                return text, replace(step, kind=StepKind.ASSIGN)
    return None


def _is_scale(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        left = dotted_name(node.left) or ""
        return left.rsplit(".", 1)[-1] == "hidden_size" and isinstance(node.right, cst.Float)
    if isinstance(node, cst.Call) and call_name(node) == "sqrt" and node.args:
        argument = dotted_name(node.args[0].value) or ""
        return argument.rsplit(".", 1)[-1] == "hidden_size"
    return False
