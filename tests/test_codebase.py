"""The shape of the code base: the import graph of rca has no cycle, no module is too long to read,
the reference pages are what the code says, and nothing cites a document users do not have."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

from rca.static.analyzer import FAMILIES as ANALYZER_FAMILIES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"rca": ROOT / "rca", "rca.analyzers": ROOT / "analyzers", "rca.knowledge": ROOT / "knowledge"}
MAX_LINES = 900
MAX_FUNCTION_LINES = 100


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            if "site" in path.relative_to(root).parts:  # the capture hook runs inside engine processes, alone
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The rca modules `module` imports, wherever the import statement is (type-checking blocks too)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                found.add(name)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    modules = _modules()
    graph = nx.DiGraph()
    for module, path in modules.items():
        graph.add_node(module)
        graph.add_edges_from((module, imported) for imported in _imports(module, path, modules))
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join([*cycle, cycle[0]]) for cycle in cycles[:5])


def _imported_when_loaded(tree: ast.AST) -> Iterator[ast.AST]:
    """The statements a module runs when imported: all but the bodies of its functions."""
    for node in ast.iter_child_nodes(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
            yield from _imported_when_loaded(node)


def test_a_diagnosis_imports_no_networkx() -> None:
    """The dataflow graph keeps its own adjacency (rca.static.graph.DiGraph): networkx's algorithms
    do not take it, and importing networkx cost every run more than some analyses. An analyzer
    walks the graph with `ctx.graph.ancestors`, `descendants`, `path` or `nearest`; only the
    function that exports the graph to networkx (`rca graph --format graphml`) imports it."""
    importers = [
        module
        for module, path in _modules().items()
        if any(
            (isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "networkx" for alias in node.names))
            or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "networkx")
            for node in _imported_when_loaded(ast.parse(path.read_text(encoding="utf-8")))
        )
    ]
    assert not importers, f"these modules import networkx when loaded: {', '.join(sorted(importers))}"


def test_a_diagnosis_imports_nothing_it_needs_to_download_only() -> None:
    """urllib and filelock fetch a release; every run after its first on a release finds it fetched,
    and a cold process should not pay for importing them (about 15 ms)."""
    probe = (
        "import sys, rca.cli, rca.diagnose; "
        "loaded = {'urllib.request', 'filelock'} & set(sys.modules); assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_module_is_too_long_to_read(module: str) -> None:
    lines = _modules()[module].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it along what it does"


def test_no_function_is_too_long_to_read() -> None:
    """A function over a screenful does several things: each gets a name of its own (a stage, a
    helper) and the function reads as their sequence."""
    spans = {}
    for root in PACKAGES.values():
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    where = f"{path.relative_to(ROOT)}:{node.name}"
                    spans[where] = max(spans.get(where, 0), node.end_lineno - node.lineno + 1)
    offenders = [f"{where} ({lines} lines)" for where, lines in spans.items() if lines > MAX_FUNCTION_LINES]
    assert not offenders, f"over {MAX_FUNCTION_LINES} lines: {', '.join(offenders)}; split along what they do"


FAMILIES = {**ANALYZER_FAMILIES, "probes": None}  # probes report no findings: they carry no code


def _plugin_modules() -> dict[str, Path]:
    return {module: path for module, path in _modules().items() if module.startswith("rca.analyzers.")}


def test_plugins_import_rca_only_through_the_sdk() -> None:
    """An analyzer or probe imports rca through `rca.sdk` alone (and, inside its family, its
    siblings), so the core can change behind that surface without breaking a plugin."""
    modules = _modules()
    offenders = []
    for module, path in _plugin_modules().items():
        family = module.split(".")[2]
        for imported in _imports(module, path, modules):
            inside_family = imported.startswith(f"rca.analyzers.{family}.")
            if not (imported == "rca.sdk" or imported.startswith("rca.sdk.") or inside_family):
                offenders.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not offenders, "; ".join(offenders) + ": import it from rca.sdk (add it there if it is missing)"


_PARSERS = {("ast", "parse"), ("libcst", "parse_module"), ("cst", "parse_module")}


def test_plugins_parse_no_file_themselves() -> None:
    """An analyzer reads code through its side (`ctx.index.load`, `ctx.standard_tree`), which refuses
    a file too complex to parse safely and parses each file once; a parser called directly does neither."""
    offenders = []
    for path in _plugin_modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and (node.func.value.id, node.func.attr) in _PARSERS
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"parses a file itself: {', '.join(offenders)}; use ctx.index.load or ctx.standard_tree"


def test_the_core_never_imports_a_plugin() -> None:
    """The core reaches analyzers and probes through discovery (`rca.discovery`), never by name."""
    modules = _modules()
    offenders = [
        f"{path.relative_to(ROOT)} imports {imported}"
        for module, path in modules.items()
        if not module.startswith("rca.analyzers")
        for imported in _imports(module, path, modules)
        if imported.startswith("rca.analyzers")
    ]
    assert not offenders, "; ".join(offenders)


def test_every_plugin_lives_in_its_family_under_its_own_name() -> None:
    """Analyzers and probes live in a family package; the file (or package) is named after the
    plugin (`name`, snake case), which is the snake case of its class; codes carry the family's prefix."""
    from rca.evidence.probes import Probe, registered_probes
    from rca.static.analyzer import Analyzer, registry

    plugins: list[type] = [*registry().analyzers, *registered_probes().values()]
    assert len(plugins) == len({plugin.name for plugin in plugins})
    for plugin in plugins:
        _, _, family, *rest = plugin.__module__.split(".")
        assert family in FAMILIES, f"{plugin.__module__}: not in a family package ({', '.join(FAMILIES)})"
        assert len(rest) == 1, f"{plugin.__module__}: a family holds plugins directly, a module or a package each"
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", plugin.__name__).lower()
        assert rest[0] == plugin.name.replace("-", "_") == snake, (plugin.__module__, plugin.__name__, plugin.name)
        if issubclass(plugin, Analyzer):
            assert FAMILIES[family] and re.fullmatch(rf"{FAMILIES[family]}1\d\d", plugin.code), (plugin.code, family)
        else:
            assert issubclass(plugin, Probe) and family == "probes", plugin
    given = [code for analyzer in registry().analyzers for code in (analyzer.code, *analyzer.formerly)]
    assert sorted(given) == sorted(set(given)), "a code once given (now or formerly) is never given to another analyzer"
    sides = {analyzer.name: (analyzer.__module__.split(".")[2], analyzer) for analyzer in registry().analyzers}
    for name, (family, analyzer) in sides.items():
        assert (family == "across") == (analyzer.across is not Analyzer.across), name
        assert family != "training_capture" or analyzer.sides == {"training"}, name
        assert family not in ("serving_capture", "draft_contract") or "serving" in analyzer.sides, name


def test_every_package_is_installed() -> None:
    """pyproject.toml lists the packages (the plugin and knowledge folders install under rca): a
    package missing there works in an editable install and is absent from a built one."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    knowledge = ROOT / "knowledge"  # data only: the folders of knowledge TOML files
    packages |= {f"rca.knowledge.{folder.name}" for folder in knowledge.iterdir() if any(folder.glob("*.toml"))}
    assert packages - listed == set(), "missing from pyproject.toml's packages"
    assert listed - packages == set(), "listed in pyproject.toml, but not in the tree"


def test_every_check_of_the_contract_says_what_stands_for_training_and_serving() -> None:
    """An analyzer that reports a break of the draft's contract declares the two facts it compares
    (docs/contracts.md is generated from them)."""
    from rca.knowledge import catalog

    from rca.static.analyzer import registry

    undeclared = [
        analyzer.name
        for analyzer in registry().analyzers
        if any(catalog()[report.hypothesis].contract for report in analyzer.reports) and analyzer.compares is None
    ]
    assert not undeclared, f"declare `compares` on {undeclared}"


def test_every_comparison_across_the_sides_declares_what_it_carries_on_the_wirings() -> None:
    """An analyzer that compares the sides (`across`) carries what it read on each side's wiring
    under a key it declares: the core has no field per analyzer, and no two analyzers (nor the
    wiring's own keys) share a JSON key."""
    from rca.static.analyzer import WIRING_KEYS, Analyzer, registry

    comparing = [analyzer for analyzer in registry().analyzers if analyzer.across is not Analyzer.across]
    assert comparing, "no analyzer compares the sides"
    undeclared = [analyzer.name for analyzer in comparing if analyzer.establishes is None]
    assert not undeclared, f"declare `establishes` on {undeclared}"
    keys = [analyzer.establishes.key for analyzer in comparing if analyzer.establishes is not None]
    assert len(set(keys)) == len(keys) and not set(keys) & WIRING_KEYS, keys
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", key) for key in keys), keys


def test_the_reference_pages_are_what_the_code_says() -> None:
    spec = importlib.util.spec_from_file_location("document", ROOT / "scripts" / "document.py")
    assert spec is not None and spec.loader is not None
    document = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(document)
    stale = [str(path.relative_to(ROOT)) for path in document.stale()]
    assert not stale, f"{', '.join(stale)} differ from the code: run python scripts/document.py"


def test_nothing_cites_a_document_users_do_not_have() -> None:
    shared = "shared" + "/"  # spelled apart, so that this line does not cite it
    cited = re.compile(
        r"DESIGN(\.md)?\s*\u00a7|DESIGN \d|" + shared + r"reference|\.\./" + shared + r"|reference/\w+\.md"
    )
    offenders = []
    for folder in ("rca", "analyzers", "knowledge", "scripts", "tests", "docs", "cases"):
        for path in (ROOT / folder).rglob("*"):
            if (
                path.is_file()
                and path.suffix in (".py", ".md", ".toml", ".json", ".patch", ".sh")
                and "trees" not in path.parts
            ):
                for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                    if cited.search(line):
                        offenders.append(f"{path.relative_to(ROOT)}:{number}")
    offenders += [
        f"README.md:{n}"
        for n, line in enumerate((ROOT / "README.md").read_text(encoding="utf-8").splitlines(), 1)
        if cited.search(line)
    ]
    assert not offenders, offenders


def test_catalog_references_are_public_urls() -> None:
    from rca.knowledge import catalog

    for entry in catalog().values():
        for reference in entry.references:
            assert reference.startswith("https://"), f"{entry.id}: {reference!r} is not a public URL"


def test_the_reported_failures_table_is_what_the_cases_say() -> None:
    """Each reported failure the README lists: its case expects the hypothesis the row names at
    rank 1, its control expects consistent, and the hypothesis's catalog entry cites the report."""
    import tomllib
    from rca.knowledge import catalog

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- reports:start -->")[1].split("<!-- reports:end -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| [")]
    assert len(rows) >= 5
    entries = catalog()
    for row in rows:
        report, _, hypothesis, case, control = (cell.strip() for cell in row.strip("|").split("|"))
        url = re.search(r"\((https://[^)]+)\)", report).group(1)
        hypothesis, case, control = (text.strip("`") for text in (hypothesis, case, control))
        assert url in entries[hypothesis].references, (hypothesis, url)
        expected = tomllib.loads((ROOT / "cases" / case / "case.toml").read_text())["expected"]
        assert (expected["status"], expected.get("root_cause")) == ("mismatch", hypothesis), case
        assert tomllib.loads((ROOT / "cases" / control / "case.toml").read_text())["expected"]["status"] == "consistent"
