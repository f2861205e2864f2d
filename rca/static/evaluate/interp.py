"""A symbolic evaluator for the Python that wires hidden states: never executes, only reads.

It interprets Python over libcst trees with abstract values (values.py): one path through the
code, with unknown runtime state settled by the policy (policy.py), every decision recorded as
an assumption at its location, and every value carrying the dataflow nodes it came from, so
that results come with citations. Two modes:

* full evaluation of a call (`call`), as the code would run it;
* goal-directed evaluation (`run_to`, goals.py): run a function only along the path to one
  statement, resolving local names on demand from their reaching definitions.

The interpreter is the mechanism: statements (statements.py), expressions and calls
(expressions.py), classes and instances (objects.py), goal-directed runs (goals.py), and here
the entry points, names, bookkeeping and the dispatch of values to the library, which models
what the analyzed code uses (Python built-ins, configs, tensors, decoder layers, launch
settings) through `interface.Interpreter` alone. A construct the evaluator does not model is
recorded as not evaluated (`events.unmodeled`), never skipped silently.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import libcst as cst

from rca.inputs.configs import ConfigFile
from rca.inputs.launch import LaunchSettings
from rca.model import Location, StepKind
from rca.static.codeindex import ClassInfo, CodeIndex, FunctionInfo, ModuleInfo
from rca.static.evaluate.expressions import Expressions
from rca.static.evaluate.goals import Goals
from rca.static.evaluate.interface import BudgetExceeded, Frame
from rca.static.evaluate.library import builtins, configs, layers, tensors
from rca.static.evaluate.library import settings as settings_model
from rca.static.evaluate.objects import Objects
from rca.static.evaluate.policy import Policy
from rca.static.evaluate.statements import Break, Continue, Control, Return, Statements
from rca.static.evaluate.trace import AppendEvent, Events, SettingRead, Unmodeled, tracing
from rca.static.evaluate.values import (
    NO_SRC,
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
)
from rca.static.graph import DataflowGraph, NodeKey

DEFAULT_BUDGET = 400_000


class Evaluator(Statements, Expressions, Objects, Goals):
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
        self.policy = Policy(num_layers)
        self.events = Events()
        self.links: dict[str, tuple[Val, NodeKey | None]] = {}
        self.budget = budget
        self.steps = 0
        self.depth = 0
        self.control: list[Control] = []
        self._globals: dict[tuple[int, str], Val] = {}
        self._resolving_fields: set[tuple[int, str]] = set()
        self._singletons: dict[int, Val] = {}
        self._mro: dict[int, list[ClassInfo]] = {}
        self._enums: dict[int, bool] = {}
        self._registered: set[int] = set()  # modules whose registering decorators ran
        # Config objects are shared, as at runtime: a field the code assigns on one, or an item it
        # writes into a list read from one, is seen by every later read (keyed by file and key path).
        self.config_fields: dict[tuple[int, tuple], dict[str, Val]] = {}
        self.config_lists: dict[tuple[int, tuple], MutList] = {}
        self.readers_of_settings: set[str] = set()  # files whose imports are followed to evaluate a setting
        if settings is not None:
            self.readers_of_settings = settings_model.apply(self, settings)

    # -- entry points ------------------------------------------------------------------------------

    def link(self, attribute: str, value: Val, node: NodeKey | None = None) -> None:
        """Make `<unknown object>.attribute` read `value` (an attribute-name link)."""
        self.links[attribute] = (value, node)

    def has_link(self, name: str) -> bool:
        return name in self.links

    @contextmanager
    def linked(self, name: str, value: Val) -> Iterator[None]:
        """While inside, `<unknown object>.name` reads `value` (a layer's `residual`, say)."""
        saved = self.links.get(name)
        self.links[name] = (value, None)
        try:
            yield
        finally:
            if saved is None:
                self.links.pop(name, None)
            else:
                self.links[name] = saved

    def new_object(self, cls: ClassInfo, args: list[Val] | None = None, kwargs: dict[str, Val] | None = None) -> Val:
        """An instance of `cls` as if constructed with these arguments (fields resolve lazily)."""
        init = None if args is None and kwargs is None else (list(args or []), dict(kwargs or {}))
        return Val(ObjRef(cls, init_args=init))

    def singleton(self, cls: ClassInfo) -> Val:
        """The one instance of `cls` that calls by method name (RPC) reach."""
        if id(cls) not in self._singletons:
            self._singletons[id(cls)] = Val(ObjRef(cls))
        return self._singletons[id(cls)]

    def call(
        self,
        fn: Val,
        args: list[Val],
        kwargs: dict[str, Val] | None = None,
        node: cst.CSTNode | None = None,
        frame: Frame | None = None,
    ) -> Val:
        return self._call(fn, args, kwargs or {}, node, frame)

    def evaluate(
        self, func: FunctionInfo, node: cst.BaseExpression, bindings: dict[str, Val], self_val: Val | None = None
    ) -> Val:
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

    def field(self, obj: Val, name: str) -> Val:
        return self.attribute(obj, name, None, None)

    def trace(self) -> Any:
        """`with evaluator.trace() as trace:` gives the events of what runs inside the block
        (appends, caught exceptions, field stores, settings read, concatenations, unmodeled
        constructs)."""
        return tracing(self.events)

    def run_script(self, module: ModuleInfo) -> Frame:
        """Evaluate a module as `python script.py` would, its top-level code and main guard."""
        frame = self._module_frame(module)
        frame.locals["__name__"] = Val("__main__")
        try:
            self._exec_block(list(module.tree.body), frame)
        except (EvalRaise, Return, Break, Continue):
            pass
        return frame

    # -- bookkeeping ---------------------------------------------------------------------------------

    def loc(self, frame: Frame, node: cst.CSTNode) -> Location:
        return frame.module.location(node, frame.anchor, frame.current)

    def node(
        self,
        kind: StepKind,
        frame: Frame,
        node: cst.CSTNode,
        note: str = "",
        sources: frozenset[NodeKey] = NO_SRC,
        control: bool = True,
    ) -> NodeKey:
        location = self.loc(frame, node)
        key = self.graph.node(kind, location, note, frame.module.code(location.line, location.end_line))
        self.graph.flow(sources, key, "data")
        if control:
            self.graph.flow([entry.node for entry in self.control if entry.node is not None], key, "control")
        return key

    def assume(self, frame: Frame | None, node: cst.CSTNode | None, note: str) -> frozenset[NodeKey]:
        if frame is None or node is None:
            return NO_SRC
        key = self.node(StepKind.ASSUMPTION, frame, node, note, control=False)
        self.events.assumed(key)
        return frozenset({key})

    def call_node(
        self, frame: Frame | None, node: cst.CSTNode | None, sources: frozenset[NodeKey], note: str
    ) -> frozenset[NodeKey]:
        if frame is None or node is None or not sources:
            return NO_SRC
        return frozenset({self.node(StepKind.CALL, frame, node, note, sources)})

    def unmodeled(self, frame: Frame, node: cst.CSTNode, construct: str) -> None:
        """Record a statement or expression the evaluator does not model, where the path reached it."""
        location = self.loc(frame, node)
        unmodeled = Unmodeled(construct, location)
        self.assume(frame, node, str(unmodeled))
        if unmodeled not in self.events.unmodeled:
            self.events.unmodeled.append(unmodeled)

    def record_append(
        self, target: MutList | MutDict, value: Val, frame: Frame | None, node: cst.CSTNode | None
    ) -> Val:
        controls = tuple(entry.node for entry in self.control if entry.node is not None)
        if frame is None or node is None:
            return value
        key = self.node(StepKind.APPEND, frame, node, "appended", value.src)
        self.graph.observe(key, describe(value))
        self.events.appends.append(AppendEvent(target.id, value, key, controls))
        return Val(value.v, frozenset({key}))

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.budget:
            raise BudgetExceeded(f"evaluation budget of {self.budget} steps exceeded")

    @contextmanager
    def isolated(self) -> Iterator[None]:
        """Evaluate something out of its execution order (a field's definition, a global): the
        conditions around the point that asked for it did not decide its value."""
        control = self.control
        self.control = []
        try:
            yield
        finally:
            self.control = control

    # -- frames and names ----------------------------------------------------------------------------

    def _function_frame(
        self, func: FunctionInfo, self_val: Val | None, lazy: bool = False, closure: dict[str, Val] | None = None
    ) -> Frame:
        return Frame(func.module, func.node, func, {}, closure, lazy, self_val, func.owner)

    def _module_frame(self, module: ModuleInfo, anchor: Any = None) -> Frame:
        return Frame(module, anchor if anchor is not None else module.tree)

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
        with self.isolated():
            value = self._resolve_global(module, name)
            self._globals[key] = value
            if isinstance(value.v, MutDict) and not value.v.items and module.assignments.get(name) is not None:
                self._register_decorated(module)  # an empty registry at import: decorators may fill it
        return value

    def _register_decorated(self, module: ModuleInfo) -> None:
        """Run the decorators of a module's functions that are the module's own functions called
        with arguments (`@register_speculator("eagle3")`), as importing the module does: they
        fill the module's registries."""
        if id(module) in self._registered:
            return
        self._registered.add(id(module))
        for function in list(module.functions.values()):
            for decorator in function.node.decorators:
                call = decorator.decorator
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)):
                    continue
                maker = module.functions.get(call.func.value)
                if maker is None or maker is function:
                    continue
                frame = self._module_frame(module)
                try:
                    wrap = self.call(Val(FuncRef(maker)), [self._eval(arg.value, frame) for arg in call.args])
                    self.call(wrap, [Val(FuncRef(function))])
                except (EvalRaise, BudgetExceeded, RecursionError):
                    continue

    def _resolve_global(self, module: ModuleInfo, name: str) -> Val:
        if name in module.classes:
            return Val(ClassRef(module.classes[name]))
        if name in module.functions:
            return Val(FuncRef(module.functions[name]))
        binding = module.imports.get(name)
        if binding is not None:
            enum = settings_model.imported_enum(self, module, binding.module, binding.attr)
            return enum if enum is not None else self._import(binding.module, binding.attr)
        statement = module.assignments.get(name)
        if statement is not None and name in module.rebound_globals:
            return Val(Opaque(name, f"{module.name}.{name}", "module state a function of its module sets at runtime"))
        if statement is not None:
            frame = self._module_frame(module)
            try:
                self._exec_stmt(statement, frame)
            except (EvalRaise, Return, Break, Continue, RecursionError):
                pass
            if name in frame.locals:
                return frame.locals[name]
        builtin = builtins.builtin(name)
        if builtin is not None:
            return Val(builtin)
        return Val(Opaque(name, f"{module.name}.{name}", "not defined in the analyzed files"))

    def _import(self, dotted: str, attr: str | None) -> Val:
        if attr is None:
            module = self.index.module_by_name(dotted)
            return (
                Val(ModuleRef(module))
                if module is not None
                else Val(Opaque(dotted.split(".")[-1], dotted, "module not analyzed"))
            )
        module = self.index.module_by_name(dotted)
        if module is not None and (
            attr in module.classes or attr in module.functions or attr in module.imports or attr in module.assignments
        ):
            return self._global(module, attr)
        submodule = self.index.module_by_name(f"{dotted}.{attr}")
        if submodule is not None:
            return Val(ModuleRef(submodule))
        return Val(Opaque(attr, f"{dotted}.{attr}", "not in the analyzed files"))

    # -- values handed to the library ----------------------------------------------------------------

    def attribute(self, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        """`owner.name`, for every kind of value."""
        payload = owner.v
        if isinstance(payload, ObjRef):
            value = self.object_attribute(owner, name)
            return value.with_src(owner.src) if not isinstance(value.v, (FuncRef, BuiltinFn)) else value
        if isinstance(payload, ConfigObj):
            return configs.attribute(self, owner, name, frame, node, default=None)
        if isinstance(payload, ModuleRef):
            module = payload.info
            if (
                name in module.classes
                or name in module.functions
                or name in module.imports
                or name in module.assignments
            ):
                return self._global(module, name)
            submodule = self.index.module_by_name(f"{module.name}.{name}")
            return Val(ModuleRef(submodule)) if submodule else Val(Opaque(name, f"{module.name}.{name}"))
        if isinstance(payload, ClassRef):
            return self._class_attr(payload.info, name, None)
        if isinstance(payload, EnumMember):
            return self._member_attr(owner, name)
        if isinstance(payload, SuperRef):
            return self._super_attr(payload, name)
        if isinstance(payload, (DecoderLayer, LayerStack)):
            return layers.attribute(self, owner, name)
        if isinstance(payload, Opaque):
            return self._unknown_attribute(owner, name, frame, node)
        if isinstance(payload, TensorVal):
            return tensors.attribute(owner, name)
        return builtins.attribute(self, owner, name, frame, node)

    def _unknown_attribute(self, owner: Val, name: str, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        """An attribute of an unknown object: a linked value (a launch setting, a field another
        object stored), the draft's config, or unknown."""
        opaque: Opaque = owner.v
        if name in self.links:
            value, link_node = self.links[name]
            read = (
                SettingRead(name, value.v, link_node)
                if link_node is not None and link_node.kind == StepKind.SETTING
                else None
            )
            if read is not None and read not in self.events.settings_read:
                self.events.settings_read.append(read)
            sources = owner.src | value.src | (frozenset({link_node}) if link_node else NO_SRC)
            if frame is not None and node is not None:
                key = self.node(
                    StepKind.LINK, frame, node, f"`.{name}` read here is the value stored by that name", sources
                )
                return Val(value.v, frozenset({key}))
            return Val(value.v, sources)
        if name == "config" and opaque.origin == tensors.HF_TARGET and self.target is not None:
            # transformers' `model.config` is the config the target model was loaded with
            whole = self.graph.node(StepKind.CONFIG, self.target.location(()), f"target config {self.target.display}")
            return Val(ConfigObj(self.target), owner.src | {whole})
        draft_config = configs.unknown_object_attribute(self, owner, name, frame, node)
        if draft_config is not None:
            return draft_config
        return Val(Opaque(name, f"{opaque.origin or opaque.hint}.{name}", "attribute of an unknown object"), owner.src)

    def subscript(self, owner: Val, key: Val, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        """`owner[key]`, for every kind of value."""
        src = owner.src | key.src
        if isinstance(key.v, Opaque):
            key = self.concrete(key, frame, node)
        index = key.v
        for model in (configs.subscript, builtins.subscript, layers.subscript):
            result = model(self, owner, index, src, frame, node)
            if result is not None:
                return result
        if isinstance(owner.v, TensorVal):
            return Val(tensors.subscript(owner.v, index), src)
        return Val(Opaque("item", "", "subscript of an unknown value"), src)

    def binary(self, operator: str, left: Val, right: Val, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        """`left <operator> right` (the libcst operator name: Add, Subtract, ...)."""
        src = left.src | right.src
        if isinstance(left.v, Opaque):
            left = self.concrete(left, frame, node)
        if isinstance(right.v, Opaque):
            right = self.concrete(right, frame, node)
        src = src | left.src | right.src
        tensor = tensors.binary(self, operator, left.v, right.v, src, frame, node)
        return tensor if tensor is not None else builtins.binary(self, operator, left.v, right.v, src, frame, node)

    def iterate(
        self, value: Val, frame: Frame | None, node: cst.CSTNode | None, count: int | None = None
    ) -> list[Val] | None:
        """The items of an iterable value (`count`: how many names it is unpacked into); None when
        they are unknown."""
        items = builtins.iterate(value)
        if items is None and isinstance(value.v, TensorVal):
            items = tensors.iterate(value.v, value.src, count)
        if items is None:
            items = layers.iterate(self, value, frame, node)
        return items

    def truth(self, value: Val, frame: Frame | None, node: cst.CSTNode | None, default: bool = False) -> bool:
        """Python's truth of a value; an unknown one is decided by the policy, and recorded."""
        payload = value.v
        if isinstance(payload, Opaque):
            truth, note = self.policy.truth(payload, default)
            self.assume(frame, node, note)
            return truth
        if isinstance(payload, (MutList, MutDict, SetVal)):
            return bool(payload.items)
        if isinstance(
            payload,
            (
                TensorVal,
                ObjRef,
                FuncRef,
                ClassRef,
                EnumMember,
                ModuleRef,
                ConfigObj,
                LambdaRef,
                BuiltinFn,
                LayerStack,
                DecoderLayer,
            ),
        ):
            return True
        try:
            return bool(payload)
        except Exception:
            return default

    def unset(self, value: Val, frame: Frame, node: cst.CSTNode) -> Val:
        """An unknown setting the deployment assumptions say is not given, as None."""
        if isinstance(value.v, Opaque):
            note = self.policy.unset(value.v)
            if note is not None:
                return Val(None, value.src | self.assume(frame, node, note))
        return value

    def concrete(self, value: Val, frame: Frame | None, node: cst.CSTNode | None) -> Val:
        """Settle an unknown number by the deployment assumptions, when one applies."""
        if isinstance(value.v, Opaque):
            settled = self.policy.number(value.v)
            if settled is not None:
                number, note = settled
                return Val(number, value.src | self.assume(frame, node, note))
        return value


sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
