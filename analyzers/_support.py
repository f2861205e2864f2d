"""Helpers shared by analyzers: locating calls and functions, turning values into steps."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from rca.inputs.configs import ConfigFile, DraftConfig
from rca.inputs.dumps import read_dump_metadata
from rca.inputs.provenance import draft_families
from rca.model import Location, Step, StepKind, Tap
from rca.static.analyzer import registry
from rca.static.codeindex import ClassInfo, FunctionInfo, ModuleInfo, call_name, children, walk
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.evaluate.values import ConfigObj, MutList, SetVal, Val, describe
from rca.static.facts import CapturedTaps, CaptureSet
from rca.static.graph import NodeKey
from rca.static.wiring import resolve_wiring

IDS_KEY = "eagle_aux_hidden_state_layer_ids"
_HEAD_CALL = re.compile(r"\.lm_head\(")


def calls_named(
    ctx: SideContext, name: str, anchor: str | None = None, outside_definitions: bool = False
) -> Iterator[tuple[FunctionInfo, cst.Call]]:
    """Every call of `name(...)` or `x.name(...)` inside a function of the anchor's files; with
    `outside_definitions`, only in files that do not define `name` themselves (callers of an
    interface, not its implementations), found by a text search before any parsing."""
    assert ctx.index is not None
    files = ctx.anchor_files(anchor or name)
    if outside_definitions:
        defining = set(ctx.tree.grep_in(f"def {name}(", files))
        files = [relpath for relpath in files if relpath not in defining]
    for relpath in files:
        module = ctx.index.load(relpath)
        if module is not None:
            yield from _calls_in_module(module, name)


def _calls_in_module(module: ModuleInfo, name: str) -> Iterator[tuple[FunctionInfo, cst.Call]]:
    """Calls of `name` with the innermost function around each. Only the functions whose text
    mentions `name(` are walked, each without its nested defs (they are walked on their own)."""
    mentioning = module.functions_mentioning(re.compile(rf"\b{re.escape(name)}\s*\("))
    if mentioning is None:
        yield from _calls_in_tree(module, name)
        return
    for function in mentioning:
        for node in walk(
            function.node, into=lambda node, top=function.node: node is top or not isinstance(node, cst.FunctionDef)
        ):
            if isinstance(node, cst.Call) and call_name(node) == name:
                yield function, node


def _calls_in_tree(module: ModuleInfo, name: str) -> Iterator[tuple[FunctionInfo, cst.Call]]:
    """The same, by one walk of the whole module."""
    functions = {id(info.node): info for info in module.all_functions}
    stack: list[tuple[cst.CSTNode, FunctionInfo | None]] = [(module.tree, None)]
    while stack:
        node, function = stack.pop()
        if isinstance(node, cst.FunctionDef):
            function = functions.get(id(node), function)
        elif isinstance(node, cst.Call) and function is not None and call_name(node) == name:
            yield function, node
        stack.extend((child, function) for child in reversed(children(node)))


@dataclass(frozen=True)
class EngineCapture:
    """What an engine's code captures for some ids: the taps in capture order, and its steps."""

    taps: tuple[Tap, ...]
    steps: tuple[Step, ...]


def capture_by_engine(ctx: SideContext, ids: list[int]) -> EngineCapture | None:
    """Read what the training side's engine (`--training-engine`) captures for `ids`: its serving
    analysis, run on a draft config that declares them where any engine reads them."""
    if ctx.engine is None:
        return None
    data = {IDS_KEY: ids, "eagle_config": {IDS_KEY: ids}}
    handed = ConfigFile.from_data("draft", Path("handed-ids.json"), f"the ids handed to {ctx.engine.label}", data)
    engine = SideContext("serving", ctx.engine, ctx.target, DraftConfig(handed))
    wanted = {CaptureSet, CapturedTaps}
    run_side(
        engine, only={analyzer.name for analyzer in registry().for_side("serving") if wanted & set(analyzer.provides)}
    )
    captured = engine.fact(CapturedTaps)
    taps = captured.taps if captured is not None else ()
    if not taps or any(tap is None for tap in taps):
        for note in engine.notes:
            ctx.note(f"{ctx.engine.label}: {note.text}")
        ctx.note(f"what {ctx.engine.label} captures for {ids} could not be read")
        return None
    steps = tuple(step for step in resolve_wiring(engine).steps if step.location.input == ctx.engine.input)
    return EngineCapture(tuple(tap for tap in taps if tap is not None), steps)


def dump_ids(ctx: SideContext) -> Val | None:
    """The layer ids the dump directory records (`--dumps`), as a value citing that record."""
    metadata = read_dump_metadata(ctx.dumps, None) if ctx.dumps is not None else None
    if metadata is None:
        return None
    key = ctx.graph.from_step(StepKind.DUMP, metadata.step)
    ctx.graph.observe(key, str(list(metadata.ids)))
    return Val(MutList([Val(i, frozenset({key})) for i in metadata.ids]), frozenset({key}))


def ints(value: Val) -> list[int] | None:
    """The value as a list of ints, when it is a concrete list, tuple or set of ints."""
    payload = value.v
    if isinstance(payload, MutList):
        items = [item.v for item in payload.items]
    elif isinstance(payload, SetVal):
        items = sorted(payload.items, key=repr)
    else:
        return None
    if all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        return items
    return None


def call_step(
    ctx: SideContext,
    module: ModuleInfo,
    function: FunctionInfo,
    node: cst.CSTNode,
    note: str,
    value: Val | None = None,
    kind: StepKind = StepKind.CALL,
) -> tuple[Step, NodeKey]:
    """Cite `node` as a step of the derivation, as a graph node fed by `value`'s sources."""
    location = module.location(node, function.node)
    key = ctx.graph.node(kind, location, note, module.code(location.line, location.end_line))
    if value is not None:
        ctx.graph.flow(value.src, key)
        ctx.graph.observe(key, describe(value))
    return ctx.graph.step(key), key


def store_location(ctx: SideContext, value: Val, attribute: str) -> Location | None:
    """Where `value` was stored into the field `attribute` (its assignment statement)."""
    for key in value.src:
        if key.kind == StepKind.ASSIGN and key in ctx.graph.g and ctx.graph.g.nodes[key]["note"] == f".{attribute} =":
            return key.location
    return None


def reads_attribute(function: FunctionInfo, attribute: str) -> bool:
    """Whether the function's body reads `<something>.<attribute>` (not only assigns it)."""
    stores: set[int] = set()
    for node in walk(function.node.body):
        if isinstance(node, cst.Assign):
            stores.update(id(target.target) for target in node.targets)
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            stores.add(id(node.target))
        if isinstance(node, cst.Attribute) and node.attr.value == attribute and id(node) not in stores:
            return True
    return False


def has_loop(function: FunctionInfo) -> bool:
    nested = (cst.FunctionDef, cst.ClassDef)
    return any(
        isinstance(node, (cst.For, cst.While))
        for node in walk(function.node.body, lambda node: not isinstance(node, nested))
    )


def inherited_method(ctx: SideContext, cls: ClassInfo, name: str) -> FunctionInfo | None:
    """The method `name` an instance of `cls` runs: its own, else the first base's that defines it."""
    return next((klass.methods[name] for klass in ctx.evaluator.mro(cls) if name in klass.methods), None)


def first_line(
    ctx: SideContext, relpaths: list[str], pattern: re.Pattern[str], note: str, kind: StepKind
) -> Step | None:
    """The first line of the side's files `relpaths` (in that order) that `pattern` matches, cited."""
    for relpath in relpaths:
        for number, line in enumerate((ctx.tree.read(relpath) or "").splitlines(), start=1):
            if pattern.search(line):
                location = Location(ctx.tree.input, relpath, number, number)
                return Step(location, note, line.strip(), kind, ctx.tree.is_patched(relpath))
    return None


def reads_draft(ctx: SideContext, value: Val, *, looked_for: bool = False) -> bool:
    """Whether the value flows from a key of the draft's config (or, with `looked_for`, from a
    lookup of one it lacks)."""
    kinds = (StepKind.CONFIG, StepKind.CONFIG_MISSING) if looked_for else (StepKind.CONFIG,)
    return any(
        node.kind in kinds and node.location.input == "draft"
        for key in value.src
        for node in (ctx.graph.ancestors(key) | {key})
    )


Guards = tuple[tuple[str, bool], ...]  # the tests around a statement, each with the branch taken


def guarded_statements(function: FunctionInfo) -> list[tuple[cst.SimpleStatementLine, str, Guards]]:
    """Every simple statement of `function` (its text on one line) with the `if` tests around it,
    each with the branch it sits in; loops, `with` and `try` bodies are walked through."""
    code = function.module.tree.code_for_node
    statements: list[tuple[cst.SimpleStatementLine, str, Guards]] = []

    def visit(body: cst.CSTNode, guards: Guards) -> None:
        for node in getattr(body, "body", ()):
            if isinstance(node, cst.If):
                branches(node, guards)
            elif isinstance(node, (cst.For, cst.While, cst.With, cst.Try)):
                visit(node.body, guards)
            elif isinstance(node, cst.SimpleStatementLine):
                statements.append((node, " ".join(code(node).split()), guards))  # continued lines as one

    def branches(node: cst.If, guards: Guards) -> None:
        test = " ".join(code(node.test).split())
        visit(node.body, (*guards, (test, True)))
        if isinstance(node.orelse, cst.If):
            branches(node.orelse, (*guards, (test, False)))
        elif node.orelse is not None:
            visit(node.orelse.body, (*guards, (test, False)))

    visit(function.node.body, ())
    return statements


def trainer_draft_module(ctx: SideContext, flag: str | None = None) -> tuple[ClassInfo, Val] | None:
    """A trainer's draft class that its config does not name (speculators' `Eagle3DraftModel`),
    found by what it does, not where it is: a class that builds an `fc` over the target's states
    (its own `self.fc`, or a base's) and whose method computes the head, the one reading `flag` (a
    draft config key) first; built with the draft's config."""
    assert ctx.index is not None and ctx.draft is not None
    named = {value for value in ctx.draft.config.data.values() if isinstance(value, str)}
    named |= set(ctx.draft.architectures) | draft_families(ctx.draft)
    found: list[tuple[bool, bool, str, ClassInfo]] = []
    heads = set(ctx.anchor_files(".lm_head("))
    for relpath in sorted(heads & set(ctx.anchor_files(_BUILDS_FC))):
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        for cls in module.classes.values() if module is not None else ():
            computing = [method for method in cls.methods.values() if _HEAD_CALL.search(method.text)]
            if computing:
                reads = flag is not None and any(flag in method.text for method in computing)
                found.append((not reads, not _named_by(cls, named), relpath, cls))
    if not found:
        return None
    cls = min(found, key=lambda item: item[:3])[3]
    return cls, ctx.evaluator.new_object(cls, [], {"config": Val(ConfigObj(ctx.draft.config))})


_BUILDS_FC = "self.fc = "  # a draft's projection of the target's concatenated states (in its module)


def _named_by(cls: ClassInfo, names: set[str]) -> bool:
    """Whether the draft config names the class: its name, or a registration decorator's key
    (speculators' `@SpeculatorModel.register("eagle3")`, for a config of the EAGLE-3 family)."""
    if cls.name in names:
        return True
    return any(
        isinstance(node, cst.SimpleString) and node.evaluated_value in names
        for decorator in cls.node.decorators
        for node in walk(decorator)
    )


_PIPELINE_SETTINGS = ("pipeline_parallel_size", "pp_size")  # vLLM's --pipeline-parallel-size, SGLang's --pp-size


def pipeline_stages(ctx: SideContext) -> tuple[int, Step] | None:
    """The pipeline stages the launch serves, where it sets more than one, with the setting's line."""
    for dest in _PIPELINE_SETTINGS:
        setting = ctx.settings.get(dest) if ctx.settings is not None else None
        value = setting.value if setting is not None else None
        stages = int(value) if isinstance(value, (int, str)) and str(value).strip().isdigit() else None
        if setting is not None and stages is not None and stages > 1:
            return stages, setting.step
    return None
