"""An engine's config builders, read from its code: classes with a `condition(hf_config)` that picks
the model family and a `build(hf_config, ..., is_draft_model=..., spec_method=...)` that adapts the
model's config.json before the model is built (lmdeploy's `pytorch/configurations/`). What a
builder assigns on the config (the layers the target captures for an EAGLE-3 draft, the draft's
renamed architecture) is what the model code then reads, whatever the draft declares."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Protocol

import libcst as cst

from rca.errors import InputError
from rca.inputs.configs import ConfigFile, DraftConfig
from rca.inputs.jsonpos import JsonDocument, loads
from rca.inputs.launch import LaunchSettings
from rca.inputs.provenance import draft_families
from rca.inputs.sources import SourceTree
from rca.model import Location, Step, StepKind
from rca.static.codeindex import ClassInfo, CodeIndex, FunctionInfo, ModuleInfo
from rca.static.evaluate.interface import BudgetExceeded
from rca.static.evaluate.interp import Evaluator
from rca.static.evaluate.syntax import attribute_stores
from rca.static.evaluate.trace import ConfigStore
from rca.static.evaluate.values import (
    ClassRef,
    ConfigObj,
    EvalRaise,
    FuncRef,
    MutDict,
    MutList,
    ObjRef,
    Val,
    describe,
    python_to_val,
    to_python,
)
from rca.static.graph import DataflowGraph


class SideContext(Protocol):
    """What the builders read of one side's context (rca.static.context.SideContext, which asks
    them for the draft's served architecture)."""

    tree: SourceTree
    draft: DraftConfig | None
    settings: LaunchSettings | None
    memo: dict
    graph: DataflowGraph
    index: CodeIndex | None

    @property
    def evaluator(self) -> Evaluator: ...

    def anchor_files(self, anchor: str) -> list[str]: ...

    def config(self, which: str) -> ConfigFile | None: ...

    def find_class(self, name: str) -> ClassInfo | None: ...


# The speculative method a builder is asked to prepare for when nothing says another: EAGLE-3.
EAGLE3_METHOD = "eagle3"


def spec_method(ctx: SideContext) -> str:
    """The speculative method the engine serves the draft with, as its config builders and config
    classes are asked for it: the launch's (vLLM's `speculative_config.method`, SGLang's and
    lmdeploy's `--speculative-algorithm`), else the draft family its config's layout names
    (knowledge/layouts: `dflash`, whose id is the engines' method name), else EAGLE-3."""
    method = ctx.settings.speculative_method() if ctx.settings is not None else None
    if method is not None:
        return method
    others = sorted(draft_families(ctx.draft) - {EAGLE3_METHOD}) if ctx.draft is not None else []
    return others[0] if others else EAGLE3_METHOD


_CONDITION = "def condition("


@dataclass(frozen=True)
class Built:
    """What the builder picked for one config did to it."""

    builder: ClassInfo
    stores: tuple[ConfigStore, ...]  # the fields it assigned on the config (or a sub-config)
    chosen: Step  # the builder's condition that matched, cited
    raised: str = ""  # the error its build raised, where it did (what it stored before still counts)


def builders(ctx: SideContext) -> list[ClassInfo]:
    """Classes that define a `condition` and can `build` (their own or inherited), in file order."""
    assert ctx.index is not None
    found = []
    for relpath in sorted(ctx.anchor_files(_CONDITION)):
        module = ctx.index.load(relpath)
        if module is None:
            continue
        _allow_imports(ctx, module)  # what a builder makes its config of (`ModelConfig`)
        for cls in module.classes.values():
            if "condition" in cls.methods and any("build" in klass.methods for klass in ctx.evaluator.mro(cls)):
                found.append(cls)
    return found


def _allow_imports(ctx: SideContext, module: ModuleInfo) -> None:
    """Let the evaluation read the modules `module` imports from."""
    assert ctx.index is not None
    for binding in module.imports.values():
        imported = ctx.index.resolve(binding.module)
        if imported is not None:
            ctx.index.allow(imported)


def build_config(ctx: SideContext, which: str) -> Built | None:
    """Run the builder whose condition matches the target's (or the draft's) config, for an
    EAGLE-3 draft, as the engine does before it builds that model. Remembered per side."""
    memo = ("config-builder", which)
    if memo in ctx.memo:
        return ctx.memo[memo]
    file = ctx.config(which)
    ctx.memo[memo] = built = _build(ctx, file, which) if file is not None else None
    return built


def _build(ctx: SideContext, file: ConfigFile, which: str) -> Built | None:
    ev = ctx.evaluator
    config = Val(ConfigObj(file))
    matched: list[tuple[ClassInfo, Val]] = []
    for cls in builders(ctx):
        try:
            with ev.isolated():
                result = ev.call(ev.attribute(Val(ClassRef(cls)), "condition", None, None), [config], {})
        except (EvalRaise, BudgetExceeded, RecursionError):
            continue  # an abstract base's condition raises NotImplementedError
        if result.v is True:
            matched.append((cls, result))
    if not matched:
        return None
    # A fallback builder matches every config; the one whose condition read the config is the one picked.
    matched.sort(key=lambda item: not ctx.graph.derives_from(item[1].src, StepKind.CONFIG))
    cls, result = matched[0]
    condition = cls.methods["condition"]
    whole = cls.module.location(condition.node, condition.node)
    location = replace(whole, end_line=whole.line)
    chosen = Step(
        location,
        f"{cls.name} builds the engine's config for this {which} model",
        cls.module.code(location.line, location.line),
        StepKind.TEST,
        ctx.tree.is_patched(location.path),
    )
    kwargs = {"is_draft_model": Val(which == "draft"), "spec_method": Val(spec_method(ctx))}
    raised = ""
    with ev.trace() as trace:
        try:
            ev.call(ev.attribute(Val(ClassRef(cls)), "build", None, None), [config, Val(None)], kwargs)
        except EvalRaise as error:
            raised = f"{error.kind} at {error.location}: {error.message[:120]}"
        except (BudgetExceeded, RecursionError) as error:
            raised = f"{type(error).__name__}"
    return Built(cls, tuple(trace.config_stores), chosen, raised)


def stored_step(ctx: SideContext, value: Val) -> Step | None:
    """The assignment that stored a value a builder set, cited from the dataflow graph."""
    for key in value.src:
        if key.kind == StepKind.ASSIGN and key in ctx.graph.g:
            return ctx.graph.step(key)
    return None


def served_architectures(ctx: SideContext) -> tuple[tuple[str, ...], Step | None]:
    """The draft's `architectures` as the engine names them once its builder ran (lmdeploy
    prefixes `Eagle3`) or its config class wrapped the draft's config (vLLM's `EAGLEConfig`), and
    the assignment that renamed them; the declared names, and None, where nothing renames them."""
    assert ctx.draft is not None
    declared = tuple(ctx.draft.architectures)
    if ctx.anchor_files(_CONDITION) and build_config(ctx, "draft") is not None:
        return _renamed(ctx, ctx.draft.config, declared)
    memo = ("wrapped-architectures", declared, spec_method(ctx))  # from the declared names and the method alone
    if memo not in ctx.memo:
        ctx.memo[memo] = _wrapped(ctx, ctx.draft.config, declared) or (declared, None)
    return ctx.memo[memo]


# A config class that wraps the draft's config for the speculative method (vLLM's EAGLEConfig
# names its architectures in the constructor's keyword arguments before the base class sets them).
_NAMES_ARCHITECTURES = 'kwargs["architectures"] ='


def _wrapped(ctx: SideContext, file: ConfigFile, declared: tuple[str, ...]) -> tuple[tuple[str, ...], Step] | None:
    """The architectures a config class of the engine names for the draft when it wraps the draft's
    config for the speculative method: a constructor taking `model` and `method` that assigns
    `kwargs["architectures"]`, evaluated with the draft's config and the method it is served with
    (`spec_method`), on the branch that method takes. None where no such class renames the declared names."""
    assert ctx.index is not None
    ev = ctx.evaluator
    method = spec_method(ctx)
    for relpath in sorted(ctx.anchor_files(_NAMES_ARCHITECTURES)):
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for cls in module.classes.values():
            init = cls.methods.get("__init__")
            params = {param.name.value for param in init.node.params.params} if init is not None else set()
            if init is None or not {"model", "method"} <= params:
                continue
            bindings = {"model": Val(ConfigObj(file)), "method": Val(method)}
            self_val = ev.new_object(cls, [], bindings)
            for statement in _taken_statements(ev, init, init.node.body, bindings, self_val):
                code = module.tree.code_for_node(statement)
                if not code.startswith(_NAMES_ARCHITECTURES):
                    continue
                assign = statement.body[0]
                if not isinstance(assign, cst.Assign):
                    continue
                with ev.isolated():
                    value = ev.evaluate(init, assign.value, bindings, self_val)
                names = tuple(str(item.v) for item in value.v.items) if isinstance(value.v, MutList) else ()
                if not names or names == declared or not all(isinstance(item.v, str) for item in value.v.items):
                    return None
                location = module.location(statement, init.node)
                step = Step(
                    location,
                    f"{cls.name} names the draft's architectures {list(names)} for method {method!r}",
                    module.code(location.line, location.end_line),
                    StepKind.ASSIGN,
                    ctx.tree.is_patched(location.path),
                )
                return names, step
    return None


def _taken_statements(
    ev: Evaluator, function: FunctionInfo, body: cst.BaseSuite, bindings: dict[str, Val], self_val: Val
) -> list[cst.SimpleStatementLine]:
    """The simple statements of `body` on the branches its `if` tests take with `bindings` (under a
    test the evaluation cannot decide, neither branch)."""
    taken: list[cst.SimpleStatementLine] = []
    for node in getattr(body, "body", ()):
        if isinstance(node, cst.SimpleStatementLine):
            taken.append(node)
        elif isinstance(node, cst.If):
            branch: cst.If | cst.Else | None = node
            while isinstance(branch, cst.If):
                with ev.isolated():
                    test = ev.evaluate(function, branch.test, bindings, self_val).v
                if test is True:
                    taken += _taken_statements(ev, function, branch.body, bindings, self_val)
                    break
                if test is not False:
                    break  # a test of runtime state (an environment variable): no branch is known to run
                branch = branch.orelse
            else:
                if isinstance(branch, cst.Else):
                    taken += _taken_statements(ev, function, branch.body, bindings, self_val)
    return taken


def _renamed(ctx: SideContext, file: ConfigFile, declared: tuple[str, ...]) -> tuple[tuple[str, ...], Step | None]:
    value = ctx.evaluator.attribute(Val(ConfigObj(file)), "architectures", None, None)
    items = value.v.items if isinstance(value.v, MutList) else []
    names = tuple(item.v for item in items if isinstance(item.v, str))
    if not names or names == declared:
        return declared, None
    return names, next((step for item in items if (step := stored_step(ctx, item)) is not None), None)


def declaration_for(ctx: SideContext, built: str) -> str | None:
    """The architecture a draft config must declare for the engine's builder to make it `built`
    (lmdeploy: `LlamaForCausalLM` for `Eagle3LlamaForCausalLM`), found by running the builders on
    trial configs that declare each tail of the name; None where no builder renames to it."""
    if ctx.draft is None or not ctx.anchor_files(_CONDITION):
        return None
    tails = [built[i:] for i in range(1, len(built)) if built[i].isupper() and built[i - 1].isalnum()]
    for tail in tails:
        trial = ConfigFile.from_data(
            "draft", ctx.draft.config.file, ctx.draft.config.display, {**ctx.draft.config.data, "architectures": [tail]}
        )
        with ctx.evaluator.isolated():
            if _build(ctx, trial, "draft") is not None and _renamed(ctx, trial, (tail,))[0] == (built,):
                return tail
    return None


def holder_of(ctx: SideContext, root: Val, attribute: str, depth: int = 3) -> tuple[Val, str] | None:
    """The object under `root` (the target model, its submodules) whose constructor copies the
    config field `attribute` into a field of its own, and that field's name."""
    ev = ctx.evaluator
    seen: set[int] = set()
    frontier = [root]
    for _ in range(depth + 1):
        following: list[Val] = []
        for value in frontier:
            obj = value.v
            if not isinstance(obj, ObjRef) or obj.id in seen:
                continue
            seen.add(obj.id)
            for name, assigned in _constructor_stores(ctx, obj.cls).items():
                try:
                    field = ev.field(value, name)
                except (EvalRaise, BudgetExceeded, RecursionError):
                    continue
                if name == attribute or any(attribute in code for code in assigned):
                    if describe(field) and not isinstance(field.v, ObjRef):
                        return value, name
                if isinstance(field.v, ObjRef):
                    following.append(field)
        frontier = following
    return None


def _constructor_stores(ctx: SideContext, cls: ClassInfo) -> dict[str, list[str]]:
    """The fields the constructors assign on `self`, in order, each with the code of what it is
    assigned from."""
    stores: dict[str, list[str]] = {}
    for klass in ctx.evaluator.mro(cls):
        init = klass.methods.get("__init__")
        if init is None:
            continue
        for statement, target in attribute_stores(init.node.body):
            if isinstance(target.value, cst.Name) and target.value.value == "self":
                code = init.module.tree.code_for_node(statement.value) if statement.value is not None else ""
                stores.setdefault(target.attr.value, []).append(code)
    return stores


# The parameter name of an engine function that converts a config's raw dict (transformers'
# `PretrainedConfig.get_config_dict` returns the dict under that name).
_CONFIG_DICT = "config_dict"


@dataclass(frozen=True)
class Converted:
    """A draft config in another trainer's format, as the engine's converter turns it into the
    config the draft is built from (vLLM reads speculators' format: no `model_type`, the layer
    config nested under `transformer_layer_config`)."""

    original: DraftConfig  # as the user has it
    draft: DraftConfig  # as the engine builds the draft from it
    converter: str  # the engine's function that converted it
    location: Location  # where that function is defined


def converted_draft(ctx: SideContext) -> Converted | None:
    """The draft config as the engine converts it: when the config has no `model_type` of its own
    and names an architecture the engine does not build, a function of an engine module that names
    one of the config's nested blocks, taking the raw config dict and returning a config with other
    `architectures` (found by evaluating each candidate on the config)."""
    draft = ctx.draft
    if draft is None or "model_type" in draft.config.data or ctx.index is None:
        return None
    data = draft.config.data
    nested = [f'"{key}"' for key, value in data.items() if isinstance(value, dict)]
    hits = ctx.tree.grep(nested) if nested else {}
    if not any(hits.values()) or any(ctx.find_class(name) is not None for name in draft.architectures):
        return None  # no engine module names its blocks, or the engine builds the class it names
    for literal in nested:
        for relpath in sorted(hits.get(literal, ())):
            ctx.index.allow(relpath)
            module = ctx.index.load(relpath)
            if module is None:
                continue
            _allow_imports(ctx, module)  # the registries its converters look formats up in
            for function in module.all_functions:
                params = [param.name.value for param in function.node.params.params]
                if _CONFIG_DICT not in params[:2]:
                    continue
                result = _convert(ctx, function, data)
                if result is None or result.get("architectures") == data.get("architectures"):
                    continue
                where = module.location(function.node, function.node)
                return Converted(
                    draft,
                    DraftConfig(mapped_config(draft.config, result), draft.weights),
                    function.qualname,
                    replace(where, end_line=where.line),
                )
    return None


def _convert(ctx: SideContext, function: FunctionInfo, data: dict) -> dict | None:
    ev = ctx.evaluator
    callee = (
        ev.attribute(Val(ClassRef(function.owner)), function.name, None, None)
        if function.owner is not None
        else Val(FuncRef(function))
    )
    try:
        with ev.isolated():
            result = ev.call(callee, [python_to_val(data, frozenset())])
        converted = to_python(result) if isinstance(result.v, MutDict) else None
    except (EvalRaise, BudgetExceeded, RecursionError, ValueError):
        return None
    return converted if isinstance(converted, dict) and isinstance(converted.get("architectures"), list) else None


def mapped_config(original: ConfigFile, data: dict) -> ConfigFile:
    """The converted config, its keys cited at the lines of the original file they came from (the
    same key, or the same key inside a nested block), so that citations and edits stay in the file
    the user has."""
    laid_out = loads(json.dumps(data, indent=2))
    blocks = [(key,) for key, value in original.data.items() if isinstance(value, dict)]
    root = original.doc.lines.get((), (1, 1))
    lines = {}
    for path in laid_out.lines:
        found = next(
            (
                original.doc.lines[where]
                for where in (path, *(block + path for block in blocks))
                if where in original.doc.lines
            ),
            None,
        )
        if found is not None or not path:
            lines[path] = found or root
    return ConfigFile(original.input, original.file, original.display, JsonDocument(data, lines, original.doc.text))


# The launch setting an engine updates every model config with (SGLang's --json-model-override-args),
# and the statement of its config factory that hands it to the draft's config too.
_OVERRIDES_SETTING = "json_model_override_args"
_HANDS_OVERRIDES = re.compile(r"model_override_args\s*=\s*[\w.()]*\bjson_model_override_args\b")


@dataclass(frozen=True)
class LaunchOverrides:
    """Keys the launch sets on the draft's (and the target's) config before the engine builds them."""

    values: dict
    setting: Step  # the launch line
    handed: Step  # where the engine hands them to the draft's config

    def apply(self, original: ConfigFile) -> ConfigFile:
        data = {**original.data, **self.values}
        return mapped_config(original, data)

    def note(self) -> str:
        keys = ", ".join(sorted(self.values))
        return (
            f"the launch's overrides ({keys}, {self.setting.location}) are applied to the draft's config too: its "
            f"config factory hands them to every model config it builds, the draft's included ({self.handed.location})"
        )


def launch_overrides(tree: SourceTree, settings: LaunchSettings | None) -> LaunchOverrides | None:
    """The launch's config overrides, where the engine's factory of model configs, which also builds
    the draft's (`is_draft_model`), hands them to the configs it builds."""
    setting = settings.get(_OVERRIDES_SETTING) if settings is not None else None
    if setting is None:
        return None
    try:
        values = json.loads(setting.value) if isinstance(setting.value, str) else setting.value
    except json.JSONDecodeError as error:
        raise InputError(
            f"{setting.flag} is not JSON: {error.msg}",
            where=str(setting.step.location),
            fix="write the overrides as a JSON object",
        ) from None
    if not isinstance(values, dict) or not values:
        return None
    for relpath in sorted(tree.grep(["is_draft_model"])["is_draft_model"]):
        text = tree.read(relpath) or ""
        if "json_model_override_args" not in text:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if _HANDS_OVERRIDES.search(line):
                location = Location(tree.input, relpath, number, number)
                handed = Step(
                    location, "hands the launch's overrides to the model config", line.strip(), StepKind.ASSIGN
                )
                return LaunchOverrides(values, setting.step, handed)
    return None
