"""Which target layers a trainer hooks to capture the draft's input (NVIDIA ModelOpt, NeMo Automodel)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from rca.sdk import (
    Analyzer,
    CapturedTaps,
    CaptureSet,
    DraftInput,
    Example,
    Fact,
    Finding,
    IdsOrigin,
    SideContext,
    Step,
    StepKind,
    Tap,
)
from rca.sdk.code import FunctionInfo, ModuleInfo, NodeKey, attribute_stores, call_step, children, dotted_name, walk
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.inputs import ConfigFile
from rca.sdk.sides import dump_ids
from rca.sdk.values import (
    HF_TARGET,
    BudgetExceeded,
    ConfigObj,
    EvalRaise,
    FuncRef,
    MutList,
    ObjRef,
    Opaque,
    Val,
    ints,
    tap_tensor,
)

# A forward hook is handed the layer's output (h(k+1) for transformers' decoder layers, whose
# output[0] is the residual stream after the layer); a forward pre-hook its input (hk).
HOOKS = {"register_forward_hook": True, "register_forward_pre_hook": False}

# NeMo Automodel's shape: a hook per id on `layers[id]`, kept by id, concatenated in the ids' order.
_KEYED = """
import torch


def default_aux_layer_ids(num_layers):
    return [1, num_layers // 2 - 1, num_layers - 4]


class TargetModel:
    def __init__(self, model, aux_layer_ids=None):
        self.model = model.eval()
        ids = list(aux_layer_ids) if aux_layer_ids is not None else default_aux_layer_ids(self._num_layers())
        self.aux_layer_ids = ids

    def _num_layers(self):
        return self.model.config.num_hidden_layers

    def generate_batch(self, input_ids):
        layers = list(self.model.model.layers)
        captured = {}

        def _make_hook(layer_id):
            def _hook(_module, _inputs, outputs):
                captured[layer_id] = outputs[0] if isinstance(outputs, tuple) else outputs

            return _hook

        for layer_id in self.aux_layer_ids:
            layers[layer_id].register_forward_hook(_make_hook(layer_id))
        outputs = self.model(input_ids=input_ids)
        aux_hidden_states = torch.cat([captured[layer_id] for layer_id in self.aux_layer_ids], dim=-1)
        return aux_hidden_states, outputs.logits
"""

# ModelOpt's shape: the converted target hooks every layer whose index is in its EAGLE config's ids
# and appends what each returns; the defaults are set on that config when the user gave none.
_APPENDED = """
import torch


def default_aux_layer_ids(num_layers):
    return sorted({{1, max(0, num_layers // 2 - 1), max(0, num_layers - 4)}})


class EagleModel:
    def _set_default_aux_hidden_state_layers(self):
        num_layers = self.config.num_hidden_layers
        self.eagle_config.eagle_aux_hidden_state_layer_ids = default_aux_layer_ids(num_layers)

    def _collect_hook(self, module, {handed}):
        raw = {kept}
        self._aux_hidden_states.append(raw.clone())

    def modify(self, config):
        if len(self.eagle_config.eagle_aux_hidden_state_layer_ids) == 0:
            self._set_default_aux_hidden_state_layers()
        self._aux_hidden_states = []
        for layer_idx, layer in enumerate(self.model.layers):
            if layer_idx in self.eagle_config.eagle_aux_hidden_state_layer_ids:
                layer.{hook}(self._collect_hook)

    def pop_aux_hidden_states(self):
        aux = torch.cat(self._aux_hidden_states, dim=-1)
        self._aux_hidden_states.clear()
        return aux
"""


@dataclass(frozen=True)
class HookSite:
    """A hook registered on the target's decoder layers, for each layer in a set of ids."""

    module: ModuleInfo
    function: FunctionInfo  # where the hooks are registered
    call: cst.Call  # `layer.register_forward_hook(hook)`
    ids: cst.BaseExpression  # the ids whose layers are hooked
    hook: FunctionInfo  # what each hook runs
    after: bool  # it keeps the layer's output (h(k+1)), not its input (hk)
    store: cst.CSTNode  # the statement of the hook that keeps it
    keyed: bool  # kept by layer id (concatenated in the ids' order), not appended in the order layers run
    storage: str  # the name it is kept under (`captured`, `_aux_hidden_states`)


class HookedLayers(Analyzer):
    """Reads which target layers a trainer hooks to capture the draft's input, and in which order.

    ## What it reads
    A forward hook registered on the target's decoder layers for each id of a set: `layers[id]`
    for `id` in the ids (NeMo Automodel's `HFEagle3TargetModel`), or every layer of
    `enumerate(layers)` whose index is in the ids (ModelOpt's `HFEagleModel`). The hook's own code
    says what it keeps: the layer's output (transformers' decoder layers return the residual
    stream after the layer, so id k is h(k+1)) or its input (hk), appended in the order the
    layers run or kept by id and concatenated in the ids' order. The ids are those the dumps
    record, else those the draft config records under the name the code reads them by
    (ModelOpt exports its `eagle_config.eagle_aux_hidden_state_layer_ids`), else the trainer's
    defaults, evaluated from its code with the target's layer count. Where the trainer reads
    the target's logits (`outputs.logits`), the teacher is the target's own head after its
    final norm (hN+norm).

    ## Why it matters
    Hooks on a layer's output capture one layer later than an engine whose id k is the stream
    entering layer k (vLLM): a draft trained this way and served with the same ids there is fed
    states one layer early, with no error.
    """

    code = "RCA-T107"
    name = "hooked-layers"
    sides = frozenset({"training"})
    anchors = tuple(HOOKS)
    provides = (CaptureSet, CapturedTaps, DraftInput)
    precedence = 5

    VALID = (
        Example(
            files={"speculative/target.py": _KEYED},
            target=LLAMA_8B_TARGET,
            slots=("h2", "h16", "h29"),
            verifier_last="h32+norm",
            why="the defaults [1, N//2-1, N-4], each layer's output kept by id",
        ),
        Example(
            files={
                "speculative/eagle.py": _APPENDED.format(
                    hook="register_forward_hook", handed="input, output", kept="output[0]"
                )
            },
            target=LLAMA_8B_TARGET,
            draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [28, 1, 15]}},
            slots=("h2", "h16", "h29"),
            why="the ids the draft config records, appended in the order the layers run",
        ),
        Example(
            files={
                "speculative/eagle.py": _APPENDED.format(
                    hook="register_forward_hook", handed="input, output", kept="output[0]"
                )
            },
            target=LLAMA_8B_TARGET,
            dumps={"manifest.json": {"aux_layer_ids": [2, 16, 29]}},
            slots=("h3", "h17", "h30"),
            why="the ids the dump directory records win over the defaults",
        ),
        Example(
            files={
                "speculative/eagle.py": _APPENDED.format(
                    hook="register_forward_pre_hook", handed="args", kept="args[0]"
                )
            },
            target=LLAMA_8B_TARGET,
            slots=("h1", "h15", "h28"),
            why="a pre-hook is handed the layer's input: id k is hk",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        unresolved: list[str] = []
        for site in hook_sites(ctx):
            found = self._ids(ctx, site, unresolved)
            if found is None:
                continue
            ids, origin = found
            numbers = ints(ids) or []
            layers = ctx.target.num_layers
            outside = [k for k in numbers if not 0 <= k < layers]
            if outside:
                ctx.note(f"hooked layer ids {outside} are outside 0..{layers - 1}: no layer runs those hooks")
            hooked = [k for k in numbers if 0 <= k < layers]
            order = hooked if site.keyed else sorted(set(hooked))
            taps = [Tap(k + 1) if site.after else Tap(k) for k in order]
            part = "output" if site.after else "input"
            registered, key = call_step(
                ctx,
                site.module,
                site.function,
                site.call,
                f"hooks the {part} of target layers {hooked} ({'id k is h(k+1)' if site.after else 'id k is hk'})",
                ids,
            )
            kept = _node(
                ctx,
                site.module,
                site.hook,
                site.store,
                StepKind.APPEND,
                f"each hook keeps its layer's {part}"
                + (" by layer id" if site.keyed else ", in the order the layers run"),
                [key],
            )
            ctx.graph.observe(kept, ", ".join(map(str, taps)))
            yield CaptureSet(
                "training",
                self.name,
                registered.location,
                f"{site.function.qualname} hooks layers {hooked}",
                ids=ids,
                ids_origin=origin,
                owner=Val(Opaque("target", HF_TARGET, "the target model the trainer hooks")),
                attribute=site.storage,
                value=Val(ids.v, frozenset({key})),
                delivery=registered,
            )
            yield CapturedTaps(
                "training",
                self.name,
                registered.location,
                f"the hooks keep {', '.join(map(str, taps))}",
                tensors=tuple(tap_tensor(tap) for tap in taps),
                sinks=(kept,),
            )
            joined = _concatenation(ctx, site)
            sinks = (kept,)
            if joined is not None:
                module, function, node = joined
                sinks = (
                    _node(
                        ctx,
                        module,
                        function,
                        node,
                        StepKind.CALL,
                        f"concatenated in this order: {', '.join(map(str, taps))}",
                        [kept],
                    ),
                )
            else:
                ctx.note(f"no concatenation of {site.storage} was found; slots are in the order the hooks keep them")
            teacher = _teacher(ctx, site)
            yield DraftInput(
                "training",
                self.name,
                registered.location,
                f"draft input = concatenation of the hooked layers' {part}s",
                slots=tuple(taps),
                verifier_last=Tap(layers, norm=True) if teacher is not None else None,
                sinks=sinks,
                steps=(teacher,) if teacher is not None else (),
            )
            return
        for note in unresolved:
            ctx.note(note)

    def _ids(self, ctx: SideContext, site: HookSite, unresolved: list[str]) -> tuple[Val, IdsOrigin] | None:
        """The hooked ids: as the dumps record them, as the draft config records them under the
        name the code reads, or the trainer's defaults."""
        recorded = dump_ids(ctx)
        if recorded is not None:
            return recorded, IdsOrigin.DUMP_METADATA
        path = _self_path(site.ids)
        if ctx.draft is not None and path:
            for start in range(len(path)):
                keypath = path[start:]
                present, value = ctx.draft.config.lookup(keypath)
                if present and isinstance(value, list) and value and all(type(item) is int for item in value):
                    step = ctx.draft.config.step(keypath, f"{'.'.join(keypath)} = {value} (recorded by the trainer)")
                    node = ctx.graph.from_step(StepKind.CONFIG, step, keypath)
                    ctx.graph.observe(node, str(value))
                    return Val(MutList([Val(i, frozenset({node})) for i in value]), frozenset({node})), IdsOrigin.CONFIG
        value = _defaults(ctx, site, path)
        if value is None or ints(value) is None:
            unresolved.append(
                f"the layer ids {site.module.tree.code_for_node(site.ids)} hooked in {site.function.qualname} "
                f"({site.module.relpath}) could not be evaluated, and neither the dumps nor the draft config record "
                f"them"
            )
            return None
        return value, IdsOrigin.DEFAULT


def hook_sites(ctx: SideContext) -> list[HookSite]:
    """Hooks registered on the layers of a set of ids: in files that name EAGLE-3 first (a trainer
    package also hooks layers for other drafting methods), then in file order."""
    assert ctx.index is not None
    found = []
    for relpath in sorted({relpath for anchor in HOOKS for relpath in ctx.anchor_files(anchor)}):
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if not any(f".{name}(" in function.text for name in HOOKS):
                continue
            for call, loops, tests in _registrations(function.node.body, (), ()):
                ids = _hooked_ids(call, loops, tests)
                hook = _hook_function(ctx, module, function, call.args[0].value) if ids and call.args else None
                kept = _kept(hook, HOOKS[call.func.attr.value]) if hook is not None else None  # type: ignore[attr-defined]
                if ids is not None and hook is not None and kept is not None:
                    found.append(HookSite(module, function, call, ids, hook, *kept))
    return sorted(
        found, key=lambda site: (not _names_eagle3(site.function.qualname), not _names_eagle3(site.module.text))
    )


def _names_eagle3(text: str) -> bool:
    return "eagle3" in text.lower().replace("_", "")


def _registrations(
    node: cst.CSTNode, loops: tuple[cst.For, ...], tests: tuple[cst.BaseExpression, ...]
) -> Iterator[tuple[cst.Call, tuple[cst.For, ...], tuple[cst.BaseExpression, ...]]]:
    """Hook registrations in a function body (not in the functions it defines), with the loops
    and conditions around each."""
    for child in children(node):
        if isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(child, cst.For):
            yield from _registrations(child.body, (*loops, child), tests)
            continue
        if isinstance(child, cst.If):
            yield from _registrations(child.body, loops, (*tests, child.test))
            if child.orelse is not None:
                yield from _registrations(child.orelse, loops, tests)
            continue
        if isinstance(child, cst.Call) and isinstance(child.func, cst.Attribute) and child.func.attr.value in HOOKS:
            yield child, loops, tests
        yield from _registrations(child, loops, tests)


def _hooked_ids(
    call: cst.Call, loops: tuple[cst.For, ...], tests: tuple[cst.BaseExpression, ...]
) -> cst.BaseExpression | None:
    """The ids expression whose layers the registration hooks: `layers[i]` for `i` in IDS, or
    `layer` of `enumerate(layers)` under `if index in IDS`."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if isinstance(receiver, cst.Subscript) and len(receiver.slice) == 1:
        index = receiver.slice[0].slice
        name = index.value.value if isinstance(index, cst.Index) and isinstance(index.value, cst.Name) else None
        for loop in reversed(loops):
            if name is not None and isinstance(loop.target, cst.Name) and loop.target.value == name:
                return loop.iter
    if isinstance(receiver, cst.Name):
        for loop in reversed(loops):
            target = loop.target
            if not (
                isinstance(target, cst.Tuple)
                and len(target.elements) == 2
                and isinstance(loop.iter, cst.Call)
                and dotted_name(loop.iter.func) == "enumerate"
            ):
                continue
            position, layer = (element.value for element in target.elements)
            if not (isinstance(position, cst.Name) and isinstance(layer, cst.Name) and layer.value == receiver.value):
                continue
            for test in tests:
                if (
                    isinstance(test, cst.Comparison)
                    and isinstance(test.left, cst.Name)
                    and test.left.value == position.value
                    and len(test.comparisons) == 1
                    and isinstance(test.comparisons[0].operator, cst.In)
                ):
                    return test.comparisons[0].comparator
    return None


def _hook_function(
    ctx: SideContext, module: ModuleInfo, function: FunctionInfo, expression: cst.BaseExpression
) -> FunctionInfo | None:
    """The function a hook runs: a method (`self._collect`), a local def, or the def a local
    factory returns (`_make_hook(layer_id)`)."""
    if isinstance(expression, cst.Attribute) and dotted_name(expression.value) == "self":
        owner = function.owner
        for klass in ctx.evaluator.mro(owner) if owner is not None else ():
            if expression.attr.value in klass.methods:
                return klass.methods[expression.attr.value]
        return None
    if isinstance(expression, cst.Call) and isinstance(expression.func, cst.Name):
        factory = _local_def(module, function, expression.func.value)
        for node in walk(factory.node.body) if factory is not None else ():
            if isinstance(node, cst.Return) and isinstance(node.value, cst.Name):
                return _local_def(module, factory, node.value.value)  # type: ignore[arg-type]
        return None
    if isinstance(expression, cst.Name):
        return _local_def(module, function, expression.value)
    return None


def _local_def(module: ModuleInfo, function: FunctionInfo, name: str) -> FunctionInfo | None:
    """A def named `name` inside `function` (at any depth), else the module's function."""
    span = function.span
    inside = [
        info
        for info in module.all_functions
        if info.name == name and span and info.span and span[0] < info.span[0] <= span[1]
    ]
    return min(inside, key=lambda info: info.span[1] - info.span[0]) if inside else module.functions.get(name)  # type: ignore[index]


def _kept(hook: FunctionInfo, forward: bool) -> tuple[bool, cst.CSTNode, bool, str] | None:
    """What the hook keeps: (after the layer?, the statement, kept by key?, storage name), or None
    when it keeps nothing of what it is handed."""
    params = [param.name.value for param in hook.node.params.params]
    if hook.owner is not None and params and params[0] == "self":
        params = params[1:]
    if len(params) < (3 if forward else 2):
        return None
    derived = {params[2]: True} if forward else {}  # names computed from what the layer returns (True) or took
    derived[params[1]] = False
    for statement in walk(hook.node.body):
        if isinstance(statement, cst.Assign):
            mentioned = _derived_from(statement.value, derived)
            for target in statement.targets:
                if isinstance(target.target, cst.Name) and mentioned is not None:
                    derived[target.target.value] = mentioned
                elif isinstance(target.target, cst.Subscript) and mentioned is not None:
                    return mentioned, statement, True, dotted_name(target.target.value) or "captured"
        elif (
            isinstance(statement, cst.Call)
            and isinstance(statement.func, cst.Attribute)
            and statement.func.attr.value == "append"
            and statement.args
        ):
            mentioned = _derived_from(statement.args[0].value, derived)
            if mentioned is not None:
                storage = dotted_name(statement.func.value) or "captured"
                return mentioned, statement, False, storage.removeprefix("self.")
    return None


def _derived_from(expression: cst.BaseExpression, derived: dict[str, bool]) -> bool | None:
    """Whether the expression is computed from the layer's output (True) or input (False)."""
    names = {node.value for node in walk(expression) if isinstance(node, cst.Name)}
    if any(derived.get(name) is True for name in names):
        return True
    if any(name in derived for name in names):
        return False
    return None


def _self_path(expression: cst.BaseExpression) -> tuple[str, ...]:
    """`self.a.b` -> ("a", "b"); () for anything else."""
    dotted = dotted_name(expression) or ""
    parts = tuple(dotted.split("."))
    return parts[1:] if len(parts) > 1 and parts[0] == "self" else ()


def _defaults(ctx: SideContext, site: HookSite, path: tuple[str, ...]) -> Val | None:
    """The ids as the trainer's own code sets them when none are given, evaluated on an instance
    of the hooking class built around the target model."""
    ev = ctx.evaluator
    owner = site.function.owner
    if owner is None or not path:
        return ev.evaluate(site.function, site.ids, {}, None)
    instance = ev.new_object(owner, _model_arguments(ctx, owner), {})
    if not any(method.may_store("config") for klass in ev.mro(owner) for method in klass.methods.values()):
        # A class that reads a `config` it never assigns is the converted target model itself.
        instance.v.fields["config"] = ev.attribute(_target_model(), "config", None, None)
    try:
        if len(path) == 1:
            return ev.field(instance, path[0])
        settings = ConfigFile.from_data("training", ctx.tree.root / "settings.json", "the training settings", {})
        holder = instance
        for name in path[:-2]:
            holder = ev.field(holder, name)
        if isinstance(holder.v, ObjRef):
            holder.v.fields[path[-2]] = Val(ConfigObj(settings))  # the user's settings: none given
        setter = _setter(ctx, owner, path[-1])
        if setter is not None:
            ev.call(Val(FuncRef(setter, bound=instance)), [])
        return ev.attribute(ev.field(holder, path[-2]), path[-1], None, None)
    except (EvalRaise, BudgetExceeded, RecursionError):
        return None


def _setter(ctx: SideContext, owner, attribute: str) -> FunctionInfo | None:
    """A method that sets `<...>.attribute` to something other than an empty literal."""
    for klass in ctx.evaluator.mro(owner):
        for method in klass.methods.values():
            if f".{attribute}" not in method.text:
                continue
            for statement, target in attribute_stores(method.node.body):
                if target.attr.value == attribute and not isinstance(statement.value, (cst.List, cst.Tuple, cst.Name)):
                    return method
    return None


def _target_model() -> Val:
    return Val(Opaque("model", HF_TARGET, "the target model the trainer hooks", instance=True))


def _model_arguments(ctx: SideContext, owner) -> list[Val]:
    """Arguments for the hooking class's constructor: the target model for a parameter named for
    it, unknown values for the others that have no default."""
    init = next((klass.methods["__init__"] for klass in ctx.evaluator.mro(owner) if "__init__" in klass.methods), None)
    if init is None:
        return []
    values = []
    for param in init.node.params.params[1:]:
        if param.default is not None:
            break
        name = param.name.value
        values.append(_target_model() if "model" in name else Val(Opaque(name, "", "a constructor argument")))
    return values


def _concatenation(ctx: SideContext, site: HookSite) -> tuple[ModuleInfo, FunctionInfo, cst.Call] | None:
    """The `torch.cat` that joins what the hooks kept: in the registering function, else in a
    method of its class that reads the storage."""
    candidates = [site.function]
    owner = site.function.owner
    for klass in ctx.evaluator.mro(owner) if owner is not None else ():
        candidates += [method for method in klass.methods.values() if method is not site.function]
    storage = site.storage.split(".")[-1]
    readers = {function.name for function in candidates if storage in function.text}
    for function in candidates:
        if "torch.cat" not in function.text:
            continue
        derived = {storage}  # names computed from the storage here, and methods that read it
        for node in walk(function.node.body):
            if isinstance(node, cst.Assign) and _names(node.value) & (derived | readers):
                derived |= {target.target.value for target in node.targets if isinstance(target.target, cst.Name)}
            elif isinstance(node, cst.Call) and dotted_name(node.func) == "torch.cat" and node.args:
                if _names(node.args[0].value) & (derived | readers):
                    return function.module, function, node
    return None


def _names(expression: cst.CSTNode) -> set[str]:
    """The names and attribute names an expression mentions."""
    return {
        node.value if isinstance(node, cst.Name) else node.attr.value
        for node in walk(expression)
        if isinstance(node, (cst.Name, cst.Attribute))
    }


def _teacher(ctx: SideContext, site: HookSite) -> Step | None:
    """Where the trainer takes the target's own logits as the teacher's (`outputs.logits`)."""
    owner = site.function.owner
    functions = [site.function] + [
        method for klass in (ctx.evaluator.mro(owner) if owner is not None else ()) for method in klass.methods.values()
    ]
    for function in functions:
        if ".logits" not in function.text:
            continue
        for node in walk(function.node.body):
            if isinstance(node, cst.Attribute) and node.attr.value == "logits" and isinstance(node.value, cst.Name):
                step = function.module.step(
                    node, function.node, "the teacher's logits are the target's own: its lm_head after the final norm"
                )
                key = ctx.graph.node(StepKind.CALL, step.location, step.note, step.code)
                return ctx.graph.step(key)
    return None


def _node(
    ctx: SideContext,
    module: ModuleInfo,
    function: FunctionInfo,
    node: cst.CSTNode,
    kind: StepKind,
    note: str,
    sources: list[NodeKey],
) -> NodeKey:
    location = module.location(node, function.node)
    key = ctx.graph.node(kind, location, note, module.code(location.line, location.end_line))
    ctx.graph.flow(sources, key)
    return key
