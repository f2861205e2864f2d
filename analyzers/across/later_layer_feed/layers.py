"""Reading how a draft module builds and feeds its decoder layers, for a draft config that declares
two or more (the `later-layer-feed` analyzer's reading of each side)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import libcst as cst

from rca.sdk import SideContext, Step, StepKind
from rca.sdk.code import ClassInfo, FunctionInfo, children, dotted_name, inherited_method, names_in, walk
from rca.sdk.inputs import DraftConfig
from rca.sdk.values import ConfigObj, MutList, ObjRef, Opaque, Val

COUNT = "num_hidden_layers"
KEYS = (("transformer_layer_config", COUNT), (COUNT,))  # speculators' format nests the layer's config
_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
_CATS = ("cat", "concat", "concatenate")


@dataclass(frozen=True, slots=True)
class LayerFeed:
    """How one side's draft module feeds its decoder layers after the first, for a draft config that
    declares two or more: with `[embeds, hidden]` concatenated as the first layer takes them, or with
    the previous layer's hidden state only; or it builds one layer whatever the config declares, or
    refuses such a config."""

    EACH: ClassVar[str] = "embeds+hidden"
    HIDDEN: ClassVar[str] = "hidden"
    ONE: ClassVar[str] = "one layer"
    REFUSED: ClassVar[str] = "refused"

    declared: int  # the draft config's num_hidden_layers
    feed: str  # EACH, HIDDEN, ONE or REFUSED
    holder: str  # where the layers are built (`LlamaModel.layers`)
    steps: tuple[Step, ...] = ()
    key: tuple[str, ...] = ("num_hidden_layers",)  # where the draft config declares the count

    @property
    def stacked(self) -> bool:
        """Whether the module builds and runs layers after the first."""
        return self.feed in (self.EACH, self.HIDDEN)

    @property
    def later(self) -> str:
        """What a layer after the first takes, in words."""
        if self.feed == self.EACH:
            return "[embeds, hidden], as the first layer does"
        if self.feed == self.HIDDEN:
            return "the previous layer's hidden state only"
        return "nothing: no layer after the first is built"

    @property
    def later_short(self) -> str:
        return {self.EACH: "[embeds, hidden]", self.HIDDEN: "the hidden state alone"}.get(self.feed, "nothing")

    def describe(self) -> str:
        if self.feed == self.ONE:
            return f"builds one decoder layer ({self.holder}) where the config declares {self.declared}"
        if self.feed == self.REFUSED:
            return f"refuses a draft of {self.declared} decoder layers"
        return f"builds {self.declared} decoder layers ({self.holder}); each after the first takes {self.later}"

    def to_json(self) -> dict[str, Any]:
        return {
            "num_hidden_layers": self.declared,
            "later_layers": self.feed,
            "holder": self.holder,
            "steps": [step.citation() for step in self.steps],
        }


def declared_layers(draft: DraftConfig) -> tuple[int, tuple[str, ...], Step] | None:
    """How many decoder layers the draft config declares, where, and that line cited."""
    for path in KEYS:
        present, value = draft.config.lookup(path)
        if present and isinstance(value, int) and not isinstance(value, bool):
            step = draft.config.step(path, f"{'.'.join(path)} = {value}")
            return value, path, replace(step, kind=StepKind.CONFIG)
    return None


def _embeds_name(name: str) -> bool:
    """A name for token embeddings (`input_embeds`, `input_emb`, `embeds`), not for positions."""
    lowered = name.lower()
    return "emb" in lowered and not any(word in lowered for word in ("pos", "rotary", "rope"))


def _mentions_embeds(node: cst.CSTNode, names: set[str] | None = None) -> bool:
    """Whether an expression reads token embeddings: a name for them, or one of `names`."""
    for inner in walk(node, lambda n: not isinstance(n, _NESTED)):
        if isinstance(inner, cst.Name) and (inner.value in (names or set()) or _embeds_name(inner.value)):
            return True
        if isinstance(inner, cst.Attribute) and _embeds_name(inner.attr.value):
            return True
    return False


def _embeds_cat(node: cst.CSTNode, names: set[str] | None = None) -> cst.Call | None:
    """The concatenation of embeddings with another state in an expression (`torch.cat([embeds, h])`)."""
    for inner in walk(node, lambda n: not isinstance(n, _NESTED)):
        if not isinstance(inner, cst.Call) or not inner.args:
            continue
        if (dotted_name(inner.func) or "").rsplit(".", 1)[-1] not in _CATS:
            continue
        parts = inner.args[0].value
        if isinstance(parts, (cst.List, cst.Tuple)) and len(parts.elements) >= 2:
            if any(_mentions_embeds(element.value, names) for element in parts.elements):
                return inner
    return None


def _targets(statement: cst.BaseSmallStatement) -> list[str]:
    """The names a small statement assigns."""
    found: list[str] = []
    targets: list[cst.BaseExpression] = []
    if isinstance(statement, cst.Assign):
        targets = [target.target for target in statement.targets]
    elif isinstance(statement, (cst.AnnAssign, cst.AugAssign)):
        targets = [statement.target]
    for target in targets:
        elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else [target]
        for element in elements:
            value = element.value if isinstance(element, cst.Element) else element
            if isinstance(value, cst.Name):
                found.append(value.value)
    return found


def _inside(node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return any(inner is node for inner in walk(container))


@dataclass
class LayerReader:
    """One side's reading: the draft module's layers, how many it builds, and how it feeds them."""

    ctx: SideContext
    cls: ClassInfo
    draft: Val
    declared: int
    key: tuple[str, ...]
    config: Step

    def read(self) -> LayerFeed | None:
        holders = [self.draft] + [inner for inner in (self.ctx.evaluator.field(self.draft, "model"),) if _obj(inner)]
        refused = self._refusal(holders)
        if refused is False:  # a refusal whose outcome is unknown: nothing said
            return None
        if isinstance(refused, Step):
            return self._feed(LayerFeed.REFUSED, self.cls.name, [refused])
        for holder in holders:
            assert isinstance(holder.v, ObjRef)
            for attribute in ("layers", "midlayer"):
                assigned = self._assignment(holder.v.cls, attribute)
                if assigned is not None:
                    return self._layers(holder, attribute, *assigned)
        self._unread("its layers were not found")
        return None

    # -- the module's layers --------------------------------------------------------------------------

    def _feed(self, feed: str, holder: str, steps: list[Step]) -> LayerFeed:
        return LayerFeed(self.declared, feed, holder, (self.config, *steps), self.key)

    def _unread(self, why: str) -> None:
        self.ctx.note(f"how {self.cls.name} feeds its decoder layers after the first was not read: {why}")

    def _refusal(self, holders: list[Val]) -> Step | bool | None:
        """The constructor's test that raises for this count (None: none; False: its outcome is unknown)."""
        ev = self.ctx.evaluator
        assert self.ctx.draft is not None
        for holder in holders:
            assert isinstance(holder.v, ObjRef)
            init = inherited_method(self.ctx, holder.v.cls, "__init__")
            if init is None or COUNT not in init.text:
                continue
            for node in walk(init.node.body, lambda n: not isinstance(n, _NESTED)):
                if isinstance(node, cst.If) and COUNT in names_in(node.test):
                    if not any(isinstance(inner, cst.Raise) for inner in walk(node.body)):
                        continue
                    test, raises_when = node.test, True
                elif isinstance(node, cst.Assert) and COUNT in names_in(node.test):
                    test, raises_when = node.test, False
                else:
                    continue
                value = ev.evaluate(init, test, {"config": Val(ConfigObj(self.ctx.draft.config))}, self_val=holder)
                if not isinstance(value.v, bool):
                    self._unread("whether its constructor refuses the count is not known here")
                    return False
                if value.v is raises_when:
                    step = init.module.step(node, init.node, f"{init.qualname} raises for {self.declared} layers")
                    return replace(step, kind=StepKind.TEST)
        return None

    def _assignment(self, cls: ClassInfo, attribute: str) -> tuple[FunctionInfo, cst.Assign] | None:
        """Where the class (or a base) assigns `self.<attribute>`."""
        for klass in self.ctx.evaluator.mro(cls):
            for method in klass.methods.values():
                if not method.may_store(attribute):
                    continue
                for node in walk(method.node.body, lambda n: not isinstance(n, _NESTED)):
                    if isinstance(node, cst.Assign) and any(
                        dotted_name(target.target) == f"self.{attribute}" for target in node.targets
                    ):
                        return method, node
        return None

    def _layers(self, holder: Val, attribute: str, method: FunctionInfo, assign: cst.Assign) -> LayerFeed | None:
        assert isinstance(holder.v, ObjRef)
        owner = f"{holder.v.cls.name}.{attribute}"
        built = self.ctx.evaluator.field(holder, attribute)
        items = _items(built)
        built_count = self._count(holder, method, assign, items)
        if built_count is None:
            self._unread(f"how many layers {owner} holds was not read")
            return None
        construction = replace(
            method.module.step(
                assign,
                method.node,
                f"{owner}: {'one decoder layer' if built_count == 1 else f'{built_count} decoder layers'}",
            ),
            kind=StepKind.ASSIGN,
        )
        if built_count == 1:
            return self._feed(LayerFeed.ONE, owner, [construction])
        read = self._loop_feed(holder.v.cls, attribute, items)
        if read is None:
            return None
        feed, steps = read
        return self._feed(feed, owner, [construction, *steps])

    def _count(self, holder: Val, method: FunctionInfo, assign: cst.Assign, items: list[Val] | None) -> int | None:
        """How many layers the assignment builds: as many as evaluated (two or more), as many as
        declared where a loop over the count builds them (under the tests the draft's config
        passes), one for a single construction."""
        if items is not None and len(items) >= 2:
            return len(items)
        if isinstance(assign.targets[0].target, cst.Attribute) and assign.targets[0].target.attr.value == "midlayer":
            return 1
        code = method.module.tree.code_for_node
        counted = {name for name, value in _local_values(method) if COUNT in code(value)}
        guards = _guards(method)
        loops = []
        for builder in _builders(method, assign.value):
            taken = self._taken(holder, method, guards.get(id(builder), ()))
            if taken is None:
                return None
            if taken:
                loops += [node for node in walk(builder) if isinstance(node, (cst.CompFor, cst.For))]
        for loop in loops:
            iterated = loop.iter
            if COUNT in code(iterated) or any(
                isinstance(name, cst.Name) and name.value in counted for name in walk(iterated)
            ):
                return self.declared
        if not loops and items is not None and len(items) == 1:
            return 1
        return None

    def _taken(self, holder: Val, method: FunctionInfo, guards: tuple[tuple[cst.If, bool], ...]) -> bool | None:
        """Whether the draft's config takes the branches around a statement (None: not known)."""
        assert self.ctx.draft is not None
        config = {"config": Val(ConfigObj(self.ctx.draft.config))}
        for test, branch in guards:
            value = self.ctx.evaluator.evaluate(method, test.test, config, self_val=holder)
            if not isinstance(value.v, bool):
                return None
            if value.v is not branch:
                return False
        return True

    # -- how the layers are fed -------------------------------------------------------------------------

    def _loop_feed(self, cls: ClassInfo, attribute: str, items: list[Val] | None) -> tuple[str, list[Step]] | None:
        found = _layer_loop(self.ctx, cls, attribute)
        if found is None:
            self._unread(f"no loop over self.{attribute} that calls each layer was found")
            return None
        method, loop, call, statement = found
        module = method.module
        call_step = replace(module.step(call, method.node, "each layer is called here"), kind=StepKind.CALL)
        bindings = _bindings(method, loop, call)
        passed: list[tuple[str | None, int | None, cst.BaseExpression]] = []
        position = 0
        for arg in call.args:
            passed.append((arg.keyword.value if arg.keyword else None, None if arg.keyword else position, arg.value))
            position += 0 if arg.keyword else 1
        for _, _, value in passed:
            inline = _embeds_cat(value)
            if inline is not None:
                note = "every layer is called with [embeds, hidden], concatenated in the call"
                return LayerFeed.EACH, [replace(call_step, note=note)]
            if not isinstance(value, cst.Name) or value.value not in bindings:
                continue
            bound, inside = bindings[value.value]
            cat = _embeds_cat(bound)
            if cat is None:
                continue
            cat_step = replace(module.step(bound, method.node, ""), kind=StepKind.CALL)
            if inside:
                return LayerFeed.EACH, [
                    replace(
                        cat_step, note=f"[embeds, hidden] concatenated for every layer, in the loop: {value.value}"
                    ),
                    replace(call_step, note="each layer is called with it"),
                ]
            if value.value in _targets_of(statement):
                return LayerFeed.HIDDEN, [
                    replace(
                        cat_step, note="[embeds, hidden] concatenated once, before the loop: the first layer's input"
                    ),
                    replace(call_step, note=f"each layer is called with the previous one's output ({value.value})"),
                ]
            self._unread("the concatenated input is passed to every layer without being replaced")
            return None
        handed = [(keyword, index) for keyword, index, value in passed if _hands_embeds(keyword, value)]
        if not handed:
            self._unread("the layers' call passes no embeddings and no concatenation of them")
            return None
        if items is None or len(items) < 2 or not all(_obj(item) for item in items):
            self._unread("the layers built were not evaluated")
            return None
        readings = [_LayerReading(self.ctx, item, index, *handed[0]).run() for index, item in enumerate(items)]
        if any(reading is None for reading in readings):
            self._unread("a layer's forward was not read")
            return None
        first, *later = readings
        assert first is not None
        if not first[0]:  # the first layer must take the embeddings: else this reading is not the design's
            self._unread("its first layer does not read the embeddings it is handed")
            return None
        takes = {reading[0] for reading in later if reading is not None}
        if len(takes) != 1:
            self._unread("its layers after the first are fed in more than one way")
            return None
        feed = LayerFeed.EACH if takes.pop() else LayerFeed.HIDDEN
        handed_step = replace(call_step, note="each layer is handed the embeddings and the hidden state")
        return feed, [handed_step, *later[0][1]]  # type: ignore[index]


def _obj(value: Val) -> bool:
    return isinstance(value.v, ObjRef)


def _items(value: Val) -> list[Val] | None:
    """The layers a container holds, where it was evaluated (`nn.ModuleList([...])`, or a list)."""
    if isinstance(value.v, MutList):
        return list(value.v.items)
    if isinstance(value.v, Opaque) and value.v.args and isinstance(value.v.args[0].v, MutList):
        return list(value.v.args[0].v.items)
    if _obj(value):
        return [value]
    return None


def _local_values(method: FunctionInfo) -> Iterator[tuple[str, cst.BaseExpression]]:
    """Each local name the method assigns, with the value assigned."""
    for node in walk(method.node.body, lambda n: not isinstance(n, _NESTED)):
        if isinstance(node, cst.Assign):
            for name in _targets(node):
                yield name, node.value


def _guards(method: FunctionInfo) -> dict[int, tuple[tuple[cst.If, bool], ...]]:
    """For each node of the method's body, the `if` statements around it with the branch it is in."""
    found: dict[int, tuple[tuple[cst.If, bool], ...]] = {}

    def visit(node: cst.CSTNode, guards: tuple[tuple[cst.If, bool], ...]) -> None:
        found[id(node)] = guards
        if isinstance(node, _NESTED) and node is not method.node:
            return
        if isinstance(node, cst.If):
            visit(node.test, guards)
            visit(node.body, (*guards, (node, True)))
            if node.orelse is not None:
                visit(node.orelse, (*guards, (node, False)))
            return
        for child in children(node):
            visit(child, guards)

    visit(method.node.body, ())
    return found


def _builders(method: FunctionInfo, value: cst.BaseExpression) -> list[cst.CSTNode]:
    """The expressions and statements that build the list assigned (`nn.ModuleList(layers)`: every
    statement of the method that assigns, extends or appends to `layers`)."""
    builders: list[cst.CSTNode] = [value]
    names = {node.value for node in walk(value) if isinstance(node, cst.Name)}
    for node in walk(method.node.body, lambda n: not isinstance(n, _NESTED)):
        if isinstance(node, cst.Assign) and names & set(_targets(node)):
            builders.append(node.value)
        elif isinstance(node, cst.AugAssign) and names & set(_targets(node)):
            builders.append(node.value)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            owner = node.func.value
            if isinstance(owner, cst.Name) and owner.value in names and node.func.attr.value in ("extend", "append"):
                builders.append(node)
        elif isinstance(node, cst.For) and any(
            isinstance(inner, cst.Call)
            and isinstance(inner.func, cst.Attribute)
            and isinstance(inner.func.value, cst.Name)
            and inner.func.value.value in names
            for inner in walk(node.body)
        ):
            builders.append(node)
    return builders


def _layer_loop(
    ctx: SideContext, cls: ClassInfo, attribute: str
) -> tuple[FunctionInfo, cst.For, cst.Call, cst.CSTNode] | None:
    """The method that runs the layers: a loop over `self.<attribute>` (or its `enumerate`) calling
    each, that call, and the statement holding it."""
    wanted = {f"self.{attribute}", f"enumerate(self.{attribute})"}
    methods = [method for klass in ctx.evaluator.mro(cls) for method in klass.methods.values()]
    methods.sort(key=lambda method: method.name != "forward")
    for method in methods:
        if f"self.{attribute}" not in method.text:
            continue
        code = method.module.tree.code_for_node
        for loop in walk(method.node.body, lambda n: not isinstance(n, _NESTED)):
            if not isinstance(loop, cst.For) or "".join(code(loop.iter).split()) not in wanted:
                continue
            target = loop.target
            element = target.elements[-1].value if isinstance(target, cst.Tuple) and target.elements else target
            if not isinstance(element, cst.Name):
                continue
            for statement in walk(loop.body, lambda n: not isinstance(n, _NESTED)):
                if not isinstance(statement, (cst.Assign, cst.Expr, cst.Return)):
                    continue
                for call in walk(statement, lambda n: not isinstance(n, _NESTED)):
                    if (
                        isinstance(call, cst.Call)
                        and isinstance(call.func, cst.Name)
                        and call.func.value == element.value
                    ):
                        return method, loop, call, statement
    return None


def _bindings(method: FunctionInfo, loop: cst.For, call: cst.Call) -> dict[str, tuple[cst.BaseExpression, bool]]:
    """For each local name: the value last assigned to it before the call, and whether that
    assignment is inside the loop (made again for every layer)."""
    module = method.module
    call_line = module.lines_of(call, method.node)[0]
    loop_line = module.lines_of(loop, method.node)[0]
    found: dict[str, tuple[cst.BaseExpression, bool, int]] = {}
    for node in walk(method.node.body, lambda n: not isinstance(n, _NESTED)):
        if not isinstance(node, cst.Assign):
            continue
        line = module.lines_of(node, method.node)[0]
        inside = _inside(node, loop.body)
        if (inside and line >= call_line) or (not inside and line >= loop_line):
            continue
        for name in _targets(node):
            rank = line + (1_000_000 if inside else 0)  # an assignment in the loop is the one each call sees
            if name not in found or found[name][2] < rank:
                found[name] = (node.value, inside, rank)
    return {name: (value, inside) for name, (value, inside, _) in found.items()}


def _targets_of(statement: cst.CSTNode) -> list[str]:
    return _targets(statement) if isinstance(statement, (cst.Assign, cst.AnnAssign, cst.AugAssign)) else []


def _hands_embeds(keyword: str | None, value: cst.BaseExpression) -> bool:
    if keyword is not None and _embeds_name(keyword):
        return True
    return isinstance(value, cst.Name) and _embeds_name(value.value)


@dataclass
class _LayerReading:
    """Whether one evaluated layer's forward concatenates the embeddings it is handed, down the
    branch its fields select."""

    ctx: SideContext
    layer: Val
    position: int  # the layer's place in the module's list
    keyword: str | None
    index: int | None
    names: set[str] = field(default_factory=set)
    steps: list[Step] = field(default_factory=list)
    cat: cst.CSTNode | None = None
    unknown: bool = False

    def run(self) -> tuple[bool, list[Step]] | None:
        assert isinstance(self.layer.v, ObjRef)
        self.forward = inherited_method(self.ctx, self.layer.v.cls, "forward")
        if self.forward is None:
            return None
        params = [p.name.value for p in self.forward.node.params.params if p.name.value != "self"]
        param = self.keyword if self.keyword is not None else None
        if param is None and self.index is not None and self.index < len(params):
            param = params[self.index]
        if param is None or param not in params:
            return None
        self.names = {param}
        self._block(self.forward.node.body.body)
        if self.unknown:
            return None
        module, anchor = self.forward.module, self.forward.node
        which = f"layer {self.position} ({self.layer.v.cls.name})"
        if self.cat is not None:
            step = module.step(self.cat, anchor, f"{which} concatenates [embeds, hidden]")
            return True, [*self.steps, replace(step, kind=StepKind.CALL)]
        if not self.steps:
            step = module.step(self.forward.node.body.body[0], anchor, f"{which} never reads the embeddings")
            return False, [replace(step, kind=StepKind.CALL)]
        return False, [replace(step, note=f"{step.note}: {which} takes the hidden state only") for step in self.steps]

    def _block(self, statements) -> None:
        for statement in statements:
            self._statement(statement)

    def _statement(self, statement: cst.CSTNode) -> None:
        assert self.forward is not None
        if isinstance(statement, cst.If):
            value = self.ctx.evaluator.evaluate(self.forward, statement.test, {}, self_val=self.layer)
            if isinstance(value.v, bool):
                code = " ".join(self.forward.module.tree.code_for_node(statement.test).split())
                step = self.forward.module.step(statement.test, self.forward.node, f"{code} is {value.v}")
                self.steps.append(replace(step, kind=StepKind.TEST))
                if value.v:
                    self._block(statement.body.body)
                elif isinstance(statement.orelse, cst.Else):
                    self._block(statement.orelse.body.body)
                elif isinstance(statement.orelse, cst.If):
                    self._statement(statement.orelse)
                return
            # a test the layer's fields do not decide: both branches must agree
            before = (set(self.names), self.cat)
            self._block(statement.body.body)
            taken = self.cat is not None
            self.names, self.cat = set(before[0]), before[1]
            if isinstance(statement.orelse, cst.Else):
                self._block(statement.orelse.body.body)
            elif isinstance(statement.orelse, cst.If):
                self._statement(statement.orelse)
            if taken != (self.cat is not None):
                self.unknown = True
            return
        if isinstance(statement, (cst.For, cst.While, cst.With, cst.Try)):
            self._block(statement.body.body)
            return
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if self.cat is None:
                    self.cat = _embeds_cat(small, self.names)
                if isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and small.value is not None:
                    if _mentions_embeds(small.value, self.names):
                        self.names.update(_targets(small))
