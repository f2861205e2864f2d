"""A symbolic evaluator for the Python that wires hidden states: never executes, only reads.

It interprets a safe subset of Python over libcst trees with abstract values (see values.py):
one path through the code, with unknown runtime state settled by recorded assumptions
(assumptions.py). Two modes:

* full evaluation of a call (`call`), as the code would run it;
* goal-directed evaluation (`run_to`): run a function only along the path to one statement,
  resolving local names on demand from their reaching definitions. This is how a field such as
  `self.eagle_aux_hidden_state_layer_ids` is read out of a 300-line `__init__` without
  evaluating the rest of it.

Every value carries the dataflow nodes it came from, so that results come with citations.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import libcst as cst

from rca.static.codeindex import (
    ClassInfo,
    CodeIndex,
    FunctionInfo,
    ModuleInfo,
    children,
    statement_blocks,
    walk,
)
from rca.static.codeindex import dotted_name as _dotted
from rca.inputs.configs import ConfigFile
from rca.static.graph import DataflowGraph, NodeKey
from rca.model import Location, Tap
from rca.inputs.launch import LaunchSettings
from rca.static.evaluate import library
from rca.static.evaluate.assumptions import BY_NAME, LAYER_STACKS
from rca.static.evaluate.values import (
    NO_SRC,
    NONE,
    BuiltinFn,
    ClassRef,
    ConfigObj,
    DecoderLayer,
    EnumMember,
    EvalRaise,
    FuncRef,
    LambdaRef,
    LayerStack,
    ModuleRef,
    MutDict,
    MutList,
    ObjRef,
    Opaque,
    SetVal,
    SuperRef,
    TensorVal,
    Val,
    describe,
    tap_tensor,
)

MAX_DEPTH = 14
DEFAULT_BUDGET = 400_000
MAX_UNROLL = 4096

# Engine objects that describe the draft model: their `.hf_config` is the draft's config.json.
DRAFT_MODEL_CONFIGS = frozenset({"draft_model_config", "draft_config"})

# Draft-config keys that, read from an unknown config-like object, mean the draft's config.
DRAFT_KEYS = frozenset({
    "eagle_config",
    "eagle_aux_hidden_state_layer_ids",
    "num_aux_hidden_states",
    "target_hidden_size",
})


class _Return(Exception):
    def __init__(self, value: Val) -> None:
        self.value = value


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class BudgetExceeded(Exception):
    pass


class _GoalReached(Exception):
    def __init__(self, frame: Frame, call_args: tuple[list[Val], dict[str, Val]] | None) -> None:
        super().__init__()
        self.frame = frame
        self.call_args = call_args


class _GoalBlocked(Exception):
    def __init__(self, reason: str, location: Location | None) -> None:
        self.reason = reason
        self.location = location


@dataclass
class Frame:
    module: ModuleInfo
    anchor: Any  # the def (or module) whose lines locate nodes
    func: FunctionInfo | None = None
    locals: dict[str, Val] = field(default_factory=dict)
    closure: dict[str, Val] | None = None
    lazy: bool = False  # resolve missing locals from their reaching definitions
    self_val: Val | None = None
    owner: ClassInfo | None = None  # the class defining the running method, for super()
    current: cst.CSTNode | None = None  # the statement being executed
    resolving: set[tuple[str, int]] = field(default_factory=set)  # (name, statement) being run to bind name
    enclosing: Frame | None = None  # for a lambda: the frame its free names come from
    guards: set[str] = field(default_factory=set)  # unbound parameters a goal path's conditions were assumed on


@dataclass
class GoalResult:
    reached: bool
    frame: Frame | None = None
    args: tuple[list[Val], dict[str, Val]] | None = None  # for a call goal
    reason: str = ""
    location: Location | None = None
    followed: bool = True  # False: the analysis could not follow the path (not: the path is not taken)


@dataclass
class AppendEvent:
    list_id: int
    value: Val
    node: NodeKey
    controls: tuple[NodeKey, ...]  # the conditions that decided this append ran


@dataclass
class Control:
    node: NodeKey | None


@dataclass
class RaiseEvent:
    kind: str
    message: str
    location: Location | None
    handled_at: Location | None = None
    sources: frozenset[NodeKey] = NO_SRC


class Evaluator:
    """Evaluates analyzed code for one side of a diagnosis."""

    def __init__(
        self,
        index: CodeIndex,
        graph: DataflowGraph,
        *,
        num_layers: int | None = None,
        target: ConfigFile | None = None,
        draft: ConfigFile | None = None,
        budget: int = DEFAULT_BUDGET,
        settings: LaunchSettings | None = None,
    ) -> None:
        self.index = index
        self.graph = graph
        self.num_layers = num_layers
        self.target = target
        self.draft = draft
        self.links: dict[str, tuple[Val, NodeKey | None]] = {}
        self.budget = budget
        self.steps = 0
        self.depth = 0
        self.control: list[Control] = []
        self.appends: list[AppendEvent] = []
        self.assumptions: list[NodeKey] = []
        self.handled: list[RaiseEvent] = []
        self.stores: list[tuple[ObjRef, str, Val]] = []  # field stores, in evaluation order
        self.concats: list[Val] = []  # torch.cat results over tracked tensors
        self._globals: dict[tuple[int, str], Val] = {}
        self._resolving_fields: set[tuple[int, str]] = set()
        self._parents: dict[int, dict[cst.CSTNode, cst.CSTNode]] = {}
        self._stmt_orders: dict[int, tuple[dict[cst.CSTNode, int], dict[str, list[tuple[int, cst.CSTNode]]]]] = {}
        self._singletons: dict[int, Val] = {}
        self.wanted: set[str] = set()
        self._last_test: Opaque | None = None
        self._mro: dict[int, list[ClassInfo]] = {}
        self._enums: dict[int, bool] = {}
        self.readers_of_settings: set[str] = set()  # files whose imports are followed to evaluate a setting
        self.settings_read: list[tuple[str, Any, NodeKey]] = []  # launch settings the evaluation has used: (attribute, value, node), in order
        self.layer_calls: dict[NodeKey, LayerStack] = {}  # call statements of decoder layers, by their graph node
        self.seeking_truth = False  # while asking whether a condition can be true (`condition_at`)
        if settings is not None:
            self._apply_settings(settings)

    # ------------------------------------------------------------------------------------------
    # public entry points
    # ------------------------------------------------------------------------------------------

    def link(self, attribute: str, value: Val, node: NodeKey | None = None) -> None:
        """Make `<unknown object>.attribute` read `value` (an attribute-name link)."""
        self.links[attribute] = (value, node)


    def _apply_settings(self, settings: LaunchSettings) -> None:
        """Launch settings answer reads of their attribute on unknown objects (`server_args.tp_size`).
        The enums the files reading them import are followed, so that the code deciding with a
        setting (`SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)`) is evaluated."""
        for setting in settings.settings:
            node = self.graph.from_step("setting", setting.step)
            self.graph.observe(node, f"{setting.dest} = {setting.value!r}")
            self.link(setting.dest, library.python_to_val(setting.value, NO_SRC), node)
        needles = [f".{setting.dest}" for setting in settings.settings]
        self.readers_of_settings = {relpath for hits in self.index.tree.grep(needles).values() for relpath in hits}

    def new_object(self, cls: ClassInfo, args: list[Val] | None = None, kwargs: dict[str, Val] | None = None) -> Val:
        """An instance of `cls` as if constructed with these arguments (fields resolve lazily)."""
        init = None if args is None and kwargs is None else (list(args or []), dict(kwargs or {}))
        return Val(ObjRef(cls, init_args=init))

    def singleton(self, cls: ClassInfo) -> Val:
        """The one instance of `cls` that calls by method name (RPC) reach."""
        if id(cls) not in self._singletons:
            self._singletons[id(cls)] = Val(ObjRef(cls))
        return self._singletons[id(cls)]

    def call(self, fn: Val, args: list[Val], kwargs: dict[str, Val] | None = None, node: cst.CSTNode | None = None, frame: Frame | None = None) -> Val:
        return self._call(fn, args, kwargs or {}, node, frame)

    def evaluate(self, func: FunctionInfo, node: cst.BaseExpression, bindings: dict[str, Val], self_val: Val | None = None) -> Val:
        """The value of an expression inside `func` with some names bound; the others are taken
        from their definitions in the function, as far as they can be."""
        frame = self._function_frame(func, self_val, lazy=True)
        frame.locals.update(self._bind_unknown_params(func, bindings, self_val))
        try:
            return self._eval(node, frame)
        except EvalRaise as error:
            return Val(Opaque("value", "", f"raises {error.kind}: {error.message}"))
        except RecursionError:
            return Val(Opaque("value", "", "too deeply nested to evaluate"))

    def run_to(self, func: FunctionInfo, goal: cst.CSTNode, self_val: Val | None = None, bindings: dict[str, Val] | None = None) -> GoalResult:
        """Run `func` only along the path to `goal` (a statement, or a call whose arguments we want)."""
        frame = self._function_frame(func, self_val, lazy=True)
        frame.locals.update(self._bind_unknown_params(func, bindings or {}, self_val))
        path = self._path_to(func, goal)
        if path is None:
            return GoalResult(False, reason="the goal is not inside the function")
        self.depth += 1
        try:
            self._exec_goal(self._block_of(func.node), frame, path, goal)
        except _GoalReached as reached:
            return GoalResult(True, reached.frame, reached.call_args)
        except _GoalBlocked as blocked:
            return GoalResult(False, reason=blocked.reason, location=blocked.location)
        except EvalRaise as error:
            return GoalResult(False, reason=f"raises {error.kind} before reaching it: {error.message}", location=error.location, followed=False)
        except _Return:
            return GoalResult(False, reason="returns before reaching it")
        except RecursionError:
            return GoalResult(False, reason="too deeply nested to evaluate", followed=False)
        finally:
            self.depth -= 1
        return GoalResult(False, reason="the path to it was not taken")

    def condition_at(self, func: FunctionInfo, statement: cst.If, self_val: Val | None = None) -> Val:
        """Whether an `if`'s test can be true where `func` reaches it: unknown conditions on the
        way (here and in what the test calls) take the branch that does not return a false
        constant. False when no such path makes it true, unknown when the path cannot be followed."""
        saved, self.seeking_truth = self.seeking_truth, True
        try:
            with self.wanting(_final_names([statement.test])):
                result = self.run_to(func, statement, self_val)
            if not result.reached or result.frame is None:
                return Val(False) if result.followed else Val(Opaque("condition", "", f"not reached: {result.reason}"))
            return self._eval(statement.test, result.frame)
        except EvalRaise as error:
            return Val(Opaque("condition", "", f"raises {error.kind}: {error.message}"))
        finally:
            self.seeking_truth = saved

    def run_to_call(self, func: FunctionInfo, call: cst.Call, self_val: Val | None = None, depth: int = 2, wanted: set[str] | None = None) -> GoalResult:
        """The arguments of `call` inside `func`. When they depend on parameters of `func` that
        nothing binds here, evaluate them at the callers of `func` (up to `depth` levels)."""
        with self.wanting(wanted if wanted is not None else _final_names(arg.value for arg in call.args)):
            result = self.run_to(func, call, self_val)
            unbound = _unbound_parameters(result)
            if self.readers_of_settings and result.frame is not None:
                unbound |= result.frame.guards  # with launch settings, a caller may decide the path too
            if not result.reached or depth <= 0 or not unbound:
                return result
            blocked: GoalResult | None = None
            for caller, site in self.callers(func):
                needed = _final_names(_arguments_for(site, func.node, unbound))
                outer = self.run_to_call(caller, site, Val(ObjRef(caller.owner)) if caller.owner is not None else None, depth - 1, needed)
                if not outer.reached or outer.args is None:
                    continue
                receiver = self_val if func.owner is not None else None
                bindings = self._bind(func.node, outer.args[0], outer.args[1], receiver, self._module_frame(func.module, func.node))
                retried = self.run_to(func, call, self_val, bindings)
                if retried.reached and not _unbound_parameters(retried):
                    return retried
                if not retried.reached and retried.location is not None:
                    blocked = blocked or retried  # what the caller passes closes the path
            return blocked or result

    def callers(self, func: FunctionInfo) -> Iterator[tuple[FunctionInfo, cst.Call]]:
        """Call sites of `func` by name, in the analyzed files (calls through `self.` for methods)."""
        needle = f"{func.name}("
        for relpath in self.index.tree.grep([needle])[needle]:
            self.index.allow(relpath)  # a call naming the function is reason enough to read the file
            module = self.index.load(relpath)
            if module is None:
                continue
            for caller in module.all_functions:
                if needle not in caller.text or caller.node is func.node:
                    continue
                for site in _calls_to(caller.node, func.name):
                    yield caller, site

    def field(self, obj: Val, name: str) -> Val:
        return self._getattr(obj, name, None, None)

    # ------------------------------------------------------------------------------------------
    # dataflow bookkeeping
    # ------------------------------------------------------------------------------------------

    def loc(self, frame: Frame, node: cst.CSTNode) -> Location:
        return frame.module.location(node, frame.anchor)

    def node(self, kind: str, frame: Frame, node: cst.CSTNode, note: str = "", sources: frozenset[NodeKey] = NO_SRC, control: bool = True) -> NodeKey:
        location = self.loc(frame, node)
        key = self.graph.node(kind, location, note, frame.module.code(location.line, location.end_line))
        self.graph.flow(sources, key, "data")
        if control:
            self.graph.flow([entry.node for entry in self.control if entry.node is not None], key, "control")
        return key

    def assume(self, frame: Frame | None, node: cst.CSTNode | None, note: str) -> frozenset[NodeKey]:
        if frame is None or node is None:
            return NO_SRC
        key = self.node("assumption", frame, node, note, control=False)
        if key not in self.assumptions:
            self.assumptions.append(key)
        return frozenset({key})

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.budget:
            raise BudgetExceeded(f"evaluation budget of {self.budget} steps exceeded")

    # ------------------------------------------------------------------------------------------
    # frames, scopes and names
    # ------------------------------------------------------------------------------------------

    def _function_frame(self, func: FunctionInfo, self_val: Val | None, lazy: bool = False, closure: dict[str, Val] | None = None) -> Frame:
        return Frame(func.module, func.node, func, {}, closure, lazy, self_val, func.owner)

    def _module_frame(self, module: ModuleInfo, anchor: Any = None) -> Frame:
        return Frame(module, anchor if anchor is not None else module.tree)

    def run_script(self, module: ModuleInfo) -> Frame:
        """Evaluate a module as `python script.py` would, its top-level code and main guard."""
        frame = self._module_frame(module)
        frame.locals["__name__"] = Val("__main__")
        try:
            self._exec_block(list(module.tree.body), frame)
        except (EvalRaise, _Return, _Break, _Continue):
            pass
        return frame

    def _lookup(self, frame: Frame, name: str, node: cst.CSTNode) -> Val:
        if name in frame.locals:
            return frame.locals[name]
        if frame.lazy and frame.func is not None:
            value = self._reaching_definition(frame, name)
            if value is not None:
                return value
        if frame.closure is not None and name in frame.closure:
            return frame.closure[name]
        if frame.enclosing is not None:
            return self._lookup(frame.enclosing, name, node)
        return self._global(frame.module, name)

    def _global(self, module: ModuleInfo, name: str) -> Val:
        key = (id(module), name)
        if key in self._globals:
            return self._globals[key]
        self._globals[key] = Val(Opaque(name, f"{module.name}.{name}", "being resolved"))
        with self._isolated():
            value = self._resolve_global(module, name)
        self._globals[key] = value
        return value

    def _resolve_global(self, module: ModuleInfo, name: str) -> Val:
        if name in module.classes:
            return Val(ClassRef(module.classes[name]))
        if name in module.functions:
            return Val(FuncRef(module.functions[name]))
        binding = module.imports.get(name)
        if binding is not None:
            enum = self._settings_enum(module, binding.module, binding.attr)
            return enum if enum is not None else self._import(binding.module, binding.attr)
        statement = module.assignments.get(name)
        if statement is not None:
            frame = self._module_frame(module)
            try:
                self._exec_stmt(statement, frame)
            except (EvalRaise, _Return, _Break, _Continue, RecursionError):
                pass
            if name in frame.locals:
                return frame.locals[name]
        builtin = library.builtin(name)
        if builtin is not None:
            return Val(builtin)
        return Val(Opaque(name, f"{module.name}.{name}", "not defined in the analyzed files"))

    def _settings_enum(self, importer: ModuleInfo, dotted: str, attr: str | None) -> Val | None:
        """An `Enum` a file that reads launch settings imports: the values settings are compared
        with (`SpeculativeAlgorithm.EAGLE3`), loaded even where no anchor chose its file. Only
        enums: they are data, so following them cannot take the analysis elsewhere."""
        if attr is None or importer.relpath not in self.readers_of_settings:
            return None
        relpath = self.index.resolve(dotted)
        module = self.index.load(relpath) if relpath is not None else None
        cls = module.classes.get(attr) if module is not None else None
        return Val(ClassRef(cls)) if cls is not None and self.is_enum(cls) else None

    def _import(self, dotted: str, attr: str | None) -> Val:
        if attr is None:
            module = self.index.module_by_name(dotted)
            return Val(ModuleRef(module)) if module is not None else Val(Opaque(dotted.split(".")[-1], dotted, "module not analyzed"))
        module = self.index.module_by_name(dotted)
        if module is not None and (attr in module.classes or attr in module.functions or attr in module.imports or attr in module.assignments):
            return self._global(module, attr)
        submodule = self.index.module_by_name(f"{dotted}.{attr}")
        if submodule is not None:
            return Val(ModuleRef(submodule))
        return Val(Opaque(attr, f"{dotted}.{attr}", "not in the analyzed files"))

    def _statement_order(self, func: FunctionInfo) -> tuple[dict[cst.CSTNode, int], dict[str, list[tuple[int, cst.CSTNode]]]]:
        """Source order of the function's statements, and which statements assign each name."""
        cached = self._stmt_orders.get(id(func.node))
        if cached is not None:
            return cached
        order: dict[cst.CSTNode, int] = {}
        defs: dict[str, list[tuple[int, cst.CSTNode]]] = {}

        def visit(statements: list[cst.CSTNode]) -> None:
            for statement in statements:
                order[statement] = len(order)
                for name in _assigned_names(statement):
                    defs.setdefault(name, []).append((order[statement], statement))
                if isinstance(statement, cst.SimpleStatementLine):
                    for small in statement.body:
                        order[small] = order[statement]
                for block in statement_blocks(statement, into_defs=False):
                    visit(block)

        visit(self._block_of(func.node))
        self._stmt_orders[id(func.node)] = (order, defs)
        return order, defs

    def _reaching_definition(self, frame: Frame, name: str) -> Val | None:
        """Bind a local the running path skipped: run the statement that last defined it before
        this point. A definition inside an if/try/with is run with its whole enclosing statement,
        so the branch the code really takes decides; one in a sibling branch cannot reach here."""
        assert frame.func is not None
        order, defs = self._statement_order(frame.func)
        sites = defs.get(name)
        if not sites:
            return None
        current = order.get(frame.current, len(order)) if frame.current is not None else len(order)
        parents = self._parent_map(frame.func)
        around_current = self._ancestors(parents, frame.current) if frame.current is not None else {frame.func.node}
        for position, candidate in reversed(sites):
            if position >= current:
                continue
            enclosing = candidate
            while parents.get(enclosing) is not None and parents[enclosing] not in around_current:
                enclosing = parents[enclosing]
            if (name, id(enclosing)) in frame.resolving:
                continue  # running it is what asked: an earlier definition binds the name inside it
            if isinstance(enclosing, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                break
        else:
            return None
        if enclosing is not candidate:
            return self._run_enclosing(frame, enclosing, name)
        statement = candidate
        saved = frame.current
        frame.resolving.add((name, id(statement)))
        with self._isolated():
            try:
                frame.current = statement
                self._exec_definition(statement, frame, name)
            except (EvalRaise, _GoalBlocked):
                pass
            finally:
                frame.resolving.discard((name, id(statement)))
                frame.current = saved
        return frame.locals.get(name)

    @staticmethod
    def _ancestors(parents: dict[cst.CSTNode, cst.CSTNode], node: cst.CSTNode) -> set[cst.CSTNode]:
        found = {node}
        while node in parents:
            node = parents[node]
            found.add(node)
        return found

    def _run_enclosing(self, frame: Frame, statement: cst.CSTNode, name: str) -> Val | None:
        """Run a whole compound statement whose branches define `name`."""
        saved = frame.current
        frame.resolving.add((name, id(statement)))
        with self._isolated():
            try:
                self._exec_stmt(statement, frame)
            except (EvalRaise, _GoalBlocked, _Break, _Continue, _Return):
                pass
            finally:
                frame.resolving.discard((name, id(statement)))
                frame.current = saved
        return frame.locals.get(name)

    def _exec_definition(self, statement: cst.CSTNode, frame: Frame, name: str) -> None:
        """Evaluate just the part of a statement that binds `name`."""
        if isinstance(statement, cst.For):
            iterable = self._eval(statement.iter, frame)
            items = self._iterate(iterable, frame, statement.iter)
            first = next(iter(items), None) if items is not None else None
            self._assign(statement.target, first or Val(Opaque(name, "", "loop variable")), frame, statement)
        elif isinstance(statement, cst.With):
            for item in statement.items:
                if item.asname is not None:
                    self._assign(item.asname.name, self._eval(item.item, frame), frame, statement)
        elif isinstance(statement, (cst.If, cst.While)):
            self._eval(statement.test, frame)  # a walrus in the condition
        elif isinstance(statement, (cst.Try, cst.TryStar)):
            return
        else:
            self._exec_stmt(statement, frame)

    # ------------------------------------------------------------------------------------------
    # statements
    # ------------------------------------------------------------------------------------------

    @staticmethod
    def _block_of(node: cst.CSTNode) -> list[cst.CSTNode]:
        body = node.body  # type: ignore[attr-defined]
        return list(body.body) if isinstance(body, (cst.IndentedBlock, cst.SimpleStatementSuite)) else list(body)

    def _exec_block(self, statements: list[cst.CSTNode], frame: Frame) -> None:
        for statement in statements:
            self._exec_stmt(statement, frame)

    def _exec_stmt(self, statement: cst.CSTNode, frame: Frame) -> None:
        self._tick()
        previous = frame.current
        if not isinstance(statement, cst.BaseSmallStatement):
            frame.current = statement
        try:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    self._exec_small(small, frame, statement)
            elif isinstance(statement, cst.BaseSmallStatement):
                self._exec_small(statement, frame, statement)
            elif isinstance(statement, cst.If):
                self._exec_if(statement, frame)
            elif isinstance(statement, cst.For):
                self._exec_for(statement, frame)
            elif isinstance(statement, cst.While):
                self._exec_while(statement, frame)
            elif isinstance(statement, (cst.Try, cst.TryStar)):
                self._exec_try(statement, frame)
            elif isinstance(statement, cst.With):
                for item in statement.items:
                    value = self._eval(item.item, frame)
                    if item.asname is not None:
                        self._assign(item.asname.name, value, frame, statement)
                self._exec_block(self._block_of(statement), frame)
            elif isinstance(statement, cst.FunctionDef) and frame.func is not None:  # module-level defs are globals
                info = FunctionInfo(frame.module, statement, statement.name.value)
                frame.locals[statement.name.value] = Val(FuncRef(info, closure=dict(frame.locals)))
            # class definitions and match statements inside functions are not modeled
        finally:
            frame.current = previous

    def _exec_small(self, small: cst.CSTNode, frame: Frame, line: cst.CSTNode) -> None:
        if isinstance(small, cst.Expr):
            self._eval(small.value, frame)
        elif isinstance(small, cst.Assign):
            value = self._eval(small.value, frame)
            for target in small.targets:
                self._assign(target.target, value, frame, line)
        elif isinstance(small, cst.AnnAssign):
            if small.value is not None:
                self._assign(small.target, self._eval(small.value, frame), frame, line)
        elif isinstance(small, cst.AugAssign):
            current = self._eval(small.target, frame)
            operand = self._eval(small.value, frame)
            operator = type(small.operator).__name__.replace("Assign", "")
            if operator == "Add" and isinstance(current.v, MutList) and not current.v.tuple_like:
                items = self._iterate(operand, frame, small.value)
                current.v.items.extend(items or [Val(Opaque("item"))])
                result = Val(current.v, current.src | operand.src)
            else:
                result = self._binary(operator, current, operand, frame, small)
            self._assign(small.target, result, frame, line)
        elif isinstance(small, cst.Return):
            raise _Return(self._eval(small.value, frame) if small.value is not None else NONE)
        elif isinstance(small, cst.Raise):
            kind = "Exception"
            if small.exc is not None:
                exc = small.exc.func if isinstance(small.exc, cst.Call) else small.exc
                kind = _dotted(exc) or kind
            error = EvalRaise(kind.split(".")[-1], frame.module.code(*frame.module.lines_of(small, frame.anchor)), small)
            error.location = self.loc(frame, small)
            raise error
        elif isinstance(small, cst.Break):
            raise _Break()
        elif isinstance(small, cst.Continue):
            raise _Continue()
        elif isinstance(small, cst.Assert):
            test = self._truth(self._eval(small.test, frame), frame, small.test, default=True)
            if test is False:
                error = EvalRaise("AssertionError", frame.module.code(*frame.module.lines_of(small, frame.anchor)), small)
                error.location = self.loc(frame, small)
                raise error
        elif isinstance(small, (cst.Import, cst.ImportFrom)):
            self._exec_import(small, frame)
        # pass, del, global, nonlocal: nothing to model

    def _exec_import(self, small: cst.Import | cst.ImportFrom, frame: Frame) -> None:
        if isinstance(small, cst.Import):
            for alias in small.names:
                dotted = _dotted(alias.name)
                if dotted:
                    local = alias.asname.name.value if alias.asname is not None else dotted.split(".")[0]  # type: ignore[union-attr]
                    frame.locals[local] = self._import(dotted if alias.asname is not None else local, None)
            return
        if isinstance(small.names, cst.ImportStar):
            return
        base = self.index._absolute_from(frame.module, small)
        for alias in small.names:
            name = _dotted(alias.name)
            if base is not None and name:
                local = alias.asname.name.value if alias.asname is not None else name  # type: ignore[union-attr]
                frame.locals[local] = self._import(base, name)

    def _exec_if(self, statement: cst.If, frame: Frame) -> None:
        test_value = self._eval(statement.test, frame)
        if isinstance(test_value.v, Opaque) and test_value.v.hint not in BY_NAME:
            self._last_test = test_value.v
            truth, why = self._choose_branch(statement, frame)
            self.assume(frame, statement.test, f"unknown runtime condition assumed {why}")
        else:
            truth = self._truth(test_value, frame, statement.test)
        entry = self._control_entry(statement.test, frame, test_value, truth)
        self.control.append(entry)
        try:
            if truth:
                self._exec_block(self._block_of(statement), frame)
            elif statement.orelse is not None:
                if isinstance(statement.orelse, cst.If):
                    self._exec_stmt(statement.orelse, frame)
                else:
                    self._exec_block(self._block_of(statement.orelse), frame)
        finally:
            self.control.pop()

    def _choose_branch(self, statement: cst.If, frame: Frame) -> tuple[bool, str]:
        """For an unknown condition: the branch from which a value being looked for gets set
        (in the branch, or after it when the other branch returns early); when asking whether a
        condition can be true, the branch that does not return a false constant; else the branch
        that does not raise (the code's normal path); else the branch a `hasattr` guard opens
        onto the attribute it checks; else "feature off"."""
        body = self._block_of(statement)
        orelse = [statement.orelse] if isinstance(statement.orelse, cst.If) else self._block_of(statement.orelse) if statement.orelse is not None else []
        if self.wanted:
            later = bool(self._names_set_after(statement, frame) & self.wanted)
            reach_if_true = bool(_stored_names(body) & self.wanted) or (later and not _always_exits(body))
            reach_if_false = bool(_stored_names(orelse) & self.wanted) or (later and not (orelse and _always_exits(orelse)))
            if reach_if_true != reach_if_false:
                wanted = ", ".join(sorted(self.wanted & (_stored_names(body if reach_if_true else orelse) | self._names_set_after(statement, frame))))
                return reach_if_true, f"{str(reach_if_true).lower()}: the path that sets {wanted}"
        if self.seeking_truth and _returns_false(body) != (bool(orelse) and _returns_false(orelse)):
            return not _returns_false(body), "so that the condition sought can still be true"
        raises_if_true = _ends_in_raise(body)
        raises_if_false = isinstance(statement.orelse, cst.Else) and _ends_in_raise(orelse)
        if raises_if_false and not raises_if_true:
            return True, "true: the other branch raises"
        if raises_if_true and not raises_if_false:
            return False, "false: that branch raises"
        if _guards_its_read(statement.test, body, orelse):
            return True, f"true: {GUARD_ASSUMED}"
        off = isinstance(test := self._last_test, Opaque) and test.off
        return off, "true (with the optional feature it tests off)" if off else "false"

    def _names_set_after(self, statement: cst.CSTNode, frame: Frame) -> set[str]:
        """Names assigned by the statements that follow `statement` in its function."""
        if frame.func is None:
            return set()
        parents = self._parent_map(frame.func)
        found: set[str] = set()
        node = statement
        while node is not frame.func.node and node in parents:
            block = parents[node]
            siblings = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
            if node in siblings:
                found |= _stored_names(siblings[siblings.index(node) + 1 :])
            node = block
        return found

    @contextmanager
    def wanting(self, names: set[str]) -> Iterator[None]:
        """While looking for values stored under these names, branch toward their assignments."""
        saved = self.wanted
        self.wanted = saved | names
        try:
            yield
        finally:
            self.wanted = saved

    def _control_entry(self, test: cst.BaseExpression, frame: Frame, value: Val, truth: bool) -> Control:
        key = None
        if value.src:
            key = self.node("test", frame, test, "", value.src)
            self.graph.observe(key, "true" if truth else "false")
        return Control(key)

    def _exec_for(self, statement: cst.For, frame: Frame) -> None:
        iterable = self._eval(statement.iter, frame)
        items = self._iterate(iterable, frame, statement.iter)
        if items is None:
            self.assume(frame, statement.iter, "loop over an unknown collection: its body is read once, for one unknown item")
            items = [Val(Opaque(_name_of(statement.target) or "item", "", "an item of an unknown collection"), iterable.src)]
        broke = False
        for count, item in enumerate(items):
            if count >= MAX_UNROLL:
                break
            self._assign(statement.target, item, frame, statement.target)
            try:
                self._exec_block(self._block_of(statement), frame)
            except _Break:
                broke = True
                break
            except _Continue:
                continue
        if not broke and statement.orelse is not None:
            self._exec_block(self._block_of(statement.orelse), frame)

    def _exec_while(self, statement: cst.While, frame: Frame) -> None:
        for _ in range(MAX_UNROLL):
            value = self._eval(statement.test, frame)
            truth = self._truth(value, frame, statement.test)
            if not truth:
                break
            self.control.append(self._control_entry(statement.test, frame, value, truth))
            try:
                self._exec_block(self._block_of(statement), frame)
            except _Break:
                break
            except _Continue:
                continue
            finally:
                self.control.pop()

    def _exec_try(self, statement: cst.Try | cst.TryStar, frame: Frame) -> None:
        try:
            try:
                self._exec_block(self._block_of(statement), frame)
            except EvalRaise as error:
                handler = self._matching_handler(statement, error, frame)
                if handler is None:
                    raise
                self._record_handled(error, handler, frame)
                if handler.name is not None:
                    frame.locals[_name_of(handler.name.name)] = Val(Opaque(error.kind, error.kind, error.message, instance=True))
                self._exec_block(self._block_of(handler), frame)
            else:
                if statement.orelse is not None:
                    self._exec_block(self._block_of(statement.orelse), frame)
        finally:
            if statement.finalbody is not None:
                self._exec_block(self._block_of(statement.finalbody), frame)

    def _record_handled(self, error: EvalRaise, handler: cst.ExceptHandler, frame: Frame) -> None:
        location = self.loc(frame, handler)
        key = self.node("handler", frame, handler, f"{error.kind} caught: {error.message}", error.src)
        self.graph.observe(key, error.kind)
        self.handled.append(RaiseEvent(error.kind, error.message, error.location, location, error.src))

    def _matching_handler(self, statement: cst.Try | cst.TryStar, error: EvalRaise, frame: Frame) -> cst.ExceptHandler | None:
        for handler in statement.handlers:
            if handler.type is None:
                return handler
            names = []
            kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
            for kind in kinds:
                expression = kind.value if isinstance(kind, cst.Element) else kind
                dotted = _dotted(expression)  # type: ignore[arg-type]
                if dotted:
                    names.append(dotted.split(".")[-1])
            if any(library.exception_matches(error.kind, name) for name in names):
                return handler
        return None

    # -- goal-directed execution ----------------------------------------------------------------

    def _parent_map(self, func: FunctionInfo) -> dict[cst.CSTNode, cst.CSTNode]:
        cached = self._parents.get(id(func.node))
        if cached is not None:
            return cached
        parents: dict[cst.CSTNode, cst.CSTNode] = {}
        stack: list[cst.CSTNode] = [func.node]
        while stack:
            current = stack.pop()
            for child in children(current):
                parents[child] = current
                stack.append(child)
        self._parents[id(func.node)] = parents
        return parents

    def _path_to(self, func: FunctionInfo, goal: cst.CSTNode) -> set[cst.CSTNode] | None:
        parents = self._parent_map(func)
        path = {goal}
        current = goal
        while current is not func.node:
            parent = parents.get(current)
            if parent is None:
                return None
            path.add(parent)
            current = parent
        return path

    def _exec_goal(self, statements: list[cst.CSTNode], frame: Frame, path: set[cst.CSTNode], goal: cst.CSTNode) -> None:
        for statement in statements:
            if statement not in path:
                continue  # off the path: skipped; names it defines resolve on demand
            self._tick()
            frame.current = statement if not isinstance(statement, cst.BaseSmallStatement) else frame.current
            if statement is goal:
                self._exec_stmt(statement, frame)
                raise _GoalReached(frame, None)
            if isinstance(statement, (cst.SimpleStatementLine, cst.BaseSmallStatement)):
                smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
                for small in smalls:
                    if small is goal:
                        self._exec_small(small, frame, statement)
                        raise _GoalReached(frame, None)
                    if small in path:
                        if isinstance(goal, cst.Call):
                            raise _GoalReached(frame, self._call_arguments(goal, frame))
                        self._exec_small(small, frame, statement)
                        raise _GoalReached(frame, None)
            elif isinstance(statement, cst.If):
                self._goal_if(statement, frame, path, goal)
            elif isinstance(statement, (cst.For, cst.While)):
                if isinstance(statement, cst.For):
                    self._exec_definition(statement, frame, "")
                block = self._block_of(statement)
                if statement.orelse is not None and statement.orelse in path:
                    block = self._block_of(statement.orelse)
                self._exec_goal(block, frame, path, goal)
            elif isinstance(statement, cst.With):
                for item in statement.items:
                    value = self._eval(item.item, frame)
                    if item.asname is not None:
                        self._assign(item.asname.name, value, frame, statement)
                self._exec_goal(self._block_of(statement), frame, path, goal)
            elif isinstance(statement, (cst.Try, cst.TryStar)):
                self._goal_try(statement, frame, path, goal)
            return

    def _goal_if(self, statement: cst.If, frame: Frame, path: set[cst.CSTNode], goal: cst.CSTNode) -> None:
        value = self._eval(statement.test, frame)
        into_body = statement.body in path
        if isinstance(value.v, Opaque):
            self.assume(frame, statement.test, f"assumed {'true' if into_body else 'false'} on the path to the cited line")
            if value.v.reason == "argument not known":
                frame.guards.add(value.v.hint)
            truth = into_body
        else:
            truth = self._truth(value, frame, statement.test)
            if truth != into_body:
                location = self.loc(frame, statement.test)
                raise _GoalBlocked(f"the condition at {location} is {str(bool(truth)).lower()}", location)
        self.control.append(self._control_entry(statement.test, frame, value, truth))
        try:
            if into_body:
                self._exec_goal(self._block_of(statement), frame, path, goal)
            elif isinstance(statement.orelse, cst.If):
                self._exec_goal([statement.orelse], frame, path, goal)
            elif statement.orelse is not None:
                self._exec_goal(self._block_of(statement.orelse), frame, path, goal)
        finally:
            self.control.pop()

    def _goal_try(self, statement: cst.Try | cst.TryStar, frame: Frame, path: set[cst.CSTNode], goal: cst.CSTNode) -> None:
        if statement.body in path:
            self._exec_goal(self._block_of(statement), frame, path, goal)
            return
        handler = next((h for h in statement.handlers if h in path), None)
        try:
            self._exec_block(self._block_of(statement), frame)
        except EvalRaise as error:
            matched = self._matching_handler(statement, error, frame)
            if handler is None or matched is not handler:
                raise
            self._record_handled(error, handler, frame)
            self._exec_goal(self._block_of(handler), frame, path, goal)
            return
        if handler is not None:
            location = self.loc(frame, handler)
            raise _GoalBlocked(f"the except branch at {location} runs only if the try block raises; it does not", location)
        final = statement.orelse if statement.orelse is not None and statement.orelse in path else statement.finalbody
        if final is not None:
            self._exec_goal(self._block_of(final), frame, path, goal)

    # ------------------------------------------------------------------------------------------
    # assignment
    # ------------------------------------------------------------------------------------------

    def _record_assignment(self, value: Val, frame: Frame, line: cst.CSTNode, note: str) -> Val:
        if isinstance(value.v, Opaque) and not value.src:
            return value
        key = self.node("assign", frame, line, note, value.src)
        self.graph.observe(key, describe(value))
        return Val(value.v, frozenset({key}))

    def _assign(self, target: cst.BaseExpression, value: Val, frame: Frame, line: cst.CSTNode, record: bool = True) -> None:
        if isinstance(target, cst.Name):
            if record:
                value = self._record_assignment(value, frame, line, f"{target.value} =")
            if isinstance(value.v, Opaque):
                value = Val(value.v.named(target.value), value.src)
            frame.locals[target.value] = value
        elif isinstance(target, (cst.Tuple, cst.List)):
            self._unpack(target, value, frame, line)
        elif isinstance(target, cst.Attribute):
            owner = self._eval(target.value, frame)
            if record:
                value = self._record_assignment(value, frame, line, f".{target.attr.value} =")
            if isinstance(value.v, Opaque):
                value = Val(value.v.named(target.attr.value), value.src)
            self._setattr(owner, target.attr.value, value)
        elif isinstance(target, cst.Subscript):
            owner = self._eval(target.value, frame)
            if len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index):
                key = self._eval(target.slice[0].slice.value, frame)
                if record:
                    value = self._record_assignment(value, frame, line, "item =")
                self._setitem(owner, key, value)
        elif isinstance(target, cst.StarredElement):
            self._assign(target.value, value, frame, line, record)

    def _unpack(self, target: cst.Tuple | cst.List, value: Val, frame: Frame, line: cst.CSTNode) -> None:
        elements = [element.value if isinstance(element, cst.Element) else element for element in target.elements]
        items = self._iterate(value, frame, target, count=len(elements))
        star = next((i for i, element in enumerate(target.elements) if isinstance(element, cst.StarredElement)), None)
        if items is None or (star is None and len(items) != len(elements)):
            parent = value.v if isinstance(value.v, Opaque) else None
            for element in elements:
                hint = _name_of(element) or "item"
                self._assign(element, Val(Opaque(hint, "", "unpacked from an unknown value", parent=parent), value.src), frame, line)
            return
        if star is not None:
            tail = len(elements) - star - 1
            middle = items[star : len(items) - tail] if tail else items[star:]
            items = items[:star] + [Val(MutList(list(middle)))] + (items[len(items) - tail :] if tail else [])
        for element, item in zip(elements, items, strict=False):
            self._assign(element, item.with_src(value.src), frame, line)

    def _setattr(self, owner: Val, name: str, value: Val) -> None:
        value = value.with_src(owner.src)  # which object holds the value is part of where it came from
        if isinstance(owner.v, ObjRef):
            owner.v.fields[name] = value
            self.stores.append((owner.v, name, value))
        elif isinstance(owner.v, DecoderLayer):
            owner.v.fields[name] = value
        elif isinstance(owner.v, ModuleRef):
            self._globals[(id(owner.v.info), name)] = value

    def _setitem(self, owner: Val, key: Val, value: Val) -> None:
        if isinstance(owner.v, MutDict) and _hashable(key.v):
            owner.v.items[key.v] = value
        elif isinstance(owner.v, MutList) and isinstance(key.v, int) and -len(owner.v.items) <= key.v < len(owner.v.items):
            owner.v.items[key.v] = value

    # ------------------------------------------------------------------------------------------
    # expressions
    # ------------------------------------------------------------------------------------------

    def _eval(self, node: cst.BaseExpression, frame: Frame) -> Val:
        self._tick()
        method = getattr(self, "_e_" + type(node).__name__, None)
        if method is None:
            return Val(Opaque(type(node).__name__, "", "expression not modeled"))
        return method(node, frame)

    def _e_Name(self, node: cst.Name, frame: Frame) -> Val:
        if node.value in ("True", "False", "None"):
            return Val({"True": True, "False": False, "None": None}[node.value])
        return self._lookup(frame, node.value, node)

    def _e_Integer(self, node: cst.Integer, frame: Frame) -> Val:
        return Val(node.evaluated_value)

    def _e_Float(self, node: cst.Float, frame: Frame) -> Val:
        return Val(node.evaluated_value)

    def _e_SimpleString(self, node: cst.SimpleString, frame: Frame) -> Val:
        value = node.evaluated_value
        return Val(value if isinstance(value, str) else Opaque("bytes"))

    def _e_ConcatenatedString(self, node: cst.ConcatenatedString, frame: Frame) -> Val:
        value = node.evaluated_value
        return Val(value if isinstance(value, str) else Opaque("string"))

    def _e_FormattedString(self, node: cst.FormattedString, frame: Frame) -> Val:
        return Val(Opaque("f-string", "", "formatted string"))

    def _e_Ellipsis(self, node: cst.Ellipsis, frame: Frame) -> Val:
        return Val(Ellipsis)

    def _e_Await(self, node: cst.Await, frame: Frame) -> Val:
        return self._eval(node.expression, frame)

    def _e_NamedExpr(self, node: cst.NamedExpr, frame: Frame) -> Val:
        value = self._eval(node.value, frame)
        self._assign(node.target, value, frame, node, record=False)
        return value

    def _elements(self, elements: Any, frame: Frame) -> list[Val]:
        values: list[Val] = []
        for element in elements:
            if isinstance(element, cst.StarredElement):
                inner = self._iterate(self._eval(element.value, frame), frame, element)
                values.extend(inner if inner is not None else [Val(Opaque("starred"))])
            else:
                values.append(self._eval(element.value, frame))
        return values

    def _e_List(self, node: cst.List, frame: Frame) -> Val:
        items = self._elements(node.elements, frame)
        return Val(MutList(items), _sources(items))

    def _e_Tuple(self, node: cst.Tuple, frame: Frame) -> Val:
        items = self._elements(node.elements, frame)
        return Val(MutList(items, tuple_like=True), _sources(items))

    def _e_Set(self, node: cst.Set, frame: Frame) -> Val:
        values = self._elements(node.elements, frame)
        return library.make_set(values, frozen=False)

    def _e_Dict(self, node: cst.Dict, frame: Frame) -> Val:
        items: dict[Any, Val] = {}
        for element in node.elements:
            if isinstance(element, cst.DictElement):
                key = self._eval(element.key, frame)
                if _hashable(key.v):
                    items[key.v] = self._eval(element.value, frame)
            else:
                inner = self._eval(element.value, frame)
                if isinstance(inner.v, MutDict):
                    items.update(inner.v.items)
        return Val(MutDict(items))

    def _e_Attribute(self, node: cst.Attribute, frame: Frame) -> Val:
        owner = self._eval(node.value, frame)
        return self._getattr(owner, node.attr.value, frame, node)

    def _e_Subscript(self, node: cst.Subscript, frame: Frame) -> Val:
        owner = self._eval(node.value, frame)
        if len(node.slice) != 1:
            keys = [self._slice_value(element.slice, frame) for element in node.slice]
            return library.subscript(self, owner, Val(MutList(keys, tuple_like=True)), frame, node)
        return library.subscript(self, owner, self._slice_value(node.slice[0].slice, frame), frame, node)

    def _slice_value(self, element: cst.BaseSlice, frame: Frame) -> Val:
        if isinstance(element, cst.Index):
            return self._eval(element.value, frame)
        assert isinstance(element, cst.Slice)
        parts = [self.concrete(self._eval(part, frame), frame, part) if part is not None else NONE for part in (element.lower, element.upper, element.step)]
        if all(isinstance(part.v, (int, type(None))) for part in parts):
            return Val(slice(*(part.v for part in parts)), frozenset().union(*(part.src for part in parts)))
        return Val(Opaque("slice", "", "slice bounds unknown"))

    def _e_IfExp(self, node: cst.IfExp, frame: Frame) -> Val:
        value = self._eval(node.test, frame)
        if isinstance(value.v, Opaque) and _guards_its_read(node.test, [node.body], [node.orelse]):
            truth = True
            self.assume(frame, node.test, f"unknown runtime condition assumed true: {GUARD_ASSUMED}")
        else:
            truth = self._truth(value, frame, node.test)
        self.control.append(self._control_entry(node.test, frame, value, truth))
        try:
            chosen = self._eval(node.body if truth else node.orelse, frame)
        finally:
            self.control.pop()
        return chosen.with_src(value.src)

    def _e_BooleanOperation(self, node: cst.BooleanOperation, frame: Frame) -> Val:
        """Three-valued `and`/`or`: an unknown operand stays unknown unless the other decides."""
        left = self._eval(node.left, frame)
        short_circuit = isinstance(node.operator, cst.Or)  # the value of `left` that decides alone
        left_truth = self._known_truth(left, frame, node.left)
        if left_truth is not None:
            if left_truth == short_circuit:
                return left
            return self._eval(node.right, frame).with_src(left.src)
        right = self._eval(node.right, frame)
        if self._known_truth(right, frame, node.right) == short_circuit:
            return right.with_src(left.src)
        off = (_off(left) or _off(right)) if short_circuit else (_off(left) and _off(right))
        return Val(Opaque("condition", "", "depends on an unknown value", off=off), left.src | right.src)

    def _known_truth(self, value: Val, frame: Frame, node: cst.CSTNode) -> bool | None:
        if isinstance(value.v, Opaque):
            assumption = BY_NAME.get(value.v.hint)
            if assumption is None or not isinstance(assumption.value, bool):
                return None
        return self._truth(value, frame, node)

    def _e_UnaryOperation(self, node: cst.UnaryOperation, frame: Frame) -> Val:
        operand = self._eval(node.expression, frame)
        if isinstance(node.operator, cst.Not):
            known = self._known_truth(operand, frame, node.expression)
            if known is None:  # stays unknown: the `if` around it decides, knowing it is negated
                return Val(Opaque("not", "", "negation of an unknown value", off=not _off(operand)), operand.src)
            return Val(not known, operand.src)
        if isinstance(operand.v, (int, float)) and not isinstance(operand.v, bool):
            if isinstance(node.operator, cst.Minus):
                return Val(-operand.v, operand.src)
            if isinstance(node.operator, cst.Plus):
                return operand
            if isinstance(node.operator, cst.BitInvert) and isinstance(operand.v, int):
                return Val(~operand.v, operand.src)
        return Val(Opaque("unary", "", "operand unknown"), operand.src)

    def _e_BinaryOperation(self, node: cst.BinaryOperation, frame: Frame) -> Val:
        left = self._eval(node.left, frame)
        right = self._eval(node.right, frame)
        return self._binary(type(node.operator).__name__, left, right, frame, node)

    def _binary(self, operator: str, left: Val, right: Val, frame: Frame, node: cst.CSTNode) -> Val:
        return library.binary(self, operator, left, right, frame, node)

    def _e_Comparison(self, node: cst.Comparison, frame: Frame) -> Val:
        left = self._eval(node.left, frame)
        src = left.src
        result: Any = True
        for target in node.comparisons:
            right = self._eval(target.comparator, frame)
            src = src | right.src
            if isinstance(target.operator, (cst.Is, cst.IsNot)):
                left, right = self._unset(left, frame, node.left), self._unset(right, frame, target.comparator)
                src = src | left.src | right.src
            outcome = library.compare(self, type(target.operator).__name__, left, right)
            if isinstance(outcome, Opaque):
                return Val(outcome, src)
            if not outcome:
                result = False
                break
            left = right
        return Val(result, src)

    def _comprehension(self, for_in: cst.CompFor, frame: Frame, produce: Callable[[Frame], None]) -> None:
        iterable = self._eval(for_in.iter, frame)
        items = self._iterate(iterable, frame, for_in.iter)
        if items is None:
            return
        for count, item in enumerate(items):
            if count >= MAX_UNROLL:
                break
            self._assign(for_in.target, item.with_src(iterable.src), frame, for_in, record=False)
            keep = True
            for condition in for_in.ifs:
                test = self._eval(condition.test, frame)
                if not self._truth(test, frame, condition.test):
                    keep = False
                    break
            if not keep:
                continue
            if for_in.inner_for_in is not None:
                self._comprehension(for_in.inner_for_in, frame, produce)
            else:
                produce(frame)

    def _comp_frame(self, frame: Frame) -> Frame:
        inner = Frame(frame.module, frame.anchor, frame.func, dict(frame.locals), frame.closure, frame.lazy, frame.self_val, frame.owner, frame.current)
        inner.resolving = frame.resolving
        return inner

    def _e_ListComp(self, node: cst.ListComp, frame: Frame) -> Val:
        results: list[Val] = []
        inner = self._comp_frame(frame)
        self._comprehension(node.for_in, inner, lambda f: results.append(self._eval(node.elt, f)))
        return Val(MutList(results), _sources(results))

    def _e_GeneratorExp(self, node: cst.GeneratorExp, frame: Frame) -> Val:
        value = self._e_ListComp(node, frame)  # type: ignore[arg-type]
        value.v.tuple_like = True
        return value

    def _e_SetComp(self, node: cst.SetComp, frame: Frame) -> Val:
        return library.make_set(self._e_ListComp(node, frame).v.items, frozen=False)  # type: ignore[arg-type]

    def _e_DictComp(self, node: cst.DictComp, frame: Frame) -> Val:
        items: dict[Any, Val] = {}
        inner = self._comp_frame(frame)

        def produce(f: Frame) -> None:
            key = self._eval(node.key, f)
            if _hashable(key.v):
                items[key.v] = self._eval(node.value, f)

        self._comprehension(node.for_in, inner, produce)
        return Val(MutDict(items), _sources(list(items.values())))

    def _e_Lambda(self, node: cst.Lambda, frame: Frame) -> Val:
        return Val(LambdaRef(node, frame.module, frame.anchor, frame))

    def _e_Call(self, node: cst.Call, frame: Frame) -> Val:
        fn = self._eval(node.func, frame)
        args, kwargs = self._call_arguments(node, frame)
        return self._call(fn, args, kwargs, node, frame)

    def _call_arguments(self, node: cst.Call, frame: Frame) -> tuple[list[Val], dict[str, Val]]:
        args: list[Val] = []
        kwargs: dict[str, Val] = {}
        for arg in node.args:
            value = self._eval(arg.value, frame)
            if arg.star == "*":
                items = self._iterate(value, frame, arg.value)
                args.extend(items if items is not None else [])
            elif arg.star == "**":
                if isinstance(value.v, MutDict):
                    kwargs.update({str(key): item for key, item in value.v.items.items()})
            elif arg.keyword is not None:
                kwargs[arg.keyword.value] = value
            else:
                args.append(value)
        return args, kwargs

    # ------------------------------------------------------------------------------------------
    # attributes
    # ------------------------------------------------------------------------------------------

    def _getattr(self, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        payload = owner.v
        if isinstance(payload, ObjRef):
            value = self._object_attr(owner, name)
            return value.with_src(owner.src) if not isinstance(value.v, (FuncRef, BuiltinFn)) else value
        if isinstance(payload, ConfigObj):
            return library.config_attr(self, owner, name, frame, node, default=None)
        if isinstance(payload, ModuleRef):
            module = payload.info
            if name in module.classes or name in module.functions or name in module.imports or name in module.assignments:
                return self._global(module, name)
            submodule = self.index.module_by_name(f"{module.name}.{name}")
            return Val(ModuleRef(submodule)) if submodule else Val(Opaque(name, f"{module.name}.{name}"))
        if isinstance(payload, ClassRef):
            return self._class_attr(payload.info, name, None)
        if isinstance(payload, EnumMember):
            return self._member_attr(owner, name)
        if isinstance(payload, SuperRef):
            return self._super_attr(payload, name)
        if isinstance(payload, DecoderLayer):
            if name in payload.fields:
                return payload.fields[name]
            instance = self.layer_instance(payload)
            if instance is not None:
                return self._object_attr(instance, name)
            return Val(Opaque(name, f"layer.{name}", "field never assigned: attribute of a decoder layer"), owner.src)
        if isinstance(payload, Opaque):
            return self._opaque_attr(owner, name, frame, node)
        return library.attribute(self, owner, name, frame, node)

    def _opaque_attr(self, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        opaque: Opaque = owner.v
        if name in self.links:
            value, link_node = self.links[name]
            if link_node is not None and link_node.kind == "setting" and (name, value.v, link_node) not in self.settings_read:
                self.settings_read.append((name, value.v, link_node))
            sources = owner.src | value.src | (frozenset({link_node}) if link_node else NO_SRC)
            if frame is not None and node is not None:
                key = self.node("link", frame, node, f"`.{name}` read here is the value stored by that name", sources)
                return Val(value.v, frozenset({key}))
            return Val(value.v, sources)
        if name == "hf_config" and opaque.hint in DRAFT_MODEL_CONFIGS and self.draft is not None:
            whole = self.graph.node("config", self.draft.location(()), f"the draft's {self.draft.display}", "", ())
            return Val(ConfigObj(self.draft), owner.src | {whole})
        if self.reads_draft_config(opaque, name):
            return library.config_attr(self, Val(ConfigObj(self.draft)), name, frame, node, default=None, missing_raises=True)
        return Val(Opaque(name, f"{opaque.origin or opaque.hint}.{name}", "attribute of an unknown object"), owner.src)

    def _super_attr(self, proxy: SuperRef, name: str) -> Val:
        instance: ObjRef = proxy.instance.v
        order = self.mro(instance.cls)
        after = order[order.index(proxy.owner) + 1 :] if proxy.owner in order else []
        for klass in after:
            if name in klass.methods:
                return Val(FuncRef(klass.methods[name], bound=proxy.instance))
            if name in klass.attributes:
                return self._class_attr(klass, name, proxy.instance)
        return Val(Opaque(name, f"super.{name}", "method of a base class outside the analyzed files"))

    def find_methods(self, name: str) -> list[FunctionInfo]:
        """Methods called `name` in the analyzed files (for calls that name a method by string)."""
        needle = f"def {name}("
        found: list[FunctionInfo] = []
        for relpath in self.index.tree.grep([needle])[needle]:
            self.index.allow(relpath)  # named by the call: worth parsing whatever its anchors
            module = self.index.load(relpath)
            if module is None:
                continue
            found.extend(info for info in module.all_functions if info.owner is not None and info.name == name)
        return found

    def reads_draft_config(self, opaque: Opaque, name: str) -> bool:
        """`<unknown HF config>.<draft key>`: a read of the draft's config.json."""
        return name in DRAFT_KEYS and self.draft is not None and _config_like(opaque)

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        cached = self._mro.get(id(cls))
        if cached is not None:
            return cached
        self._mro[id(cls)] = [cls]
        order = [cls]
        frame = self._module_frame(cls.module, cls.node)
        for base in cls.base_expressions:
            try:
                value = self._eval(base, frame)
            except (EvalRaise, BudgetExceeded):
                continue
            if isinstance(value.v, ClassRef):
                for inherited in self.mro(value.v.info):
                    if inherited not in order:
                        order.append(inherited)
        self._mro[id(cls)] = order
        return order

    def _class_attr(self, cls: ClassInfo, name: str, instance: Val | None) -> Val:
        for klass in self.mro(cls):
            if name in klass.methods:
                method = klass.methods[name]
                kinds = _decorators(method.node)
                if "staticmethod" in kinds:
                    return Val(FuncRef(method))
                if "classmethod" in kinds:
                    return Val(FuncRef(method, bound=Val(ClassRef(cls))))
                if "property" in kinds and instance is not None:
                    return self._call(Val(FuncRef(method, bound=instance)), [], {}, None, None)
                return Val(FuncRef(method, bound=instance))
            if name in klass.attributes:
                if self.is_enum(klass) and not name.startswith("_"):
                    return Val(EnumMember(klass, name))
                frame = self._module_frame(klass.module, klass.node)
                try:
                    return self._eval(klass.attributes[name], frame)
                except EvalRaise:
                    break
        return Val(Opaque(name, f"{cls.name}.{name}", "no such attribute in the analyzed class"))

    def is_enum(self, cls: ClassInfo) -> bool:
        """A subclass of `Enum` (or `IntEnum`, `StrEnum`, `Flag`), named in the analyzed bases."""
        if id(cls) not in self._enums:
            self._enums[id(cls)] = any(
                (_dotted(base) or "").rsplit(".", 1)[-1] in _ENUM_BASES for klass in self.mro(cls) for base in klass.base_expressions
            )
        return self._enums[id(cls)]

    def _member_attr(self, owner: Val, name: str) -> Val:
        member: EnumMember = owner.v
        if name == "name":
            return Val(member.name, owner.src)
        if name == "value":
            frame = self._module_frame(member.cls.module, member.cls.node)
            try:
                return self._eval(member.cls.attributes[member.name], frame).with_src(owner.src)
            except EvalRaise:
                return Val(Opaque("value", f"{member!r}.value", "enum value not evaluated"), owner.src)
        return self._class_attr(member.cls, name, owner)

    def _object_attr(self, owner: Val, name: str) -> Val:
        obj: ObjRef = owner.v
        if name in obj.fields:
            return obj.fields[name]
        if name == "__class__":
            return Val(ClassRef(obj.cls))
        for klass in self.mro(obj.cls):
            if name in klass.methods or name in klass.attributes:
                return self._class_attr(obj.cls, name, owner)
        if obj.backing is not None and name in _LIST_METHODS:
            return Val(BuiltinFn(f"list.{name}", Val(obj.backing)))
        value = self._lazy_field(owner, name)
        if value is not None:
            return value
        return Val(Opaque(name, f"{obj.cls.name}.{name}", "field never assigned in the analyzed code"))

    def _store_sites(self, cls: ClassInfo, name: str) -> list[tuple[ClassInfo, FunctionInfo, cst.CSTNode]]:
        """Statements that assign `self.<name>`, __init__ first, last-in-source first."""
        init_sites: list[tuple[ClassInfo, FunctionInfo, cst.CSTNode]] = []
        other_sites: list[tuple[ClassInfo, FunctionInfo, cst.CSTNode]] = []
        for klass in self.mro(cls):
            for method in klass.methods.values():
                if not method.may_store(name):
                    continue
                found = _self_stores(method.node, name)
                target = init_sites if method.name == "__init__" else other_sites
                target.extend((klass, method, statement) for statement in reversed(found))
        return init_sites + other_sites

    @contextmanager
    def _isolated(self) -> Iterator[None]:
        """Evaluate something out of its execution order (a field's definition, a global): the
        conditions around the point that asked for it did not decide its value."""
        control = self.control
        self.control = []
        try:
            yield
        finally:
            self.control = control

    def _lazy_field(self, owner: Val, name: str) -> Val | None:
        obj: ObjRef = owner.v
        key = (obj.id, name)
        if key in self._resolving_fields:
            return None
        self._resolving_fields.add(key)
        with self._isolated():
            return self._resolve_field(owner, name, key)

    def _resolve_field(self, owner: Val, name: str, key: tuple[int, str]) -> Val | None:
        obj: ObjRef = owner.v
        try:
            for klass, method, statement in self._store_sites(obj.cls, name):
                bindings = self._init_bindings(owner, klass) if method.name == "__init__" else {}
                result = self.run_to(method, statement, owner, bindings)
                if result.reached and name in obj.fields:
                    return obj.fields[name]
            return None
        finally:
            self._resolving_fields.discard(key)

    def _init_bindings(self, owner: Val, klass: ClassInfo) -> dict[str, Val]:
        """The arguments `klass.__init__` received while constructing `owner`."""
        obj: ObjRef = owner.v
        chain = [c for c in self.mro(obj.cls) if "__init__" in c.methods]
        if not chain or klass not in chain:
            return {}
        args, kwargs = obj.init_args if obj.init_args is not None else (None, None)
        position = chain.index(klass)
        if args is None:
            return {}
        if position == 0:
            return self._bind_params(chain[0].methods["__init__"], args, kwargs or {}, owner, chain[0].module)
        child = chain[position - 1]
        child_init = child.methods["__init__"]
        call = _super_init_call(child_init.node)
        if call is None:
            return {}
        result = self.run_to(child_init, call, owner, self._init_bindings(owner, child))
        if not result.reached or result.frame is None:
            return {}
        frame = result.frame
        call_args: list[Val] = []
        call_kwargs: dict[str, Val] = {}
        explicit_self = isinstance(call.func, cst.Attribute) and not _is_super_call(call.func.value)
        for arg in call.args[1:] if explicit_self else call.args:
            value = self._eval(arg.value, frame)
            if arg.keyword is not None:
                call_kwargs[arg.keyword.value] = value
            elif arg.star == "":
                call_args.append(value)
        return self._bind_params(klass.methods["__init__"], call_args, call_kwargs, owner, klass.module)

    # ------------------------------------------------------------------------------------------
    # calls
    # ------------------------------------------------------------------------------------------

    def _params(self, node: cst.FunctionDef | cst.Lambda) -> list[cst.Param]:
        params = node.params
        return [*params.posonly_params, *params.params]

    def _bind_params(self, func: FunctionInfo, args: list[Val], kwargs: dict[str, Val], self_val: Val | None, module: ModuleInfo) -> dict[str, Val]:
        return self._bind(func.node, args, kwargs, self_val, self._module_frame(module, func.node))

    def _bind(self, node: cst.FunctionDef | cst.Lambda, args: list[Val], kwargs: dict[str, Val], self_val: Val | None, default_frame: Frame, open_varargs: bool = False) -> dict[str, Val]:
        """Parameters bound as Python would bind them; what no argument gives is its default, else
        unknown. With `open_varargs` (a function entered on its own), *args and **kwargs are unknown."""
        bound: dict[str, Val] = {}
        positional = self._params(node)
        values = list(args)
        if self_val is not None and positional:
            bound[positional[0].name.value] = self_val
            positional = positional[1:]
        remaining = dict(kwargs)

        def argument(param: cst.Param, values: list[Val]) -> Val:
            name = param.name.value
            if values:
                return values.pop(0)
            if name in remaining:
                return remaining.pop(name)
            if param.default is not None:
                return self._eval(param.default, default_frame)
            return Val(Opaque(name, "", "argument not known"))

        for param in positional:
            bound[param.name.value] = argument(param, values)
        params = node.params
        for param in params.kwonly_params:
            bound[param.name.value] = argument(param, [])
        if isinstance(params.star_arg, cst.Param):
            name = params.star_arg.name.value
            bound[name] = Val(Opaque(name)) if open_varargs else Val(MutList(values, tuple_like=True))
        if params.star_kwarg is not None:
            name = params.star_kwarg.name.value
            bound[name] = Val(Opaque(name)) if open_varargs else Val(MutDict(dict(remaining)))
        return bound

    def _bind_unknown_params(self, func: FunctionInfo, bindings: dict[str, Val], self_val: Val | None) -> dict[str, Val]:
        """Parameters for a goal-directed run: given bindings, else defaults, else unknown."""
        receiver = None if "staticmethod" in _decorators(func.node) else self_val
        bound = self._bind(func.node, [], dict(bindings), receiver, self._module_frame(func.module, func.node), open_varargs=True)
        return {**bindings, **bound}

    def _call(self, fn: Val, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None) -> Val:
        payload = fn.v
        if isinstance(payload, FuncRef):
            return self._call_function(payload, args, kwargs, node, frame)
        if isinstance(payload, LambdaRef):
            inner = Frame(payload.module, payload.anchor, None, {}, enclosing=payload.frame)
            inner.locals.update(self._bind(payload.node, args, kwargs, None, inner))
            return self._eval(payload.node.body, inner)
        if isinstance(payload, ClassRef):
            return self._instantiate(payload.info, args, kwargs, node, frame)
        if isinstance(payload, BuiltinFn):
            return library.call_builtin(self, payload, fn, args, kwargs, node, frame)
        if isinstance(payload, DecoderLayer):
            sources = fn.src.union(*(arg.src for arg in [*args, *kwargs.values()]))
            if any(_is_capture_target(arg) for arg in [*args, *kwargs.values()]):
                self._run_layer_code(payload, args, kwargs, node, frame)
            call_node = self._call_node(frame, node, sources, f"decoder layer {payload.index}")
            if payload.stack is not None:
                self.layer_calls.update(dict.fromkeys(call_node, payload.stack))
            return Val(TensorVal("layer_out", layer=payload.index), call_node)
        if isinstance(payload, Opaque):
            return library.call_opaque(self, fn, args, kwargs, node, frame)
        if isinstance(payload, ObjRef):
            call = self._object_attr(fn, "__call__") if self._has_method(payload.cls, "__call__") else None
            if call is not None:
                return self._call(call, args, kwargs, node, frame)
            forward = self._object_attr(fn, "forward") if self._has_method(payload.cls, "forward") else None
            if forward is not None:
                return self._call(forward, args, kwargs, node, frame)
        return Val(Opaque("call", "", "call of a value that is not callable here"))

    def _has_method(self, cls: ClassInfo, name: str) -> bool:
        return any(name in klass.methods for klass in self.mro(cls))

    def _call_node(self, frame: Frame | None, node: cst.CSTNode | None, sources: frozenset[NodeKey], note: str) -> frozenset[NodeKey]:
        if frame is None or node is None or not sources:
            return NO_SRC
        return frozenset({self.node("call", frame, node, note, sources)})

    def _call_function(self, ref: FuncRef, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None) -> Val:
        func = ref.info
        if self.depth >= MAX_DEPTH:
            return Val(Opaque(func.name, func.qualname, "call depth limit reached"))
        sources = NO_SRC
        if frame is not None and node is not None:
            incoming = frozenset().union(*(arg.src for arg in [*args, *kwargs.values()])) if (args or kwargs) else NO_SRC
            if incoming:
                key = self.node("call", frame, node, f"calls {func.qualname}", incoming)
                sources = frozenset({key})
        callee = self._function_frame(func, ref.bound, closure=ref.closure)
        bound = self._bind(func.node, [a.with_src(sources) if sources else a for a in args], {k: (v.with_src(sources) if sources else v) for k, v in kwargs.items()}, ref.bound, self._module_frame(func.module, func.node))
        callee.locals.update(bound)
        appends_before = len(self.appends)
        self.depth += 1
        try:
            self._exec_block(self._block_of(func.node), callee)
        except _Return as returned:
            return returned.value
        except RecursionError:
            return Val(Opaque(func.name, func.qualname, "too deeply nested to evaluate"))
        finally:
            self.depth -= 1
            self._collect(ref, args, appends_before, node, frame)
        return NONE

    def _collect(self, ref: FuncRef, args: list[Val], appends_before: int, node: cst.CSTNode | None, frame: Frame | None) -> None:
        """A collector's `append`/`capture` holds what it is handed, even when its body writes into a
        buffer the analysis cannot follow (a packed tensor, a preallocated slot)."""
        receiver = ref.bound.v if ref.bound is not None else None
        if ref.info.name not in _COLLECTOR_METHODS or not isinstance(receiver, ObjRef) or len(self.appends) > appends_before:
            return
        tensor = next((arg for arg in args if isinstance(arg.v, TensorVal)), None)
        if tensor is None:
            return
        if receiver.backing is None:
            receiver.backing = MutList([])
        receiver.backing.items.append(self.record_append(receiver.backing, tensor, frame, node))

    def _instantiate(self, cls: ClassInfo, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None) -> Val:
        obj = ObjRef(cls, init_args=(list(args), dict(kwargs)))
        if self._is_list_class(cls):
            obj.backing = MutList([])
        return Val(obj)

    def _is_list_class(self, cls: ClassInfo) -> bool:
        """Whether instances are Python lists (a class deriving from `list` or `List`)."""
        return any(_dotted(base) in ("list", "List", "typing.List") for klass in self.mro(cls) for base in klass.base_expressions)

    # ------------------------------------------------------------------------------------------
    # truth and iteration
    # ------------------------------------------------------------------------------------------

    def _truth(self, value: Val, frame: Frame | None, node: cst.CSTNode | None, default: bool = False) -> bool:
        payload = value.v
        if isinstance(payload, Opaque):
            assumption = BY_NAME.get(payload.hint)
            if assumption is not None and isinstance(assumption.value, bool):
                self.assume(frame, node, f"`{payload.hint}` assumed {assumption.value}: {assumption.why}")
                return assumption.value
            truth = payload.off or default
            self.assume(frame, node, f"unknown runtime condition assumed {'true' if truth else 'false'}" + (" (an optional feature off)" if payload.off else ""))
            return truth
        if isinstance(payload, (MutList,)):
            return bool(payload.items)
        if isinstance(payload, MutDict):
            return bool(payload.items)
        if isinstance(payload, SetVal):
            return bool(payload.items)
        if isinstance(payload, (TensorVal, ObjRef, FuncRef, ClassRef, EnumMember, ModuleRef, ConfigObj, LambdaRef, BuiltinFn, LayerStack, DecoderLayer)):
            return True
        try:
            return bool(payload)
        except Exception:  # noqa: BLE001 - a payload we cannot judge
            return default

    def _unset(self, value: Val, frame: Frame, node: cst.CSTNode) -> Val:
        """An unknown setting the deployment assumptions say is not given, as None."""
        if isinstance(value.v, Opaque) and value.v.hint in BY_NAME and BY_NAME[value.v.hint].value is None:
            return Val(None, value.src | self.assume(frame, node, f"`{value.v.hint}` assumed unset: {BY_NAME[value.v.hint].why}"))
        return value

    def concrete(self, value: Val, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        """Settle an unknown number by the deployment assumptions, when one applies."""
        if isinstance(value.v, Opaque):
            assumption = BY_NAME.get(value.v.hint)
            if assumption is not None:
                number = self.num_layers if assumption.value == "num_layers" else assumption.value
                if number is not None:
                    return Val(number, value.src | self.assume(frame, node, f"`{value.v.hint}` assumed {number}: {assumption.why}"))
        return value

    def layer_stack(self, value: Val, frame: Frame | None, node: cst.CSTNode | None) -> LayerStack | None:
        if isinstance(value.v, LayerStack):
            return value.v
        opaque = value.v
        if isinstance(opaque, Opaque) and opaque.hint in LAYER_STACKS and self.num_layers:
            self.assume(frame, node, f"`{opaque.hint}` taken as the target's {self.num_layers} decoder layers")
            if opaque.stack is None:
                factory = next((arg for arg in opaque.call_args() if isinstance(arg.v, (LambdaRef, FuncRef, ClassRef))), None)
                opaque.stack = LayerStack(self.num_layers, factory=factory)
            return opaque.stack
        return None

    def layer_instance(self, layer: DecoderLayer) -> Val | None:
        """The analyzed object of a decoder layer, built by the stack's factory (once)."""
        if layer.instance is None and layer.stack is not None and layer.stack.factory is not None:
            with self._isolated():
                try:
                    built = self.call(layer.stack.factory, [Val(layer.index), Val(f"layers.{layer.index}")])
                except (EvalRaise, BudgetExceeded, RecursionError):
                    built = NONE
            layer.instance = built if isinstance(built.v, ObjRef) else NONE
        return layer.instance if layer.instance is not None and isinstance(layer.instance.v, ObjRef) else None

    def _run_layer_code(self, layer: DecoderLayer, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None) -> None:
        """Run a layer's own forward for what it does with the capture list (or callback) it is
        handed; the stream it returns is the modeled one, h(index+1)."""
        entry = Val(tap_tensor(Tap(layer.index)))
        appends_before = len(self.appends)
        instance = self.layer_instance(layer)
        forward = self._object_attr(instance, "forward") if instance is not None else None
        if forward is not None and isinstance(forward.v, FuncRef):
            saved = self.links.get("residual")
            self.links["residual"] = (entry, None)  # `stream.residual` inside layer i: the stream entering it
            try:
                self._call_function(forward.v, args, kwargs, node, frame)
            except (EvalRaise, _Break, _Continue):
                pass
            finally:
                if saved is None:
                    self.links.pop("residual", None)
                else:
                    self.links["residual"] = saved
        if len(self.appends) > appends_before:
            return
        # The layer's code could not be followed to what it hands its capture hook: layers that
        # take one capture at their entry boundary, so the hook receives the stream entering it.
        for target in [*args, *kwargs.values()]:
            if _is_capture_target(target):
                src = self.assume(frame, node, f"decoder layer {layer.index} takes its capture at its entry: h{layer.index}")
                self._deliver(target, Val(entry.v, src | target.src), node, frame)

    @staticmethod
    def is_capture_hook(value: Val) -> bool:
        """A callable that captures what it is called with (a collector's bound method)."""
        payload = value.v
        return _is_capture_target(value) and not isinstance(payload, MutList)

    def _deliver(self, target: Val, value: Val, node: cst.CSTNode | None, frame: Frame | None) -> None:
        if isinstance(target.v, MutList):
            target.v.items.append(self.record_append(target.v, value, frame, node))
        elif isinstance(target.v, ObjRef):
            method = "capture" if "capture" in target.v.cls.methods else "append"
            self._call(self._object_attr(target, method), [value], {}, node, frame)
        else:
            self._call(target, [value], {}, node, frame)

    def _iterate(self, value: Val, frame: Frame | None, node: cst.CSTNode | None, count: int | None = None) -> list[Val] | None:
        return library.iterate(self, value, frame, node, count)

    def record_append(self, target: MutList, value: Val, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        controls = tuple(entry.node for entry in self.control if entry.node is not None)
        if frame is None or node is None:
            return value
        key = self.node("append", frame, node, "appended", value.src)
        self.graph.observe(key, describe(value))
        self.appends.append(AppendEvent(target.id, value, key, controls))
        return Val(value.v, frozenset({key}))


# -- syntax helpers ------------------------------------------------------------------------------


def _name_of(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return ""


def _sources(values: list[Val]) -> frozenset[NodeKey]:
    return frozenset().union(*(value.src for value in values)) if values else NO_SRC


def _stored_names(statements: list[cst.CSTNode]) -> set[str]:
    """Names and attribute names assigned anywhere in these statements (not in nested defs)."""
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
            found.update(_target_names(target))
            if isinstance(target, cst.Attribute):
                found.add(target.attr.value)
        stack.extend(children(node))
    return found


_COLLECTOR_METHODS = ("capture", "append")
_ENUM_BASES = frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"})
_LIST_METHODS = frozenset({"append", "extend", "insert", "pop", "index", "count", "copy", "sort", "reverse", "clear"})


def _is_capture_target(value: Val) -> bool:
    """A list or collector a layer may append to, or a callback it may call with a tensor."""
    payload = value.v
    if isinstance(payload, MutList):
        return not payload.tuple_like
    if isinstance(payload, ObjRef):
        return payload.backing is not None or any(name in payload.cls.methods for name in _COLLECTOR_METHODS)
    if isinstance(payload, BuiltinFn):
        return payload.bound is not None and isinstance(payload.bound.v, MutList)
    return isinstance(payload, FuncRef) and payload.bound is not None and isinstance(payload.bound.v, ObjRef)


def _unbound_parameters(result: GoalResult) -> set[str]:
    """Names of the goal call's arguments that are parameters nothing bound."""
    args, kwargs = result.args or ([], {})
    return {value.v.hint for value in [*args, *kwargs.values()] if isinstance(value.v, Opaque) and value.v.reason == "argument not known"}


def _arguments_for(site: cst.Call, function: cst.FunctionDef, parameters: set[str]) -> list[cst.BaseExpression]:
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


def _final_names(expressions: Iterable[cst.BaseExpression]) -> set[str]:
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


def _calls_to(node: cst.CSTNode, name: str) -> Iterator[cst.Call]:
    for current in walk(node):
        if isinstance(current, cst.Call):
            func = current.func
            called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
            if called == name:
                yield current


GUARD_ASSUMED = "an unknown object has the attribute its guard checks for"


def _guards_its_read(test: cst.BaseExpression, body: list, orelse: list) -> bool:
    """`hasattr(x, "a")` guarding code that reads `x.a`, with a fallback that does not use `x`
    (`x.a if hasattr(x, "a") else 0`): the object the code expects has the attribute. A chain of
    alternatives (`elif hasattr(x, "b"): ... x.b`) is duck typing, not a guard, and is left alone."""
    if not (isinstance(test, cst.Call) and _dotted(test.func) == "hasattr" and len(test.args) == 2 and isinstance(test.args[1].value, cst.SimpleString)):
        return False
    owner, name = test.args[0].value, test.args[1].value.evaluated_value

    def reads(parts: list, attribute: str | None) -> bool:
        return any(
            isinstance(found, cst.Attribute) and found.value.deep_equals(owner) and attribute in (None, found.attr.value)
            for part in parts for found in walk(part)
        )

    return reads(body, name) and not reads(orelse, None)


def _off(value: Val) -> bool:
    """A condition's truth with every unknown in it taken as off."""
    return value.v.off if isinstance(value.v, Opaque) else bool(value.v) if isinstance(value.v, (bool, int)) else False


def _always_exits(statements: list[cst.CSTNode]) -> bool:
    """Whether every path through these statements returns or raises."""
    if not statements:
        return False
    last = statements[-1]
    if isinstance(last, cst.SimpleStatementLine):
        return isinstance(last.body[-1], (cst.Return, cst.Raise))
    if isinstance(last, cst.If):
        if last.orelse is None:
            return False
        orelse = [last.orelse] if isinstance(last.orelse, cst.If) else Evaluator._block_of(last.orelse)
        return _always_exits(Evaluator._block_of(last)) and _always_exits(orelse)
    return False


def _ends_in_raise(statements: list[cst.CSTNode]) -> bool:
    if not statements:
        return False
    last = statements[-1]
    if isinstance(last, cst.SimpleStatementLine):
        return isinstance(last.body[-1], cst.Raise)
    return isinstance(last, cst.Raise)


def _returns_false(statements: list[cst.CSTNode]) -> bool:
    """The block ends in `return` of a false constant (`return False`, `return None`, `return`)."""
    last = statements[-1] if statements else None
    if isinstance(last, cst.SimpleStatementLine):
        last = last.body[-1]
    if not isinstance(last, cst.Return):
        return False
    value = last.value
    return value is None or (isinstance(value, cst.Name) and value.value in ("False", "None")) or (isinstance(value, cst.Integer) and value.value == "0")


def _hashable(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool, type(None), tuple))


def _config_like(opaque: Opaque) -> bool:
    """An unknown object that is a model's HF config (`draft_model_config.hf_config`, `config`)."""
    name = opaque.hint.lower()
    return name in ("config", "draft_config", "hf_config") or name.endswith(("hf_config", "model_config"))


def _decorators(node: cst.FunctionDef) -> set[str]:
    names = set()
    for decorator in node.decorators:
        expression = decorator.decorator
        dotted = _dotted(expression.func if isinstance(expression, cst.Call) else expression)
        if dotted:
            names.add(dotted.split(".")[-1])
    return names


def _target_names(target: cst.CSTNode) -> Iterator[str]:
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _target_names(target.value)


def _assigned_names(statement: cst.CSTNode) -> Iterator[str]:
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            yield from _assigned_names(small)
    elif isinstance(statement, cst.Assign):
        for target in statement.targets:
            yield from _target_names(target.target)
    elif isinstance(statement, (cst.AnnAssign, cst.AugAssign)):
        yield from _target_names(statement.target)
    elif isinstance(statement, cst.For):
        yield from _target_names(statement.target)
    elif isinstance(statement, cst.With):
        for item in statement.items:
            if item.asname is not None:
                yield from _target_names(item.asname.name)
    elif isinstance(statement, (cst.Import, cst.ImportFrom)):
        if not isinstance(statement.names, cst.ImportStar):
            for alias in statement.names:
                if alias.asname is not None:
                    yield from _target_names(alias.asname.name)
                else:
                    dotted = _dotted(alias.name)
                    if dotted:
                        yield dotted.split(".")[0]
    elif isinstance(statement, cst.FunctionDef):
        yield statement.name.value


def _self_stores(function: cst.FunctionDef, name: str) -> list[cst.CSTNode]:
    """Statements in `function` that assign `self.<name>` (any nesting, no inner scopes)."""
    params = function.params.params
    if not params:
        return []
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

    visit(Evaluator._block_of(function))
    return found


def _is_super_call(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "super"


def _super_init_call(function: cst.FunctionDef) -> cst.Call | None:
    """The `super().__init__(...)` (or `Base.__init__(self, ...)`) call in an __init__."""
    for current in walk(function.body, lambda node: not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))):
        if isinstance(current, cst.Call) and isinstance(current.func, cst.Attribute) and current.func.attr.value == "__init__":
            return current
    return None


sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
