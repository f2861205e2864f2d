"""Whether the draft's checkpoint holds weights for every layer the serving engine builds from its config."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import libcst as cst

from rca.sdk import Analyzer, Compares, ConfigEdit, Example, Fact, Finding, Reports, SideContext, Step, StepKind
from rca.sdk.code import ClassInfo, guarded_statements, inherited_method, walk
from rca.sdk.examples import SMALL_TARGET
from rca.sdk.inputs import ConfigFile
from rca.sdk.values import MutList, ObjRef, Opaque, Val

_LAYERED_DRAFT = """
import torch
from torch import nn


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size)


class DraftModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.hidden_size * 3, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.num_hidden_layers)])


class DraftForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None):
        super().__init__()
        self.model = DraftModel(config)

    def load_weights(self, weights):
        params_dict = dict(self.named_parameters())
        for name, loaded_weight in weights:
            {rename}
            params_dict["model." + name].copy_(loaded_weight)
"""
_RENAMING = 'name = name.replace("midlayer.", "layers.0.")'
_DRAFT = {"architectures": ["DraftForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2}
_LAYER = ("input_layernorm.weight", "self_attn.q_proj.weight")


def _layer(prefix: str) -> dict:
    return {f"{prefix}.{name}": ("F16", (64,) if "norm" in name else (64, 64), None) for name in _LAYER}


# Parts of a decoder layer's parameter names: a tensor named so, whose layer the engine's renaming
# does not tell, leaves which layers the checkpoint fills unknown.
_LAYER_PARTS = re.compile(r"midlayer|self_attn\.|mlp\.|layernorm")
# `... for i in range(config.num_hidden_layers)`, `range(getattr(self.config, "num_hidden_layers"))`
_COUNTED = re.compile(
    r"\bfor\s+\w+\s+in\s+range\(\s*(?:[\w.]*\bconfig\.(\w+)|getattr\(\s*[\w.]*\bconfig\s*,\s*[\"'](\w+)[\"'])"
)
_MODULE_LIST = re.compile(r"^self\.(\w+)\s*(?::[^=]*)?=\s*(?:[\w.]+\.)?ModuleList\(")
_MAPPERS = ("orig_to_new_substr", "orig_to_new_prefix")  # vLLM's WeightsMapper: substrings, prefixes


class DraftModules(Analyzer):
    """Reads how many decoder layers the serving engine builds for the draft, against the layers its checkpoint fills.

    ## What it reads
    The class named by the draft config's `architectures`, constructed with that config (and its
    `model`): each `nn.ModuleList` its `__init__` builds with a comprehension over
    `range(config.<key>)` (`num_hidden_layers`), and how many modules the evaluation built. Then the
    renamings its loader applies to checkpoint names (`name.replace("midlayer.", "layers.0.")`, a
    `{"midlayer": "layers.0"}` map the loader replaces with, vLLM's
    `WeightsMapper(orig_to_new_substr=...)`) and, from the checkpoint's safetensors headers, which
    layer indices its tensor names fill once renamed. Where the count is not read from a config key,
    where the checkpoint names no layer the loader maps (a stand-in, or another naming), or names one
    outside the built range, or where the draft's `load_weights` returns what it loaded (an engine
    may then refuse a checkpoint that leaves parameters unloaded: a load that fails, not a silent
    one), it says so in a note and reports nothing.

    ## Why it matters
    An engine takes the config at face value: a draft config declaring two layers whose checkpoint
    holds the weights of one builds the second with its initial weights, and its loader skips what
    the checkpoint lacks without an error. The draft runs its hidden states through an untrained
    layer and almost nothing is accepted (an MTP module declared but never exported: 0% acceptance).
    """

    code = "RCA-D107"
    name = "draft-modules"
    formerly = ("RCA-S116",)
    sides = frozenset({"serving"})
    compares = Compares(
        training="the decoder layers the draft's checkpoint holds weights for",
        serving="the layers the engine builds from the draft config's count",
    )
    reports = (Reports("draft-layers-unfilled", hypothesis="weights-missing"),)
    INVALID = (
        Example(
            files={"draft.py": _LAYERED_DRAFT.format(rename=_RENAMING)},
            target=SMALL_TARGET,
            draft=_DRAFT,
            weights={"fc.weight": ("F16", (64, 192), None), **_layer("midlayer")},
            finding="draft-layers-unfilled",
            path="draft.json",
            key=("num_hidden_layers",),
            message=(
                "the draft config declares num_hidden_layers 2, and DraftModel builds 2 layers from it (layers.0 to "
                "layers.1), but the draft's checkpoint holds weights for layer 0 only: layer 1 is served with the "
                "weights it was initialized with"
            ),
            why="a one-layer draft whose config says two: the second layer is built and never loaded",
        ),
    )
    VALID = (
        Example(
            files={"draft.py": _LAYERED_DRAFT.format(rename=_RENAMING)},
            target=SMALL_TARGET,
            draft={**_DRAFT, "num_hidden_layers": 1},
            weights={"fc.weight": ("F16", (64, 192), None), **_layer("midlayer")},
            why="one layer declared, one layer's weights (midlayer, which the loader reads as layers.0)",
        ),
        Example(
            files={"draft.py": _LAYERED_DRAFT.format(rename=_RENAMING)},
            target=SMALL_TARGET,
            draft=_DRAFT,
            weights={"fc.weight": ("F16", (64, 192), None), **_layer("layers.0"), **_layer("layers.1")},
            why="two layers declared, both layers' weights",
        ),
        Example(
            files={"draft.py": _LAYERED_DRAFT.format(rename=_RENAMING) + "        return set(params_dict)\n"},
            target=SMALL_TARGET,
            draft=_DRAFT,
            weights={"fc.weight": ("F16", (64, 192), None), **_layer("midlayer")},
            why="a loader that returns what it loaded, which an engine may check: a load that fails, not a silent one",
        ),
        Example(
            files={"draft.py": _LAYERED_DRAFT.format(rename="pass")},
            target=SMALL_TARGET,
            draft=_DRAFT,
            weights={"fc.weight": ("F16", (64, 192), None), **_layer("midlayer")},
            why="a loader whose renaming is not read: which layer midlayer fills is unknown, so nothing is said",
        ),
        Example(
            files={"draft.py": _LAYERED_DRAFT.format(rename=_RENAMING)},
            target=SMALL_TARGET,
            draft=_DRAFT,
            weights={"fc.weight": ("F16", (64, 192), None), "lm_head.weight": ("F16", (32, 64), None)},
            why="a checkpoint naming no layer at all (a stand-in, or a naming the loader does not map): nothing said",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return (
            ctx.draft is not None
            and bool(ctx.draft.architectures)
            and ctx.draft.weights is not None
            and bool(ctx.draft.weights.tensors)
        )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None and ctx.draft.weights is not None
        built = ctx.draft_model()
        if built is None:
            ctx.note(f"which layers the draft's checkpoint fills was not checked: no draft class in {ctx.tree.label}")
            return
        lists = _counted_lists(ctx, built[1])
        if not lists:
            ctx.note(
                f"which layers the draft's checkpoint fills was not checked: {built[0].name} builds no module list "
                "counted from its config"
            )
            return
        checked = _loader_returns(ctx, built[0])
        if checked is not None:
            ctx.note(
                f"which layers the draft's checkpoint fills was not checked: {built[0].name}.load_weights returns what "
                f"it loaded ({checked}), which an engine's loader may hold against the parameters built, refusing a "
                "checkpoint that leaves some unloaded rather than serving it"
            )
            return
        renamings = _renamings(ctx, built[1])
        for modules in lists:
            yield from self._check(ctx, modules, renamings)

    def _check(self, ctx: SideContext, modules: _Counted, renamings: list[_Renaming]) -> Iterator[Finding]:
        assert ctx.draft is not None and ctx.draft.weights is not None
        weights = ctx.draft.weights
        index = re.compile(rf"(?:^|\.){re.escape(modules.attribute)}\.(\d+)\.")
        filled: dict[int, list[str]] = {}
        used: list[_Renaming] = []
        unplaced: list[str] = []
        for name in sorted(weights.tensors):
            renamed, applied = _renamed(name, renamings)
            found = index.search(renamed)
            if found is not None:
                filled.setdefault(int(found[1]), []).append(name)
                used += [renaming for renaming in applied if renaming not in used]
            elif _LAYER_PARTS.search(renamed):
                unplaced.append(name)
        what = f"which of the {modules.count} built in {modules.owner}.{modules.attribute} the draft's checkpoint fills"
        if unplaced:
            ctx.note(
                f"{what} was not checked: {len(unplaced)} tensors ({unplaced[0]}, ...) name a layer the loader's "
                "renaming, as read, does not place"
            )
            return
        if not filled:
            ctx.note(f"{what} was not checked: no tensor is named {modules.attribute}.N, as the loader reads names")
            return
        outside = sorted(i for i in filled if i >= modules.count)
        if outside:
            ctx.note(
                f"{what} was not checked: the checkpoint names {modules.attribute}.{outside[0]}, outside the "
                f"{modules.count} built"
            )
            return
        missing = [i for i in range(modules.count) if i not in filled]
        if not missing:
            return
        declared = _declared_key(ctx, modules.key, modules.count)
        if declared is None:
            ctx.note(
                f"{modules.owner} builds {modules.count} in {modules.attribute} from {modules.key}, and the checkpoint "
                f"fills {_layers(sorted(filled))} only, but where the draft config declares {modules.key} was not "
                "found: no finding"
            )
            return
        keypath, config = declared
        held = sorted(filled)
        key_step = config.step(keypath, f"{'.'.join(keypath)} {modules.count}: {modules.count} {modules.attribute}")
        listing = weights.listing(
            f"{_layers(held)} filled ({sum(len(names) for names in filled.values())} tensors named "
            f"{modules.attribute}.N, as the loader reads them), none for {_layers(missing)}"
        )
        edit = held == list(range(len(held))) and _builds(ctx, modules, keypath, len(held))
        fix = (
            f"set {'.'.join(keypath)} to {len(held)} in the draft config ({key_step.location}), the layers its "
            f"checkpoint holds, or export the weights of {_layers(missing)} the draft was trained with"
            if edit
            else f"export the weights of {_layers(missing)} the draft was trained with, or declare in "
            f"{'.'.join(keypath)} the layers its checkpoint holds"
        )
        yield self.finding(
            ctx,
            "draft-layers-unfilled",
            f"the draft config declares {'.'.join(keypath)} {modules.count}, and {modules.owner} builds "
            f"{modules.count} {modules.attribute} from it ({modules.attribute}.0 to "
            f"{modules.attribute}.{modules.count - 1}), but the draft's checkpoint holds weights for "
            f"{_layers(held)} only: {_layers(missing)} {'is' if len(missing) == 1 else 'are'} served with the weights "
            f"{'it was' if len(missing) == 1 else 'they were'} initialized with",
            key_step.location,
            likelihood_ratio=10.0,
            steps=(key_step, listing, modules.step, *(renaming.step for renaming in used)),
            fix=fix,
            edit=ConfigEdit(keypath, len(held)) if edit else None,
        )


@dataclass(frozen=True)
class _Counted:
    """A module list the draft class builds with one module per step of `range(config.<key>)`."""

    owner: str  # the class that builds it
    attribute: str  # the field it is stored in (`layers`)
    key: str  # the config key it is counted from
    count: int  # how many modules the evaluation built
    step: Step  # the statement that builds it


@dataclass(frozen=True)
class _Renaming:
    """A rename the draft's loader applies to checkpoint names (`midlayer.` -> `layers.0.`)."""

    old: str
    new: str
    prefix: bool  # only at the start of the name (vLLM's orig_to_new_prefix)
    step: Step


def _holders(ctx: SideContext, draft: Val) -> list[ObjRef]:
    """The draft module and its `model`, where the layers live."""
    inner = ctx.evaluator.field(draft, "model")
    return [holder.v for holder in (draft, inner) if isinstance(holder.v, ObjRef)]


def _counted_lists(ctx: SideContext, draft: Val) -> list[_Counted]:
    """The module lists the draft module (or its `model`) builds counted from a config key, with
    the number the evaluation built."""
    found: list[_Counted] = []
    for holder in _holders(ctx, draft):
        seen: set[str] = set()
        for klass in ctx.evaluator.mro(holder.cls):
            init = klass.methods.get("__init__")
            if init is None:
                continue
            for node, text, _ in guarded_statements(init):
                built, counted = _MODULE_LIST.match(text), _COUNTED.search(text)
                if built is None or counted is None or built[1] in seen:
                    continue
                seen.add(built[1])  # a subclass's assignment is the one that runs
                value = ctx.evaluator.field(Val(holder), built[1])
                items = _built_items(value)
                if items is None:
                    ctx.note(f"how many {built[1]} {klass.name} builds was not read ({init.module.relpath})")
                    continue
                step = init.module.step(node, init.node, f"{klass.name} builds {items} {built[1]} from the config")
                found.append(
                    _Counted(klass.name, built[1], counted[1] or counted[2], items, replace(step, kind=StepKind.CALL))
                )
    return found


def _built_items(value: Val) -> int | None:
    """How many modules an evaluated `nn.ModuleList([...])` holds."""
    if not isinstance(value.v, Opaque) or not value.v.origin.endswith("ModuleList"):
        return None
    lists = [arg.v for arg in value.v.call_args() if isinstance(arg.v, MutList)]
    return len(lists[0].items) if len(lists) == 1 else None


def _renamings(ctx: SideContext, draft: Val) -> list[_Renaming]:
    """The renamings the draft's loaders apply to checkpoint names: constant `.replace(a, b)` calls
    in the `load_weights` each module runs, a map of constant names it replaces with, and the
    `orig_to_new_*` maps of a weights mapper its classes define."""
    found: list[_Renaming] = []
    for holder in _holders(ctx, draft):
        load = inherited_method(ctx, holder.cls, "load_weights")
        if load is not None:
            replaces = ".replace(" in load.text
            for node in walk(load.node):
                if isinstance(node, cst.Call) and _is_replace(node):
                    old, new = (_string(arg.value) for arg in node.args)
                    if old and new is not None:
                        found.append(_Renaming(old, new, False, load.module.step(node, load.node, "renamed")))
                elif isinstance(node, cst.Dict) and replaces:
                    found += _pairs(node, False, lambda n, load=load: load.module.step(n, load.node, "renamed"))
        for klass in ctx.evaluator.mro(holder.cls):
            for expression in klass.attributes.values():
                for node in walk(expression):
                    if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in _MAPPERS:
                        if isinstance(node.value, cst.Dict):
                            prefix = node.keyword.value.endswith("prefix")
                            found += _pairs(
                                node.value, prefix, lambda n, klass=klass: klass.module.step(n, klass.node, "renamed")
                            )
    unique: dict[tuple[str, str, bool], _Renaming] = {}
    for renaming in found:
        unique.setdefault((renaming.old, renaming.new, renaming.prefix), renaming)
    return [
        replace(renaming, step=replace(renaming.step, note=f"the loader reads {renaming.old} as {renaming.new}"))
        for renaming in unique.values()
    ]


def _loader_returns(ctx: SideContext, cls: ClassInfo) -> str | None:
    """Where the draft class's `load_weights` returns a value (the names it loaded), if it does:
    an engine may then check every parameter was loaded, and fail loudly instead."""
    load = inherited_method(ctx, cls, "load_weights")
    if load is None:
        return None
    nested = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
    for node in walk(load.node.body, lambda n: not isinstance(n, nested)):
        if isinstance(node, cst.Return) and node.value is not None and not _is_none(node.value):
            return str(load.module.location(node, load.node))
    return None


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _is_replace(node: cst.Call) -> bool:
    return (
        isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "replace"
        and len(node.args) == 2
        and all(_string(arg.value) is not None for arg in node.args)
    )


def _pairs(node: cst.Dict, prefix: bool, step) -> list[_Renaming]:
    """The constant name -> name entries of a dict literal."""
    pairs = []
    for element in node.elements:
        if isinstance(element, cst.DictElement):
            old, new = _string(element.key), _string(element.value)
            if old and new is not None:
                pairs.append(_Renaming(old, new, prefix, step(element)))
    return pairs


def _string(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _renamed(name: str, renamings: list[_Renaming]) -> tuple[str, list[_Renaming]]:
    applied = []
    for renaming in renamings:
        if renaming.prefix and name.startswith(renaming.old):
            name = renaming.new + name[len(renaming.old) :]
        elif not renaming.prefix and renaming.old in name:
            name = name.replace(renaming.old, renaming.new)
        else:
            continue
        applied.append(renaming)
    return name, applied


def _declared_key(ctx: SideContext, key: str, count: int) -> tuple[tuple[str, ...], ConfigFile] | None:
    """Where the draft config as the user has it declares `key` with the value the engine built
    from: at its top level, or in a block an engine's conversion reads it from."""
    config = ctx.declared_draft
    data = config.config.data
    if data.get(key) == count and not isinstance(data.get(key), bool):
        return (key,), config.config
    nested = [(block, key) for block, value in data.items() if isinstance(value, dict) and value.get(key) == count]
    return (nested[0], config.config) if len(nested) == 1 and ctx.conversion is not None else None


def _builds(ctx: SideContext, modules: _Counted, keypath: tuple[str, ...], count: int) -> bool:
    """Whether the draft class, built again with the key set to `count`, builds that many modules
    (the fix, checked against the engine's code; a converted config is not built again)."""
    assert ctx.draft is not None
    if ctx.conversion is not None or keypath != (modules.key,):
        return False
    trial = ctx.trial(keypath, count)
    built = trial.draft_model()
    rebuilt = _counted_lists(trial, built[1]) if built is not None else []
    return any(m.attribute == modules.attribute and m.count == count for m in rebuilt)


def _layers(indices: list[int]) -> str:
    """`layer 1`, `layers 1, 2`."""
    return ("layer " if len(indices) == 1 else "layers ") + _indices(indices)


def _indices(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)
