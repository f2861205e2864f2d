"""An engine's config builders, read from its code: classes with a `condition(hf_config)` that picks
the model family and a `build(hf_config, ..., is_draft_model=..., spec_method=...)` that adapts the
model's config.json before the model is built (lmdeploy's `pytorch/configurations/`). What a
builder assigns on the config (the layers the target captures for an EAGLE-3 draft, the draft's
renamed architecture) is what the model code then reads, whatever the draft declares."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import libcst as cst

from rca.inputs.configs import ConfigFile, DraftConfig
from rca.inputs.sources import SourceTree
from rca.model import Step, StepKind
from rca.static.codeindex import ClassInfo, CodeIndex, FunctionInfo, walk
from rca.static.evaluate.interface import BudgetExceeded
from rca.static.evaluate.interp import Evaluator
from rca.static.evaluate.trace import ConfigStore
from rca.static.evaluate.values import ClassRef, ConfigObj, EvalRaise, MutList, ObjRef, Val, describe
from rca.static.graph import DataflowGraph


class SideContext(Protocol):
    """What the builders read of one side's context (rca.static.context.SideContext, which asks
    them for the draft's served architecture)."""

    tree: SourceTree
    draft: DraftConfig | None
    memo: dict
    graph: DataflowGraph
    index: CodeIndex | None

    @property
    def evaluator(self) -> Evaluator: ...

    def anchor_files(self, anchor: str) -> list[str]: ...

    def config(self, which: str) -> ConfigFile | None: ...


# The speculative method a builder is asked to prepare for: the one rca diagnoses.
SPEC_METHOD = "eagle3"
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
        for binding in module.imports.values():  # what a builder makes its config of (`ModelConfig`)
            imported = ctx.index.resolve(binding.module)
            if imported is not None:
                ctx.index.allow(imported)
        for cls in module.classes.values():
            if "condition" in cls.methods and any("build" in klass.methods for klass in ctx.evaluator.mro(cls)):
                found.append(cls)
    return found


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
    kwargs = {"is_draft_model": Val(which == "draft"), "spec_method": Val(SPEC_METHOD)}
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
    prefixes `Eagle3`), and the assignment that renamed them; the declared names, and None,
    where no builder renames them."""
    assert ctx.draft is not None
    declared = tuple(ctx.draft.architectures)
    if not ctx.anchor_files(_CONDITION) or build_config(ctx, "draft") is None:
        return declared, None
    return _renamed(ctx, ctx.draft.config, declared)


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
            for name in _fields_assigned(ctx, obj.cls):
                try:
                    field = ev.field(value, name)
                except (EvalRaise, BudgetExceeded, RecursionError):
                    continue
                if name == attribute or _mentions(ctx, obj.cls, name, attribute):
                    if describe(field) and not isinstance(field.v, ObjRef):
                        return value, name
                if isinstance(field.v, ObjRef):
                    following.append(field)
        frontier = following
    return None


def _init_methods(ctx: SideContext, cls: ClassInfo) -> list[FunctionInfo]:
    return [klass.methods["__init__"] for klass in ctx.evaluator.mro(cls) if "__init__" in klass.methods]


def _fields_assigned(ctx: SideContext, cls: ClassInfo) -> list[str]:
    """`self.<name> = ...` targets of the constructors, in order."""
    names: list[str] = []
    for init in _init_methods(ctx, cls):
        for node in walk(init.node.body):
            targets = (
                [target.target for target in node.targets]
                if isinstance(node, cst.Assign)
                else [node.target]
                if isinstance(node, cst.AnnAssign)
                else []
            )
            for target in targets:
                if (
                    isinstance(target, cst.Attribute)
                    and isinstance(target.value, cst.Name)
                    and target.value.value == "self"
                    and target.attr.value not in names
                ):
                    names.append(target.attr.value)
    return names


def _mentions(ctx: SideContext, cls: ClassInfo, field: str, attribute: str) -> bool:
    """Whether a constructor assigns `self.<field>` from an expression naming the config field."""
    for init in _init_methods(ctx, cls):
        for node in walk(init.node.body):
            if isinstance(node, (cst.Assign, cst.AnnAssign)) and node.value is not None:
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                if any(isinstance(t, cst.Attribute) and t.attr.value == field for t in targets):
                    if attribute in init.module.tree.code_for_node(node.value):
                        return True
    return False
