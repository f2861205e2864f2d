"""Which quantization the serving engine builds the draft's layers with, against the draft's own."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Location, Reports, SideContext, Step, StepKind
from rca.sdk.code import ClassInfo, FunctionInfo, contains, names_in, walk
from rca.sdk.examples import SMALL_TARGET
from rca.sdk.inputs import ConfigFile, quantized_exports
from rca.sdk.values import DRAFT_MODEL_CONFIGS, FuncRef, MutList, ObjRef, Opaque, Val

_DRAFT_SOURCE = """
import torch
from torch import nn


class DecoderLayer(nn.Module):
    def __init__(self, vllm_config, config=None, prefix=""):
        super().__init__()
        quant_config = {quant}
        self.mlp = MLP(config.hidden_size, quant_config=quant_config, prefix=prefix)


class DraftModel(nn.Module):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        self.config = vllm_config.speculative_config.draft_model_config.hf_config
        self.layers = nn.ModuleList([DecoderLayer(vllm_config, config=self.config)])


class DraftForCausalLM(nn.Module):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        self.model = DraftModel(vllm_config=vllm_config)
"""
# `self.quantization = quant_method`: the branch where a draft takes its checkpoint's method.
_TAKES_QUANT_METHOD = m.Assign(
    targets=[m.AssignTarget(m.Attribute(value=m.Name("self"), attr=m.Name("quantization")))],
    value=m.Name("quant_method"),
)
_VERIFIERS = "vllm_config.quant_config"
_DRAFTS = "get_quantization_config(vllm_config.speculative_config.draft_model_config)"
_DRAFT = {"architectures": ["DraftForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1}
_FP8_TARGET = {**SMALL_TARGET, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
_PLAIN = {
    "fc.weight": ("BF16", (64, 192), None),
    "layers.0.mlp.down_proj.weight": ("BF16", (64, 64), None),
}
_FP8 = {
    "fc.weight": ("BF16", (64, 192), None),
    "layers.0.mlp.down_proj.weight": ("F8_E4M3", (64, 64), None),
    "layers.0.mlp.down_proj.weight_scale": ("F32", (1,), None),
}

# An engine whose model loader hands the draft class its quantization config (SGLang's shape).
_LOADED_DRAFT = """
from torch import nn


class DraftForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__()
        self.mlp = MLP(config.hidden_size, quant_config=quant_config, prefix=prefix)
"""
_MODEL_CONFIG = """
class ModelConfig:
    @staticmethod
    def from_server_args(server_args, model_path=None, is_draft_model=False):
        quantization = (
            server_args.speculative_draft_model_quantization
            if is_draft_model
            else server_args.quantization
        )
        return ModelConfig(model_path=model_path, quantization=quantization)
"""
_SERVER_ARGS = """
import argparse


class ServerArgs:
    def __post_init__(self):
        if self.speculative_draft_model_quantization is None:
            self.speculative_draft_model_quantization = self.quantization


def add_cli_args(parser: argparse.ArgumentParser):
    parser.add_argument("--quantization", type=str, default=None)
    parser.add_argument("--speculative-draft-model-quantization", type=str, default=None)
"""
_METHODS = """
class AWQConfig:
    @classmethod
    def get_config_filenames(cls):
        return ["quant_config.json", "quantize_config.json"]


class Fp8Config:
    @classmethod
    def get_config_filenames(cls):
        return []


QUANTIZATION_METHODS = {"awq": AWQConfig, "fp8": Fp8Config}
"""
_LOADED = {
    "draft.py": _LOADED_DRAFT,
    "model_config.py": _MODEL_CONFIG,
    "server_args.py": _SERVER_ARGS,
    "quantization.py": _METHODS,
}
_AWQ_TARGET = {**SMALL_TARGET, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}

LOADER = "the engine's model loader"
_FOLLOWED = 3  # helpers followed into their modules to read what a quantization config is made from


class DraftQuantization(Analyzer):
    """Reads which quantization config the serving engine builds the draft's layers with, against the draft's own.

    ## What it reads
    The class named by the draft config's `architectures`, built with that config, its `model` and
    the modules they hold (the decoder layers), each with its base classes (a base a module
    imports under its own name included). In each one's `__init__`, every call handed a
    `quant_config=` is run to with the arguments the module was built with (a base's from the
    `super().__init__(...)` call), following the helpers it calls (`self.get_quant_config(...)`,
    `get_draft_quant_config(...)`) into their modules, and the value handed is read: `None` (the
    layers are built unquantized), an engine config's `quant_config` (vLLM's `vllm_config.quant_config`,
    made from the target model's config: the verifier's), or one made from the draft's own model
    config (`VllmConfig.get_quantization_config(draft_model_config, ...)`). Then what the draft is:
    its config's `quantization_config` and, from its checkpoint's safetensors headers, tensors only
    a quantized export holds (`weight_scale`, `input_scale`, `qweight`, `scales`, FP8 weights); and
    what the target is: its config's `quantization_config`, or the launch's `--quantization`.

    A draft class that takes a `quant_config` parameter (SGLang's) is handed one by the engine's
    model loader, made from the draft's model config: then the engine's `from_server_args` is read
    for the launch setting that config takes its method from (`--quantization`, or
    `--speculative-draft-model-quantization`, and where the engine copies `--quantization` onto it
    when it is not given), the branch of the model config's check where a draft's own declared
    method wins, and, for an unquantized draft, whether the method's config class reads its
    settings from a checkpoint file (`get_config_filenames()`: AWQ's, which the draft lacks) or
    quantizes a plain checkpoint on load (FP8's: it loads, a note).

    ## Why it matters
    Built with the verifier's quantization, an unquantized draft beside a quantized target gets
    quantized layers: the engine looks for the scales and packed weights that quantization
    declares and the load fails (`KeyError: 'layers.0.mlp.down_proj.weight'`), or, where the
    method quantizes on load, the draft's weights are read in a format they were never trained in.
    A quantized draft beside an unquantized target is built without its quantization likewise.
    Where the engine builds the draft with its own config, or neither model is quantized, nothing
    is said.
    """

    code = "RCA-D108"
    name = "draft-quantization"
    formerly = ("RCA-S117",)
    sides = frozenset({"serving"})
    compares = Compares(
        training="the draft's own precision: its config's quantization and its checkpoint's dtypes",
        serving=(
            "the quantization config the engine builds the draft's layers with (its own, the target's, the launch's)"
        ),
    )
    reports = (Reports("draft-built-with-verifier-quantization", hypothesis="quant-inherited"),)
    INVALID = (
        Example(
            files={"draft.py": _DRAFT_SOURCE.format(quant=_VERIFIERS)},
            target=_FP8_TARGET,
            draft=_DRAFT,
            weights=_PLAIN,
            finding="draft-built-with-verifier-quantization",
            path="draft.py",
            line=9,
            message=(
                "DecoderLayer builds the draft's layers with the verifier's quantization config "
                "(vllm_config.quant_config): fp8, from the target config's quantization_config, but the draft is not "
                "quantized (its config has no quantization_config, and its checkpoint holds 2 tensors, none a "
                "quantized export writes): loading it fails, or its weights are read as fp8"
            ),
            why="an unquantized draft beside an FP8 target, built with the engine-wide quantization config",
        ),
        Example(
            files=_LOADED,
            target=_AWQ_TARGET,
            draft=_DRAFT,
            weights=_PLAIN,
            settings="--quantization awq",
            finding="draft-built-with-verifier-quantization",
            path="server_args.py",
            line=8,
            message=(
                "the engine's model loader builds DraftForCausalLM with the draft's model config's quantization "
                "method, awq (the launch's --quantization awq, which speculative_draft_model_quantization takes when "
                "it is not given (server_args.py:8)), but the draft is not quantized (its config has no "
                "quantization_config, and its checkpoint holds 2 tensors, none a quantized export writes): awq reads "
                "its settings from a file the draft's checkpoint does not have, so loading it fails (Cannot find the "
                "config file for awq), or its weights are read as awq"
            ),
            why="an unquantized draft whose model config takes the launch's --quantization awq, copied onto it",
        ),
    )
    VALID = (
        Example(
            files={"draft.py": _DRAFT_SOURCE.format(quant=_DRAFTS)},
            target=_FP8_TARGET,
            draft=_DRAFT,
            weights=_PLAIN,
            why="the draft's layers built with the quantization config made from its own model config",
        ),
        Example(
            files={"draft.py": _DRAFT_SOURCE.format(quant=_VERIFIERS)},
            target=SMALL_TARGET,
            draft=_DRAFT,
            weights=_PLAIN,
            why="the verifier's quantization config, but neither model is quantized",
        ),
        Example(
            files={"draft.py": _DRAFT_SOURCE.format(quant=_VERIFIERS)},
            target=_FP8_TARGET,
            draft={**_DRAFT, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
            weights=_FP8,
            why="the verifier's quantization config, and a draft quantized with the same method",
        ),
        Example(
            files={"draft.py": _DRAFT_SOURCE.format(quant="None")},
            target=_FP8_TARGET,
            draft=_DRAFT,
            weights=_PLAIN,
            why="layers built unquantized, an unquantized draft beside an FP8 target",
        ),
        Example(
            files=_LOADED,
            target=_AWQ_TARGET,
            draft=_DRAFT,
            weights=_PLAIN,
            settings="--quantization awq --speculative-draft-model-quantization unquant",
            why="the launch names the draft's quantization itself (unquant: none)",
        ),
        Example(
            files=_LOADED,
            target=_AWQ_TARGET,
            draft=_DRAFT,
            weights=_PLAIN,
            why="no --quantization: the draft's model config reads the draft's own (none)",
        ),
        Example(
            files=_LOADED,
            target=_AWQ_TARGET,
            draft=_DRAFT,
            weights=_PLAIN,
            settings="--quantization fp8",
            why="fp8 reads no file: an unquantized checkpoint is quantized on load, and loads",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and bool(ctx.draft.architectures)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        built = ctx.draft_model()
        if built is None:
            ctx.note(f"which quantization the draft is built with was not checked: no draft class in {ctx.tree.label}")
            return
        draft = _built_by_loader(ctx, *built)
        handed = [use for module in _modules(ctx, draft) for use in _handed(ctx, module)]
        verifiers = [use for use in handed if use.source is _Source.VERIFIER]
        unread = [use for use in handed if use.source is None]
        loaders = [use for use in handed if use.source is _Source.LOADER]
        if loaders and not verifiers:
            yield from self._loaded(ctx, loaders[0])
            return
        if not verifiers:
            unquantized = [use for use in handed if use.source is _Source.NONE]
            own = _draft_quantization(ctx) if unquantized and len(unquantized) == len(handed) else None
            if own is not None and own.method is not None:
                ctx.note(
                    f"{unquantized[0].owner} builds the draft's layers unquantized ({unquantized[0].step.location}), "
                    f"whatever the draft is, and the draft is {own.described}: its scales have no parameter to load "
                    "into"
                )
            elif unread:
                ctx.note(
                    f"which quantization config {unread[0].owner} builds the draft with was not read "
                    f"({unread[0].step.location}): {unread[0].shown}"
                )
            return
        use = verifiers[0]
        target = _target_quantization(ctx)
        own = _draft_quantization(ctx)
        if own is None and target.method is None:
            return  # the verifier's config is no quantization: a draft that declares none is built as it is
        if own is None:
            ctx.note(
                f"{use.owner} builds the draft's layers with the verifier's quantization config, but whether the draft "
                "is quantized was not read: no checkpoint beside its config"
            )
            return
        if target.method == own.method or (target.method is not None and own.method == "quantized"):
            return  # both unquantized, or quantized alike (a method only the tensors tell is taken as alike)
        if own.method == "quantized":
            ctx.note(
                f"{use.owner} builds the draft's layers with the verifier's quantization config, none here, and the "
                f"draft is {own.described} but its config declares no method: no engine builds it quantized"
            )
            return
        if target.method is None:
            built_as, consequence = (
                "no quantization (the target is not quantized: its config has no quantization_config)",
                f"the draft's {own.method} weights and scales are loaded into unquantized layers, and the load fails "
                "or they are read as plain weights",
            )
        else:
            built_as = f"{target.method}, from {target.origin}"
            consequence = (
                f"loading it fails, or its weights are read as {target.method}"
                if own.method is None
                else f"its {own.method} weights are loaded into {target.method} layers, and the load fails or they "
                f"are read in the wrong format"
            )
        message = (
            f"{use.owner} builds the draft's layers with the verifier's quantization config ({use.shown}): "
            f"{built_as}, but the draft is {own.described}: {consequence}"
        )
        fix = (
            "serve the draft with a release whose draft builder takes the quantization config from the draft's own "
            "model config (vLLM from 0.11.1, `get_draft_quant_config`), or serve it beside a target quantized as the "
            "draft is"
        )
        yield self.finding(
            ctx,
            "draft-built-with-verifier-quantization",
            message,
            use.step.location,
            likelihood_ratio=20.0,
            steps=(*target.steps, *own.steps, use.call, use.step),
            fix=fix,
        )

    def _loaded(self, ctx: SideContext, use: _Use) -> Iterator[Finding]:
        """The draft class handed its quantization config by the engine's model loader (SGLang):
        made from the draft's model config, whose method the launch's `--quantization` sets
        unless the draft's own is read."""
        settings = ctx.settings
        launch = settings.get("quantization") if settings is not None else None
        if launch is None or not launch.value:
            return  # the draft's model config detects the draft's own method: nothing is copied onto it
        spec = _loader_quantization(ctx)
        if spec is None:
            ctx.note(
                f"{use.owner} is handed its quantization config by {ctx.tree.label}'s model loader, but where the "
                "loader takes the draft's quantization method from was not read"
            )
            return
        if spec.dest != "quantization" and settings is not None and settings.get(spec.dest) is not None:
            return  # the launch names the draft's quantization itself
        if spec.dest != "quantization" and spec.copied is None:
            return  # the draft's setting is not copied from --quantization
        method = str(launch.value)
        draft = _draft_quantization(ctx)
        if draft is None:
            ctx.note(
                f"the draft's model config takes its quantization method from the launch's {launch.flag} {method}, "
                "but whether the draft is quantized was not read: no checkpoint beside its config"
            )
            return
        inherits = f"the launch's {launch.flag} {method}" + (
            f", which {spec.dest} takes when it is not given ({spec.copied.location})" if spec.copied else ""
        )
        steps = (launch.step, spec.step, *((spec.copied,) if spec.copied else ()))
        location = (spec.copied or spec.step).location
        fix = (
            "launch without --quantization (the target's checkpoint declares its method, and the draft's model "
            "config then reads the draft's own)"
            + (f", or with --{spec.dest.replace('_', '-')} unquant for an unquantized draft" if spec.copied else "")
        )
        if draft.method == "quantized":
            return  # quantized, the method not named: nothing to compare with
        if draft.method is not None:
            if draft.method == method or spec.own_wins is not None:
                return  # the same method, or the draft's own wins
            yield self.finding(
                ctx,
                "draft-built-with-verifier-quantization",
                f"the engine's model loader builds {use.owner} with the draft's model config's quantization method, "
                f"{method} ({inherits}), but the draft is {draft.described}, and the engine's check of the two has no "
                f"branch for a draft: loading it fails (the method in the draft's config does not match {method})",
                location,
                likelihood_ratio=20.0,
                steps=(*steps, *draft.steps, use.call),
                fix=fix,
            )
            return
        on_load = _quantizes_on_load(ctx, method)
        if on_load is None:
            ctx.note(
                f"the draft is built with {method} ({inherits}) and is not quantized, but whether {method} quantizes "
                "an unquantized checkpoint on load was not read"
            )
            return
        quantizes, made = on_load
        if quantizes:
            ctx.note(
                f"the draft is built with {method} ({inherits}), and is not quantized: {method} quantizes its weights "
                f"on load ({made.location}), so it loads, served in {method} rather than as trained"
            )
            return
        yield self.finding(
            ctx,
            "draft-built-with-verifier-quantization",
            f"the engine's model loader builds {use.owner} with the draft's model config's quantization method, "
            f"{method} ({inherits}), but the draft is {draft.described}: {method} reads its settings from a file "
            f"the draft's checkpoint does not have, so loading it fails (Cannot find the config file for {method}), "
            f"or its weights are read as {method}",
            location,
            likelihood_ratio=20.0,
            steps=(*steps, *draft.steps, made, use.call),
            fix=fix,
        )


class _Source(enum.Enum):
    """Where a quantization config handed to a draft module is made from."""

    NONE = "none"  # no quantization: None handed
    LOADER = "loader"  # the loader's own, for the checkpoint it loads
    DRAFT = "draft"  # from the draft's model config
    VERIFIER = "verifier"  # an engine config's `quant_config`, made from the target's


@dataclass(frozen=True)
class _Use:
    """A quantization config handed to a call that builds part of the draft."""

    owner: str  # the class whose __init__ hands it
    source: _Source | None  # None: not read
    shown: str  # how it reads
    step: Step  # where it is made (the assignment of the name handed, or the call)
    call: Step  # the call it is handed to


@dataclass(frozen=True)
class _Quantization:
    method: str | None  # None: not quantized; "quantized": quantized, the method not named
    described: str
    origin: str
    steps: tuple[Step, ...]


def _modules(ctx: SideContext, draft: Val) -> list[Val]:
    """The draft module, its `model`, and the modules they hold (one level: the decoder layers)."""
    ev = ctx.evaluator
    holders = [draft]
    inner = ev.field(draft, "model")
    if isinstance(inner.v, ObjRef):
        holders.append(inner)
    found = list(holders)
    for holder in holders:
        assert isinstance(holder.v, ObjRef)
        for klass in ev.mro(holder.v.cls):
            init = klass.methods.get("__init__")
            if init is None:
                continue
            for name in dict.fromkeys(re.findall(r"\bself\.(\w+)\s*(?::[^=\n]*)?=[^=]", init.text)):
                if name == "model":
                    continue
                value = ev.field(holder, name)
                items = [value] if isinstance(value.v, ObjRef) else []
                if isinstance(value.v, Opaque) and value.v.origin.endswith("ModuleList"):
                    lists = [arg.v for arg in value.v.call_args() if isinstance(arg.v, MutList)]
                    items = [item for lst in lists for item in lst.items if isinstance(item.v, ObjRef)][:1]
                found += [item for item in items if all(item.v is not seen.v for seen in found)]
    return found


def _built_by_loader(ctx: SideContext, cls: ClassInfo, draft: Val) -> Val:
    """The draft module as the engine's model loader builds it: a class taking a `quant_config`
    is handed one (SGLang's `LlamaForCausalLMEagle3(config, quant_config=None)`), made by the
    loader from the draft's model config, not its default."""
    init = next((klass.methods["__init__"] for klass in ctx.evaluator.mro(cls) if "__init__" in klass.methods), None)
    if init is None or "quant_config" not in init.text.split(")", 1)[0]:
        return draft
    assert isinstance(draft.v, ObjRef)
    args, kwargs = draft.v.init_args or ([], {})
    loaders = Val(Opaque("quant_config", LOADER, "handed by the engine's model loader"))
    return ctx.evaluator.new_object(cls, list(args), {**kwargs, "quant_config": loaders})


def _chain(ctx: SideContext, cls: ClassInfo) -> list[ClassInfo]:
    """The class and its bases, a base the module imports under the class's own name included
    (`class LlamaDecoderLayer(LlamaDecoderLayer)`, which subclasses the imported one)."""
    assert ctx.index is not None
    order = list(ctx.evaluator.mro(cls))
    for base in cls.base_expressions:
        if not (isinstance(base, cst.Name) and base.value == cls.name):
            continue
        binding = cls.module.imports.get(cls.name)
        relpath = ctx.index.resolve(binding.module) if binding is not None else None
        if relpath is None or binding is None or binding.attr is None:
            continue
        module = ctx.index.load(relpath)  # read, not allowed: what other analyzers resolve stays as it was
        if module is not None and binding.attr in module.classes and module.classes[binding.attr] is not cls:
            order += [klass for klass in _chain(ctx, module.classes[binding.attr]) if klass not in order]
    return order


def _handed(ctx: SideContext, module: Val) -> Iterator[_Use]:
    """Each quantization config one module's `__init__` (and its bases') hands to what it builds."""
    assert isinstance(module.v, ObjRef)
    obj: ObjRef = module.v
    args, kwargs = obj.init_args or ([], {})
    bindings = _bind(ctx, obj.cls, args, kwargs, module)
    chain = _chain(ctx, obj.cls)
    for position, klass in enumerate(chain):
        init = klass.methods.get("__init__")
        if init is None:
            continue
        for call in walk(init.node):
            if isinstance(call, cst.Call) and _keyword(call, "quant_config") is not None:
                yield _read(ctx, klass, init, call, module, bindings)
        handed = _super_bindings(ctx, chain[position + 1 :], init, module, bindings)
        if handed is None:
            return  # a base's __init__ that never runs (`nn.Module.__init__(self)` instead)
        bindings = handed


def _bind(ctx: SideContext, cls: ClassInfo, args: list[Val], kwargs: dict[str, Val], module: Val) -> dict[str, Val]:
    init = cls.methods.get("__init__")
    if init is None:
        return {}
    return ctx.evaluator.bind_params(init, list(args), dict(kwargs), module, init.module)


def _super_bindings(
    ctx: SideContext, later: list[ClassInfo], init: FunctionInfo, module: Val, bindings: dict[str, Val]
) -> dict[str, Val] | None:
    """What `super().__init__(...)` in `init` hands the `__init__` of the next class of `later`
    (the rest of the chain), bound to its parameters; None where `init` calls no `super().__init__`."""
    base = next((k for k in later if "__init__" in k.methods), None)
    call = next((node for node in walk(init.node) if isinstance(node, cst.Call) and _is_super_init(node)), None)
    if call is None:
        return None
    if base is None:
        return {}
    result = ctx.evaluator.run_to(init, call, module, bindings)
    if not result.reached or result.args is None:
        return {}
    return _bind(ctx, base, *result.args, module)


def _is_super_init(call: cst.Call) -> bool:
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value == "__init__"
        and isinstance(func.value, cst.Call)
        and isinstance(func.value.func, cst.Name)
        and func.value.func.value == "super"
    )


def _keyword(call: cst.Call, name: str) -> cst.Arg | None:
    return next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def _read(
    ctx: SideContext, klass: ClassInfo, init: FunctionInfo, call: cst.Call, module: Val, bindings: dict[str, Val]
) -> _Use:
    """The quantization config handed to `call`, run to with the module's arguments; helpers the
    value comes from are followed into their modules until it says where it is made from."""
    assert ctx.index is not None
    arg = _keyword(call, "quant_config")
    assert arg is not None
    call_step = init.module.step(call, init.node, f"{klass.name} hands it a quantization config")
    made = _assignment(init, arg.value) or arg.value
    step = init.module.step(made, init.node, "the quantization config the draft is built with")
    result = ctx.evaluator.run_to(init, call, module, bindings)
    value = result.args[1].get("quant_config") if result.reached and result.args is not None else None
    for _ in range(_FOLLOWED):
        if value is None or _source(value) is not None:
            break
        value = _follow(ctx, value)
    source = _source(value) if value is not None else None
    shown = init.module.code(step.location.line, step.location.end_line).strip()
    shown = shown.split("=", 1)[1].strip() if made is not arg.value and "=" in shown else shown
    return _Use(klass.name, source, shown if source is not None else f"{shown}: {value!r}", step, call_step)


def _assignment(init: FunctionInfo, expression: cst.BaseExpression) -> cst.CSTNode | None:
    """The statement of `init` that assigns the name handed (`quant_config = vllm_config.quant_config`)."""
    if not isinstance(expression, cst.Name):
        return None
    found = None
    for node in walk(init.node):
        if isinstance(node, cst.Assign) and any(
            isinstance(target.target, cst.Name) and target.target.value == expression.value for target in node.targets
        ):
            found = found or node
    return found


def _source(value: Val) -> _Source | None:
    """Where a quantization config is made from, or None: not said."""
    if value.v is None:
        return _Source.NONE
    if not isinstance(value.v, Opaque):
        return None
    if value.v.origin == LOADER:
        return _Source.LOADER
    if _from_draft(value.v):
        return _Source.DRAFT
    if value.v.origin.endswith(".quant_config") and value.v.reason == "attribute of an unknown object":
        return _Source.VERIFIER
    return None


def _from_draft(opaque: Opaque, depth: int = 0) -> bool:
    """Whether an unknown value is the draft's model config, an attribute of it, or made from it."""
    if depth > 4:
        return False
    names = {opaque.hint, *opaque.origin.split(".")}
    if names & DRAFT_MODEL_CONFIGS:
        return True
    inner = [arg.v for arg in opaque.call_args() if isinstance(arg.v, Opaque)]
    return any(_from_draft(arg, depth + 1) for arg in inner)


def _follow(ctx: SideContext, value: Val) -> Val | None:
    """The result of a module-level helper the value came from, evaluated with the arguments it
    was handed (`...utils.get_draft_quant_config(vllm_config)`), when the helper is in the tree."""
    assert ctx.index is not None
    opaque = value.v
    if not isinstance(opaque, Opaque) or "not analyzed" not in opaque.reason or "." not in opaque.origin:
        return None
    dotted, name = opaque.origin.rsplit(".", 1)
    relpath = ctx.index.resolve(dotted)
    if relpath is None:
        return None
    helper = ctx.index.load(relpath)  # read, not allowed: what other analyzers resolve stays as it was
    function = helper.functions.get(name) if helper is not None else None
    if function is None:
        return None
    return ctx.evaluator.call(Val(FuncRef(function)), list(opaque.args), dict(opaque.kwargs))


def _quant_method(config: ConfigFile) -> tuple[str | None, Step | None]:
    found, value = config.lookup(("quantization_config",))
    if not found or not isinstance(value, dict):
        return None, None
    method = str(value.get("quant_method") or "quantized")
    return method, config.step(("quantization_config",), f"quantization_config: {method}")


def _target_quantization(ctx: SideContext) -> _Quantization:
    method, step = _quant_method(ctx.target.config)
    setting = ctx.settings.get("quantization") if ctx.settings is not None else None
    if setting is not None and setting.value:
        return _Quantization(str(setting.value), "", f"the launch's {setting.flag}", (setting.step,))
    if method is not None and step is not None:
        return _Quantization(method, "", "the target config's quantization_config", (step,))
    return _Quantization(None, "", "", ())


def _draft_quantization(ctx: SideContext) -> _Quantization | None:
    """What the draft is: quantized as its config declares, or as its checkpoint's tensors show."""
    assert ctx.draft is not None
    config = ctx.declared_draft.config
    method, step = _quant_method(config)
    weights = ctx.draft.weights
    if weights is None or not weights.tensors:
        return None
    marked = sorted(name for name, tensor in weights.tensors.items() if quantized_exports().marks(name, tensor.dtype))
    if method is not None and step is not None:
        return _Quantization(method, f"quantized ({method}, its config's quantization_config)", "", (step,))
    if marked:
        tensor = weights.tensors[marked[0]]
        return _Quantization(
            "quantized",
            f"quantized (its checkpoint holds {len(marked)} tensors a quantized export writes: {marked[0]}, "
            f"{tensor.dtype}, ...)",
            "",
            (weights.step(marked[0]),),
        )
    missing = config.location(())
    absent = Step(
        Location(missing.input, missing.path, missing.line, missing.line),
        "no quantization_config",
        kind=StepKind.CONFIG_MISSING,
    )
    listing = weights.listing(f"none a quantized export writes ({_dtypes(weights.tensors)})")
    return _Quantization(
        None,
        f"not quantized (its config has no quantization_config, and its checkpoint holds {len(weights.tensors)} "
        "tensors, none a quantized export writes)",
        "",
        (absent, listing),
    )


def _dtypes(tensors) -> str:
    kinds = sorted({tensor.dtype for tensor in tensors.values()})
    return "dtypes " + ", ".join(kinds)


@dataclass(frozen=True)
class _LoaderQuantization:
    """Where the engine's model loader takes the draft's quantization method from (SGLang)."""

    dest: str  # the launch setting the draft's model config takes it from
    step: Step  # where (the engine's model config, built for the draft)
    copied: Step | None  # where the engine copies --quantization into it when it is not given
    own_wins: Step | None  # where a draft checkpoint's own quantization method wins over it


def _loader_quantization(ctx: SideContext) -> _LoaderQuantization | None:
    """The launch setting the engine's model config takes the draft's quantization from
    (`quantization=server_args.speculative_draft_model_quantization if is_draft_model else ...`),
    where the engine copies `--quantization` into it, and where the draft's own method wins."""
    assert ctx.index is not None
    needle = "def from_server_args("
    for relpath in ctx.tree.grep([needle])[needle]:
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if function.name != "from_server_args" or "quantization" not in function.text:
                continue
            read = _draft_setting(function)
            if read is None:
                continue
            dest, node = read
            step = module.step(node, function.node, f"the draft's model config takes its quantization from {dest}")
            copied = _copied(ctx, dest) if dest != "quantization" else None
            return _LoaderQuantization(dest, step, copied, _own_wins(module))
    return None


def _draft_setting(function: FunctionInfo) -> tuple[str, cst.CSTNode] | None:
    """The launch setting the `quantization=` handed to the model config reads for a draft."""
    for node in walk(function.node):
        if not isinstance(node, cst.Call):
            continue
        arg = _keyword(node, "quantization")
        if arg is None:
            continue
        shown: cst.CSTNode = arg
        value = arg.value
        made = _assignment(function, value)
        if isinstance(made, cst.Assign):
            shown, value = made, made.value
        if isinstance(value, cst.IfExp) and "is_draft_model" in names_in(value.test):
            value = value.body
        if isinstance(value, cst.Attribute):
            return value.attr.value, shown
    return None


def _copied(ctx: SideContext, dest: str) -> Step | None:
    """Where the engine sets `dest` from `--quantization` (`self.<dest> = self.quantization`, or
    `replace(cfg, <dest>=cfg.quantization)`)."""
    pattern = re.compile(rf"\b{re.escape(dest)}\s*=\s*\w+\.quantization\b")
    for relpath in ctx.tree.grep([dest])[dest]:
        text = ctx.tree.read(relpath)
        found = pattern.search(text) if text is not None else None  # None: a file not read (too large)
        if text is not None and found is not None:
            line = text.count("\n", 0, found.start()) + 1
            code = text.splitlines()[line - 1].strip()
            location = Location(ctx.tree.input, relpath, line, line)
            return Step(location, f"{dest} is --quantization when not given", code, StepKind.ASSIGN)
    return None


def _own_wins(module) -> Step | None:
    """The branch of the model config's check of the quantization method where a draft takes the
    method its checkpoint declares (`elif self.is_draft_model: ... self.quantization = quant_method`)."""
    for function in module.all_functions:
        if "is_draft_model" not in function.text or "quant_method" not in function.text:
            continue
        for node in walk(function.node):
            if (
                isinstance(node, cst.If)
                and "is_draft_model" in names_in(node.test)
                and contains(node.body, _TAKES_QUANT_METHOD)
            ):
                return module.step(node.test, function.node, "a draft takes the method its checkpoint declares")
    return None


def _quantizes_on_load(ctx: SideContext, method: str) -> tuple[bool, Step] | None:
    """Whether the engine's config class for `method` quantizes an unquantized checkpoint on load
    (its `get_config_filenames()` returns no file to read settings from) or needs the checkpoint's
    own quantization config (a file the loader fails without); None where it was not read."""
    assert ctx.index is not None
    needle = f'"{method}": '
    for relpath in ctx.tree.grep([needle])[needle]:
        text = ctx.tree.read(relpath)
        found = re.search(rf'"{re.escape(method)}":\s*(\w+Config)\b', text) if text is not None else None
        cls = ctx.find_class(found[1]) if found is not None else None
        if cls is None:
            continue
        for klass in ctx.evaluator.mro(cls):
            named = klass.methods.get("get_config_filenames")
            returned = (
                next((node.value for node in walk(named.node) if isinstance(node, cst.Return)), None)
                if named is not None
                else None
            )
            if isinstance(returned, cst.List) and named is not None:
                step = klass.module.step(returned, named.node, f"{klass.name} reads its settings from these files")
                return not returned.elements, step
            if named is not None:
                return None
    return None
