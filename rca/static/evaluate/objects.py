"""Analyzed classes and their instances: method resolution order, methods bound to their receiver,
properties, enums, `super()`, and fields read lazily from the statements that assign them
(`__init__` first), with the arguments the instance was constructed with. Part of `Evaluator`
(see interp.py)."""

from __future__ import annotations

import libcst as cst

from rca.static.codeindex import ClassInfo, FunctionInfo, dotted_name
from rca.static.evaluate.interface import BudgetExceeded, Frame, Parts
from rca.static.evaluate.syntax import decorators, is_super_call, self_stores, super_init_call
from rca.static.evaluate.values import (
    BuiltinFn,
    ClassRef,
    EnumMember,
    EvalRaise,
    FuncRef,
    MutList,
    ObjRef,
    Opaque,
    SuperRef,
    Val,
)

_ENUM_BASES = frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"})
_LIST_METHODS = frozenset({"append", "extend", "insert", "pop", "index", "count", "copy", "sort", "reverse", "clear"})


class Objects(Parts):
    """How the evaluator reads classes and instances."""

    def object_attribute(self, owner: Val, name: str) -> Val:
        obj: ObjRef = owner.v
        if name in obj.fields:
            return obj.fields[name]
        if name == "__class__":
            return Val(ClassRef(obj.cls))
        constructed = self._dataclass_field(obj, name)
        if constructed is not None:
            obj.fields[name] = constructed
            return constructed
        for klass in self.mro(obj.cls):
            if name in klass.methods or name in klass.attributes:
                return self._class_attr(obj.cls, name, owner)
        if obj.backing is not None and name in _LIST_METHODS:
            return Val(BuiltinFn(f"list.{name}", Val(obj.backing)))
        value = self._lazy_field(owner, name)
        if value is not None:
            return value
        return Val(Opaque(name, f"{obj.cls.name}.{name}", "field never assigned in the analyzed code"))

    def _dataclass_field(self, obj: ObjRef, name: str) -> Val | None:
        """A field of a dataclass instance (no `__init__` of its own): the argument it was
        constructed with, by keyword or by position in field order (bases first)."""
        if obj.init_args is None:
            return None
        chain = self.mro(obj.cls)
        if any("__init__" in klass.methods for klass in chain) or not any(_is_dataclass(k) for k in chain):
            return None
        fields = [field for klass in reversed(chain) if _is_dataclass(klass) for field in _annotated_fields(klass)]
        if name not in fields:
            return None
        args, kwargs = obj.init_args
        position = fields.index(name)
        value = kwargs.get(name, args[position] if position < len(args) else None)
        # Only a value derived from the inputs (a config key, a setting) is bound: a bare constant
        # may be one the evaluator's assumptions picked among branches.
        return value if value is not None and value.src else None

    def _class_attr(self, cls: ClassInfo, name: str, instance: Val | None) -> Val:
        for klass in self.mro(cls):
            if name in klass.methods:
                method = klass.methods[name]
                kinds = decorators(method.node)
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

    def _super_attr(self, proxy: SuperRef, name: str) -> Val:
        instance = proxy.instance.v  # an ObjRef, or the class itself inside a classmethod
        cls = instance.info if isinstance(instance, ClassRef) else instance.cls
        order = self.mro(cls)
        after = order[order.index(proxy.owner) + 1 :] if proxy.owner in order else []
        for klass in after:
            if name in klass.methods:
                kinds = decorators(klass.methods[name].node)
                if "staticmethod" in kinds:
                    return Val(FuncRef(klass.methods[name]))
                if "classmethod" in kinds:
                    return Val(FuncRef(klass.methods[name], bound=Val(ClassRef(cls))))
                return Val(FuncRef(klass.methods[name], bound=proxy.instance))
            if name in klass.attributes:
                return self._class_attr(klass, name, proxy.instance)
        return Val(Opaque(name, f"super.{name}", "method of a base class outside the analyzed files"))

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

    def is_enum(self, cls: ClassInfo) -> bool:
        """A subclass of `Enum` (or `IntEnum`, `StrEnum`, `Flag`), named in the analyzed bases."""
        if id(cls) not in self._enums:
            self._enums[id(cls)] = any(
                (dotted_name(base) or "").rsplit(".", 1)[-1] in _ENUM_BASES
                for klass in self.mro(cls)
                for base in klass.base_expressions
            )
        return self._enums[id(cls)]

    def _has_method(self, cls: ClassInfo, name: str) -> bool:
        return any(name in klass.methods for klass in self.mro(cls))

    def _instantiate(
        self, cls: ClassInfo, args: list[Val], kwargs: dict[str, Val], node: cst.CSTNode | None, frame: Frame | None
    ) -> Val:
        obj = ObjRef(cls, init_args=(list(args), dict(kwargs)))
        if self._is_list_class(cls):
            obj.backing = MutList([])
        return Val(obj)

    def _is_list_class(self, cls: ClassInfo) -> bool:
        """Whether instances are Python lists (a class deriving from `list` or `List`)."""
        return any(
            dotted_name(base) in ("list", "List", "typing.List")
            for klass in self.mro(cls)
            for base in klass.base_expressions
        )

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

    def _store_sites(self, cls: ClassInfo, name: str) -> list[tuple[ClassInfo, FunctionInfo, cst.CSTNode]]:
        """Statements that assign `self.<name>`, __init__ first, last-in-source first."""
        init_sites: list[tuple[ClassInfo, FunctionInfo, cst.CSTNode]] = []
        other_sites: list[tuple[ClassInfo, FunctionInfo, cst.CSTNode]] = []
        for klass in self.mro(cls):
            for method in klass.methods.values():
                if not method.may_store(name):
                    continue
                found = self_stores(method.node, name)
                target = init_sites if method.name == "__init__" else other_sites
                target.extend((klass, method, statement) for statement in reversed(found))
        return init_sites + other_sites

    def _lazy_field(self, owner: Val, name: str) -> Val | None:
        obj: ObjRef = owner.v
        key = (obj.id, name)
        if key in self._resolving_fields:
            return None
        self._resolving_fields.add(key)
        with self.isolated():
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
            return self.bind_params(chain[0].methods["__init__"], args, kwargs or {}, owner, chain[0].module)
        child = chain[position - 1]
        child_init = child.methods["__init__"]
        call = super_init_call(child_init.node)
        if call is None:
            return {}
        result = self.run_to(child_init, call, owner, self._init_bindings(owner, child))
        if not result.reached or result.frame is None:
            return {}
        frame = result.frame
        call_args: list[Val] = []
        call_kwargs: dict[str, Val] = {}
        explicit_self = isinstance(call.func, cst.Attribute) and not is_super_call(call.func.value)
        for arg in call.args[1:] if explicit_self else call.args:
            value = self._eval(arg.value, frame)
            if arg.keyword is not None:
                call_kwargs[arg.keyword.value] = value
            elif arg.star == "":
                call_args.append(value)
        return self.bind_params(klass.methods["__init__"], call_args, call_kwargs, owner, klass.module)


def _is_dataclass(cls: ClassInfo) -> bool:
    for decorator in cls.node.decorators:
        expression = decorator.decorator
        dotted = dotted_name(expression.func if isinstance(expression, cst.Call) else expression)
        if dotted and dotted.split(".")[-1] == "dataclass":
            return True
    return False


def _annotated_fields(cls: ClassInfo) -> list[str]:
    """The names a dataclass body annotates, in order (its fields)."""
    names = []
    for statement in cls.node.body.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                    names.append(small.target.value)
    return names
