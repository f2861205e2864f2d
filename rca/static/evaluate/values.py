"""Abstract values for symbolic evaluation.

A `Val` is a payload plus the dataflow nodes it came from. Payloads are plain Python scalars,
containers we can mutate and track (`MutList`, `MutDict`), references to analyzed code
(`ObjRef`, `FuncRef`, `ClassRef`, `ModuleRef`), views of config files (`ConfigObj`), symbolic
tensors (`TensorVal`), and `Opaque` for everything the analysis does not model.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import libcst as cst

from rca.inputs.configs import ConfigFile
from rca.inputs.jsonpos import KeyPath
from rca.model import Location, Tap
from rca.static.graph import NodeKey

if TYPE_CHECKING:
    from rca.static.codeindex import ClassInfo, FunctionInfo, ModuleInfo

_ids = itertools.count(1)
NO_SRC: frozenset[NodeKey] = frozenset()


class Val:
    """A value and the set of dataflow nodes it derives from."""

    __slots__ = ("src", "v")

    def __init__(self, v: Any, src: frozenset[NodeKey] = NO_SRC) -> None:
        self.v = v
        self.src = src

    def with_src(self, extra: frozenset[NodeKey] | set[NodeKey]) -> Val:
        return Val(self.v, self.src | frozenset(extra)) if extra else self

    def __repr__(self) -> str:
        return f"Val({self.v!r})"


NONE = Val(None)


@dataclass(eq=False)
class Opaque:
    """Something the analysis does not model: an unresolved name, call or attribute.

    `hint` is the last name it was reached by (an attribute or variable name), `origin` the
    qualified name of what produced it (`torch.cat`, `sglang.srt.layers.layernorm.RMSNorm`).
    """

    hint: str
    origin: str = ""
    reason: str = ""
    instance: bool = False  # produced by calling something that looks like a class
    args: tuple[Val, ...] = ()  # for a constructed instance: the constructor arguments
    kwargs: dict[str, Val] = field(default_factory=dict)
    anonymous: bool = False  # a call result: it takes the name it is first stored under
    parent: Opaque | None = None  # the unknown value this one was unpacked from
    stack: Any = None  # the LayerStack this value stands for, once one was made for it
    off: bool = False  # as a condition, its truth when every unknown in it is off (false)

    def named(self, name: str) -> Opaque:
        if not self.anonymous:
            return self
        return Opaque(
            name, self.origin or self.hint, self.reason, self.instance, self.args, self.kwargs, parent=self.parent
        )

    def reached_as(self, name: str) -> Opaque:
        """This value under another name (the attribute it is stored as), all else kept."""
        renamed = Opaque(name, self.origin or self.hint, self.reason, self.instance, self.args, self.kwargs)
        renamed.parent, renamed.stack, renamed.off = self.parent, self.stack, self.off
        return renamed

    def call_args(self) -> list[Val]:
        """Arguments of the call that produced this value (or the value it was unpacked from)."""
        return [*self.args, *self.kwargs.values()] or (self.parent.call_args() if self.parent is not None else [])

    def __repr__(self) -> str:
        return f"<opaque {self.hint}{' from ' + self.origin if self.origin and self.origin != self.hint else ''}>"


@dataclass(eq=False)
class MutList:
    items: list[Val]
    tuple_like: bool = False  # a tuple: immutable in the analyzed code
    id: int = field(default_factory=lambda: next(_ids))

    def python(self) -> list[Any] | None:
        """The items as plain Python values when all are scalars, else None."""
        values = [item.v for item in self.items]
        if all(isinstance(value, (int, float, str, bool, type(None))) for value in values):
            return values
        return None


@dataclass(eq=False)
class MutDict:
    items: dict[Any, Val]
    config: tuple[ConfigFile, KeyPath] | None = None  # where it was read from, for a missing key
    attrs: bool = False  # items are also attributes (a transformers ModelOutput)
    id: int = field(default_factory=lambda: next(_ids))


@dataclass(eq=False)
class SetVal:
    items: frozenset[Any]
    frozen: bool = True
    id: int = field(default_factory=lambda: next(_ids))


@dataclass(eq=False)
class ConfigObj:
    """A HF-style config object read from a config.json (attribute access, sub-configs)."""

    file: ConfigFile
    path: KeyPath = ()

    @property
    def data(self) -> dict[str, Any]:
        return self.file.lookup(self.path)[1]


@dataclass(eq=False)
class ObjRef:
    """An instance of an analyzed class. Fields not yet set are resolved lazily from its code."""

    cls: ClassInfo
    fields: dict[str, Val] = field(default_factory=dict)
    init_args: tuple[list[Val], dict[str, Val]] | None = None
    backing: MutList | None = None  # what a collector holds (a list subclass, or what it was handed)
    id: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return f"<{self.cls.name} #{self.id}>"


@dataclass(eq=False)
class FuncRef:
    info: FunctionInfo
    bound: Val | None = None  # the receiver of a bound method
    closure: dict[str, Val] | None = None


@dataclass(eq=False)
class LambdaRef:
    node: cst.Lambda
    module: ModuleInfo
    anchor: Any
    frame: Any  # the frame it was created in: free names resolve there, on demand


@dataclass(eq=False)
class ClassRef:
    info: ClassInfo


@dataclass(frozen=True)
class EnumMember:
    """A member of an analyzed `Enum` class (`SpeculativeAlgorithm.EAGLE3`): equal only to itself."""

    cls: ClassInfo
    name: str

    def __repr__(self) -> str:
        return f"{self.cls.name}.{self.name}"


@dataclass(eq=False)
class ModuleRef:
    info: ModuleInfo


@dataclass(eq=False)
class SuperRef:
    """`super()` inside a method of `owner`, bound to `instance`."""

    instance: Val
    owner: ClassInfo


@dataclass(eq=False)
class BuiltinFn:
    name: str
    bound: Val | None = None  # for methods of modeled payloads, the receiver


# -- symbolic tensors ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorVal:
    """A tensor whose identity we track.

    kind "tap": a full residual-stream tensor (`tap`);
    kind "part": one element of a decoder layer's output pair (`part` = "hidden" or "residual"),
      whose sum is the stream after `layer` layers;
    kind "layer_out": a decoder layer's whole output before unpacking (with `extra`, the values its
      code returns after the pair when a flag asks it for more);
    kind "concat" / "stack": a concatenation or stack of `items` along the hidden dimension;
    kind "unknown": a tensor we lost track of (`reason`).
    """

    kind: str
    tap: Tap | None = None
    layer: int | None = None
    part: str = ""
    items: tuple[TensorVal, ...] = ()
    dim: Any = None
    reason: str = ""
    extra: tuple[Any, ...] = ()  # layer_out: what the layer returns after its pair, read from its code
    whole: bool = False  # layer_out: the layer returns the stream after it alone (`(hidden_states,)`), not a pair

    def as_tap(self) -> Tap | None:
        if self.kind == "tap":
            return self.tap
        if self.kind == "layer_out" and self.layer is not None:
            return Tap(self.layer + 1)
        if self.kind == "part" and self.part == "hidden" and self.layer is not None:
            return Tap(self.layer, residual_missing=True)
        return None

    def describe(self) -> str:
        tap = self.as_tap()
        if tap is not None:
            return str(tap)
        if self.kind in ("concat", "stack"):
            return f"{self.kind}[{', '.join(item.describe() for item in self.items)}]"
        if self.kind == "part":
            return f"{self.part} part of h{self.layer}"
        return f"tensor ({self.reason or 'untracked'})"


def tap_tensor(tap: Tap) -> TensorVal:
    return TensorVal("tap", tap=tap)


@dataclass(eq=False)
class LayerStack:
    """The target's decoder layers (`self.layers`): indexing gives `DecoderLayer(i)`, the same
    object each time, so that flags set on a layer are seen by the forward pass.

    `factory` builds the analyzed layer object (the function `make_layers` is given), so that
    what a layer does with a capture list handed to it can be read from its code."""

    count: int
    start: int = 0
    factory: Val | None = None
    layers: dict[int, DecoderLayer] = field(default_factory=dict)
    whole: bool | None = None  # its layers return the stream alone (read once from their forward)

    def layer(self, index: int) -> DecoderLayer:
        if index not in self.layers:
            self.layers[index] = DecoderLayer(index, self)
        return self.layers[index]


@dataclass(eq=False)
class DecoderLayer:
    """Decoder layer `index`. Calling it yields the stream after it (h(index+1)) as the pair
    (hidden, residual); its code runs only for side effects on capture lists it is handed."""

    index: int
    stack: LayerStack | None = None
    fields: dict[str, Val] = field(default_factory=dict)
    instance: Val | None = None


class EvalRaise(Exception):
    """An exception raised by the analyzed code, as the analysis sees it."""

    def __init__(
        self, kind: str, message: str, node: cst.CSTNode | None = None, src: frozenset[NodeKey] = NO_SRC
    ) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.node = node
        self.src = src
        self.location: Location | None = None  # filled in where it is raised


NORM_RE = re.compile(r"norm", re.IGNORECASE)
EMBED_RE = re.compile(r"embed", re.IGNORECASE)


def describe(value: Any, depth: int = 0) -> str:
    """A short, human-readable rendering of a payload for graph notes and reports."""
    if isinstance(value, Val):
        value = value.v
    if depth > 2:
        return "..."
    if isinstance(value, TensorVal):
        return value.describe()
    if isinstance(value, MutList):
        inner = ", ".join(describe(item, depth + 1) for item in value.items[:12])
        if len(value.items) > 12:
            inner += ", ..."
        return f"({inner})" if value.tuple_like else f"[{inner}]"
    if isinstance(value, SetVal):
        return "{" + ", ".join(str(item) for item in sorted(value.items, key=repr)) + "}"
    if isinstance(value, MutDict):
        return (
            "{"
            + ", ".join(f"{key!r}: {describe(item, depth + 1)}" for key, item in list(value.items.items())[:6])
            + "}"
        )
    if isinstance(value, ConfigObj):
        return f"<config {value.file.display}{':' + '.'.join(map(str, value.path)) if value.path else ''}>"
    if isinstance(value, Opaque):
        return "?"
    if isinstance(value, ObjRef):
        return f"<{value.cls.name}>"
    if isinstance(value, FuncRef):
        return f"<function {value.info.qualname}>"
    if isinstance(value, ClassRef):
        return f"<class {value.info.name}>"
    if isinstance(value, ModuleRef):
        return f"<module {value.info.name}>"
    if isinstance(value, DecoderLayer):
        return f"<decoder layer {value.index}>"
    if isinstance(value, LayerStack):
        return f"<{value.count} decoder layers>"
    if isinstance(value, (int, float, str, bool, type(None), slice)):
        return repr(value)
    return f"<{type(value).__name__}>"


# -- plain Python values -------------------------------------------------------------------------


def sources_of(values: list[Val]) -> frozenset[NodeKey]:
    """Every dataflow node the values came from."""
    return frozenset().union(*(value.src for value in values)) if values else NO_SRC


def hashable(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool, type(None), tuple))


def make_set(values: list[Val], frozen: bool = True) -> Val:
    items = [value.v for value in values]
    if not all(isinstance(item, (int, float, str, bool, type(None), tuple)) for item in items):
        return Val(Opaque("set", "", "set of unknown values"), sources_of(values))
    return Val(SetVal(frozenset(items), frozen), sources_of(values))


def python_to_val(value: Any, src: frozenset) -> Val:
    if isinstance(value, list):
        return Val(MutList([python_to_val(item, src) for item in value]), src)
    if isinstance(value, tuple):
        return Val(MutList([python_to_val(item, src) for item in value], tuple_like=True), src)
    if isinstance(value, dict):
        return Val(MutDict({key: python_to_val(item, src) for key, item in value.items()}), src)
    return Val(value, src)


def to_python(value: Val) -> Any:
    """A plain Python value for a fully concrete abstract value, else raises ValueError."""
    payload = value.v
    if isinstance(payload, MutList):
        items = [to_python(item) for item in payload.items]
        return tuple(items) if payload.tuple_like else items
    if isinstance(payload, SetVal):
        return payload.items if payload.frozen else set(payload.items)
    if isinstance(payload, MutDict):
        return {key: to_python(item) for key, item in payload.items.items()}
    if isinstance(payload, (int, float, str, bool, type(None))):
        return payload
    raise ValueError("not concrete")
