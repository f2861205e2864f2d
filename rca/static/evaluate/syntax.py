"""Facts about Python syntax the evaluator reads off libcst trees: what a block assigns, whether it
always exits, which call sites name a function, how a name is known. Pure functions of the tree;
those an analysis asks for again and again (every fix trial evaluates the same defs afresh) are
kept per node for the process, as trees never change."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence

import libcst as cst

from rca.static.codeindex import children, dotted_name, walk
from rca.static.parsing import statement_blocks


def block_of(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The statements of a compound statement's (or a def's) body."""
    body = node.body  # type: ignore[attr-defined]
    return list(body.body) if isinstance(body, (cst.IndentedBlock, cst.SimpleStatementSuite)) else list(body)


def name_of(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return ""


def target_names(target: cst.CSTNode) -> Iterator[str]:
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from target_names(target.value)


def assigned_names(statement: cst.CSTNode) -> Iterator[str]:
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            yield from assigned_names(small)
    elif isinstance(statement, cst.Assign):
        for target in statement.targets:
            yield from target_names(target.target)
    elif isinstance(statement, (cst.AnnAssign, cst.AugAssign)):
        yield from target_names(statement.target)
    elif isinstance(statement, cst.For):
        yield from target_names(statement.target)
    elif isinstance(statement, cst.With):
        for item in statement.items:
            if item.asname is not None:
                yield from target_names(item.asname.name)
    elif isinstance(statement, (cst.Import, cst.ImportFrom)):
        if not isinstance(statement.names, cst.ImportStar):
            for alias in statement.names:
                if alias.asname is not None:
                    yield from target_names(alias.asname.name)
                else:
                    dotted = dotted_name(alias.name)
                    if dotted:
                        yield dotted.split(".")[0]
    elif isinstance(statement, cst.FunctionDef):
        yield statement.name.value


def stored_names(statements: Iterable[cst.CSTNode]) -> frozenset[str]:
    """Names and attribute names assigned anywhere in these statements (not in nested defs)."""
    return _stored_names(tuple(statements))


@functools.lru_cache(maxsize=8192)
def _stored_names(statements: tuple[cst.CSTNode, ...]) -> frozenset[str]:
    found: set[str] = set()
    stack: list[cst.CSTNode] = list(statements)
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        targets: list[cst.CSTNode] = []
        if isinstance(node, cst.Assign):
            targets = [target.target for target in node.targets]
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            targets = [node.target]
        for target in targets:
            found.update(target_names(target))
            if isinstance(target, cst.Attribute):
                found.add(target.attr.value)
        stack.extend(children(node))
    return frozenset(found)


@functools.lru_cache(maxsize=2048)
def statement_order(
    function: cst.CSTNode,
) -> tuple[dict[cst.CSTNode, int], dict[str, list[tuple[int, cst.CSTNode]]]]:
    """Source order of a def's statements, and which statements assign each name (read only)."""
    order: dict[cst.CSTNode, int] = {}
    defs: dict[str, list[tuple[int, cst.CSTNode]]] = {}

    def visit(statements: list[cst.CSTNode]) -> None:
        for statement in statements:
            order[statement] = len(order)
            for name in assigned_names(statement):
                defs.setdefault(name, []).append((order[statement], statement))
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    order[small] = order[statement]
            for block in statement_blocks(statement, into_defs=False):
                visit(block)

    visit(block_of(function))
    return order, defs


@functools.lru_cache(maxsize=8192)
def self_stores(function: cst.FunctionDef, name: str) -> tuple[cst.CSTNode, ...]:
    """Statements in `function` that assign `self.<name>` (any nesting, no inner scopes)."""
    params = function.params.params
    if not params:
        return ()
    receiver = params[0].name.value
    found: list[cst.CSTNode] = []

    def targets_self(target: cst.CSTNode) -> bool:
        if isinstance(target, cst.Attribute):
            return isinstance(target.value, cst.Name) and target.value.value == receiver and target.attr.value == name
        if isinstance(target, (cst.Tuple, cst.List)):
            return any(targets_self(element.value) for element in target.elements)
        return False

    def visit(statements: list[cst.CSTNode]) -> None:
        for statement in statements:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, cst.Assign) and any(targets_self(t.target) for t in small.targets):
                        found.append(statement)
                    elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and targets_self(small.target):
                        found.append(statement)
            for block in statement_blocks(statement, into_defs=False):
                visit(block)

    visit(block_of(function))
    return tuple(found)


def is_super_call(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "super"


def super_init_call(function: cst.FunctionDef) -> cst.Call | None:
    """The `super().__init__(...)` (or `Base.__init__(self, ...)`) call in an __init__."""
    for current in walk(function.body, lambda node: not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))):
        if (
            isinstance(current, cst.Call)
            and isinstance(current.func, cst.Attribute)
            and current.func.attr.value == "__init__"
        ):
            return current
    return None


def calls_to(node: cst.CSTNode, name: str) -> Iterator[cst.Call]:
    for current in walk(node):
        if isinstance(current, cst.Call):
            func = current.func
            called = (
                func.value
                if isinstance(func, cst.Name)
                else func.attr.value
                if isinstance(func, cst.Attribute)
                else None
            )
            if called == name:
                yield current


def final_names(expressions: Iterable[cst.BaseExpression]) -> set[str]:
    """The name each expression's value is known by: `a.b.c` -> c, `x[0]` -> x, `f(y)` -> f."""
    names = set()
    for node in expressions:
        while isinstance(node, (cst.Subscript, cst.Call)):
            node = node.value if isinstance(node, cst.Subscript) else node.func
        if isinstance(node, cst.Attribute):
            names.add(node.attr.value)
        elif isinstance(node, cst.Name):
            names.add(node.value)
    return names


def arguments_for(site: cst.Call, function: cst.FunctionDef, parameters: set[str]) -> list[cst.BaseExpression]:
    """The argument expressions at a call site that bind the given parameters of `function`."""
    positional = [param.name.value for param in [*function.params.posonly_params, *function.params.params]]
    if positional and positional[0] in ("self", "cls") and isinstance(site.func, cst.Attribute):
        positional = positional[1:]
    found = []
    index = 0
    for arg in site.args:
        if arg.keyword is not None:
            if arg.keyword.value in parameters:
                found.append(arg.value)
        elif arg.star == "":
            if index < len(positional) and positional[index] in parameters:
                found.append(arg.value)
            index += 1
    return found


def decorators(node: cst.FunctionDef) -> set[str]:
    names = set()
    for decorator in node.decorators:
        expression = decorator.decorator
        dotted = dotted_name(expression.func if isinstance(expression, cst.Call) else expression)
        if dotted:
            names.add(dotted.split(".")[-1])
    return names


def always_exits(statements: Sequence[cst.CSTNode]) -> bool:
    """Whether every path through these statements returns or raises."""
    if not statements:
        return False
    last = statements[-1]
    if isinstance(last, cst.SimpleStatementLine):
        return isinstance(last.body[-1], (cst.Return, cst.Raise))
    if isinstance(last, cst.If):
        if last.orelse is None:
            return False
        orelse = [last.orelse] if isinstance(last.orelse, cst.If) else block_of(last.orelse)
        return always_exits(block_of(last)) and always_exits(orelse)
    return False


def ends_in_raise(statements: list[cst.CSTNode]) -> bool:
    if not statements:
        return False
    last = statements[-1]
    if isinstance(last, cst.SimpleStatementLine):
        return isinstance(last.body[-1], cst.Raise)
    return isinstance(last, cst.Raise)


def returns_false(statements: list[cst.CSTNode]) -> bool:
    """The block ends in `return` of a false constant (`return False`, `return None`, `return`)."""
    last = statements[-1] if statements else None
    if isinstance(last, cst.SimpleStatementLine):
        last = last.body[-1]
    if not isinstance(last, cst.Return):
        return False
    value = last.value
    return (
        value is None
        or (isinstance(value, cst.Name) and value.value in ("False", "None"))
        or (isinstance(value, cst.Integer) and value.value == "0")
    )


def attribute_stores(node: cst.CSTNode) -> Iterator[tuple[cst.Assign | cst.AnnAssign, cst.Attribute]]:
    """Every `<object>.<attribute> = value` (or annotated) under `node`, with its target."""
    for statement in walk(node):
        if isinstance(statement, cst.Assign):
            targets = [target.target for target in statement.targets]
        elif isinstance(statement, cst.AnnAssign) and statement.value is not None:
            targets = [statement.target]
        else:
            continue
        for target in targets:
            if isinstance(target, cst.Attribute):
                yield statement, target
