"""Inputs users hand over: configs with line numbers, patches, source specs, dumps, case files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rca.cases.casefile import load_case
from rca.errors import InputError, PatchError
from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.dumps import read_dump_metadata
from rca.inputs.jsonpos import JsonSyntaxError, loads
from rca.inputs.patching import apply_patch
from rca.inputs.sources import SourceSpec, SourceTree, materialize
from tests.conftest import CASES, make_patch, write_json, write_tree

# -- JSON with line numbers -------------------------------------------------------------------------


def test_json_lines_of_nested_keys() -> None:
    doc = loads('{\n  "a": 1,\n  "eagle_config": {\n    "ids": [\n      -1, 2, 30\n    ]\n  }\n}\n')
    assert doc.lines[("a",)] == (2, 2)
    assert doc.lines[("eagle_config", "ids")] == (4, 6)
    assert doc.lines[("eagle_config", "ids", 2)] == (5, 5)
    assert doc.line_range(("eagle_config", "missing")) == (3, 7)


def test_json_syntax_error_has_a_position() -> None:
    with pytest.raises(JsonSyntaxError) as error:
        loads('{\n  "a": 1,\n  "b": [1, 2,\n}')
    assert error.value.line == 4


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(json_values, st.sampled_from([None, 2]))
def test_json_positions_cover_every_value(value, indent) -> None:
    text = json.dumps({"root": value}, indent=indent)
    doc = loads(text)
    assert doc.data == {"root": value}
    total = text.count("\n") + 1
    for first, last in doc.lines.values():
        assert 1 <= first <= last <= total


# -- configs ---------------------------------------------------------------------------------------


def test_target_layers_under_text_config(tmp_path: Path) -> None:
    target = TargetConfig(load_config("target", CASES / "kimi-k25-consistent" / "target"))
    assert target.num_layers == 61
    assert target.num_layers_path == ("text_config", "num_hidden_layers")
    assert target.architectures == ("KimiK25ForConditionalGeneration",)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"num_hidden_layers": 32,', "malformed JSON"),
        ("[1, 2]", "not an object"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_bad_config_files(tmp_path: Path, content, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError, match=message):
        load_config("target", path)


def test_config_without_layer_count(tmp_path: Path) -> None:
    target = TargetConfig(
        load_config("target", write_json(tmp_path / "config.json", {"hidden_size": 8, "text_config": {}}))
    )
    with pytest.raises(InputError, match="no num_hidden_layers"):
        _ = target.num_layers


def test_config_paths(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_config("draft", tmp_path / "nope")
    with pytest.raises(InputError, match=r"no config\.json"):
        load_config("draft", tmp_path)


# -- patches ---------------------------------------------------------------------------------------

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 40))


def test_patch_applies_even_when_lines_moved(tmp_path: Path) -> None:
    patched = ORIGINAL.replace("line 20\n", "line twenty\n")
    diff = make_patch("pkg/mod.py", ORIGINAL, patched)
    drifted = "header\nheader\n" + ORIGINAL
    changes = apply_patch(diff, "fix.patch", lambda rel: rel == "pkg/mod.py", lambda rel: drifted)
    assert changes["pkg/mod.py"] == "header\nheader\n" + patched


def test_patch_that_does_not_apply_names_the_hunk() -> None:
    diff = make_patch("pkg/mod.py", ORIGINAL, ORIGINAL.replace("line 20\n", "x\n"))
    with pytest.raises(PatchError, match=r"fix.patch: hunk at patch line 3 does not apply to pkg/mod.py"):
        apply_patch(
            diff, "fix.patch", lambda rel: rel == "pkg/mod.py", lambda rel: ORIGINAL.replace("line 20\n", "changed\n")
        )


def test_patch_for_a_file_not_in_the_tree() -> None:
    diff = make_patch("other/mod.py", ORIGINAL, ORIGINAL + "x\n")
    with pytest.raises(PatchError, match="not in the source tree"):
        apply_patch(diff, "fix.patch", lambda rel: False, lambda rel: "")


def test_patch_is_an_overlay_and_never_touches_the_tree(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "src", {"pkg/mod.py": ORIGINAL})
    patch = tmp_path / "fix.patch"
    patch.write_text(make_patch("pkg/mod.py", ORIGINAL, ORIGINAL.replace("line 5\n", "five\n")))
    tree = SourceTree("serving", "src", root)
    tree.apply(patch, "fix.patch")
    assert "five" in tree.read("pkg/mod.py")
    assert (root / "pkg/mod.py").read_text() == ORIGINAL
    assert tree.patched_lines("pkg/mod.py") == {5}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["x = 1", "", "pass", "# note"]), min_size=0, max_size=30),
    st.data(),
)
def test_the_lines_a_patch_adds_are_found_among_repeated_context(
    tmp_path_factory: pytest.TempPathFactory, context: list[str], data: st.DataObject
) -> None:
    """Lines a patch adds or changes are the new file's lines it reports, however repetitive the
    lines around them (which are compared one by one before the rest is diffed)."""
    start = data.draw(st.integers(0, len(context)))
    stop = data.draw(st.integers(start, len(context)))
    added = [f"added_{number} = {number}" for number in range(data.draw(st.integers(1, 4)))]
    root = write_tree(tmp_path_factory.mktemp("src"), {"pkg/mod.py": "".join(f"{line}\n" for line in context)})
    tree = SourceTree("serving", "src", root)
    tree.overlay["pkg/mod.py"] = "".join(f"{line}\n" for line in [*context[:start], *added, *context[stop:]])
    assert tree.patched_lines("pkg/mod.py") == set(range(start + 1, start + len(added) + 1))


def test_not_a_patch(tmp_path: Path) -> None:
    patch = tmp_path / "notes.txt"
    patch.write_text("just some text\n")
    with pytest.raises(PatchError, match="no file changes"):
        SourceTree("serving", "src", tmp_path).apply(patch, "notes.txt")


# -- source specs and trees ------------------------------------------------------------------------


def test_source_specs(tmp_path: Path) -> None:
    assert SourceSpec.parse("sglang==0.5.12", "--serving").kind == "release"
    assert SourceSpec.parse(str(tmp_path), "--serving").kind == "path"
    with pytest.raises(InputError, match="neither an existing path"):
        SourceSpec.parse(str(tmp_path / "missing"), "--serving")


def test_package_directory_reports_paths_from_the_package(tmp_path: Path) -> None:
    write_tree(
        tmp_path, {"sglang/__init__.py": "", "sglang/srt/models/x.py": "X = 1\n", "sglang/srt/__pycache__/y.py": ""}
    )
    tree = materialize(SourceSpec.parse(str(tmp_path / "sglang"), "--serving"), "serving")
    assert tree.files() == ["sglang/__init__.py", "sglang/srt/models/x.py"]


def test_sources_python_would_read_are_read_and_the_others_named_in_a_warning(tmp_path: Path) -> None:
    write_tree(tmp_path, {"good.py": "x = 1\n"})
    (tmp_path / "latin.py").write_bytes(b"x = '\xe9'\n")  # neither UTF-8 nor declared: read, with a warning
    (tmp_path / "declared.py").write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")  # PEP 263: no warning
    (tmp_path / "binary.py").write_bytes(b"\x00\x01x =")  # skipped, with a warning
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    tree = SourceTree("serving", "src", tmp_path)
    assert tree.files() == ["binary.py", "declared.py", "good.py", "latin.py"]
    assert tree.grep(["x ="])["x ="] == ["binary.py", "declared.py", "good.py", "latin.py"]
    assert tree.read("latin.py") == "x = '\xe9'\n"
    assert tree.read("declared.py").endswith("x = '\xe9'\n")
    assert tree.read("binary.py") is None
    assert tree.warnings == [
        "latin.py: not utf-8 text (byte 5); read as latin-1",
        "binary.py: skipped, binary content in a .py file",
    ]


# -- dumps and cases -------------------------------------------------------------------------------


def test_dump_metadata(tmp_path: Path) -> None:
    write_json(tmp_path / "data_config.json", {"hidden_states": {"layer_ids": [2, 16, 29, 31]}})
    metadata = read_dump_metadata(tmp_path)
    assert metadata.ids == (2, 16, 29, 31) and metadata.step.location.line == 3
    write_json(tmp_path / "data_config.json", {"hidden_states": {"layer_ids": "all"}})
    with pytest.raises(InputError, match="not a list of layer ids"):
        read_dump_metadata(tmp_path)


def test_case_files(tmp_path: Path) -> None:
    case = load_case(CASES / "kimi-k25-embed-slot")
    assert case.inputs.serving == "sglang==0.5.12" and case.expected.root_cause == "embed-slot-added"
    (tmp_path / "case.toml").write_text("[inputs]\nserving = 3\n")
    with pytest.raises(InputError, match="not a string"):
        load_case(tmp_path)
    (tmp_path / "case.toml").write_text("[inputs\n")
    with pytest.raises(InputError, match="malformed case file"):
        load_case(tmp_path)


def test_a_source_archive_yields_only_its_python_files_inside_the_release(tmp_path: Path) -> None:
    import io
    import tarfile

    from rca.inputs.sources import _unpack_python_files

    archive = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:

        def add(name: str, data: bytes = b"x = 1\n", kind: bytes = tarfile.REGTYPE) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("pkg-1.0/pkg/__init__.py")
        add("pkg-1.0/pkg/core.py", b"def f():\n    return 2\n")
        add("pkg-1.0/setup.py")
        add("pkg-1.0/README.md", b"docs")
        add("pkg-1.0/../escape.py")
        add("/abs.py")
        link = tarfile.TarInfo("pkg-1.0/pkg/link.py")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    dest = tmp_path / "src" / "pkg-1.0"
    _unpack_python_files(archive, dest)
    unpacked = sorted(path.relative_to(dest).as_posix() for path in dest.rglob("*") if path.is_file())
    assert unpacked == [".complete", "pkg/__init__.py", "pkg/core.py", "setup.py"]
    assert (dest / "pkg" / "core.py").read_text() == "def f():\n    return 2\n"
    assert not (tmp_path / "src" / "escape.py").exists()


def test_pip_downloads_are_shown_with_their_size_and_its_errors_kept() -> None:
    """pip's own "Downloading NAME (SIZE)" lines become progress; its stderr comes back for the error."""
    import sys

    from rca.inputs.sources import _run_pip

    script = (
        "import sys; print('Collecting pkg==1.0'); print('  Downloading pkg-1.0-py3-none-any.whl (12.3 MB)'); "
        "print('ERROR: No matching distribution', file=sys.stderr); sys.exit(1)"
    )
    shown: list[str] = []
    returncode, errors = _run_pip([sys.executable, "-c", script], shown.append)
    assert returncode == 1 and errors.strip() == "ERROR: No matching distribution"
    assert shown == ["downloading pkg-1.0-py3-none-any.whl (12.3 MB)"]
