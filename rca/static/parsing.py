"""Parsing a source file for the analysis: its libcst skeleton (every function body stubbed, parsed
one def at a time when the analysis reaches it) with the standard parser's line numbers, shared
across trees holding the same text, and kept in the analysis cache (`rca.static.filecache`) with
the defs parsed and the line ranges computed so far, for the next run that reads the same text.

Nothing is handed to libcst that could exhaust it: libcst's native parser crashes the process on
expressions nested a thousand deep and takes seconds per thousand terms of one expression. The
standard parser reads the file first; what it refuses (too many nested parentheses, an
expression too deep to build) and long expressions nested deeper than `MAX_EXPRESSION_DEPTH` are
refused with the file and line (`TooComplexToParse`), and so is a file beyond the parsing budget
(`MAX_NODES`). Only a file the standard parser rejects for its syntax (code newer than this Python)
goes to libcst whole, after a token scan bounds its nesting and length.
"""

from __future__ import annotations

import ast
import hashlib
import io
import itertools
import tokenize
from collections import OrderedDict
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import CodeRange
from libcst.metadata.position_provider import PositionProvidingCodegenState

from rca.static import filecache

MAX_EXPRESSION_DEPTH = 400  # libcst takes about 0.3 s at 1000, and crashes between 1000 and 2000
_LONG = 400  # characters: an expression shorter than this cannot nest deeper than the limit
MAX_TOKENS_PER_LINE = 20_000  # tokens of one logical line, for a file only libcst reads
# The parsing budget of one file: libcst reads about 50,000 syntax nodes a second, and the largest
# framework module (vLLM's gpu_model_runner.py) has about 33,000; ten times that is refused rather
# than parsed for minutes (a generated table, or a file made to stall the analysis).
MAX_NODES = 330_000


class TooComplexToParse(ValueError):
    """A file nested or sprawling beyond what can be parsed safely, at `line`."""

    def __init__(self, reason: str, line: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line


def statement_blocks(statement: cst.CSTNode, into_defs: bool = True) -> Iterator[list[cst.CSTNode]]:
    """The nested statement lists of a compound statement (bodies of defs only if `into_defs`)."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and not into_defs:
        return
    if isinstance(
        statement, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While, cst.With, cst.If, cst.Try, cst.TryStar)
    ):
        yield list(statement.body.body)  # type: ignore[union-attr]
    if isinstance(statement, cst.If) and statement.orelse is not None:
        yield [statement.orelse] if isinstance(statement.orelse, cst.If) else list(statement.orelse.body.body)
    elif isinstance(statement, (cst.For, cst.While, cst.Try, cst.TryStar)) and statement.orelse is not None:
        yield list(statement.orelse.body.body)
    if isinstance(statement, (cst.Try, cst.TryStar)):
        for handler in statement.handlers:
            yield list(handler.body.body)
        if statement.finalbody is not None:
            yield list(statement.finalbody.body.body)
    if isinstance(statement, cst.Match):
        for case in statement.cases:
            yield list(case.body.body)


def walk_defs_cst(body: list[cst.CSTNode]) -> Iterator[cst.CSTNode]:
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            yield statement
        for block in statement_blocks(statement):
            yield from walk_defs_cst(list(block))


def standard_blocks(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The nested statement lists of a compound statement of the standard parser's, in the order
    `statement_blocks` gives libcst's (the two are paired by position)."""
    if isinstance(statement, ast.Match):
        for case in statement.cases:
            yield case.body
        return
    for name in ("body", "orelse"):
        inner = getattr(statement, name, None)
        if isinstance(inner, list) and inner:
            yield inner
    for handler in getattr(statement, "handlers", None) or ():
        yield handler.body
    if getattr(statement, "finalbody", None):
        yield statement.finalbody  # type: ignore[attr-defined]


def walk_defs_ast(body: list[ast.stmt], skip: set[int] = frozenset()) -> Iterator[ast.AST]:  # type: ignore[assignment]
    """Defs and classes in the order `walk_defs_cst` finds them; `skip` names defs whose bodies
    are not descended into (stubbed in the libcst skeleton)."""
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield statement
            if id(statement) in skip:
                continue
        for block in standard_blocks(statement):
            yield from walk_defs_ast(block, skip)


def _cst_def_name(node: cst.CSTNode) -> str:
    return node.name.value  # type: ignore[attr-defined]


def _match_defs(cst_defs: list[cst.CSTNode], ast_defs: list[ast.AST]) -> dict[cst.CSTNode, tuple[int, int]]:
    """The lines of each libcst def, from the standard parser's def in the same position."""
    if len(cst_defs) != len(ast_defs):
        return {}
    lines: dict[cst.CSTNode, tuple[int, int]] = {}
    for cst_def, ast_def in zip(cst_defs, ast_defs, strict=True):
        if _cst_def_name(cst_def) != ast_def.name:  # type: ignore[attr-defined]
            return {}
        lines[cst_def] = (ast_def.lineno, ast_def.end_lineno)  # type: ignore[attr-defined]
    return lines


Derived = tuple[int, int, int]  # how much of a parse is derived (`ParsedFile.state`)


class _LineProvider:
    """Stands in for a libcst metadata provider: collects node ranges during codegen."""

    def __init__(self) -> None:
        self._computed: dict[cst.CSTNode, CodeRange] = {}


def generated_ranges(node: cst.CSTNode, tree: cst.Module) -> dict[cst.CSTNode, CodeRange]:
    """The ranges of `node` and every node under it in a code generation of `node` alone (lines
    counted from its first, leading comments included), in `tree`'s indentation and newlines."""
    provider = _LineProvider()
    state = PositionProvidingCodegenState(
        default_indent=tree.default_indent,
        default_newline=tree.default_newline,
        provider=provider,  # type: ignore[arg-type]  # collects ranges as the metadata provider does
    )
    node._codegen(state)
    return provider._computed


_COMPOUND: dict[type[cst.CSTNode], tuple[type[ast.stmt], ...]] = {
    cst.If: (ast.If,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.Try: (ast.Try,),
    cst.TryStar: tuple(getattr(ast, name) for name in ("TryStar",) if hasattr(ast, name)),  # Python 3.11+
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.Match: (ast.Match,),
}


class _Unpaired(Exception):
    """libcst's statements and the standard parser's differ in shape here."""


def _pair_statements(
    statements: Sequence[cst.CSTNode],
    standard: Sequence[ast.stmt],
    lines: dict[cst.CSTNode, tuple[int, int]],
    stubbed: Container[cst.CSTNode],
) -> None:
    position = 0
    for statement in statements:
        if isinstance(statement, cst.SimpleStatementLine):
            smalls = statement.body
            theirs = standard[position : position + len(smalls)]
            if len(theirs) != len(smalls) or not theirs:
                raise _Unpaired
            for small, other in zip(smalls, theirs, strict=True):
                lines[small] = _lines(other)
            lines[statement] = (theirs[0].lineno, _lines(theirs[-1])[1])
            position += len(smalls)
            continue
        kinds = _COMPOUND.get(type(statement))
        if position >= len(standard) or not (
            isinstance(statement, cst.BaseSmallStatement)  # one of a block on its header's line
            or (kinds is not None and isinstance(standard[position], kinds))
        ):
            raise _Unpaired
        other = standard[position]
        position += 1
        lines[statement] = _lines(other)
        if isinstance(statement, (cst.Try, cst.TryStar)) and len(statement.handlers) == len(other.handlers):  # type: ignore[attr-defined]
            for handler, theirs_handler in zip(statement.handlers, other.handlers, strict=True):  # type: ignore[attr-defined]
                lines[handler] = _lines(theirs_handler)
        if statement in stubbed:
            continue
        mine, standards = list(statement_blocks(statement)), list(standard_blocks(other))
        if len(mine) != len(standards):
            raise _Unpaired
        for block, theirs_block in zip(mine, standards, strict=True):
            _pair_statements(block, theirs_block, lines, stubbed)
    if position != len(standard):
        raise _Unpaired


def _lines(node: ast.stmt | ast.excepthandler) -> tuple[int, int]:
    return node.lineno, node.end_lineno or node.lineno


def statement_lines(
    node: cst.FunctionDef | cst.Module,
    standard: ast.FunctionDef | ast.AsyncFunctionDef | ast.Module,
    stubbed: Container[cst.CSTNode] = (),
) -> dict[cst.CSTNode, tuple[int, int]] | None:
    """The lines of a def and of every statement in it (small ones too, and except clauses), or
    of every statement of a module, from the standard parser's tree of the same code: no code
    generation. The defs `stubbed` (a skeleton's, their bodies left out) are not paired inside.
    None when the two do not pair up."""
    if isinstance(node, cst.Module):
        lines: dict[cst.CSTNode, tuple[int, int]] = {}
        statements: list[cst.CSTNode] = list(node.body)
    else:
        assert not isinstance(standard, ast.Module)
        lines = {node: _lines(standard)}
        statements = list(node.body.body)
    try:
        _pair_statements(statements, standard.body, lines, stubbed)
    except _Unpaired:
        return None
    return lines


_HEADED = (
    cst.SimpleStatementLine,
    cst.If,
    cst.While,
    cst.For,
    cst.With,
    cst.FunctionDef,
    cst.ClassDef,
    cst.ExceptHandler,
)
_PASS = cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])])
_PASS_NODES = frozenset(generated_ranges(_PASS, cst.Module(body=[])))


def statement_ranges(statement: cst.CSTNode, line: int, tree: cst.Module) -> dict[cst.CSTNode, tuple[int, int]] | None:
    """The lines of the nodes of a statement starting at `line` outside its body (a compound
    statement's header: an `if`'s test, a `for`'s target and iterable, a def's decorators and
    parameters, an `except` clause's types), from a code generation of those lines alone. None
    for a statement without a header of its own to generate (`try`, `match`)."""
    if not isinstance(statement, _HEADED):
        return None
    own: cst.CSTNode = statement
    if not isinstance(statement, cst.SimpleStatementLine):
        body = statement.body  # type: ignore[attr-defined]
        # a body on the header's line (`if ready: return x`) is kept: the evaluator runs it as the header's
        own = statement.with_changes(body=body if isinstance(body, cst.SimpleStatementSuite) else _PASS)
        if isinstance(statement, (cst.If, cst.While, cst.For)):
            own = own.with_changes(orelse=None)
    generated = generated_ranges(own, tree)
    offset = line - generated[own].start.line
    return {
        node: (code.start.line + offset, code.end.line + offset)
        for node, code in generated.items()
        if node is not own and node not in _PASS_NODES
    }


@dataclass(eq=False)
class ParsedFile:
    """One file's libcst skeleton, every function in it with its body replaced by `...`, and the
    bodies parsed one def at a time when asked for."""

    text: str
    tree: cst.Module
    def_lines: dict[cst.CSTNode, tuple[int, int]]
    line_map: list[int] | None = None  # the file's line for each line of the skeleton
    standard: ast.Module | None = None  # the standard parser's tree of the whole file
    stubs: dict[cst.CSTNode, ast.FunctionDef | ast.AsyncFunctionDef] = field(
        default_factory=dict
    )  # skeleton def -> its full def
    stubs_by_span: dict[tuple[int, int], ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    units: dict[int, cst.FunctionDef] = field(default_factory=dict)
    # anchor (a def, or the skeleton module) -> the line range of each node under it (codeindex)
    ranges: dict[cst.CSTNode, dict[cst.CSTNode, tuple[int, int]]] = field(default_factory=dict)
    standard_defs: dict[cst.CSTNode, ast.FunctionDef | ast.AsyncFunctionDef] = field(
        default_factory=dict
    )  # a parsed def (or one nested in it) -> the standard parser's def, for its statements' lines
    # a parsed def -> the line range of each of its statements, and of the nodes inside those an
    # analysis cited (codeindex: from the standard parser's lines and each statement's own code)
    statement_ranges: dict[cst.CSTNode, dict[cst.CSTNode, tuple[int, int]]] = field(default_factory=dict)
    # a def of the standard parser's tree -> the attributes it assigns (`x.attr = ...`), as asked
    stored: dict[ast.AST, frozenset[str]] = field(default_factory=dict)
    saved: Derived | None = None  # what the analysis cache holds of it (see `state`)

    def state(self) -> Derived:
        """How much has been derived: defs parsed, anchors whose ranges are known, nodes whose
        ranges were found through their statement."""
        return len(self.units), len(self.ranges), sum(map(len, self.statement_ranges.values()))

    def stored_attributes(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
        """The attributes a def of this file's standard tree assigns, nested defs included: found
        once, and kept with the parse (an analysis asks of hundreds of methods, every run)."""
        found = self.stored.get(function)
        if found is None:
            found = self.stored[function] = frozenset(
                node.attr
                for node in ast.walk(function)
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            )
        return found

    def unit(self, stub: ast.FunctionDef | ast.AsyncFunctionDef) -> cst.FunctionDef:
        """The full libcst node of a stubbed def, parsed from its own lines (once)."""
        node = self.units.get(stub.lineno)
        if node is not None:
            return node
        key, source = self._unit_source(stub)
        node = _UNITS.get(key)
        if node is None or node in self.def_lines:  # a def this file repeats gets nodes of its own: lines differ
            module = cst.parse_module(source)
            indented = stub.col_offset > 0
            first: Any = module.body[0]
            node = first.body.body[0] if indented else first  # a method's skeleton: in its class
            assert isinstance(node, cst.FunctionDef)
            _shared_unit(key, node)
        self.def_lines[node] = (stub.lineno, stub.end_lineno or stub.lineno)
        self.standard_defs[node] = stub
        inner_cst = list(walk_defs_cst(list(node.body.body)))
        inner_ast = list(walk_defs_ast(stub.body))
        if len(inner_cst) == len(inner_ast):
            for cst_def, ast_def in zip(inner_cst, inner_ast, strict=True):
                self.def_lines[cst_def] = (ast_def.lineno, ast_def.end_lineno)  # type: ignore[attr-defined]
                if isinstance(ast_def, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.standard_defs[cst_def] = ast_def
        self.units[stub.lineno] = node
        return node

    def _unit_source(
        self, stub: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str] | None = None
    ) -> tuple[str, str]:
        """What `unit` parses for a def (its lines, decorators included, inside an `if` when
        indented), and a digest of it; `lines` are the file's, when the caller has them."""
        first = min([stub.lineno, *(decorator.lineno for decorator in stub.decorator_list)])
        own = (lines if lines is not None else self.text.splitlines(keepends=True))[first - 1 : stub.end_lineno]
        source = ("if 1:\n" if stub.col_offset > 0 else "") + "".join(own)
        return hashlib.sha1(source.encode("utf-8", "surrogatepass")).hexdigest(), source

    def share_units(self) -> None:
        """Offer the defs parsed here, and the line ranges found in them, to every file holding
        the same def (`_UNITS`, `RELATIVE_RANGES`, `RELATIVE_STATEMENTS`)."""
        lines = self.text.splitlines(keepends=True)
        for stub in self.stubs.values():
            node = self.units.get(stub.lineno)
            if node is not None:
                _shared_unit(self._unit_source(stub, lines)[0], node)
        for shared, found in ((RELATIVE_RANGES, self.ranges), (RELATIVE_STATEMENTS, self.statement_ranges)):
            for anchor, ranges in found.items():
                span = self.def_lines.get(anchor)
                if span is not None:
                    share_ranges(anchor, span[0], ranges, shared)


# Defs parsed in this process (or held by its server), by their text: a def that a patch left as
# it was is not parsed again for the file's new version. The nodes are shared, and read only.
_UNITS: OrderedDict[str, cst.FunctionDef] = OrderedDict()
_UNITS_MAX = 8192


# The line ranges of the nodes under a def, counted from the def's line: the same wherever the
# def stands in its file, so a shared def's are found once (by codegen, in codeindex). Those of
# every node under it; those of its statements and of some nodes inside them.
RELATIVE_RANGES: dict[cst.CSTNode, dict[cst.CSTNode, tuple[int, int]]] = {}
RELATIVE_STATEMENTS: dict[cst.CSTNode, dict[cst.CSTNode, tuple[int, int]]] = {}


def share_ranges(
    anchor: cst.CSTNode,
    line: int,
    ranges: dict[cst.CSTNode, tuple[int, int]],
    shared: dict[cst.CSTNode, dict[cst.CSTNode, tuple[int, int]]] = RELATIVE_RANGES,
) -> None:
    """Add to `shared` the ranges found under the def `anchor`, which starts at `line` in its file."""
    if len(shared) > 65536:  # a bound for a process that reads many releases
        shared.clear()
    relative = shared.setdefault(anchor, {})
    for node, (first, last) in ranges.items():
        relative[node] = (first - line, last - line)


def _shared_unit(key: str, node: cst.FunctionDef) -> None:
    _UNITS[key] = node
    _UNITS.move_to_end(key)
    while len(_UNITS) > _UNITS_MAX:
        forgotten = _UNITS.popitem(last=False)[1]
        RELATIVE_RANGES.pop(forgotten, None)
        RELATIVE_STATEMENTS.pop(forgotten, None)


_PARSED: OrderedDict[str, ParsedFile] = OrderedDict()


_PARSED_MAX = 256


def parse_text(text: str) -> ParsedFile:
    """A file's parse, shared by every tree holding the same text (releases repeat most files;
    a fix is checked by analyzing the same tree again). Raises TooComplexToParse, or libcst's
    ParserSyntaxError."""
    key = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
    cached = _PARSED.get(key)
    if cached is not None:
        _PARSED.move_to_end(key)
        return cached
    parsed = _remembered(key, text)
    if parsed is None:
        standard = _standard(text)
        if standard is None:
            _check_tokens(text)
        parsed = (_parse_skeleton(text, standard) if standard is not None else None) or _parse_whole(text, standard)
    _PARSED[key] = parsed
    if len(_PARSED) > _PARSED_MAX:
        _PARSED.popitem(last=False)
    return parsed


def standard_tree(text: str) -> ast.Module | None:
    """The standard parser's tree of a file, for a reader that needs no libcst node (string
    constants, a class's assignments): refused as `parse_text` refuses it (None), and shared with
    its parse when the file was parsed for the analysis already."""
    key = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
    parsed = _PARSED.get(key)
    if parsed is not None and parsed.standard is not None:
        return parsed.standard
    if key not in _STANDARD:
        try:
            _STANDARD[key] = _standard(text)
        except TooComplexToParse:
            _STANDARD[key] = None
        if len(_STANDARD) > _PARSED_MAX:
            _STANDARD.popitem(last=False)
    return _STANDARD[key]


_STANDARD: OrderedDict[str, ast.Module | None] = OrderedDict()


# The parses an rca server holds for the commands it forks, loaded from the analysis cache after
# earlier commands used them, and what the cache held of each: read as the cache is, when it is on.
_HELD: OrderedDict[str, ParsedFile] = OrderedDict()
_HELD_MAX = 256


def _remembered(key: str, text: str) -> ParsedFile | None:
    """The parse of `text` an earlier run kept in the analysis cache (None when there is none).
    Only a parse that passed every check is kept, so a file refused as too complex is refused
    again by parsing it."""
    if not filecache.enabled():
        return None
    held = _HELD.get(key)
    if held is not None and held.text == text:
        return held
    parsed = filecache.load_tree(filecache.key("parse", key), (ParsedFile,))
    if not isinstance(parsed, ParsedFile) or parsed.text != text:
        return None
    parsed.saved = parsed.state()
    return parsed


_KEPT_ELSEWHERE: dict[str, Derived] = {}  # parses the processes this one forked used (`kept`)


def kept() -> dict[str, Derived]:
    """The parses this process (and those it forked, as they told it) used, each with what the
    analysis cache holds of it (or will, once this run's entries are written): what a server
    should hold for the next command."""
    found = {key: parsed.saved for key, parsed in _PARSED.items() if parsed.saved is not None}
    return {**_KEPT_ELSEWHERE, **found}


def kept_elsewhere(parses: dict[str, Derived]) -> None:
    """Count among this process's the parses a process it forked used (`kept` there)."""
    _KEPT_ELSEWHERE.update(parses)


def hold(key: str, wanted: Derived, root: Path) -> bool | None:
    """Keep the parse `key` of the analysis cache at `root` in this process's memory (a server's:
    the commands it forks start with it), once the cache holds as much of it as `wanted`. True
    when held; False when the cache has less so far (its writer has not written it yet); None
    when the cache has none to give."""
    held = _HELD.get(key)
    if held is not None and held.saved is not None and _covers(held.saved, wanted):
        _HELD.move_to_end(key)
        return True
    parsed = filecache.load_tree(filecache.key("parse", key), (ParsedFile,), root)
    if not isinstance(parsed, ParsedFile):
        return None
    parsed.saved = parsed.state()
    if held is not None and held.saved is not None and _covers(held.saved, parsed.saved):
        return False
    parsed.share_units()
    _HELD[key] = parsed
    _HELD.move_to_end(key)
    while len(_HELD) > _HELD_MAX:
        _HELD.popitem(last=False)
    return _covers(parsed.saved, wanted)


def _covers(have: Derived, want: Derived) -> bool:
    """Whether a parse derived as far as `have` holds all of one derived as far as `want`."""
    return len(have) == len(want) and all(had >= wanted for had, wanted in zip(have, want, strict=True))


def held() -> int:
    """How many parses this process holds for the commands it forks."""
    return len(_HELD)


@filecache.flusher
def persist(really: bool = True) -> int:
    """Keep in the analysis cache every parse this process derived more of than the cache holds
    (best effort); the number of entries written."""
    if not filecache.enabled():
        return 0
    written = 0
    for key, parsed in list(_PARSED.items()):
        state = parsed.state()
        if parsed.saved == state:
            continue
        parsed.saved = state  # tried once: a tree pickle refuses (too deep) is not tried again
        if really and filecache.store_tree(filecache.key("parse", key), parsed):
            written += 1
    return written


def _parse_whole(text: str, standard: ast.Module | None) -> ParsedFile:
    tree = cst.parse_module(text)
    if standard is None:
        return ParsedFile(text, tree, {})  # positions fall back to a whole-module pass
    return ParsedFile(
        text,
        tree,
        _match_defs(list(walk_defs_cst(list(tree.body))), list(walk_defs_ast(standard.body))),
        standard=standard,
    )


def _parse_skeleton(text: str, standard: ast.Module) -> ParsedFile | None:
    """Parse the file with every function body stubbed out; None when its line endings are unusual
    (the whole file is then parsed as it is)."""
    if "\r" in text.replace("\r\n", ""):
        return None
    lines: list[str | None] = text.splitlines(keepends=True)  # type: ignore[assignment]
    stubbed: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def stub_out(body: list[ast.stmt]) -> None:
        for statement in body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = statement.body[0]
                start = lines[first.lineno - 1]
                assert start is not None  # a def's first body line is stubbed out only once
                indent = start[: len(start) - len(start.lstrip())]
                if (
                    first.lineno > statement.lineno
                    and len(indent) == first.col_offset
                    and statement.end_lineno is not None
                ):
                    ending = "\r\n" if start.endswith("\r\n") else "\n"
                    lines[first.lineno - 1] = f"{indent}...{ending}"
                    for number in range(first.lineno, statement.end_lineno):
                        lines[number] = None
                    stubbed.append(statement)
                continue
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(statement, name, None)
                if isinstance(inner, list):
                    stub_out(inner)
            for handler in getattr(statement, "handlers", []) or []:
                stub_out(handler.body)
            for case in getattr(statement, "cases", []) or []:
                stub_out(case.body)

    stub_out(standard.body)
    line_map = [number for number, line in enumerate(lines, 1) if line is not None]
    try:
        tree = cst.parse_module("".join(line for line in lines if line is not None))
    except cst.ParserSyntaxError:
        return None
    skipped = {id(statement) for statement in stubbed}
    cst_defs = list(walk_defs_cst(list(tree.body)))
    ast_defs = list(walk_defs_ast(standard.body, skip=skipped))
    def_lines = _match_defs(cst_defs, ast_defs)
    if not def_lines:
        return None
    parsed = ParsedFile(text, tree, def_lines, line_map, standard)
    for cst_def, ast_def in zip(cst_defs, ast_defs, strict=True):
        if id(ast_def) in skipped:  # a def stub_out stubbed: it has its end line
            assert isinstance(ast_def, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast_def.end_lineno is not None
            parsed.stubs[cst_def] = ast_def
            parsed.stubs_by_span[(ast_def.lineno, ast_def.end_lineno)] = ast_def
    return parsed


def _standard(text: str) -> ast.Module | None:
    """The standard parser's tree, checked for expressions libcst cannot take; None when the file's
    syntax is not this Python's (libcst may still read it)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        if "too many nested" in (error.msg or ""):
            raise TooComplexToParse(error.msg, error.lineno or 1) from None
        return None
    except (RecursionError, MemoryError, ValueError):
        raise TooComplexToParse(
            "an expression too deeply nested for the standard parser", _first_long_line(text)
        ) from None
    _check_expressions(tree, text)
    if len(text) > MAX_NODES // 3:  # a character makes at most about three nodes ("+a": BinOp, Add, Name, Load)
        nodes = _count_nodes(tree)
        if nodes > MAX_NODES:
            raise TooComplexToParse(f"{nodes:,} syntax nodes, beyond the parsing budget of {MAX_NODES:,}", 1)
    return tree


def _count_nodes(tree: ast.AST) -> int:
    """The number of nodes under `tree`, as `ast.walk` yields them, in about half its time."""
    count, stack = 0, [tree]
    while stack:
        node = stack.pop()
        count += 1
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(item for item in value if isinstance(item, ast.AST))
    return count


def _check_expressions(tree: ast.Module, text: str) -> None:
    """Refuse a long expression nested deeper than MAX_EXPRESSION_DEPTH (short ones cannot be)."""
    starts: list[int] = []

    def long(node: ast.AST) -> bool:
        first, last = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
        if first == last:
            return (node.end_col_offset or 0) - node.col_offset > _LONG  # type: ignore[attr-defined]
        if not starts:
            starts.extend([0, *itertools.accumulate(len(line) for line in text.splitlines(keepends=True))])
        return starts[last - 1] + (node.end_col_offset or 0) - starts[first - 1] - node.col_offset > _LONG  # type: ignore[attr-defined]

    statements: list[ast.AST] = list(tree.body)
    while statements:
        statement = statements.pop()
        for _, value in ast.iter_fields(statement):
            for item in value if isinstance(value, list) else (value,):
                if isinstance(item, (ast.stmt, ast.excepthandler, ast.match_case)):
                    statements.append(item)
                elif isinstance(item, ast.expr) and long(item):
                    depth = _depth(item)
                    if depth > MAX_EXPRESSION_DEPTH:
                        raise TooComplexToParse(f"an expression nested {depth} deep", item.lineno)


def _depth(node: ast.AST) -> int:
    deepest = 0
    stack = [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(current))
    return deepest


def _check_tokens(text: str) -> None:
    """For a file only libcst will read: bracket nesting and logical-line length, from its tokens."""
    depth = tokens = 0
    try:
        for count, token in enumerate(tokenize.generate_tokens(io.StringIO(text).readline)):
            if count > MAX_NODES:  # a token makes at least one node
                raise TooComplexToParse(f"more than {MAX_NODES:,} tokens, beyond the parsing budget", token.start[0])
            if token.type == tokenize.OP and token.string in "([{":
                depth += 1
                if depth > 200:
                    raise TooComplexToParse("too many nested parentheses", token.start[0])
            elif token.type == tokenize.OP and token.string in ")]}":
                depth = max(depth - 1, 0)
            tokens = 0 if token.type == tokenize.NEWLINE else tokens + 1
            if tokens > MAX_TOKENS_PER_LINE:
                raise TooComplexToParse(f"a statement of more than {MAX_TOKENS_PER_LINE} tokens", token.start[0])
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return  # libcst reports the syntax error itself


def _first_long_line(text: str) -> int:
    lines = text.splitlines()
    longest = max(range(len(lines)), key=lambda index: len(lines[index]), default=0)
    return longest + 1
