"""The code index: bodies parsed on demand must give the same nodes and lines as a whole parse."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from rca.inputs.sources import SourceTree
from rca.static.codeindex import _TRIVIA, CodeIndex, ModuleInfo, walk
from tests.conftest import write_tree

SOURCE = textwrap.dedent(
    '''\
    """A module with every kind of def the skeleton must keep straight."""
    import functools


    def helper(x): return x + 1


    class Model:
        layers = 4

        @functools.cache
        @staticmethod
        def decorated(a,
                      b):
            # a comment before the body
            total = a + b
            return total

        async def fetch(self):
            await self.io()

        def outer(self):
            def inner(y):
                marker_inner = y
                return marker_inner

            class Local:
                def method(self):
                    marker_local = 1

            return inner(self.layers)

        if True:
            def guarded(self):
                marker_guarded = """a
    string that leaves the indentation"""


        after_methods = 8


    try:
        def optional():
            marker_optional = 2
    except ImportError:
        pass

    at_the_end = Model
    '''
)


def load(tmp_path: Path, text: str, name: str = "mod.py") -> ModuleInfo:
    root = write_tree(tmp_path / "src", {name: text})
    module = CodeIndex(SourceTree("serving", "test", root)).load(name)
    assert module is not None
    return module


def line_of(module: ModuleInfo, function_qualname: str, marker: str) -> int:
    """The line the index reports for the assignment to `marker` inside the function."""
    function = next(info for info in module.all_functions if info.qualname == function_qualname)
    node = next(
        node
        for node in walk(function.node)
        if isinstance(node, cst.Assign)
        and isinstance(node.targets[0].target, cst.Name)
        and node.targets[0].target.value == marker
    )
    return module.lines_of(node, function.node)[0]


def line_starting(text: str) -> int:
    return line_in(SOURCE, text)


def line_in(text: str, start: str) -> int:
    """The first line of `text` starting with `start` (indentation aside)."""
    return next(number for number, line in enumerate(text.splitlines(), 1) if line.strip().startswith(start))


def expected_line(marker: str) -> int:
    return line_starting(f"{marker} =")


@pytest.mark.parametrize(
    ("qualname", "marker"),
    [
        ("Model.decorated", "total"),
        ("Model.outer.inner", "marker_inner"),
        ("Model.outer.method", "marker_local"),
        ("Model.guarded", "marker_guarded"),
        ("optional", "marker_optional"),
    ],
)
def test_lines_inside_bodies_parsed_on_demand(tmp_path: Path, qualname: str, marker: str) -> None:
    module = load(tmp_path, SOURCE)
    assert line_of(module, qualname, marker) == expected_line(marker)


def test_module_and_class_lines_survive_the_stubbed_bodies(tmp_path: Path) -> None:
    module = load(tmp_path, SOURCE)
    model = module.classes["Model"]
    attribute = model.attributes["after_methods"]
    assert module.lines_of(attribute, model.node)[0] == line_starting("after_methods =")
    statement = module.assignments["at_the_end"]
    assert module.lines_of(statement, None) == (line_starting("at_the_end ="),) * 2
    assert module.lines_of(model.node, None) == (line_starting("class Model:"), line_starting("after_methods ="))
    guard = next(statement for statement in model.node.body.body if isinstance(statement, cst.If))
    whole = (line_starting("if True:"), line_starting("string that leaves"))  # it ends with a def's last line
    assert module.lines_of(guard, model.node) == whole == module._compute_ranges(module.tree)[guard]


def test_structure_is_known_before_any_body_is_parsed(tmp_path: Path) -> None:
    module = load(tmp_path, SOURCE)
    model = module.classes["Model"]
    assert set(model.methods) == {"decorated", "fetch", "outer", "guarded"}
    assert "after_methods" in model.attributes
    assert all(info._node is None for info in model.methods.values())  # nothing parsed yet
    assert model.methods["decorated"].span == (line_starting("def decorated("), line_starting("return total"))
    assert module.functions["helper"].node.name.value == "helper"  # a one-line def is kept whole
    assert "layers" in set(model.attributes)
    decorated = model.methods["decorated"].node
    assert [
        decorator.decorator.attr.value if isinstance(decorator.decorator, cst.Attribute) else decorator.decorator.value
        for decorator in decorated.decorators
    ] == ["cache", "staticmethod"]
    assert model.methods["fetch"].node.asynchronous is not None


def test_store_and_mention_tests_need_no_body(tmp_path: Path) -> None:
    module = load(tmp_path, SOURCE)
    outer = module.classes["Model"].methods["outer"]
    assert not outer.may_store("layers")
    assert [info.qualname for info in module.functions_mentioning(re.compile(r"\binner\("))] == [
        "Model.outer",
        "Model.outer.inner",
    ]  # the call, the def
    assert outer._node is None


def test_windows_line_endings_fall_back_to_a_whole_parse(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "crlf.py").write_bytes(SOURCE.replace("\n", "\r\n").encode())
    module = CodeIndex(SourceTree("serving", "test", root)).load("crlf.py")
    assert module is not None
    assert line_of(module, "Model.outer.inner", "marker_inner") == expected_line("marker_inner")


@pytest.mark.parametrize(
    ("qualname", "marker", "unit"),
    [
        ("Model.decorated", "total", "Model.decorated"),
        ("Model.outer.inner", "marker_inner", "Model.outer"),
        ("optional", "marker_optional", "optional"),
    ],
)
def test_a_def_shared_with_another_version_of_its_file_keeps_its_own_lines(
    tmp_path: Path, qualname: str, marker: str, unit: str
) -> None:
    """A def left as it was by a patch is shared with the file's earlier parse (its node, `unit`,
    and the line ranges under it, counted from the def): in the new version its lines are the new
    ones."""
    before = load(tmp_path / "before", SOURCE)
    assert line_of(before, qualname, marker) == expected_line(marker)
    after = load(tmp_path / "after", "# three lines a patch added\nPATCHED = True\n\n" + SOURCE)
    assert line_of(after, qualname, marker) == expected_line(marker) + 3
    shared = [next(info.node for info in module.all_functions if info.qualname == unit) for module in (before, after)]
    assert shared[0] is shared[1]  # parsed once


def test_the_parsing_budget_counts_the_nodes_ast_walk_yields() -> None:
    """The node count that bounds a file's parse is what `ast.walk` yields, on real code."""
    import ast

    from rca.static.parsing import _count_nodes

    for path in sorted(Path(__file__).resolve().parent.parent.joinpath("rca").rglob("*.py"))[:60]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert _count_nodes(tree) == sum(1 for _ in ast.walk(tree)), path


def test_a_line_range_reads_as_its_code_on_one_line() -> None:
    """The code of a line range: stripped lines joined, comments and blank lines left out, cut at
    160 characters, for a range inside the file or running past either end."""
    lines = ["def f(x):", "    # a comment", "", "    return (x +", "            1)", *["    y = 1" * 9] * 3]
    module = ModuleInfo("m.py", "m", "serving", "\n".join(lines), cst.parse_module(""))
    assert module.code(4, 5) == "return (x + 1)"
    assert module.code(1, 3) == "def f(x):"
    assert module.code(5) == "1)" and module.code(0, 1) == "def f(x):" and module.code(len(lines) + 1) == ""
    long = module.code(6, 8)
    assert len(long) == 160 and long.endswith("...") and long.startswith("y = 1    y = 1")
    assert module.code(4, 5) is module.code(4, 5)  # kept


STATEMENTS = textwrap.dedent(
    """\
    import contextlib


    class Runner:
        @contextlib.contextmanager
        def every_kind(self, items, *, limit=(
                3)):
            # a comment before the first statement
            first = 1; second = [
                item for item in items
            ]
            if (first and
                    second):
                self.a = call(first,
                              second)
            elif limit > 2: return limit
            else:
                pass
            for index, (key,
                        value) in enumerate(items):
                continue
            else:
                index = None
            while self.ready(
                    limit):
                break
            with open(
                    "f") as handle, other():
                handle.read()
            try:
                risky()
            except (ValueError,
                    KeyError) as error:
                raise RuntimeError("failed") from error
            except Exception:
                pass
            else:
                yield second
            finally:
                self.done = True
            match limit:
                case 1:
                    found = "one"
                case _:
                    found = None

            @staticmethod
            def nested(x=first +
                       1):
                return x

            class Local(Base,
                        metaclass=Meta):
                size = limit
            return Local
    """
)


def header_and_statement_lines_agree_with_the_whole_def(module: ModuleInfo) -> int:
    """Every statement of every def in `module`, and every node of each statement outside its
    body, asked for with the statement it is in: the lines a code generation of the whole def
    gives, found without generating any def whole. Returns how many nodes were compared."""
    from rca.static.parsing import generated_ranges, statement_ranges

    assert module.parsed is not None
    compared = 0
    for stub in list(module.parsed.stubs.values()):
        unit = module.parsed.unit(stub)
        whole = generated_ranges(unit, module.tree)
        offset = stub.lineno - whole[unit.name].start.line
        expected = {node: (code.start.line + offset, code.end.line + offset) for node, code in whole.items()}
        statements = dict(module._statement_lines(unit) or {})
        assert statements, f"{module.relpath}:{stub.lineno}"
        for statement, lines in statements.items():
            assert module.lines_of(statement, unit) == lines == expected[statement]
            header = statement_ranges(statement, lines[0], module.tree) or {}
            for node in header:
                assert module.lines_of(node, unit, statement) == expected[node], (module.relpath, node)
            compared += 1 + len(header)
        assert unit not in module.parsed.ranges  # no def was generated whole
    return compared + module_lines_agree_with_the_whole_skeleton(module)


def module_lines_agree_with_the_whole_skeleton(module: ModuleInfo) -> int:
    """The same for the statements outside defs (classes' included) and their headers: the lines
    a generation of the module's whole skeleton gives."""
    from rca.static.parsing import statement_ranges

    assert module.parsed is not None
    statements = dict(module._statement_lines(module.tree) or {})
    assert statements, module.relpath
    found = {}
    for statement, lines in statements.items():
        found[statement] = module.lines_of(statement, module.tree)
        for node in statement_ranges(statement, lines[0], module.tree) or {}:
            found[node] = module.lines_of(node, module.tree, statement)
    assert module.tree not in module.parsed.ranges  # the skeleton was not generated whole
    expected = module._compute_ranges(module.tree)
    code = {node: lines for node, lines in found.items() if not isinstance(node, _TRIVIA)}  # a last newline aside
    assert {node: expected[node] for node in code} == code
    return len(code)


def test_statement_lines_agree_with_a_generation_of_the_whole_def(tmp_path: Path) -> None:
    """Statements and their headers (tests, targets, decorators, defaults, bases) of every compound
    statement kind, on one line or several, take their lines from the standard parser and their
    own generation: the lines a generation of the whole def gives."""
    fresh = "\n# a text no other test parses\n"  # parses are shared by text: one whole lines were found for
    module = load(tmp_path, STATEMENTS + fresh)
    assert header_and_statement_lines_agree_with_the_whole_def(module) > 150
    assert header_and_statement_lines_agree_with_the_whole_def(load(tmp_path / "defs", SOURCE + fresh)) > 50
    every_kind = module.classes["Runner"].methods["every_kind"].node
    assert module.lines_of(every_kind, every_kind) == (
        line_in(STATEMENTS, "def every_kind"),
        line_in(STATEMENTS, "return Local"),
    )


def test_a_node_outside_the_statement_named_is_found_through_the_whole_def(tmp_path: Path) -> None:
    """A node asked for with a statement that does not hold it (a body statement's call, with the
    `if` around it) still gets its own lines."""
    module = load(tmp_path, STATEMENTS)
    function = module.classes["Runner"].methods["every_kind"].node
    branch = next(statement for statement in function.body.body if isinstance(statement, cst.If))
    call = next(node for node in walk(branch.body) if isinstance(node, cst.Call))
    line = line_in(STATEMENTS, "self.a = call(")
    assert module.lines_of(call, function, branch) == (line, line + 1)


def test_a_def_repeated_in_its_file_cites_its_own_lines(tmp_path: Path) -> None:
    """Two classes with the same method, word for word: each method's statements are cited at
    their own lines, not at the first copy's."""
    method = "    def forward(self, x):\n        hidden = self.layer(x)\n        return hidden\n"
    text = f"class First:\n{method}\n\nclass Second:\n{method}"
    module = load(tmp_path, text)
    for name in ("First", "Second"):
        function = module.classes[name].methods["forward"].node
        statement = function.body.body[0]
        call = next(node for node in walk(statement) if isinstance(node, cst.Call))
        line = line_in(text, f"class {name}:") + 2
        assert module.lines_of(statement, function) == (line, line)
        assert module.lines_of(call, function, statement) == (line, line)
        assert module.lines_of(call, function) == (line, line)  # through the whole def too


@pytest.mark.release
def test_statement_lines_agree_on_a_release_s_largest_model_files(
    sglang_0_5_12: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on real code: the founding release's model runner and DeepSeek model, every def,
    parsed afresh (not as an earlier analysis left them, with some defs' lines found whole)."""
    from collections import OrderedDict

    from rca.static import filecache, parsing

    monkeypatch.setattr(parsing, "_PARSED", OrderedDict())
    index = CodeIndex(SourceTree("serving", "sglang==0.5.12", sglang_0_5_12))
    with filecache.turned_off():
        for relpath in ("sglang/srt/model_executor/model_runner.py", "sglang/srt/models/deepseek_v2.py"):
            module = index.load(relpath)
            assert module is not None
            assert header_and_statement_lines_agree_with_the_whole_def(module) > 10_000


def test_what_a_def_assigns_is_found_once_and_kept_with_its_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a method may assign `x.<name>` is read from the standard parser's def (a call
    `self.ready(...)` assigns nothing), once: the answer is kept with the parse, so a later run
    reading the parse from the analysis cache walks no def again."""
    import ast
    import pickle

    module = load(tmp_path, STATEMENTS)
    method = module.classes["Runner"].methods["every_kind"]
    assert method.may_store("a") and method.may_store("done")
    assert not method.may_store("ready") and not method.may_store("read")
    assert method._node is None  # no body parsed for it
    assert module.parsed is not None
    kept = pickle.loads(pickle.dumps(module.parsed))

    def no_walk(node: ast.AST) -> None:
        raise AssertionError("walked again")

    monkeypatch.setattr(ast, "walk", no_walk)
    assert list(kept.stored.values()) == [frozenset({"a", "done"})]
    assert all(kept.stored_attributes(function) == stored for function, stored in kept.stored.items())


def test_defs_nested_in_except_and_finally_are_told_apart(tmp_path: Path) -> None:
    """Defs inside a function's `except` and `finally` blocks are found by the standard parser and
    fetched from libcst's tree by position: both list them in the same order."""
    text = textwrap.dedent(
        """\
        def outer():
            try:
                pass
            except ValueError:
                def in_except():
                    marker_except = 1
            finally:
                def in_finally():
                    marker_finally = 2
        """
    )
    module = load(tmp_path, text)
    for name in ("in_except", "in_finally"):
        function = next(info for info in module.all_functions if info.qualname == f"outer.{name}")
        assert function.node.name.value == name
        assert module.lines_of(function.node, function.node)[0] == line_in(text, f"def {name}(")
