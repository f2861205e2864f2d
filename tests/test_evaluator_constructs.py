"""Every construct the evaluator models, one row each: a snippet, the value it evaluates to, and the
assumptions it records. Constructs it does not model are recorded as not evaluated."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
import pytest

from rca.inputs.configs import load_config
from rca.inputs.sources import SourceTree
from rca.static.codeindex import CodeIndex
from rca.static.evaluate.expressions import Expressions
from rca.static.evaluate.interp import Evaluator
from rca.static.evaluate.statements import MODELED_STATEMENTS
from rca.static.evaluate.values import ConfigObj, FuncRef, Opaque, Val, describe
from rca.static.graph import DataflowGraph

from .conftest import write_json, write_tree


@dataclass(frozen=True)
class Row:
    constructs: tuple[str, ...]  # libcst node types this row exercises
    code: str  # a module defining `f`, called with `args` (names of unknown values)
    value: str  # describe() of what f returns
    assumptions: tuple[str, ...] = ()  # the notes of every assumption recorded, in order
    args: tuple[str, ...] = ()


ROWS = [
    Row(("Name", "Integer", "Return", "Assign"), "def f():\n    x = 3\n    return x", "3"),
    Row(("Float",), "def f():\n    return 1.5", "1.5"),
    Row(("SimpleString", "ConcatenatedString"), "def f():\n    return 'a' 'b'", "'ab'"),
    Row(
        ("FormattedString",),
        "def f():\n    arch = 'LlamaForCausalLM'\n    return f'Eagle3{arch}'",
        "'Eagle3LlamaForCausalLM'",
    ),
    Row(("FormattedString", "FormattedStringExpression"), "def f(x):\n    return f'{x:>4}'", "?", args=("x",)),
    Row(("Ellipsis",), "def f():\n    return ...", "<ellipsis>"),
    Row(("List", "Tuple", "Set", "Dict"), "def f():\n    return [(1, 2), {3}, {'k': 4}]", "[(1, 2), {3}, {'k': 4}]"),
    Row(
        ("Attribute", "Subscript", "Index"),
        "class C:\n    def __init__(self):\n        self.a = [5, 6]\n\ndef f():\n    return C().a[1]",
        "6",
    ),
    Row(("Slice",), "def f():\n    return [1, 2, 3, 4][1:3]", "[2, 3]"),
    Row(("BinaryOperation", "UnaryOperation", "AugAssign"), "def f():\n    x = -2\n    x += 5 * 2\n    return x", "8"),
    Row(("BooleanOperation", "Comparison"), "def f():\n    return 1 < 2 and 3 in [3] or False", "True"),
    Row(("IfExp",), "def f():\n    return 1 if len([]) else 2", "2"),
    Row(("NamedExpr",), "def f():\n    if (n := 4) > 3:\n        return n\n    return 0", "4"),
    Row(("ListComp", "CompFor"), "def f():\n    return [i + 1 for i in range(3) if i != 1]", "[1, 3]"),
    Row(("GeneratorExp",), "def f():\n    return tuple(i for i in (7, 8))", "(7, 8)"),
    Row(("SetComp",), "def f():\n    return {i % 2 for i in range(4)}", "{0, 1}"),
    Row(("DictComp",), "def f():\n    return {k: k * 2 for k in (1, 2)}", "{1: 2, 2: 4}"),
    Row(("Lambda", "Call"), "def f():\n    g = lambda v: v * 3\n    return g(2)", "6"),
    Row(("Await",), "async def f():\n    return await g()\n\nasync def g():\n    return 9", "9"),
    Row(("AnnAssign",), "def f():\n    x: int = 11\n    return x", "11"),
    Row(("If",), "def f():\n    if 2 > 1:\n        return 'yes'\n    return 'no'", "'yes'"),
    Row(
        ("If",),
        "def f(flag):\n    if flag.enabled:\n        return 'on'\n    return 'off'",
        "'off'",
        ("unknown runtime condition assumed false",),
        args=("flag",),
    ),
    Row(
        ("For", "Break", "Continue"),
        "def f():\n    out = []\n    for i in range(6):\n        if i == 1:\n            continue\n        if i == "
        "4:\n            break\n        out.append(i)\n    return out",
        "[0, 2, 3]",
    ),
    Row(
        ("For",),
        "def f(items):\n    out = []\n    for item in items:\n        out.append(1)\n    return out",
        "[1]",
        ("loop over an unknown collection: its body is read once, for one unknown item",),
        args=("items",),
    ),
    Row(("While",), "def f():\n    i = 0\n    while i < 3:\n        i += 1\n    return i", "3"),
    Row(
        ("Try", "Raise"),
        "def f():\n    try:\n        raise KeyError('k')\n    except KeyError:\n        return 'caught'",
        "'caught'",
    ),
    Row(("Assert",), "def f():\n    assert 1 == 1\n    return 2", "2"),
    Row(("With",), "import contextlib\n\ndef f():\n    with contextlib.nullcontext() as c:\n        return 5", "5"),
    Row(("FunctionDef",), "def f():\n    def inner(v):\n        return v + 1\n    return inner(1)", "2"),
    Row(
        ("Import", "ImportFrom", "Expr"),
        "def f():\n    import math\n    from os import path\n    print('x')\n    return 1",
        "1",
    ),
    Row(
        ("Pass", "Del", "Global", "Nonlocal"),
        "def f():\n    global G\n    x = 1\n    def g():\n        nonlocal x\n    pass\n    del x\n    return 0",
        "0",
    ),
    Row(
        ("TryStar",),
        "def f():\n    try:\n        raise ValueError('v')\n    except* ValueError:\n        return 'group'",
        "'group'",
    ),
    Row(("SimpleStatementLine",), "def f():\n    a = 1; b = 2\n    return a + b", "3"),
    Row(
        ("Call",),
        "def f(ctx):\n    return ctx.rank_in_group + 1",
        "1",
        ("`rank_in_group` assumed 0: the view of tensor-parallel rank 0",),
        args=("ctx",),
    ),
    Row(
        ("Decorator",),
        "REGISTRY = {}\n\n\ndef register(name):\n    def wrap(fn):\n        REGISTRY[name] = fn\n        return fn\n\n"
        "    return wrap\n\n\n@register('eagle3')\ndef update(config):\n    return config + 1\n\n\ndef f():\n"
        "    return REGISTRY['eagle3'](2)",
        "3",
    ),
    Row(
        ("Call",),
        "class A:\n    @classmethod\n    def make(cls):\n        return 4\n\n\nclass B(A):\n    @classmethod\n"
        "    def make(cls):\n        return super().make() + 1\n\n\ndef f():\n    return B.make()",
        "5",
    ),
]

# What the evaluator does not model: recorded as an assumption at its line, never skipped silently.
UNMODELED = [
    Row(
        ("Match",),
        "def f(v):\n    match v:\n        case 1:\n            return 1\n    return 0",
        "0",
        ("`match` at mod.py:2-4 not evaluated",),
        args=("v",),
    ),
    Row(
        ("ClassDef",),
        "def f():\n    class Local:\n        pass\n    return 1",
        "1",
        ("a class defined inside a function at mod.py:2-3 not evaluated",),
    ),
    Row(
        ("Yield",),
        "def f():\n    x = yield 1\n    return 2",
        "2",
        ("the expression `Yield` at mod.py:2 not evaluated",),
    ),
]


def _evaluate(tmp_path: Path, row: Row) -> tuple[Val, list[str], Evaluator]:
    root = write_tree(tmp_path / "src", {"mod.py": textwrap.dedent(row.code) + "\n"})
    index = CodeIndex(SourceTree("serving", "test", root))
    target = load_config("target", write_json(tmp_path / "target.json", {"num_hidden_layers": 8}))
    ev = Evaluator(index, DataflowGraph(), num_layers=8, target=target)
    function = index.load("mod.py").functions["f"]
    value = ev.call(Val(FuncRef(function)), [Val(Opaque(name)) for name in row.args])
    notes = [ev.graph.g.nodes[key]["note"] for key in ev.events.assumptions]
    return value, notes, ev


@pytest.mark.parametrize("row", ROWS + UNMODELED, ids=lambda row: "-".join(row.constructs))
def test_construct(tmp_path: Path, row: Row) -> None:
    value, notes, _ = _evaluate(tmp_path, row)
    assert describe(value) == row.value
    assert notes == list(row.assumptions)


@pytest.mark.parametrize("row", UNMODELED, ids=lambda row: row.constructs[0])
def test_unmodeled_construct_is_reported_where_it_was_reached(tmp_path: Path, row: Row) -> None:
    _, _, ev = _evaluate(tmp_path, row)
    [unmodeled] = ev.events.unmodeled
    assert str(unmodeled) == row.assumptions[0]
    assert unmodeled.location.path == "mod.py"


def test_the_table_covers_every_modeled_construct() -> None:
    modeled_expressions = {name.removeprefix("_e_") for name in dir(Expressions) if name.startswith("_e_")}
    covered = {construct for row in ROWS for construct in row.constructs}
    missing = (modeled_expressions | set(MODELED_STATEMENTS)) - covered
    assert not missing, f"constructs the evaluator models without a row here: {sorted(missing)}"
    for construct in covered - {"Index", "Slice", "CompFor"}:
        assert hasattr(cst, construct), construct


# A config builder's shape (lmdeploy's `configurations/`): it sets fields on the model's config and
# writes into a list read from it, and the model built later reads both; a dataclass built from
# config values holds them as its fields.
_CONFIG_SHARING = """
from dataclasses import dataclass


@dataclass
class Built:
    layers: int
    spare: int = 0


def build(config):
    config.aux_layers = (2, config.num_hidden_layers // 2)
    config.architectures[0] = "Eagle3" + config.architectures[0]
    return Built(config.num_hidden_layers)


def f(config):
    built = build(config)
    return (config.aux_layers, config.architectures[0], built.layers, hasattr(config, "aux_layers"))
"""


def test_fields_set_on_a_config_are_seen_by_later_reads_and_dataclass_fields_by_construction(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "src", {"mod.py": _CONFIG_SHARING})
    index = CodeIndex(SourceTree("serving", "test", root))
    target = load_config(
        "target",
        write_json(tmp_path / "target.json", {"num_hidden_layers": 8, "architectures": ["LlamaForCausalLM"]}),
    )
    ev = Evaluator(index, DataflowGraph(), num_layers=8, target=target)
    value = ev.call(Val(FuncRef(index.load("mod.py").functions["f"])), [Val(ConfigObj(target))])
    assert describe(value) == "((2, 4), 'Eagle3LlamaForCausalLM', 8, True)"
    [store] = [store for store in ev.events.config_stores if store.attribute == "aux_layers"]
    [assigned] = [ev.graph.step(key) for key in store.value.src]
    assert (assigned.location.path, assigned.location.line) == ("mod.py", 12)
