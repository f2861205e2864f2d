"""Parsed modules of a source tree: classes, functions, imports and line numbers, on demand.

Only the files an analysis actually needs are parsed (with libcst). Line numbers are found per
statement rather than per file: a full libcst position pass costs about three parses, while the
lines of a def and of every statement in it come cheaply from the standard `ast` parser, and those
of the nodes inside a statement from a line-tracking code generation of that statement alone (of
the whole def, or the module's skeleton, where those cannot tell).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

from rca.inputs.sources import SourceTree
from rca.model import Location, Step
from rca.static.parsing import (
    RELATIVE_RANGES,
    RELATIVE_STATEMENTS,
    ParsedFile,
    TooComplexToParse,
    generated_ranges,
    parse_text,
    share_ranges,
    statement_blocks,
    statement_lines,
    statement_ranges,
    walk_defs_ast,
    walk_defs_cst,
)

Anchor = cst.FunctionDef | cst.ClassDef | cst.Module

# Told the path of each file before it is parsed: an analysis in a forked process leaves it where
# its parent can read which file it was parsing if the parser kills the process.
parsing_witness: Callable[[str], None] | None = None


@dataclass(eq=False)
class FunctionInfo:
    """A function or method. Its body is parsed with libcst only when `node` is first asked for:
    a release's model runner holds hundreds of methods and an analysis reads a handful."""

    module: ModuleInfo
    _node: cst.FunctionDef | None
    qualname: str
    owner: ClassInfo | None = None
    span: tuple[int, int] | None = None  # the def's first and last line, when known
    _load: Callable[[], cst.FunctionDef] | None = None
    name: str = ""
    standard: ast.FunctionDef | ast.AsyncFunctionDef | None = None  # the standard parser's node, when known

    def __post_init__(self) -> None:
        if not self.name and self._node is not None:
            self.name = self._node.name.value

    @property
    def node(self) -> cst.FunctionDef:
        if self._node is None:
            assert self._load is not None
            self._node = self._load()
        return self._node

    def may_store(self, attribute: str) -> bool:
        """Whether the function may assign `<something>.<attribute>`: exact when the standard
        parser's node is known (no libcst parse needed), else a text test."""
        if f".{attribute}" not in self.text:
            return False
        if self.standard is None or self.module.parsed is None:
            return True
        return attribute in self.module.parsed.stored_attributes(self.standard)

    @functools.cached_property
    def text(self) -> str:
        """The def's source text (the whole module's when its lines are unknown): cheap to test
        for a name before parsing the body."""
        if self.span is None:
            return self.module.text
        return "\n".join(self.module.lines[self.span[0] - 1 : self.span[1]])

    def __repr__(self) -> str:
        return f"<function {self.module.name}.{self.qualname}>"


@dataclass(eq=False)
class ClassInfo:
    module: ModuleInfo
    node: cst.ClassDef
    qualname: str
    methods: dict[str, FunctionInfo] = field(default_factory=dict)
    attributes: dict[str, cst.BaseExpression] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.name.value

    @property
    def base_expressions(self) -> list[cst.BaseExpression]:
        return [arg.value for arg in self.node.bases if arg.keyword is None]

    def __repr__(self) -> str:
        return f"<class {self.module.name}.{self.qualname}>"


@dataclass(frozen=True)
class ImportBinding:
    module: str  # absolute dotted module
    attr: str | None  # None for `import x.y as z`


@dataclass(eq=False)
class ModuleInfo:
    relpath: str
    name: str
    input: str
    text: str
    tree: cst.Module
    patched: bool = False
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    functions: dict[str, FunctionInfo] = field(default_factory=dict)
    imports: dict[str, ImportBinding] = field(default_factory=dict)
    assignments: dict[str, cst.CSTNode] = field(default_factory=dict)  # top-level name -> statement
    all_functions: list[FunctionInfo] = field(default_factory=list)
    _def_lines: dict[cst.CSTNode, tuple[int, int]] = field(default_factory=dict)  # def line, last line
    parsed: ParsedFile | None = None
    _ranges: dict[cst.CSTNode, dict[cst.CSTNode, tuple[int, int]]] = field(default_factory=dict)
    _lines: list[str] | None = None
    _code: dict[tuple[int, int], str] = field(default_factory=dict)
    # defs (or the module) whose statements the standard parser's do not pair with
    _unpaired: set[cst.CSTNode] = field(default_factory=set)

    def __repr__(self) -> str:
        return f"<module {self.name}>"

    @functools.cached_property
    def rebound_globals(self) -> frozenset[str]:
        """Top-level names a function of this module rebinds (`global _PP`, then `_PP = ...`): state
        set at runtime, whose value at import (`_PP = None`) is not the one later code reads."""
        standard = self.parsed.standard if self.parsed is not None else None
        if standard is not None:  # the whole file's tree (libcst's may have its def bodies left out)
            return frozenset(name for node in ast.walk(standard) if isinstance(node, ast.Global) for name in node.names)
        return frozenset(
            name.name.value for node in walk(self.tree) if isinstance(node, cst.Global) for name in node.names
        )

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.text.splitlines()
        return self._lines

    def code(self, line: int, end_line: int | None = None) -> str:
        """The stripped source text of a line range, joined into one line for reports (every node
        evaluation passes through asks for its code: kept per range)."""
        end_line = end_line or line
        known = self._code.get((line, end_line))
        if known is not None:
            return known
        lines, parts, length = self.lines, [], 0
        for number in range(max(line, 1), min(end_line, len(lines)) + 1):
            part = lines[number - 1].strip()
            if part and not part.startswith("#"):
                parts.append(part)
                length += len(part) + 1
                if length > 161:  # the rest would be cut off
                    break
        text = " ".join(parts)
        text = text if len(text) <= 160 else text[:157] + "..."
        self._code[(line, end_line)] = text
        return text

    # -- line numbers ---------------------------------------------------------------------------

    def _compute_ranges(self, anchor: Anchor) -> dict[cst.CSTNode, tuple[int, int]]:
        """Line ranges of the nodes under `anchor` from a code generation of it alone. A def's own
        text is contiguous in the file, so its lines are offset from the def's; a class or the
        module is generated as the skeleton and its lines mapped back to the file's."""
        if isinstance(anchor, cst.ClassDef):
            anchor = self.tree
        kept = self.parsed.ranges if self.parsed is not None else self._ranges  # with the parse: cached on disk
        cached = kept.get(anchor)
        if cached is not None:
            return cached
        span = self._def_lines.get(anchor)
        relative = RELATIVE_RANGES.get(anchor) if span is not None else None
        if (
            relative is not None and span is not None
        ):  # a def this process found the ranges of before (in another version of the file)
            kept[anchor] = {node: (first + span[0], last + span[0]) for node, (first, last) in relative.items()}
            return kept[anchor]
        computed = generated_ranges(anchor, self.tree)
        if isinstance(anchor, cst.Module):
            line_map = self.parsed.line_map if self.parsed is not None else None
            # a stubbed def's `...` stands for its whole body: what ends there ends where the def does
            stubs = self.parsed.stubs.values() if self.parsed is not None else ()
            ends = {stub.body[0].lineno: stub.end_lineno or stub.lineno for stub in stubs}

            def original(line: int) -> int:
                return line_map[min(line, len(line_map)) - 1] if line_map else line

            ranges = {
                node: (
                    original(rng.start.line),
                    self._def_lines[node][1]
                    if node in self._def_lines
                    else ends.get(end := original(rng.end.line), end),
                )
                for node, rng in computed.items()
            }
        else:
            offset = (span[0] - computed[anchor.name].start.line) if span is not None else 0
            ranges = {node: (rng.start.line + offset, rng.end.line + offset) for node, rng in computed.items()}
            if span is not None:
                share_ranges(anchor, span[0], ranges)
        kept[anchor] = ranges
        return ranges

    def _statement_lines(self, anchor: cst.CSTNode) -> dict[cst.CSTNode, tuple[int, int]] | None:
        """The lines of the statements of the def `anchor` (or of the module's skeleton), and of
        the nodes found inside them so far, kept with the parse: from another version of the file
        holding the same def, else from the standard parser's tree paired with libcst's statement
        by statement. None when the two do not pair up, or the standard parser's is unknown."""
        assert self.parsed is not None
        known = self.parsed.statement_ranges.get(anchor)
        if known is not None or anchor in self._unpaired:
            return known
        relative = RELATIVE_STATEMENTS.get(anchor)  # None for the module: only defs are shared
        if isinstance(anchor, cst.Module):
            standard = self.parsed.standard
            known = statement_lines(anchor, standard, self.parsed.stubs) if standard is not None else None
        elif relative is not None:
            line = self._def_lines[anchor][0]
            known = {node: (first + line, last + line) for node, (first, last) in relative.items()}
        else:
            function = self.parsed.standard_defs.get(anchor)
            known = statement_lines(anchor, function) if function is not None else None  # type: ignore[arg-type]
            if known is not None:
                share_ranges(anchor, self._def_lines[anchor][0], known, RELATIVE_STATEMENTS)
        if known is None:
            self._unpaired.add(anchor)
            return None
        self.parsed.statement_ranges[anchor] = known
        return known

    def _lines_by_statement(
        self, node: cst.CSTNode, anchor: cst.CSTNode, within: cst.CSTNode | None
    ) -> tuple[int, int] | None:
        """The lines of `node`, a statement of the def `anchor` or a node of the statement
        `within` outside its body, without generating the def's code: from the standard parser's
        lines and a code generation of that statement's own lines (a def's is costlier by far,
        and an analysis cites a few of its statements). None when it cannot tell."""
        known = self._statement_lines(anchor)
        if known is None:
            return None
        found = known.get(node)
        if found is not None:
            return found
        if within is None or within not in known:  # an analyzer's question: the statement is its nearest
            parents = parent_map(anchor)
            within = parents.get(node)
            while within is not None and (within not in known or isinstance(within, cst.BaseSmallStatement)):
                within = parents.get(within)
            if within is None:
                return None
        own = statement_ranges(within, known[within][0], self.tree)
        if own is None or node not in own:
            return None
        known.update(own)
        if not isinstance(anchor, cst.Module):
            share_ranges(anchor, self._def_lines[anchor][0], own, RELATIVE_STATEMENTS)
        return own[node]

    def lines_of(self, node: cst.CSTNode, anchor: Anchor | None, within: cst.CSTNode | None = None) -> tuple[int, int]:
        """1-based first and last line of `node`, found through its enclosing def (or the module);
        `within`, when known, is the statement holding it (the one being evaluated)."""
        if anchor is not None and (isinstance(anchor, cst.Module) or anchor in self._def_lines):
            owner = self.tree if isinstance(anchor, (cst.Module, cst.ClassDef)) else anchor  # as `_compute_ranges`
            if self.parsed is not None and owner not in self.parsed.ranges:
                found = self._lines_by_statement(node, owner, within)
                if found is not None:
                    return found
            ranges = self._compute_ranges(anchor)
            if node in ranges:
                return ranges[node]
        ranges = self._compute_ranges(self.tree)
        return ranges.get(node, (1, 1))

    def location(self, node: cst.CSTNode, anchor: Anchor | None, within: cst.CSTNode | None = None) -> Location:
        first, last = self.lines_of(node, anchor, within)
        return Location(self.input, self.relpath, first, last)

    def step(self, node: cst.CSTNode, anchor: Anchor | None, note: str) -> Step:
        location = self.location(node, anchor)
        return Step(location, note, self.code(location.line, location.end_line))

    def functions_mentioning(self, pattern: re.Pattern[str]) -> list[FunctionInfo] | None:
        """The innermost functions whose text matches `pattern` somewhere, in source order; None
        when def spans are unknown (the caller then walks the whole module)."""
        spans = [(info.span, info) for info in self.all_functions if info.span is not None]
        if not spans:
            return None
        hits = {self.text.count("\n", 0, match.start()) + 1 for match in pattern.finditer(self.text)}
        chosen: dict[int, tuple[int, FunctionInfo]] = {}
        for line in hits:
            inside = [(span[0], info) for span, info in spans if span[0] <= line <= span[1]]
            if inside:
                start, info = max(inside, key=lambda entry: entry[0])
                chosen[id(info)] = (start, info)
        return [info for _, info in sorted(chosen.values(), key=lambda entry: entry[0])]


def _dotted(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    return None


@functools.lru_cache(maxsize=65536)
def module_name(relpath: str) -> str:
    parts = relpath[:-3].split("/") if relpath.endswith(".py") else relpath.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


class CodeIndex:
    """Resolves dotted module names to files of one tree and parses them once, on demand."""

    def __init__(self, tree: SourceTree, allowed: set[str] | None = None) -> None:
        self.tree = tree
        self.allowed = allowed  # relpaths analysis may load; None means any
        self.denied: set[str] = set()  # relpaths an evaluation asked for while they were not allowed
        self.modules: dict[str, ModuleInfo] = {}
        self.failures: dict[str, str] = {}
        self._by_name: dict[str, list[str]] | None = None
        self._resolved: dict[str, str | None] = {}

    def resolve(self, dotted: str) -> str | None:
        """The file of module `dotted` in this tree, matching by the longest package suffix."""
        if dotted in self._resolved:
            return self._resolved[dotted]
        if self._by_name is None:  # files by their module's last name: one pass over the listing
            self._by_name = {}
            for relpath in self.tree.files():
                self._by_name.setdefault(module_name(relpath).rpartition(".")[2], []).append(relpath)
        suffix = "." + dotted
        candidates = [
            relpath
            for relpath in self._by_name.get(dotted.rpartition(".")[2], ())
            if module_name(relpath) == dotted or module_name(relpath).endswith(suffix)
        ]
        found = min(candidates, key=lambda rel: (len(module_name(rel)), rel)) if candidates else None
        self._resolved[dotted] = found
        return found

    def allow(self, relpath: str) -> None:
        if self.allowed is not None:
            self.allowed.add(relpath)

    def loadable(self, relpath: str) -> bool:
        return self.allowed is None or relpath in self.allowed

    def module_by_name(self, dotted: str) -> ModuleInfo | None:
        relpath = self.resolve(dotted)
        if relpath is None:
            return None
        if not self.loadable(relpath):
            self.denied.add(relpath)
            return None
        return self.load(relpath)

    def allowed_since_denied(self) -> set[str]:
        """Modules an evaluation was refused that analysis allowed afterwards: what was evaluated
        before depends on when they were allowed (the order analyzers ran in)."""
        return self.denied & self.allowed if self.allowed is not None else set()

    def load(self, relpath: str) -> ModuleInfo | None:
        """Parse a file (once); a file that cannot be parsed is recorded and gives None."""
        if relpath in self.modules:
            return self.modules[relpath]
        if relpath in self.failures:
            return None
        text = self.tree.read(relpath)
        if text is None:
            self.failures[relpath] = "unreadable"
            return None
        if parsing_witness is not None:
            parsing_witness(relpath)
        try:
            parsed = parse_text(text)
        except cst.ParserSyntaxError as error:
            message = (
                f"{relpath}:{error.raw_line}:{error.raw_column + 1}: syntax error: {error.message.splitlines()[0]}"
            )
            try:  # Python's own message points at the cause ("'(' was never closed"), not where parsing gave up
                compile(text, relpath, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
            except SyntaxError as python_error:
                message = (
                    f"{relpath}:{python_error.lineno}:{python_error.offset or 1}: syntax error: {python_error.msg}"
                )
            except (ValueError, RecursionError):
                pass
            self.failures[relpath] = message
            self.tree.warnings.append(message)
            return None
        except TooComplexToParse as error:
            self.failures[relpath] = f"{relpath}:{error.line}: too complex to parse safely: {error.reason}"
            self.tree.warnings.append(self.failures[relpath])
            return None
        except RecursionError:
            self.failures[relpath] = f"{relpath}: too deeply nested to parse"
            self.tree.warnings.append(self.failures[relpath])
            return None
        module = ModuleInfo(
            relpath,
            module_name(relpath),
            self.tree.input,
            text,
            parsed.tree,
            patched=self.tree.is_patched(relpath),
            _def_lines=parsed.def_lines,
            parsed=parsed,
        )
        self._index_body(module, module.tree.body, None, "")
        self.modules[relpath] = module
        return module

    # -- module structure ----------------------------------------------------------------------

    def _index_body(
        self, module: ModuleInfo, body: Sequence[cst.CSTNode], owner: ClassInfo | None, prefix: str
    ) -> None:
        for statement in body:
            if isinstance(statement, cst.FunctionDef):
                info = self._function(module, statement, prefix + statement.name.value, owner)
                module.all_functions.append(info)
                if owner is not None:
                    owner.methods[statement.name.value] = info
                elif not prefix:
                    module.functions[statement.name.value] = info
                self._index_nested(module, info)
            elif isinstance(statement, cst.ClassDef):
                info_class = ClassInfo(module, statement, prefix + statement.name.value)
                if owner is None and not prefix:
                    module.classes[statement.name.value] = info_class
                self._index_body(module, list(statement.body.body), info_class, info_class.qualname + ".")
            elif isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    self._index_small(module, small, statement, owner, prefix)
            else:  # if/try at module level: imports and definitions under guards count too
                for block in statement_blocks(statement):
                    self._index_body(module, list(block), owner, prefix)

    def _function(
        self, module: ModuleInfo, statement: cst.FunctionDef, qualname: str, owner: ClassInfo | None
    ) -> FunctionInfo:
        parsed = module.parsed
        stub = parsed.stubs.get(statement) if parsed is not None else None
        if parsed is None or stub is None:
            return FunctionInfo(module, statement, qualname, owner, span=module._def_lines.get(statement))
        return FunctionInfo(
            module,
            None,
            qualname,
            owner,
            span=(stub.lineno, stub.end_lineno or stub.lineno),
            _load=lambda: parsed.unit(stub),
            name=statement.name.value,
            standard=stub,
        )

    def _index_nested(self, module: ModuleInfo, function: FunctionInfo) -> None:
        """Functions defined inside `function`: from the standard parser's tree while its body is
        still unparsed, each fetching its libcst node from the parent's when needed."""
        prefix = function.qualname + "."
        stub = (
            module.parsed.stubs_by_span.get(function.span)
            if module.parsed is not None and function._node is None and function.span is not None
            else None
        )
        if stub is None:
            for node in walk_defs_cst(list(function.node.body.body)):
                if isinstance(node, cst.FunctionDef):
                    module.all_functions.append(
                        FunctionInfo(module, node, prefix + node.name.value, span=module._def_lines.get(node))
                    )
            return
        for position, inner in enumerate(walk_defs_ast(stub.body)):
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                module.all_functions.append(
                    FunctionInfo(
                        module,
                        None,
                        prefix + inner.name,
                        span=(inner.lineno, inner.end_lineno or inner.lineno),
                        _load=functools.partial(_nested_def, function, position),
                        name=inner.name,
                        standard=inner,
                    )
                )

    def _index_small(
        self, module: ModuleInfo, small: cst.CSTNode, line: cst.CSTNode, owner: ClassInfo | None, prefix: str
    ) -> None:
        if owner is not None:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    if isinstance(target.target, cst.Name):
                        owner.attributes[target.target.value] = small.value
            elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
                owner.attributes[small.target.value] = small.value
            return
        if prefix:
            return
        if isinstance(small, cst.Import):
            for alias in small.names:
                dotted = _dotted(alias.name)
                if dotted is None:
                    continue
                if alias.asname is not None:
                    module.imports[alias.asname.name.value] = ImportBinding(dotted, None)  # type: ignore[union-attr]
                else:
                    head = dotted.split(".")[0]
                    module.imports[head] = ImportBinding(head, None)
        elif isinstance(small, cst.ImportFrom):
            base = self._absolute_from(module, small)
            if base is None or isinstance(small.names, cst.ImportStar):
                return
            for alias in small.names:
                name = _dotted(alias.name)
                if name is None:
                    continue
                local = alias.asname.name.value if alias.asname is not None else name  # type: ignore[union-attr]
                module.imports[local] = ImportBinding(base, name)
        elif isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            targets: Sequence[cst.AssignTarget | cst.AnnAssign | cst.AugAssign]
            targets = small.targets if isinstance(small, cst.Assign) else [small]
            for assigned in targets:
                node = assigned.target
                if isinstance(node, cst.Name):
                    module.assignments[node.value] = line

    def _absolute_from(self, module: ModuleInfo, node: cst.ImportFrom) -> str | None:
        name = _dotted(node.module) if node.module is not None else ""
        if name is None:
            return None
        dots = len(node.relative)
        if not dots:
            return name
        package = module.name.split(".")
        if not module.relpath.endswith("__init__.py"):
            package = package[:-1]
        if dots > 1:
            package = package[: len(package) - (dots - 1)]
        return ".".join(part for part in (*package, name) if part)


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
# Nodes that hold only layout (whitespace, comments, newlines, brackets, separators): two thirds of
# a module's nodes, never read by an analysis, so walks skip them.
_TRIVIA = (
    cst.BaseParenthesizableWhitespace,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Newline,
    cst.Comment,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Comma,
    cst.Dot,
    cst.Colon,
    cst.Semicolon,
    cst.AssignEqual,
)
_WALKED: dict[type, bool] = {}  # a field value's type -> whether walks visit it (CSTNode is an ABC: slow to ask)


def _walked(value: object) -> bool:
    kind = type(value)
    known = _WALKED.get(kind)
    if known is None:
        known = _WALKED[kind] = isinstance(value, cst.CSTNode) and not isinstance(value, _TRIVIA)
    return known


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of `node` that hold code, in source order (layout nodes are skipped).
    libcst's own `.children` runs a visitor per call, which made tree walks the slowest part of an
    analysis; the fields say it directly."""
    names = _CHILD_FIELDS.get(type(node))
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(node) if not f.name.startswith("_"))
        _CHILD_FIELDS[type(node)] = names
    found: list[cst.CSTNode] = []
    for name in names:
        value = getattr(node, name)
        if _walked(value):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if _walked(item))
    return found


@functools.lru_cache(maxsize=2048)
def parent_map(function: cst.CSTNode) -> dict[cst.CSTNode, cst.CSTNode]:
    """The parent of every node under `function` that holds code (read only: shared by every
    caller)."""
    parents: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [function]
    while stack:
        current = stack.pop()
        for child in children(current):
            parents[child] = current
            stack.append(child)
    return parents


def walk(node: cst.CSTNode, into: Callable[[cst.CSTNode], bool] | None = None) -> Iterator[cst.CSTNode]:
    """Every node under `node` (itself included) that holds code, in source order; `into` can
    prune subtrees."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if into is None or into(current):
            stack.extend(reversed(children(current)))


def iter_calls(node: cst.CSTNode) -> Iterator[cst.Call]:
    """Every call expression under `node`, in source order."""
    return (current for current in walk(node) if isinstance(current, cst.Call))


def call_name(call: cst.Call) -> str | None:
    """`a.b.c(...)` -> "c"; `f(...)` -> "f"."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return None


def dotted_name(node: cst.BaseExpression | None) -> str | None:
    return _dotted(node)


def _nested_def(parent: FunctionInfo, position: int) -> cst.FunctionDef:
    """The `position`-th def inside `parent`'s body, in `walk_defs_cst`'s order (parsed on demand)."""
    node = list(walk_defs_cst(list(parent.node.body.body)))[position]
    assert isinstance(node, cst.FunctionDef)
    return node
