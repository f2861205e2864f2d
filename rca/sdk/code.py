"""Reading code: the module index (modules, classes, functions, with their cited lines), the calls
and attribute reads analyzers look for, and steps citing them in the side's dataflow graph."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from rca.model import Location, Step, StepKind
from rca.static.codeindex import (
    ClassInfo,
    FunctionInfo,
    ModuleInfo,
    call_name,
    children,
    dotted_name,
    iter_calls,
    module_name,
    walk,
)
from rca.static.context import SideContext
from rca.static.evaluate.flow import CLEAN, Flow, State, Taint
from rca.static.evaluate.interface import BudgetExceeded
from rca.static.evaluate.syntax import attribute_stores
from rca.static.evaluate.values import EvalRaise, MutList, ObjRef, Opaque, Val, describe
from rca.static.graph import NodeKey

__all__ = [
    "CLEAN",
    "ClassInfo",
    "Flow",
    "FunctionInfo",
    "Guards",
    "ModuleInfo",
    "NodeKey",
    "State",
    "Taint",
    "attribute_stores",
    "call_name",
    "call_step",
    "calls_named",
    "children",
    "classes_built_with",
    "code_steps",
    "constructor_kwargs",
    "contains",
    "dotted_name",
    "first_line",
    "guarded_statements",
    "has_loop",
    "inherited_method",
    "iter_calls",
    "module_name",
    "names_in",
    "reads_attribute",
    "store_location",
    "submodules",
    "walk",
]


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
        top = function.node

        def own(node: cst.CSTNode, top: cst.CSTNode = top) -> bool:
            return node is top or not isinstance(node, cst.FunctionDef)

        for node in walk(top, into=own):
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


def names_in(node: cst.CSTNode | list | tuple) -> set[str]:
    """What an expression or statement names: its identifiers (`x`, the `attr` of `a.attr`) and its
    plain string literals (`config["num_hidden_layers"]`), read from the tree, never from its text
    (a comment, or a longer name that merely contains one, names nothing)."""
    found: set[str] = set()
    for top in node if isinstance(node, (list, tuple)) else (node,):
        for current in walk(top):
            if isinstance(current, cst.Name):
                found.add(current.value)
            elif isinstance(current, cst.SimpleString):
                value = current.evaluated_value
                if isinstance(value, str):
                    found.add(value)
    return found


def contains(node: cst.CSTNode | list | tuple, matcher: object) -> bool:
    """Whether a node under `node` matches `matcher`, a `libcst.matchers` pattern (`m.Subscript(...)`)."""
    import libcst.matchers as m

    return any(m.findall(top, matcher) for top in (node if isinstance(node, (list, tuple)) else (node,)))  # type: ignore[arg-type]


_FIELDS = re.compile(r"^\s*self\.(\w+)\s*(?::[^=]*)?=(?!=)", re.MULTILINE)  # fields an __init__ assigns
_DEPTH = 5  # modules followed from a draft class down to its layers' attention


def submodules(ctx: SideContext, model: Val, names: set[str]) -> list[tuple[str, Val, ClassInfo | None]]:
    """The modules of the classes `names` under an evaluated model, in the order its fields and
    lists hold them (a decoder layer's own before the next layer's), each with the class of the
    module that built it: a draft's attention modules, one per decoder layer."""
    found: list[tuple[str, Val, ClassInfo | None]] = []
    _collect(ctx, model, names, found, None, 0, set())
    return found


def _collect(
    ctx: SideContext,
    value: Val,
    names: set[str],
    found: list[tuple[str, Val, ClassInfo | None]],
    layer: ClassInfo | None,
    depth: int,
    seen: set[int],
) -> None:
    payload = value.v
    if depth > _DEPTH or id(payload) in seen:
        return
    seen.add(id(payload))
    if isinstance(payload, Opaque):
        name = payload.origin.rpartition(".")[2] if payload.instance else ""
        if name in names:
            found.append((name, value, layer))
            return
        if payload.origin.endswith("ModuleList"):  # the decoder layers: each item builds its own modules
            for listed in (arg.v for arg in payload.call_args() if isinstance(arg.v, MutList)):
                for item in listed.items:
                    built = item.v.cls if isinstance(item.v, ObjRef) else layer
                    _collect(ctx, item, names, found, built, depth + 1, seen)
        return
    if not isinstance(payload, ObjRef):
        return
    if payload.cls.name in names:
        found.append((payload.cls.name, value, layer))
        return
    fields: list[str] = []
    for klass in ctx.evaluator.mro(payload.cls):
        init = klass.methods.get("__init__")
        if init is not None:
            fields += _FIELDS.findall(init.text)
    for field in dict.fromkeys(fields):
        try:
            child = ctx.evaluator.field(value, field)
        except (EvalRaise, BudgetExceeded, RecursionError):  # a field that cannot be built is not followed
            continue
        _collect(ctx, child, names, found, layer or payload.cls, depth + 1, seen)


def constructor_kwargs(module: Val) -> dict[str, Val] | None:
    """The keyword arguments an evaluated module was built with (None where they are not known)."""
    payload = module.v
    if isinstance(payload, Opaque):
        return payload.kwargs
    if isinstance(payload, ObjRef) and payload.init_args is not None:
        return payload.init_args[1]
    return None


def classes_built_with(ctx: SideContext, *params: str) -> set[str]:
    """The names of the side's classes whose constructor mentions every one of `params` (the first
    is searched for as text: `sliding_window_size: int`), as the engine's attention classes are known
    by the arguments they are built with."""
    assert ctx.index is not None
    names: set[str] = set()
    for relpath in ctx.anchor_files(params[0]):
        module = ctx.index.load(relpath)
        for cls in module.classes.values() if module is not None else ():
            init = cls.methods.get("__init__")
            if init is not None and all(param in init.text for param in params):
                names.add(cls.name)
    return names


def code_steps(ctx: SideContext, value: Val) -> list[Step]:
    """The statements of code a value derives from, in the order they ran (the last made it)."""
    return [step for step in (ctx.graph.step(key) for key in value.src) if step.code]
