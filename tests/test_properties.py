"""Properties of the input readers and the symbolic evaluator, on any input.

What is promised: given any file (arbitrary text or bytes, valid syntax of any shape, valid files
with values of the wrong kind), a reader either returns its result or raises the project's
domain error for bad input (`InputError`, or the subclass that reader documents: `DumpError`,
`CheckpointError`, `PatchError`; `JsonSyntaxError` and the parser's syntax errors from the
lower-level parsers), never another exception, and it finishes within a time bound (the
`deadline` of each property). The evaluator, given any program in the shape of a model's
forward, returns a value or says the analyzed code raised (`EvalRaise`) or ran out of its step
budget, and the analysis of a side never reports an analyzer that crashed (but for one known
crash, kept as an expected failure below until its analyzer is fixed).

Where a reader's result has a meaning that can be checked, it is: configs that load have line
ranges inside the file, a fix's config edit sets the value it says, a diff made by difflib from
A to B turns A into B, dumps that open have one token count and one width, the embedding rows
read from a checkpoint are the rows saved in it, a draft checkpoint reads no more bytes than it
has, and a vocab map of distinct target ids passes the checks while a collision is reported.
"""

from __future__ import annotations

import difflib
import gzip
import io
import json
import re
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import libcst as cst
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from rca.cases.casefile import INPUT_KEYS, load_case
from rca.errors import InputError, PatchError, RcaError
from rca.inputs.checkpoint import Checkpoint
from rca.inputs.configs import TEXT_CONFIG_KEYS, ConfigFile, DraftConfig, TargetConfig, load_config
from rca.inputs.dumps import DumpError, open_dumps, read_dump_metadata
from rca.inputs.jsonpos import JsonSyntaxError, loads
from rca.inputs.patching import apply_hunks, parse_patch
from rca.inputs.runconfig import read_run_config
from rca.inputs.sandbox import MAX_VALUE
from rca.inputs.sources import SourceTree
from rca.inputs.templates import ChatTemplate, TemplateError, conversation
from rca.model import Location, Step
from rca.static.codeindex import CodeIndex
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.evaluate.interface import BudgetExceeded
from rca.static.evaluate.interp import Evaluator
from rca.static.evaluate.values import NO_SRC, EvalRaise, FuncRef, Opaque, Val, describe, python_to_val
from rca.static.graph import DataflowGraph
from rca.static.parsing import TooComplexToParse, parse_text
from rca.static.wiring import resolve_wiring
from tests.conftest import TREES, write_json

QUICK = settings(max_examples=80, deadline=timedelta(seconds=3))
SLOW = settings(max_examples=50, deadline=timedelta(seconds=5))


def scratch() -> tempfile.TemporaryDirectory:
    """A directory for one example (function-scoped fixtures are not reset between examples)."""
    return tempfile.TemporaryDirectory(prefix="rca-prop-")


# -- JSON values -----------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=16,
)
# Text that looks like JSON often enough to reach past the first character.
json_ish_text = st.text(alphabet='{}[]",:0123456789.eE-+ \n\t\\tnulrfasINiy', max_size=60)
layouts = st.sampled_from([None, 0, 1, 2, 4, "\t"])


def _lines_in(doc: Any, text: str) -> None:
    total = text.count("\n") + 1
    for first, last in doc.lines.values():
        assert 1 <= first <= last <= total


@QUICK
@given(st.text(max_size=80) | json_ish_text)
@example("1" * 5000)  # more digits than Python converts to an int
@example("[" * 200 + "]" * 200)
def test_json_text_loads_or_is_a_syntax_error(text: str) -> None:
    try:
        doc = loads(text)
    except JsonSyntaxError as error:
        assert error.line >= 1 and error.column >= 1
        return
    assert doc.data == json.loads(text) or doc.data != doc.data  # NaN is not equal to itself
    _lines_in(doc, text)


@QUICK
@given(json_values, layouts)
def test_json_documents_load_with_their_lines(value: Any, indent: Any) -> None:
    text = json.dumps({"root": value}, indent=indent)
    doc = loads(text)
    assert doc.data == {"root": value}
    _lines_in(doc, text)


# -- config.json -----------------------------------------------------------------------------------

layer_ids = st.lists(st.integers(-3, 80), max_size=5) | json_values
positive_ish = st.integers(-2, 20_000) | st.sampled_from([10**6, 2**63]) | json_values
architectures = st.lists(st.text(max_size=12), max_size=3) | json_values
text_config = (
    st.fixed_dictionaries(
        {},
        optional={"num_hidden_layers": positive_ish, "hidden_size": positive_ish, "architectures": architectures},
    )
    | json_values
)
eagle_config = (
    st.fixed_dictionaries(
        {}, optional={"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": json_values}
    )
    | json_values
)
configs = st.fixed_dictionaries(
    {},
    optional={
        "architectures": architectures,
        "num_hidden_layers": positive_ish,
        "hidden_size": positive_ish,
        "eagle_config": eagle_config,
        "eagle_aux_hidden_state_layer_ids": layer_ids,
        **dict.fromkeys(TEXT_CONFIG_KEYS, text_config),
        "other": json_values,
    },
)
ID_PATHS = (("eagle_config", "eagle_aux_hidden_state_layer_ids"), ("eagle_aux_hidden_state_layer_ids",))


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("configs")


def _load(directory: Path, content: bytes) -> Any:
    path = directory / "config.json"
    path.write_bytes(content)
    try:
        config = load_config("target", path, directory)
    except InputError as error:
        assert str(path) in str(error) and error.fix
        event(f"refused: {error.what[:20]}")
        return None
    event("loaded")
    return config


@QUICK
@given(st.binary(max_size=100) | st.text(max_size=80).map(str.encode) | json_ish_text.map(str.encode))
@example(b"\xef\xbb\xbf{}")  # a byte-order mark
@example(b"{" + b"1" * 5000 + b"}")
@example(b'{"a": ' + b"9" * 5000 + b"}")
def test_config_bytes_load_or_are_refused(config_dir: Path, content: bytes) -> None:
    config = _load(config_dir, content)
    if config is not None:
        assert isinstance(config.data, dict)


def _set(doc: Any, path: tuple, value: Any) -> Any:
    """`doc` with `path` set, parents made into mappings: what a config edit is meant to do."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return doc


@QUICK
@given(configs, layouts, st.lists(st.integers(-1, 80), min_size=1, max_size=4))
@example({"eagle_config": None}, 2, [2, 30, 58])  # a null parent: the fix must replace it
@example({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1]}}, None, [2])  # the whole file on one line
def test_structured_configs_are_read_or_refused(config_dir: Path, data: dict, indent: Any, ids: list[int]) -> None:
    text = json.dumps(data, indent=indent)
    config = _load(config_dir, text.encode())
    assert config is not None  # valid JSON objects always load
    target, draft = TargetConfig(config), DraftConfig(config)
    try:
        layers = target.num_layers
    except InputError as error:
        assert error.where and error.fix
    else:
        assert isinstance(layers, int) and 0 < layers <= 10_000
    assert target.hidden_size is None or isinstance(target.hidden_size, int)
    assert all(isinstance(name, str) for name in (*target.architectures, *target.text_architectures()))
    assert all(isinstance(name, str) for name in draft.architectures)
    try:
        draft.check_ids()
    except InputError as error:
        assert error.where and error.fix
    else:
        for _, value in draft.declared_ids():
            assert value is None or (value and all(type(item) is int for item in value))
    for path in ID_PATHS:
        config.step(path, "a note")  # cites a line of the file, present or not
        diff = config.edit_diff(path, ids)
        if diff:  # empty when the layout is too unusual to edit by lines
            edited = apply_diff(text, diff)
            assert json.loads(edited) == _set(data, path, ids), diff


def apply_diff(text: str, diff: str) -> str:
    [file_patch] = parse_patch(diff, "edit.patch")
    return apply_hunks(text, file_patch, "edit.patch", "config.json")


# -- a trainer's run config (--training-args run.yaml) ----------------------------------------------

# Text that looks like YAML often enough: sections, lists, anchors, aliases, tags.
yaml_ish_text = st.text(alphabet="ab:-[]{}&*!?|>#'\", \n019.", max_size=80)
# Eight lines of ten aliases each, which expand to 10**8 values.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join(['*' + previous] * 10)}]\n"
    for previous, name in zip("abcdefg", "bcdefgh", strict=True)
)


@QUICK
@given(yaml_ish_text | st.text(max_size=80))
@example("a: &a [*a]\n")  # an alias inside the value it names
@example(ALIAS_BOMB)
@example("a: !!python/object/apply:os.system ['true']\n")
@example("a: " + "[" * 5000 + "]" * 5000)
@example("a: 2024-13-45\n")  # a date YAML resolves, of month 13
def test_run_config_text_is_read_or_refused(text: str) -> None:
    try:
        leaves = read_run_config(text, "run.yaml")
    except InputError as error:
        assert error.where.startswith("run.yaml") and error.fix
        event(f"refused: {error.what[:20]}")
        return
    event("read")
    for leaf in leaves or ():
        assert leaf.keys and 1 <= leaf.line <= text.count("\n") + 1


# -- chat templates --------------------------------------------------------------------------------

# Steps that build a string from `S`, one held across a loop's iterations; `{n}` is a count or width.
BUILDING_STEPS = [
    "S ~ S", "S + S", "S * {n}", "S.center({n})", "S.ljust({n})", "S|indent({n})", "[S, S, S]|join",
    "S.replace('x', S)", "'{{:>{n}}}'.format(S)", "'%{n}s' % S", "S.expandtabs({n})", "([S] * {n})|join",
    "S|wordwrap({n})", "[S] * {n}", "S|center({n})", "(S ~ '\\n') * 3",
]  # fmt: skip


@QUICK
@given(
    st.lists(
        st.tuples(st.sampled_from(BUILDING_STEPS), st.integers(0, 9) | st.integers(0, 10**10)), min_size=1, max_size=5
    ),
    st.integers(1, 40),
)
@example([("S ~ S", 0)], 40)  # doubled forty times
@example([("S.center({n})", 10**10)], 1)
def test_a_template_renders_within_its_bound_or_is_refused(steps: list[tuple[str, int]], loops: int) -> None:
    body = "".join("{% set ns.s = " + step.replace("S", "ns.s").format(n=n) + " %}" for step, n in steps)
    text = f"{{% set ns = namespace(s='x\\t') %}}{{% for i in range({loops}) %}}{body}{{% endfor %}}{{{{ ns.s }}}}"
    template = ChatTemplate(text, Step(Location("target", "chat_template.jinja", 1, 1), "a template"))
    try:
        rendered = template.render(conversation(), add_generation_prompt=True, kwargs={})
    except TemplateError as error:
        assert error.where == "chat_template.jinja:1" and error.fix
        event(f"refused: {error.what[:40]}")
        return
    event("rendered")
    assert len(rendered) <= MAX_VALUE


# -- case.toml -------------------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    """A TOML literal for a generated value (inline tables for mappings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan" if value != value else ("inf" if value > 0 else "-inf") if abs(value) == float("inf") else repr(value)
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return "{" + ", ".join(f"{_toml_string(key)} = {toml_value(item)}" for key, item in value.items()) + "}"


def _toml_string(text: str) -> str:
    """A JSON string is a TOML basic string, but for DEL, which TOML wants escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


toml_scalars = st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=8)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
taps = st.sampled_from(["h0", "h3", "h31+norm", "h?", "x1", "", "h-1", "h" + "9" * 5000])
case_inputs = st.dictionaries(
    st.sampled_from([*INPUT_KEYS, "base"]), st.text(max_size=10) | st.text(max_size=10) | toml_values, max_size=4
)
expected_tables = st.dictionaries(
    st.sampled_from(["status", "root_cause", "serving", "training", "verifier_last", "fix_ids", "ranked_below", "x"]),
    st.sampled_from(["consistent", "mismatch", "inconclusive"])
    | taps
    | st.lists(taps, max_size=3)
    | st.lists(st.integers(-2, 70), max_size=3)
    | toml_values,
    max_size=5,
)


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("case")


def _load_case(directory: Path, content: bytes) -> Any:
    (directory / "case.toml").write_bytes(content)
    try:
        case = load_case(directory)
    except InputError as error:
        assert "case.toml" in str(error) and error.fix
        event(f"refused: {error.what[:20]}")
        return None
    event("loaded")
    return case


@QUICK
@given(st.binary(max_size=80) | st.text(max_size=80).map(str.encode))
@example(b"[inputs]\nserving = " + b"[" * 2000 + b"]" * 2000)  # nested deeper than the parser recurses
@example(b"x = " + b"1" * 5000)
def test_case_file_text_loads_or_is_refused(case_dir: Path, content: bytes) -> None:
    _load_case(case_dir, content)


@QUICK
@given(st.none() | toml_values, case_inputs, st.none() | expected_tables | toml_values)
def test_structured_case_files_load_or_are_refused(case_dir: Path, title: Any, inputs: dict, expected: Any) -> None:
    lines = [] if title is None else [f"title = {toml_value(title)}"]
    if expected is not None and not isinstance(expected, dict):
        lines.append(f"expected = {toml_value(expected)}")
    lines += ["[inputs]", *(f"{key} = {toml_value(value)}" for key, value in inputs.items())]
    if isinstance(expected, dict):
        lines += ["[expected]", *(f"{_toml_string(key)} = {toml_value(value)}" for key, value in expected.items())]
    text = "\n".join(lines) + "\n"
    case = _load_case(case_dir, text.encode())
    if case is not None:
        assert all(isinstance(value, str) for value in case.inputs.as_dict().values())
        if case.expected is not None:
            assert case.expected.status in (None, "consistent", "mismatch", "inconclusive")
            assert case.expected.fix_ids is None or all(type(item) is int for item in case.expected.fix_ids)


# -- patches ---------------------------------------------------------------------------------------

line_text = st.text(st.characters(exclude_characters="\r\n"), max_size=6)
line_lists = st.lists(st.sampled_from(["a", "b", "c", "", "x = 1"]) | line_text, max_size=12)
diff_ish = st.lists(
    st.sampled_from(
        ["--- a/m.py\n+++ b/m.py", "--- /dev/null", "@@ -1 +1 @@", "@@ -1,2 +1,3 @@", "@@ -0,0 +1 @@", "@@ -3 @@"]
    )
    | st.builds(str.__add__, st.sampled_from([" ", "-", "+", "\\", "", "@@ -"]), line_text),
    max_size=12,
).map("\n".join)


def unified_diff(before: list[str], after: list[str], context: int = 3) -> str:
    return "".join(
        difflib.unified_diff(
            [line + "\n" for line in before], [line + "\n" for line in after], "a/m.py", "b/m.py", n=context
        )
    )


def _apply_all(text: str, original: str) -> str | None:
    """Parse a patch and apply each file's hunks to `original`: the text, or None when refused."""
    try:
        files = parse_patch(text, "fix.patch")
        for file_patch in files:
            original = apply_hunks(original, file_patch, "fix.patch", "m.py")
    except PatchError as error:
        assert "fix.patch" in str(error) and error.fix
        event(f"refused: {error.what[:20]}")
        return None
    event("applied")
    return original


@QUICK
@given(st.text(max_size=100) | diff_ish, st.text(max_size=40))
@example("--- a\n+++ b\n@@ -" + "1" * 5000 + " +1 @@\n-x\n+y\n", "x\n")  # more digits than int() reads
@example("--- a\n+++ b\n@@ -1 +1 @@\n-x\f\n+y\n", "x\f\n")  # a form feed is not a line break in a diff
def test_patch_text_parses_and_applies_or_is_refused(text: str, original: str) -> None:
    _apply_all(text, original)


@st.composite
def mutated_diffs(draw: st.DrawFn) -> tuple[str, str]:
    """A real diff with its headers, hunk counts or lines changed: (diff, the file it was made from)."""
    before, after = draw(line_lists), draw(line_lists)
    lines = unified_diff(before, after, draw(st.sampled_from([0, 1, 3]))).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        if not lines:
            break
        at = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["count", "drop", "repeat", "prefix"]))
        if kind == "count" and lines[at].startswith("@@"):
            number = draw(st.integers(0, 10**6).map(str) | st.sampled_from(["1" + "0" * 30, "9" * 5000]))
            lines[at] = re.sub(r"\d+", number, lines[at], count=draw(st.integers(1, 4)))
        elif kind == "drop":
            del lines[at]
        elif kind == "repeat":
            lines.insert(at, lines[at])
        else:
            lines[at] = draw(st.sampled_from(["+", "-", " ", "@", "\\", "--- ", "+++ "])) + lines[at][1:]
    return "".join(lines), "".join(line + "\n" for line in before)


@QUICK
@given(mutated_diffs())
def test_mutated_diffs_apply_or_are_refused(case: tuple[str, str]) -> None:
    _apply_all(*case)


@QUICK
@given(line_lists, line_lists, st.sampled_from([0, 1, 3]))
@example(["a", "b", "c"], ["a", "b", "c", "d"], 0)  # an insertion with no context: `@@ -3,0 +4 @@`
@example(["a\fb"], ["c"], 3)  # a form feed inside a line
def test_a_difflib_diff_turns_a_into_b(before: list[str], after: list[str], context: int) -> None:
    diff = unified_diff(before, after, context)
    old, new = "".join(line + "\n" for line in before), "".join(line + "\n" for line in after)
    if not diff:
        return  # nothing differs: difflib writes no diff, and an empty patch is refused
    [file_patch] = parse_patch(diff, "fix.patch")
    assert apply_hunks(old, file_patch, "fix.patch", "m.py") == new


# -- dumps and checkpoints -------------------------------------------------------------------------

TENSOR_NAMES = ("hidden_states", "token_ids", "input_ids", "verifier_last", "aux_hidden_state", "hidden_state")
DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "int64", "int32", "uint8", "uint64", "bool")
FILLS = (0, 1, -1, 3.5, 2**40, float("inf"), float("nan"))
# A tensor as (dtype, shape, fill): built in the test, so that collecting this file needs no torch.
tensor_specs = st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 4), max_size=4), st.sampled_from(FILLS))
SAFETENSORS_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "U8", "BOOL", "X")
header_entries = (
    st.fixed_dictionaries(
        {},
        optional={
            "dtype": st.sampled_from(SAFETENSORS_DTYPES) | json_values,
            "shape": st.lists(st.integers(-2, 6) | st.sampled_from([10**12]), max_size=3) | json_values,
            "data_offsets": st.lists(
                st.integers(-8, 300) | st.sampled_from([2**64, 1.5, float("inf"), float("nan")]), max_size=3
            )
            | json_values,
        },
    )
    | json_values
)
embedding_entries = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(SAFETENSORS_DTYPES),
        "shape": st.lists(st.integers(-1, 4) | st.sampled_from([10**12]), min_size=2, max_size=2),
        "data_offsets": st.lists(st.integers(-8, 64), min_size=2, max_size=2),
    }
)
header_names = st.sampled_from([*TENSOR_NAMES, "model.embed_tokens.weight", "__metadata__"]) | st.text(max_size=4)
headers = (
    st.dictionaries(header_names, header_entries, max_size=4)
    | st.fixed_dictionaries({"model.embed_tokens.weight": embedding_entries})
    | json_values
)


def safetensors_bytes(header: Any, data: bytes, lie: int = 0) -> bytes:
    """The safetensors layout: 8-byte little-endian header length (off by `lie`), JSON header, data."""
    text = json.dumps(header).encode()
    return max(len(text) + lie, 0).to_bytes(8, "little") + text + data


@st.composite
def raw_safetensors(draw: st.DrawFn) -> bytes:
    """A safetensors file with a header of any shape, a length that may lie, and any data."""
    return safetensors_bytes(
        draw(headers), draw(st.binary(max_size=300)), draw(st.sampled_from([0, 0, 0, -1, 1, 2**40]))
    )


def build(torch: Any, spec: tuple[str, list[int], float]) -> Any:
    dtype, shape, fill = spec
    return torch.full(shape, float(fill)).to(getattr(torch, dtype))


@pytest.fixture(scope="module")
def torch_lib() -> Any:
    pytest.importorskip("safetensors")
    return pytest.importorskip("torch")


def _read_dumps(torch: Any, path: Path, hidden_size: int | None, max_tokens: int | None) -> None:
    """Open a dump file and read every sample: what comes back has the shapes rca relies on."""
    try:
        dumps = open_dumps(path, path.parent, hidden_size)
        samples = list(dumps.samples(max_tokens))
    except DumpError as error:
        assert error.where and error.fix
        event(f"refused: {error.what[:20]}")
        return
    event("read")
    for sample in samples:
        tokens = len(sample.token_ids)
        assert sample.token_ids.dtype == torch.int64 and tokens > 0
        assert max_tokens is None or tokens <= max_tokens
        for tensor in (*sample.slots, *([sample.verifier_last] if sample.verifier_last is not None else [])):
            assert tensor.dtype.is_floating_point and tensor.dim() == 2 and tensor.shape[0] == tokens
            assert bool(torch.isfinite(tensor.float()).all())
        assert len({int(slot.shape[1]) for slot in sample.slots}) == 1


FLOATS = st.sampled_from(["float32", "float32", "float32", "bfloat16", "float16", "float8_e4m3fn", "int32"])
INTS = st.sampled_from(["int64", "int64", "int64", "int32", "uint8", "uint64", "float32", "bool"])


@st.composite
def dump_contents(draw: st.DrawFn, format: str) -> dict[str, Any]:
    """Tensors in a format's layout, mostly of agreeing shapes, sometimes not (as specs; see `build`)."""
    sizes = st.sampled_from([1, 2, 3, 4, 0])
    tokens, slots, width = draw(sizes), draw(sizes), draw(sizes)
    fill = st.sampled_from([0, 1, 3.5, 0, 1, 3.5, *FILLS])
    mostly = st.sampled_from([True, True, True, True, False])

    def shape(*dims: int) -> list[int]:
        return list(dims) if draw(mostly) else draw(st.lists(st.integers(0, 4), max_size=4))

    ids = (draw(INTS), shape(1, tokens) if format == "specforge" else shape(tokens), draw(st.sampled_from(FILLS[:3])))
    if format == "speculators-pt":
        layers = [(draw(FLOATS), shape(tokens, width), draw(fill)) for _ in range(slots)]
        return {"input_ids": ids, "hidden_states": layers}
    if format == "specforge":
        content = {"input_ids": ids, "aux_hidden_state": (draw(FLOATS), shape(1, tokens, slots * width), draw(fill))}
        if draw(st.booleans()):
            content["hidden_state"] = (draw(FLOATS), shape(1, tokens, width), draw(fill))
        return content
    content = {"hidden_states": (draw(FLOATS), shape(tokens, slots, width), draw(fill))}
    content[draw(st.sampled_from(["token_ids", "token_ids", "input_ids"]))] = ids
    if draw(st.booleans()):
        content["verifier_last"] = (draw(FLOATS), shape(tokens, width), draw(fill))
    return content


dump_names = st.sampled_from(["sample.safetensors", "hs_0.safetensors", "data_0.pt", "rows_0-5000/data_0.ckpt"])
read_options = st.tuples(st.none() | st.integers(0, 8), st.none() | st.integers(1, 5))


@SLOW
@given(dump_names, st.binary(max_size=200) | raw_safetensors(), read_options)
@example("hs_0.safetensors", b"\x08" + b"\x00" * 7 + b"{}", (None, None))
def test_dump_bytes_are_read_or_refused(torch_lib: Any, name: str, content: bytes, options: tuple) -> None:
    with scratch() as directory:
        path = Path(directory, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        _read_dumps(torch_lib, path, *options)


@SLOW
@given(
    st.sampled_from(["sample.safetensors", "hs_0.safetensors"]),
    dump_contents("safetensors")
    | st.dictionaries(st.sampled_from(TENSOR_NAMES) | st.text(min_size=1, max_size=4), tensor_specs, max_size=4),
    read_options,
)
@example(
    "sample.safetensors", {"hidden_states": ("float32", [2, 1, 3], 0), "input_ids": ("uint64", [2], 1)}, (None, None)
)
@example(
    "sample.safetensors",
    {"hidden_states": ("float8_e4m3fn", [2, 1, 3], 0), "input_ids": ("int64", [2], 1)},
    (None, None),
)
def test_safetensors_dumps_are_read_or_refused(
    torch_lib: Any, name: str, tensors: dict[str, tuple], options: tuple
) -> None:
    from safetensors.torch import save_file

    with scratch() as directory:
        path = Path(directory, name)
        save_file({key: build(torch_lib, spec).contiguous() for key, spec in tensors.items()}, path)
        _read_dumps(torch_lib, path, *options)


pickled = st.recursive(
    tensor_specs | st.none() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(TENSOR_NAMES), inner, max_size=4),
    max_leaves=6,
)


def unpack(torch: Any, value: Any) -> Any:
    """A generated value with its tensor specs built."""
    if isinstance(value, tuple):
        return build(torch, value)
    if isinstance(value, list):
        return [unpack(torch, item) for item in value]
    if isinstance(value, dict):
        return {key: unpack(torch, item) for key, item in value.items()}
    return value


@SLOW
@given(
    st.sampled_from(["data_0.pt", "rows_0-5000/data_0.ckpt", "data_0.ckpt.gz"]).flatmap(
        lambda name: st.tuples(
            st.just(name), dump_contents("speculators-pt" if name.endswith(".pt") else "specforge") | pickled
        )
    ),
    read_options,
)
def test_pickled_dumps_are_read_or_refused(torch_lib: Any, file: tuple[str, Any], options: tuple) -> None:
    name, value = file
    with scratch() as directory:
        path = Path(directory, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch_lib.save(unpack(torch_lib, value), buffer)
        path.write_bytes(gzip.compress(buffer.getvalue()) if name.endswith(".gz") else buffer.getvalue())
        _read_dumps(torch_lib, path, *options)


metadata = st.fixed_dictionaries(
    {},
    optional={
        "hidden_states": st.fixed_dictionaries({}, optional={"layer_ids": layer_ids}) | json_values,
        "layer_ids": layer_ids,
        "target_layer_ids": layer_ids,
    },
)


@QUICK
@given(st.binary(max_size=80) | json_values.map(json.dumps).map(str.encode) | metadata.map(json.dumps).map(str.encode))
@example(b'{"layer_ids": [' + b"1" * 5000 + b"]}")
def test_dump_metadata_is_read_or_refused(config_dir: Path, content: bytes) -> None:
    """data_config.json beside the dumps: the layer ids it records, none, or one line saying why not."""
    (config_dir / "data_config.json").write_bytes(content)
    try:
        found = read_dump_metadata(config_dir, config_dir)
    except InputError as error:
        assert "data_config.json" in str(error) and error.fix
        event(f"refused: {error.what[:20]}")
        return
    event("none" if found is None else "read")
    assert found is None or all(type(item) is int for item in found.ids)


def _read_checkpoint(torch: Any, directory: Path, rows: list[int]) -> Any:
    """Open a checkpoint and read the embedding rows of `rows`, as the embedding probe does: the
    rows as float32 [len(rows), width], or None when refused or there is no embedding."""
    try:
        checkpoint = Checkpoint.open(directory, directory)
        name = checkpoint.find(["embed_tokens.weight", "hidden_states", "token_ids", "input_ids"])
        table = checkpoint.rows(name, torch.tensor(rows, dtype=torch.int64)) if name is not None else None
        assert checkpoint.total_bytes >= 0
    except InputError as error:  # CheckpointError, or the index file itself unreadable
        assert error.where and error.fix
        event(f"refused: {error.what[:20]}")
        return None
    event("read")
    assert table is None or (table.dtype == torch.float32 and table.dim() == 2 and table.shape[0] == len(rows))
    return table


token_rows = st.lists(st.integers(0, 6) | st.sampled_from([2**40]), max_size=4)


def _embedding(shape: list, offsets: list, dtype: str = "F32") -> bytes:
    return safetensors_bytes(
        {"model.embed_tokens.weight": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}, bytes(8)
    )


@SLOW
@given(st.binary(max_size=200) | raw_safetensors(), token_rows)
@example(_embedding([2, 10**12], [0, 8]), [0])  # a row wider than the file: MemoryError
@example(_embedding([2, -2], [0, 8]), [0])  # a negative width: ValueError
@example(_embedding([2, 2**62], [0, 8]), [0])  # OverflowError
@example(_embedding([2, 1], [-8, 0]), [0])  # data before the data section: the header read as weights
@example(_embedding([2, 1], [0, float("inf")]), [0])  # OverflowError
def test_checkpoint_bytes_are_read_or_refused(torch_lib: Any, content: bytes, rows: list[int]) -> None:
    with scratch() as directory:
        Path(directory, "model.safetensors").write_bytes(content)
        _read_checkpoint(torch_lib, Path(directory), rows)


@SLOW
@given(
    st.dictionaries(
        st.sampled_from(["model.embed_tokens.weight", "lm_head.weight"]) | st.text(min_size=1, max_size=4),
        tensor_specs,
        max_size=3,
    ),
    token_rows,
)
@example({"model.embed_tokens.weight": ("float32", [1, 0], 0)}, [0])  # rows 0 wide: IndexError
def test_safetensors_checkpoints_are_read_or_refused(torch_lib: Any, tensors: dict, rows: list[int]) -> None:
    from safetensors.torch import save_file

    built = {key: build(torch_lib, spec) for key, spec in tensors.items()}
    with scratch() as directory:
        save_file(built, Path(directory, "model.safetensors"))
        table = _read_checkpoint(torch_lib, Path(directory), rows)
    if table is not None:  # the rows read are the rows saved
        expected = built["model.embed_tokens.weight"].float()[rows]
        torch_lib.testing.assert_close(table, expected, rtol=0, atol=0, equal_nan=True)


shard_names = st.sampled_from(["model.safetensors", "shard-1.safetensors", "../x.safetensors", "/etc/passwd", ""])


@SLOW
@given(
    st.dictionaries(st.text(max_size=4), shard_names | json_values, max_size=3) | json_values,
    st.binary(max_size=100) | raw_safetensors(),
    token_rows,
)
@example({"model.embed_tokens.weight": "a\x00b"}, b"", [0])  # a NUL byte cannot be in a path
def test_checkpoint_indexes_are_read_or_refused(torch_lib: Any, weight_map: Any, shard: bytes, rows: list) -> None:
    with scratch() as directory:
        Path(directory, "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        Path(directory, "model.safetensors").write_bytes(shard)
        _read_checkpoint(torch_lib, Path(directory), rows)


# -- the draft's checkpoint and the contract checks ------------------------------------------------

vocab_map_entries = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(SAFETENSORS_DTYPES),
        "shape": st.lists(st.integers(-1, 6) | st.sampled_from([10**12]), min_size=1, max_size=2),
        "data_offsets": st.lists(st.integers(-8, 64), min_size=2, max_size=2),
    }
)
draft_headers = (
    st.dictionaries(
        st.sampled_from(["d2t", "t2d", "lm_head.weight", "input_norm.weight"]), vocab_map_entries, max_size=4
    )
    | headers
)


@SLOW
@given(
    st.binary(max_size=120)
    | draft_headers.flatmap(lambda h: st.binary(max_size=80).map(lambda d: safetensors_bytes(h, d)))
)
@example(safetensors_bytes({"d2t": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}, bytes(16)))
@example(safetensors_bytes({"d2t": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}, bytes(6)))
def test_draft_checkpoint_bytes_are_read_or_refused_and_checked(content: bytes) -> None:
    """A draft checkpoint is read (names, shapes, the vocab maps' values) or refused with one
    CheckpointError; whatever is read, the vocab-map checks give reasons and never raise."""
    from rca.analyzers.draft_contract.vocab_map import _problems

    from rca.inputs.draft import read_draft_weights

    with scratch() as directory:
        Path(directory, "config.json").write_text("{}")
        Path(directory, "model.safetensors").write_bytes(content)
        try:
            weights = read_draft_weights(Path(directory))
        except InputError as error:
            assert error.where and error.fix
            event(f"refused: {error.what[:20]}")
            return
    assert weights is not None and weights.bytes_read <= weights.total_bytes
    d2t = weights.find("d2t")
    if d2t is not None:
        for sizes in ((2, 4), (3, 3), (0, 1)):
            problems = _problems(weights, d2t, *sizes)
            assert all(isinstance(problem, str) and problem for problem in problems)
    event("read, with a d2t" if d2t is not None else "read")


@QUICK
@given(st.integers(1, 40), st.integers(0, 60), st.randoms(use_true_random=False))
def test_a_map_of_distinct_target_ids_is_valid_and_a_collision_is_named(draft: int, extra: int, rng: Any) -> None:
    """d2t built from any set of distinct target ids (with its t2d) passes every check; sending two
    draft ids to one target id is always reported."""
    from rca.analyzers.draft_contract.vocab_map import _problems

    from rca.inputs.draftweights import DraftTensor, DraftWeights

    vocab = draft + extra
    kept = sorted(rng.sample(range(vocab), draft))
    offsets = tuple(target - i for i, target in enumerate(kept))
    keep = tuple(i in kept for i in range(vocab))
    tensors = {"d2t": DraftTensor("d2t", "I64", (draft,), "m"), "t2d": DraftTensor("t2d", "BOOL", (vocab,), "m")}
    weights = DraftWeights("draft", tensors, {"d2t": offsets, "t2d": keep})
    assert _problems(weights, tensors["d2t"], draft, vocab) == [] or (not any(offsets) and kept == list(range(draft)))
    if draft >= 2:
        clashing = (offsets[1] + 1, *offsets[1:])  # draft id 0 lands on draft id 1's target
        problems = _problems(DraftWeights("draft", tensors, {"d2t": clashing}), tensors["d2t"], draft, vocab)
        assert any("more than once" in problem or "all" in problem for problem in problems), problems


@QUICK
@given(json_values, json_values)
def test_rope_settings_of_any_shape_are_read(draft: Any, target: Any) -> None:
    """The RoPE of configs of any shape is read as a mapping of known keys, never an error."""
    from rca.analyzers.across.draft_positions import _describe, _rope

    for data in (draft, target):
        config = ConfigFile.from_data("draft", Path("c.json"), "c.json", {"rope_scaling": data, "rope_theta": data})
        rope = _rope(config, ())
        assert isinstance(rope, dict) and isinstance(_describe(rope), str)


# -- the evaluator on generated programs -----------------------------------------------------------

# Names the generated code reads and writes; the ones no statement binds are unknown values.
NAMES = ("i", "x", "n", "val", "layer_ids", "num_layers", "hidden_states", "residual")
atoms = st.integers(-3, 70).map(str) | st.sampled_from(
    [
        *NAMES,
        "None",
        "True",
        "'a'",
        "'inf'",
        "[]",
        "1.5",
        "self.layers",
        "self.layers_to_capture",
        "self.config.num_hidden_layers",
        "len(self.layers)",
        "self.start_layer",
        "0x" + "f" * 2000,  # an integer of 8000 bits
        "1" * 5000,  # more digits than Python reads: the standard parser refuses the file
    ]
)
BINARY = ("+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^")
METHODS = "append extend insert pop sort index count reverse copy center replace join split __pow__".split()
CALLS = "len range list sorted min max sum abs int float str tuple set enumerate".split()


def _expression(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(BINARY), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["-", "not ", "~"]), inner).map("({0[0]}{0[1]})".format),
        st.tuples(inner, st.sampled_from(["<", "==", "in", "is not", ">="]), inner).map(" ".join),
        st.lists(inner, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
        st.tuples(inner, inner).map("[{0[0]} for val in range({0[1]})]".format),
        st.tuples(inner, inner, inner).map("[{0[0]} for val in {0[1]} if {0[2]}]".format),
        st.tuples(inner, inner, inner).map("({0[0]} if {0[1]} else {0[2]})".format),
        st.tuples(st.sampled_from(CALLS), st.lists(inner, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.tuples(inner, inner).map("{0[0]}[{0[1]}]".format),
        st.tuples(inner, inner, inner).map("{0[0]}[{0[1]}:{0[2]}]".format),
    )


expressions = st.recursive(atoms, _expression, max_leaves=6)
iterables = st.sampled_from(
    ["range(self.start_layer, self.end_layer)", "self.layers", "layer_ids", "range(num_layers)", "range(10**6)"]
) | expressions.map("range({})".format)


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


def statements(depth: int, in_loop: bool = False) -> st.SearchStrategy[list[str]]:
    """Lists of source lines, one statement (compound ones nested up to `depth` deep)."""
    simple = st.one_of(
        st.tuples(st.sampled_from(NAMES), expressions).map("{0[0]} = {0[1]}".format),
        st.tuples(st.sampled_from(NAMES), st.sampled_from(BINARY), expressions).map("{0[0]} {0[1]}= {0[2]}".format),
        expressions.map("aux_hidden_states.append({})".format),
        st.tuples(st.sampled_from(NAMES), st.sampled_from(METHODS), st.lists(expressions, max_size=2)).map(
            lambda t: f"{t[0]}.{t[1]}({', '.join(t[2])})"
        ),
        expressions.map("self.layers_to_capture = {}".format),
        expressions.map("self.model.layers_to_capture = {}".format),
        st.sampled_from(
            [
                "aux_hidden_states.append(hidden_states + residual)",
                "hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)",
                "assert x",
                "pass",
                *(["break", "continue"] if in_loop else []),
            ]
        ),
    ).map(lambda line: [line])
    if depth == 0:
        return simple

    def block(loop: bool) -> st.SearchStrategy[list[str]]:
        inner = statements(depth - 1, loop)
        return st.lists(inner, min_size=1, max_size=3).map(lambda parts: _indent([line for p in parts for line in p]))

    return st.one_of(
        simple,
        simple,
        st.tuples(expressions, block(in_loop), block(in_loop)).map(lambda t: [f"if {t[0]}:", *t[1], "else:", *t[2]]),
        st.tuples(st.sampled_from(NAMES), iterables, block(True)).map(lambda t: [f"for {t[0]} in {t[1]}:", *t[2]]),
        st.tuples(expressions, block(True)).map(lambda t: [f"while {t[0]}:", *t[1]]),
        st.tuples(block(in_loop), block(in_loop)).map(lambda t: ["try:", *t[0], "except Exception:", *t[1]]),
    )


bodies = st.lists(statements(2), min_size=1, max_size=4).map(lambda parts: [line for p in parts for line in p])


def _function(body: list[str]) -> str:
    lines = ["x = []", "aux_hidden_states = []", *body, "return [x, aux_hidden_states, layer_ids]"]
    return "def f(n, layer_ids, hidden_states, residual):\n" + "\n".join(_indent(lines)) + "\n"


arguments = st.lists(
    st.none() | st.integers(-2, 70) | st.lists(st.integers(-2, 70), max_size=3), min_size=4, max_size=4
)


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("source")


@settings(max_examples=60, deadline=timedelta(seconds=5))
@given(bodies, arguments)
@example(["x = (2 ** (10 ** 10))"], [None] * 4)  # a power that takes minutes to compute
@example(["x = ('ab' * (10 ** 9))"], [None] * 4)  # a 2 GB string
@example(["x = ([0] * (10 ** 9))"], [None] * 4)  # a list of a billion items
@example(["x = 0x" + "f" * 5000], [None] * 4)  # an integer too long to print
@example(["x = " + "1" * 5000], [None] * 4)  # more digits than Python reads: the standard parser refuses the file
@example(["x = (1 << (-1))"], [None] * 4)  # ValueError, as Python raises
@example(["x = (2.0 ** 5000)"], [None] * 4)  # OverflowError, as Python raises
@example(["x = int(float('inf'))"], [None] * 4)  # OverflowError, as Python raises
@example(["x = float(0x" + "f" * 300 + ")"], [None] * 4)  # OverflowError, as Python raises
@example(["x = sorted([1, 'a'])"], [None] * 4)  # TypeError, as Python raises
@example(["x = range(1, 5, 0)"], [None] * 4)  # ValueError, as Python raises
@example(["x = len(range((10 ** 30)))"], [None] * 4)  # a length past 2**63
@example(["x = [1]", "for i in range(70):", "    x += x"], [None] * 4)  # 2**70 items: memory runs out
@example(["x = [1]", "for i in range(70):", "    x.extend(x)"], [None] * 4)  # the same, in place
@example(["x = [1]", "x.pop(5)"], [None] * 4)  # IndexError, as Python raises
@example(["x = [1]", "x.insert((10 ** 30), 2)"], [None] * 4)  # OverflowError, as Python raises
@example(["x = [1, 'a']", "x.sort()"], [None] * 4)  # TypeError, as Python raises
@example(["x = 'abc'.center((10 ** 9))"], [None] * 4)  # a 1 GB string
@example(["x = (10).__pow__((10 ** 9))"], [None] * 4)  # a power that takes minutes
@example(["x = '%999999999d' % 1"], [None] * 4)  # a 1 GB string from a format width
@example(["x = '{:>999999999}'.format(1)"], [None] * 4)  # the same, from a format spec
def test_generated_functions_evaluate_or_raise(source_dir: Path, body: list[str], args: list) -> None:
    """A function's value, or the analyzed code's own exception, or the step budget spent."""
    (source_dir / "mod.py").write_text(_function(body))
    index = CodeIndex(SourceTree("serving", "test", source_dir))
    module = index.load("mod.py")
    assert module is not None, index.failures
    target = ConfigFile.from_data("target", Path("target.json"), "target.json", {"num_hidden_layers": 8})
    ev = Evaluator(index, DataflowGraph(), num_layers=8, target=target, budget=20_000)
    names = ("n", "layer_ids", "hidden_states", "residual")
    values = [
        Val(Opaque(name)) if arg is None else python_to_val(arg, NO_SRC) for name, arg in zip(names, args, strict=True)
    ]
    try:
        result = ev.call(Val(FuncRef(module.functions["f"])), values)
    except EvalRaise as error:
        event(f"raises {error.kind}")
        return
    except BudgetExceeded:
        event("budget spent")
        return
    event("value")
    assert isinstance(result, Val) and isinstance(describe(result), str)


@QUICK
@given(
    st.text(max_size=120)
    | bodies.map(_function)
    | bodies.map(_function).map(lambda text: text.replace("    ", "\t", 1))
)
@example("x = (" * 1000 + ")" * 1000)
@example("def f():\n    return " + "-" * 100_000 + "1\n")
@example("x = 1\fy = 2\n")
def test_source_text_parses_or_is_a_parse_error(text: str) -> None:
    try:
        parsed = parse_text(text)
    except (TooComplexToParse, cst.ParserSyntaxError):
        event("refused")
        return
    event("parsed")
    assert parsed.text == text


# The SGLang-shaped model of the test tree, with generated statements in its constructor, in its
# layer loop and where it stores the draft's layer ids.
MODEL = """\
import torch
from torch import nn

from sglang.srt.distributed import get_pp_group
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.utils import make_layers


class DeepseekLikeModel(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__()
        self.config = config
        self.pp_group = get_pp_group()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers, self.start_layer, self.end_layer = make_layers(
            config.num_hidden_layers, lambda idx, prefix: DecoderLayer(config, idx), pp_rank=self.pp_group.rank_in_group
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers_to_capture = []
{init}

    def forward(self, input_ids, positions, forward_batch, input_embeds=None):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
{loop}
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        if len(aux_hidden_states) == 0:
            return hidden_states
        return hidden_states, aux_hidden_states


class DeepseekLikeForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__()
        self.config = config
        self.model = DeepseekLikeModel(config, quant_config, prefix=prefix)
        self.logits_processor = LogitsProcessor(config)
        self.capture_aux_hidden_states = False

    def forward(self, input_ids, positions, forward_batch, input_embeds=None):
        hidden_states = self.model(input_ids, positions, forward_batch, input_embeds)
        aux_hidden_states = None
        if self.capture_aux_hidden_states:
            hidden_states, aux_hidden_states = hidden_states
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch, aux_hidden_states)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.capture_aux_hidden_states = True
        num_layers = self.config.num_hidden_layers
        if layer_ids is None:
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
{capture}


EntryClass = [DeepseekLikeForCausalLM]
"""
CAPTURE_DEFAULT = "self.model.layers_to_capture = [val + 1 for val in layer_ids]"
LOOP_DEFAULT = "if i in self.layers_to_capture:\n    aux_hidden_states.append(hidden_states + residual)"


def _model(init: list[str], loop: list[str], capture: list[str]) -> str:
    def at(depth: int, lines: list[str]) -> str:
        return "\n".join(" " * depth + line for line in lines)

    return MODEL.format(init=at(8, init or ["pass"]), loop=at(12, loop), capture=at(12, capture))


model_parts = st.tuples(
    st.lists(statements(1), max_size=2).map(lambda parts: [line for p in parts for line in p]),
    st.tuples(st.booleans(), bodies).map(lambda t: [*(LOOP_DEFAULT.splitlines() if t[0] else []), *t[1]]),
    st.tuples(st.booleans(), bodies).map(lambda t: [*([CAPTURE_DEFAULT] if t[0] else []), *t[1]]),
)
TARGET = {"architectures": ["DeepseekLikeForCausalLM"], "num_hidden_layers": 8}
DRAFT = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}
targets = st.fixed_dictionaries(
    {"architectures": st.just(["DeepseekLikeForCausalLM"]), "num_hidden_layers": st.integers(1, 64)},
    optional={"hidden_size": st.integers(1, 8192)},
)
drafts = st.fixed_dictionaries(
    {}, optional={"eagle_config": eagle_config, "eagle_aux_hidden_state_layer_ids": layer_ids}
)


@settings(max_examples=25, deadline=timedelta(seconds=10))
@given(model_parts, targets, drafts)
@example(([], LOOP_DEFAULT.splitlines(), [CAPTURE_DEFAULT]), TARGET, DRAFT)
def test_generated_models_are_analyzed_without_a_crash(
    source_dir: Path, parts: tuple, target: dict, draft: dict
) -> None:
    """The serving side of a diagnosis: every analyzer runs to its end or stops at the budget;
    none fails with an exception of its own (which the engine would note, with a traceback)."""
    tree = source_dir / "serving"
    if not tree.exists():
        shutil.copytree(TREES / "sglang_like", tree)
    (tree / "sglang/srt/models/deepseek_like.py").write_text(_model(*parts))
    ctx = SideContext(
        "serving",
        SourceTree("serving", "test", tree),
        TargetConfig(ConfigFile.from_data("target", Path("target.json"), "target.json", target)),
        DraftConfig(ConfigFile.from_data("draft", Path("draft.json"), "draft.json", draft)),
    )
    try:
        run_side(ctx)
        wiring = resolve_wiring(ctx)
    except RcaError as error:  # the engine lets the domain errors through, as one line
        assert error.fix
        event("refused")
        return
    crashes = [note.text for note in ctx.notes if re.match(r"analyzer \S+ failed: ", note.text)]
    assert not crashes, "\n".join(ctx.debug)
    event("resolved" if wiring.resolved else "unresolved")


def test_a_target_that_raises_when_given_the_ids_is_noted_not_a_crash(tmp_path: Path) -> None:
    tree = Path(shutil.copytree(TREES / "sglang_like", tmp_path / "serving"))
    model = _model([], LOOP_DEFAULT.splitlines(), ["raise ValueError('this draft is not supported')"])
    (tree / "sglang/srt/models/deepseek_like.py").write_text(model)
    ctx = SideContext(
        "serving",
        SourceTree("serving", "test", tree),
        TargetConfig(load_config("target", write_json(tmp_path / "target.json", TARGET))),
        DraftConfig(load_config("draft", write_json(tmp_path / "draft.json", DRAFT))),
    )
    run_side(ctx)
    assert not ctx.debug, ctx.debug[0]
    said = [note.text for note in ctx.notes if "raises ValueError" in note.text]
    assert said and "set_eagle3_layers_to_capture raises ValueError" in said[0], [note.text for note in ctx.notes]
    assert "this draft is not supported" in said[0]


# Needles over a small alphabet, one holding another or sharing a prefix with it, and files made
# of pieces of them: what a search should find there is found there often.
@st.composite
def needles_and_files(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    needles = draw(st.lists(st.text(alphabet="ab(:", min_size=1, max_size=12), min_size=1, max_size=8, unique=True))
    pieces = st.sampled_from(needles).flatmap(lambda needle: st.sampled_from([needle, needle[1:], needle[:-1]]))
    files = draw(
        st.lists(st.lists(pieces | st.text(alphabet="ab(: ", max_size=4), max_size=8).map("".join), max_size=5)
    )
    return needles, files


@given(needles_and_files(), st.sampled_from([2, 12]))
@settings(deadline=None)
def test_a_search_plan_finds_in_a_file_what_searching_every_needle_finds(
    case: tuple[list[str], list[str]], shared_prefix: int
) -> None:
    """The text search looks for some needles only in files that hold a shorter needle or a
    prefix they share: it finds in each file exactly the needles a search for each finds."""
    from unittest import mock

    from rca.inputs import textsearch

    needles, files = case
    with mock.patch.object(textsearch, "_SHARED_PREFIX", shared_prefix):
        plan = textsearch.search_plan({needle: needle.encode() for needle in needles})
    assert sorted(needle for needle, _, _ in plan if needle is not None) == sorted(needles)
    for text in files:
        found = sorted(needle for needle in needles if needle in text)
        event(f"found {min(len(found), 3)}+ needles")
        assert sorted(textsearch.needles_in(text.encode(), plan)) == found
