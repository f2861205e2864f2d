"""How an engine's model runners decide whether the target returns its auxiliary hidden states for
an EAGLE-3 draft, whether each decision reads the draft's `use_aux_hidden_state`, and which runner
a launch selects (read from the code, never run)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rca.sdk import Location, SideContext, Step, StepKind
from rca.sdk.code import module_name

FLAG = "use_aux_hidden_state"

# -- the runners: how each decides whether the target returns its captured layers ---------------------

_ENV = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")  # an environment variable's name (`VLLM_USE_V2_MODEL_RUNNER`)
_GUARDED = re.compile(r"^(\s*)(?:el)?if\s+(?:not\s+)?self\.(\w+)\s*(?:$|:|\bor\b|\band\b)")
_UNPACKED = re.compile(r"\w\s*,\s*aux_hidden_states\s*=(?!=)")  # the target's output taken apart
_DEPTH = 4  # base classes followed from a class a runner picks to the one that decides
_HOPS = 2  # attributes and functions followed from a runner's assignment to a read of the flag


@dataclass(frozen=True)
class Decision:
    """How one runner class decides, for an EAGLE-3 draft, whether the target returns its captured layers."""

    runner: str  # the class
    relpath: str
    assignment: Step  # its assignment of the capture switch for an EAGLE-3 draft
    reads: tuple[Step, ...]  # the way from that assignment to a read of the flag; () when it reads none
    constant: bool  # the assignment is `True`, under no test that reads the flag

    @property
    def label(self) -> str:
        return f"{self.runner} ({self.relpath})"

    @property
    def verdict(self) -> str | None:
        return "reads" if self.reads else "ignores" if self.constant else None


@dataclass(frozen=True)
class RunnerChoice:
    """Where the engine picks the runner class under a test, and what this launch makes the test."""

    test: Step
    when: dict[bool, tuple[Decision, ...]]  # the runners each value of the test builds
    distance: int  # classes between the deciding runners and those built (a platform's subclasses)
    env: str | None  # the environment variable the test reads
    selected: bool | None  # the test's value with this launch; None when the engine computes it at run time
    why: tuple[Step, ...]  # the setting (or the default) that settles it, and the code carrying it to the test
    written: str | None  # the variable's value as the launch writes it

    def verdict(self, side: bool) -> str | None:
        verdicts = {decision.verdict for decision in self.when[side]}
        return verdicts.pop() if len(verdicts) == 1 else None

    def selects(self, side: bool) -> str:
        """The runners of one side of the test, named by how this launch comes to run them."""
        if self.selected is None:  # unsettled, and both sides decide alike
            both = "; ".join(decision.label for decision in (*self.when[True], *self.when[False]))
            return f"every runner the engine picks between, {both},"
        runners = "; ".join(decision.label for decision in self.when[side])
        if self.env is None:
            return f"the runner the engine runs, {runners},"
        if self.written is not None:
            return f"the runner the launch selects with {self.env}={self.written}, {runners},"
        return f"the runner {self.env} selects when left unset, {runners},"

    @staticmethod
    def spelled(side: bool) -> str:
        """The variable's value that selects one side of the test (the test is the variable's value)."""
        return "1" if side else "0"


def runner_choice(ctx: SideContext) -> RunnerChoice | None:
    """The place the engine picks between runner classes that decide differently whether the target
    returns its captured layers for an EAGLE-3 draft, with the value this launch gives its test."""
    decisions = _Runners(ctx, _switches(ctx))
    if not decisions.pending:
        return None
    choices = sorted(
        (  # where each runner decides for itself: with or without the flag
            choice
            for choice in _choices(ctx, decisions)
            if choice.verdict(True) is not None and choice.verdict(False) is not None
        ),
        key=lambda choice: (
            choice.verdict(True) == choice.verdict(False),  # where the runners differ, which runs matters
            choice.distance,  # the engine's own runners before a platform's subclasses of them
            choice.test.location.path,
            choice.test.location.line,
        ),
    )
    return choices[0] if choices else None


def _switches(ctx: SideContext) -> set[str]:
    """The capture switch: a field a runner tests (`if self.use_aux_hidden_state_outputs:`) before
    taking auxiliary hidden states out of the target's output (`hidden_states, aux_hidden_states =
    model_output`), and that is set to a constant True or False somewhere."""
    tested: set[str] = set()
    for relpath in ctx.anchor_files("aux_hidden_states"):
        lines = (ctx.tree.read(relpath) or "").splitlines()
        for number, line in enumerate(lines):
            match = _GUARDED.match(line)
            if match is None or match[2] in tested:
                continue
            indent, block = len(match[1]), []
            for following in lines[number + 1 : number + 8]:
                if following.strip() and len(following) - len(following.lstrip()) <= indent:
                    break
                block.append(following)
            if _UNPACKED.search("\n".join(line.split("#", 1)[0] for line in block)):  # code, not comments
                tested.add(match[2])
    if not tested:
        return set()
    hits = ctx.tree.grep([f"self.{name} = " for name in sorted(tested)])
    constant = re.compile(rf"self\.({'|'.join(map(re.escape, tested))})\s*=\s*(?:True|False)\b")
    return {
        match[1]
        for relpath in {path for paths in hits.values() for path in paths}
        for match in constant.finditer(ctx.tree.read(relpath) or "")
    }


@dataclass(frozen=True)
class Source:
    """A file read with the standard parser only: runners and workers are read for a few statements,
    and libcst's parse of every model file that sets a capture switch would cost seconds."""

    relpath: str
    name: str  # the dotted module name
    lines: tuple[str, ...]
    patched: bool

    def code(self, line: int, end_line: int | None = None) -> str:
        end_line = end_line or line
        text = " ".join(
            part
            for number in range(line, min(end_line, len(self.lines)) + 1)
            if (part := self.lines[number - 1].strip()) and not part.startswith("#")
        )
        return text if len(text) <= 160 else text[:157] + "..."


def _standard(ctx: SideContext, relpath: str) -> tuple[Source, ast.Module] | None:
    """A file of the serving tree with its standard parser's tree (shared with the code index)."""
    memo = ctx.memo.setdefault("aux-flag:parsed", {})
    if relpath not in memo:
        tree = ctx.standard_tree(relpath)
        lines = tuple((ctx.tree.read(relpath) or "").splitlines())
        source = Source(relpath, module_name(relpath), lines, ctx.tree.is_patched(relpath))
        memo[relpath] = (source, tree) if tree is not None else None
    return memo[relpath]


def _step(ctx: SideContext, module: Source, node: ast.AST, note: str, kind: StepKind) -> Step:
    line = getattr(node, "lineno", 1)
    end = getattr(node, "end_lineno", None) or line
    location = Location(ctx.tree.input, module.relpath, line, end)
    return Step(location, note, module.code(line, end), kind, module.patched)


Guards = tuple[tuple[ast.expr, bool], ...]


def _guarded(body: list[ast.stmt], guards: Guards = ()) -> Iterator[tuple[ast.stmt, Guards]]:
    """The statements of a function body with the tests around each (and the branch taken); nested
    definitions are left out."""
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield statement, guards
        if isinstance(statement, ast.If):
            yield from _guarded(statement.body, (*guards, (statement.test, True)))
            yield from _guarded(statement.orelse, (*guards, (statement.test, False)))
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(statement, field, None)
                if isinstance(block, list):
                    for item in block:
                        if isinstance(item, ast.ExceptHandler):
                            yield from _guarded(item.body, guards)
                    yield from _guarded([item for item in block if isinstance(item, ast.stmt)], guards)


def _stores(statement: ast.stmt, switches: set[str]) -> ast.expr | None:
    """The value `statement` stores into `self.<switch>`, when it does."""
    if isinstance(statement, ast.Assign):
        targets, value = statement.targets, statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        targets, value = [statement.target], statement.value
    else:
        return None
    for target in targets:
        if (
            isinstance(target, ast.Attribute)
            and target.attr in switches
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            return value
    return None


def _names_flag(node: ast.AST) -> bool:
    return any(isinstance(item, ast.Constant) and item.value == FLAG for item in ast.walk(node))


def _for_eagle3(test: ast.expr, taken: bool) -> bool:
    """A test that holds for an EAGLE-3 draft on the branch taken (`method == "eagle3"`)."""
    negated = (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)) or any(
        isinstance(node, ast.Compare) and any(isinstance(op, (ast.NotEq, ast.NotIn)) for op in node.ops)
        for node in ast.walk(test)
    )
    return any("eagle3" in name.lower() for name in _named(test)) and taken != negated


def _named(node: ast.AST) -> Iterator[str]:
    """The identifiers and string constants under `node` (what it names, not its text)."""
    for item in ast.walk(node):
        if isinstance(item, ast.Name):
            yield item.id
        elif isinstance(item, ast.Attribute):
            yield item.attr
        elif isinstance(item, ast.Constant) and isinstance(item.value, str):
            yield item.value


Store = tuple[ast.stmt, ast.expr, Guards]  # an assignment of the switch, its value, the tests around it


class _Runners:
    """The classes that set the switch to something other than False (by relpath and name), each
    decided when a choice between runners builds it: read for an EAGLE-3 draft from its assignments
    under a test for EAGLE-3, else from all of them."""

    def __init__(self, ctx: SideContext, switches: set[str]) -> None:
        self.ctx = ctx
        self.pending: dict[tuple[str, str], tuple[Source, ast.ClassDef, list[Store], list[Store], bool]] = {}
        self.decided: dict[tuple[str, str], Decision] = {}
        self.readable: set[str] = set()  # the modules read for the runners a choice builds
        hits = ctx.tree.grep([f"self.{name}" for name in sorted(switches)]) if switches else {}
        for relpath in sorted({path for paths in hits.values() for path in paths}):
            parsed = _standard(ctx, relpath)
            if parsed is None:
                continue
            module, tree = parsed
            for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
                stores: list[Store] = []
                clears: list[Store] = []  # assignments of False: a test around one may read the flag too
                for method in cls.body:
                    if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        for statement, guards in _guarded(method.body):
                            value = _stores(statement, switches)
                            if value is None:
                                continue
                            off = isinstance(value, ast.Constant) and value.value in (False, None)
                            (clears if off else stores).append((statement, value, guards))
                eagle3 = [store for store in stores if any(_for_eagle3(test, taken) for test, taken in store[2])]
                computed = [store for store in stores if not isinstance(store[1], ast.Constant)]
                if eagle3 or computed:  # a class that decides, not one told to capture (SGLang's models)
                    self.pending[(relpath, cls.name)] = (module, cls, eagle3 or stores, clears, bool(eagle3))
                    self.readable.add(relpath)

    def get(self, key: tuple[str, str]) -> Decision | None:
        if key not in self.decided and key in self.pending:
            module, cls, stores, clears, for_eagle3 = self.pending[key]
            self.decided[key] = _decide(self.ctx, module, cls, stores, clears, for_eagle3)
        return self.decided.get(key)


def _decide(
    ctx: SideContext, module: Source, cls: ast.ClassDef, stores: list[Store], clears: list[Store], for_eagle3: bool
) -> Decision:
    """How a class sets the switch for an EAGLE-3 draft: from a read of the flag (in the value, or a
    test around it or around an assignment of False), or a constant True under its own test for
    EAGLE-3. A class that sets it True without deciding for EAGLE-3 (a model's
    `set_eagle3_layers_to_capture`) is told to by a caller, and one that names the flag anywhere
    may read it in a way not followed here: both are left undecided, never said to ignore it."""
    runner = cls.name
    for statement, value, guards in (*stores, *clears):
        step = _step(ctx, module, statement, "sets whether the target returns its captured layers", StepKind.ASSIGN)
        for test, _ in guards:
            reads = _test_reads(ctx, module, test)
            if reads:
                return Decision(runner, module.relpath, step, reads, False)
        reads = _reads(ctx, module, value, _HOPS) if not isinstance(value, ast.Constant) else ()
        if reads:
            return Decision(runner, module.relpath, step, reads, False)
    constant = (
        for_eagle3
        and all(isinstance(value, ast.Constant) and value.value is True for _, value, _ in stores)
        and not _names_flag(cls)
    )
    statement = stores[0][0]
    step = _step(ctx, module, statement, "sets whether the target returns its captured layers", StepKind.ASSIGN)
    return Decision(runner, module.relpath, step, (), constant)


def _test_reads(ctx: SideContext, module: Source, test: ast.expr) -> tuple[Step, ...]:
    """A test around an assignment of the switch that reads the flag: by name, or through a field or
    a call about auxiliary states (`if self.drafter.eagle3_use_aux_hidden_state:`) followed like a value."""
    if _names_flag(test):
        return (_step(ctx, module, test, f"reads {FLAG}", StepKind.TEST),)
    for node in ast.walk(test):
        name = node.attr if isinstance(node, ast.Attribute) else None
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name is not None and "aux" in name:
            reads = _reads(ctx, module, node, _HOPS)  # type: ignore[arg-type]
            if reads:
                return (_step(ctx, module, test, "tests it", StepKind.TEST), *reads)
    return ()


def _reads(ctx: SideContext, module: Source, value: ast.expr, hops: int) -> tuple[Step, ...]:
    """The steps from `value` to a read of the flag: the value itself, the assignments of the field
    it reads (`self.drafter.eagle3_use_aux_hidden_state`), or the function it calls
    (`requires_aux_hidden_states(...)`), followed `hops` deep."""
    if _names_flag(value):
        return (_step(ctx, module, value, f"reads {FLAG}", StepKind.CONFIG),)
    if hops == 0:
        return ()
    if isinstance(value, ast.Attribute):
        attribute = value.attr
        hits = ctx.tree.grep([f".{attribute} =", f".{attribute}:"])
        for relpath in sorted({path for paths in hits.values() for path in paths}):
            parsed = _standard(ctx, relpath)
            if parsed is None:
                continue
            other, tree = parsed
            for node in ast.walk(tree):
                stored = _stores(node, {attribute}) if isinstance(node, ast.stmt) else None
                if stored is not None:
                    deeper = _reads(ctx, other, stored, hops - 1)
                    if deeper:
                        return (_step(ctx, other, node, f"sets .{attribute}", StepKind.ASSIGN), *deeper)
    elif isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name is None:
            return ()
        defining = ctx.tree.grep([f"def {name}("])[f"def {name}("]
        for relpath in sorted(defining, key=lambda path: path != module.relpath):
            parsed = _standard(ctx, relpath)
            if parsed is None:
                continue
            other, tree = parsed
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                    read = next(
                        (item for item in ast.walk(node) if isinstance(item, ast.Constant) and item.value == FLAG),
                        None,
                    )
                    if read is not None:
                        return (_step(ctx, other, read, f"{name} reads {FLAG}", StepKind.CONFIG),)
                    for returned in (item for item in ast.walk(node) if isinstance(item, ast.Return)):
                        if returned.value is not None:
                            deeper = _reads(ctx, other, returned.value, hops - 1)
                            if deeper:
                                return deeper
    return ()


# -- where the engine picks its runner, and what the launch makes of the test ---------------------------


def _choices(ctx: SideContext, decisions: _Runners) -> Iterator[RunnerChoice]:
    """Tests whose two branches build runner classes (or their subclasses) that decide: `if
    self.use_v2_model_runner: ... GPUModelRunnerV2(...) else: ... GPUModelRunnerV1(...)`, an early
    return included, or `A if test else B`. Looked for in the files that import a deciding module."""
    assert ctx.index is not None
    modules = sorted({module_name(relpath) for relpath in decisions.readable})
    hits = ctx.tree.grep(modules)
    importers = sorted({path for paths in hits.values() for path in paths})
    decisions.readable.update(importers)
    for relpath in importers:
        parsed = _standard(ctx, relpath)
        if parsed is None:
            continue
        module, tree = parsed
        top = _bindings(module, tree.body, classes=True)
        for cls, function in _functions(tree):
            bound = {**top}
            for name, targets in _bindings(module, list(ast.walk(function))).items():
                bound[name] = bound.get(name, []) + targets
            for test, yes, no in _branches(function.body):
                (held, near), (failed, far) = _built(ctx, decisions, bound, yes), _built(ctx, decisions, bound, no)
                if held and failed:
                    yield _settle(ctx, module, cls, test, {True: held, False: failed}, max(near, far))


def _functions(tree: ast.Module) -> Iterator[tuple[ast.ClassDef | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield node, item
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield None, node


def _branches(body: list[ast.stmt]) -> Iterator[tuple[ast.expr, list[ast.AST], list[ast.AST]]]:
    """Each test of a block with what runs when it holds and when it does not: an `if` without an
    `else` whose body returns leaves the statements after it to the other branch; `A if test else B`
    in a simple statement picks between two names."""
    for position, statement in enumerate(body):
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(statement, ast.If):
            returns = bool(statement.body) and isinstance(statement.body[-1], (ast.Return, ast.Raise))
            otherwise = statement.orelse or (body[position + 1 :] if returns else [])
            yield statement.test, list(statement.body), list(otherwise)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return)):
            for node in ast.walk(statement):
                if isinstance(node, ast.IfExp):
                    yield node.test, [node.body], [node.orelse]
        for field in ("body", "orelse", "finalbody", "handlers"):
            for item in getattr(statement, field, None) or ():
                if isinstance(item, ast.ExceptHandler):
                    yield from _branches(item.body)
            block = [item for item in getattr(statement, field, None) or () if isinstance(item, ast.stmt)]
            yield from _branches(block)


def _bindings(module: Source, nodes: Iterable[ast.AST], classes: bool = False) -> dict[str, list[tuple[str, str]]]:
    """Names bound by the `from ... import` statements among `nodes` to (module, name); with
    `classes`, the classes among them too (a module's own)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            for alias in node.names if base is not None else ():
                found.setdefault(alias.asname or alias.name, []).append((base or "", alias.name))
        elif classes and isinstance(node, ast.ClassDef):
            found.setdefault(node.name, []).append((module.name, node.name))
    return found


def _absolute(module: Source, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    package = module.name.split(".")
    if not module.relpath.endswith("__init__.py"):
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
    return ".".join(part for part in (*package, node.module or "") if part)


def _built(
    ctx: SideContext,
    decisions: _Runners,
    bound: dict[str, list[tuple[str, str]]],
    branch: list[ast.AST],
) -> tuple[tuple[Decision, ...], int]:
    """The deciding runners a branch builds: the classes its calls (or the names it picks) are bound
    to, each decided by itself or the nearest base class that decides; and how many classes down
    from a deciding one the nearest it builds is (0: a runner itself, not a platform's subclass)."""
    names: list[str] = []
    for root in branch:
        for node in ast.walk(root):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                names.append(node.func.id)
            elif isinstance(node, ast.Name) and root is node:
                names.append(node.id)
    built: dict[tuple[str, str], Decision] = {}
    nearest = _DEPTH
    for name in dict.fromkeys(names):
        for dotted, attr in bound.get(name, []):
            found = _lineage(ctx, decisions, dotted, attr, _DEPTH)
            if found is not None:
                built[(found[0].relpath, found[0].runner)] = found[0]
                nearest = min(nearest, _DEPTH - found[1])
    return tuple(built.values()), nearest


def _lineage(ctx: SideContext, decisions: _Runners, dotted: str, name: str, depth: int) -> tuple[Decision, int] | None:
    """The decision of class `name` of module `dotted`: its own, or its nearest deciding base's;
    with the depth left when it was found. Only modules that decide or import one are read."""
    assert ctx.index is not None
    relpath = ctx.index.resolve(dotted)
    if relpath is None or relpath not in decisions.readable:
        return None
    decision = decisions.get((relpath, name))
    if decision is not None:
        return decision, depth
    parsed = _standard(ctx, relpath) if depth > 0 else None
    if parsed is None:
        return None
    module, tree = parsed
    cls = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name), None)
    if cls is None:  # re-exported: follow the module's own import of the name
        named = _bindings(module, tree.body).get(name, [])
        return next((found for d, a in named if (found := _lineage(ctx, decisions, d, a, depth))), None)
    bound = _bindings(module, tree.body, classes=True)
    for base in cls.bases:
        base_name = base.id if isinstance(base, ast.Name) else None
        for d, a in bound.get(base_name or "", []):
            found = _lineage(ctx, decisions, d, a, depth - 1)
            if found is not None:
                return found
    return None


def _settle(
    ctx: SideContext,
    module: Source,
    cls: ast.ClassDef | None,
    test: ast.expr,
    when: dict[bool, tuple[Decision, ...]],
    distance: int,
) -> RunnerChoice:
    """Read the test for the environment variable it decides with, and what this launch sets it to."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    read = _environment(ctx, module, cls, test.operand if negated else test, 2)  # type: ignore[attr-defined]
    if negated:
        when = {True: when[False], False: when[True]}
    test_step = _step(ctx, module, test, "picks the runner", StepKind.TEST)
    if read is None:
        return RunnerChoice(test_step, when, distance, None, None, (), None)
    name, direct, steps = read
    setting = ctx.settings.get(name) if ctx.settings is not None else None
    if setting is not None:
        value = _truth(setting.value)
        return RunnerChoice(test_step, when, distance, name, value, (setting.step, *steps[::-1]), str(setting.value))
    default = _default(ctx, name)
    if direct and default is not None:
        raw, step = default
        value = False if raw is None else _truth(raw)
        return RunnerChoice(test_step, when, distance, name, value, (step, *steps[::-1]), None)
    return RunnerChoice(test_step, when, distance, name, None, steps[::-1], None)


def _truth(raw: object) -> bool | None:
    """An environment variable's value as a switch (`"1"`, `"0"`, `"true"`); None when it is neither."""
    text = str(raw).strip().lower()
    if text.lstrip("-").isdigit():
        return int(text) != 0
    return {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False, "": False}.get(text)


def _environment(
    ctx: SideContext, module: Source, cls: ast.ClassDef | None, expression: ast.expr, hops: int
) -> tuple[str, bool, tuple[Step, ...]] | None:
    """The environment variable a test reads (`envs.VLLM_USE_V2_MODEL_RUNNER`), through the field it
    tests (`self.use_v2_model_runner = vllm_config.use_v2_model_runner`) and the property computing
    it; and whether the variable alone decides (the property returns it, whatever it holds)."""
    if not isinstance(expression, ast.Attribute):
        return None
    if _ENV.match(expression.attr) and _default(ctx, expression.attr) is not None:
        return expression.attr, True, ()
    if hops == 0:
        return None
    if isinstance(expression.value, ast.Name) and expression.value.id == "self" and cls is not None:
        for node in ast.walk(cls):
            stored = _stores(node, {expression.attr}) if isinstance(node, ast.stmt) else None
            if stored is not None:
                found = _environment(ctx, module, cls, stored, hops - 1)
                if found is not None:
                    return (
                        found[0],
                        found[1],
                        (_step(ctx, module, node, f"sets .{expression.attr}", StepKind.ASSIGN), *found[2]),
                    )
    name = expression.attr
    for relpath in sorted(ctx.tree.grep([f"def {name}("])[f"def {name}("]):
        parsed = _standard(ctx, relpath)
        if parsed is None:
            continue
        other, tree = parsed
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name != name:
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Attribute) and _ENV.match(node.attr) and _default(ctx, node.attr) is not None:
                    returns = [item for item in ast.walk(function) if isinstance(item, ast.Return)]
                    direct = (
                        len(returns) == 1
                        and returns[0].value is not None
                        and ast.unparse(returns[0].value) in (ast.unparse(node),)
                    )
                    location = Location(ctx.tree.input, relpath, function.lineno, function.lineno)
                    code = other.code(function.lineno)
                    step = Step(location, f"{name} reads {node.attr}", code, StepKind.ASSIGN, other.patched)
                    return node.attr, direct, (step,)
    return None


def _default(ctx: SideContext, name: str) -> tuple[str | None, Step] | None:
    """The value the engine reads for an environment variable left unset (`os.getenv(NAME, "0")`),
    with its line; None when no code reads `name` from the environment."""
    needle = f'"{name}"'
    for relpath in sorted(ctx.tree.grep([needle])[needle]):
        text = ctx.tree.read(relpath) or ""
        if "getenv(" not in text and "environ" not in text:
            continue
        parsed = _standard(ctx, relpath)
        if parsed is None:
            continue
        module, tree = parsed
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            reads = node.func.attr == "getenv" or (node.func.attr == "get" and "environ" in ast.unparse(node.func))
            if reads and isinstance(node.args[0], ast.Constant) and node.args[0].value == name:
                raw = node.args[1] if len(node.args) > 1 else None
                value = (
                    raw.value if isinstance(raw, ast.Constant) and isinstance(raw.value, (str, type(None))) else None
                )
                return value, _step(ctx, module, node, f"reads {name} from the environment", StepKind.CONFIG)
    return None
