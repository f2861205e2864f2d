"""docs/adding-an-analyzer.md, followed as a new contributor would, in a copy of rca: the scaffold,
the page's analyzer and hypothesis, its examples run by the harness, the docs regenerated, and its
note in SARIF. Adding it touches its file, its hypothesis and the generated pages, nothing else."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "adding-an-analyzer.md"
COPIED = ("rca", "analyzers", "knowledge", "scripts", "docs")
TESTS = ("__init__.py", "conftest.py", "releases.py", "test_analyzer_examples.py")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for folder in ("analyzers", "knowledge", "docs")
        for path in (root / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def _run(copy: Path, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy), "RCA_SERVER": "off"}
    return subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.release
def test_the_guide_adds_an_analyzer_whose_note_shows_in_sarif(tmp_path: Path) -> None:
    copy = tmp_path / "rca-copy"
    for folder in COPIED:
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tests").mkdir()
    for name in TESTS:
        shutil.copy(ROOT / "tests" / name, copy / "tests" / name)
    # the installed layout: the plugin and knowledge folders are parts of `rca`
    (copy / "rca" / "analyzers").symlink_to(copy / "analyzers")
    (copy / "rca" / "knowledge").symlink_to(copy / "knowledge")
    before = _tree(copy)

    (scaffold,) = [block for block in _blocks("sh") if "new_analyzer.py" in block]
    made = _run(copy, sys.executable, *scaffold.split()[1:])
    assert made.returncode == 0, made.stderr
    written = copy / "analyzers" / "draft_contract" / "draft_dtype.py"
    code = re.search(r'code = "(RCA-D\d+)"', written.read_text(encoding="utf-8")).group(1)
    (analyzer,) = [block for block in _blocks("python") if "class DraftDtype" in block]
    written.write_text(re.sub(r'code = "RCA-D\d+"', f'code = "{code}"', analyzer), encoding="utf-8")
    (hypothesis,) = _blocks("toml")
    (copy / "knowledge" / "hypotheses" / "dtype-differs.toml").write_text(hypothesis, encoding="utf-8")

    documented = _run(copy, sys.executable, "scripts/document.py")
    assert documented.returncode == 0, documented.stderr
    tested = _run(copy, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "draft-dtype",
                  "tests/test_analyzer_examples.py")  # fmt: skip
    assert tested.returncode == 0 and " passed" in tested.stdout, tested.stdout + tested.stderr

    changed = {path for path, data in _tree(copy).items() if before.get(path) != data}
    assert changed == {
        "analyzers/draft_contract/draft_dtype.py",
        "knowledge/hypotheses/dtype-differs.toml",
        "docs/analyzers.md",
        "docs/contracts.md",
        "docs/hypotheses.md",
    }

    case = tmp_path / "dtype-case"
    shutil.copytree(ROOT / "cases" / "kimi-k25-consistent", case)
    for config, dtype in (("draft", "float32"), ("target", "bfloat16")):
        path = case / config / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "torch_dtype": dtype}, indent=2))
    diagnosed = _run(copy, sys.executable, "-m", "rca", "diagnose", "--case", str(case), "--format", "sarif", "-q")
    assert diagnosed.returncode == 0, diagnosed.stderr  # a note: the draft still serves as trained
    results = json.loads(diagnosed.stdout)["runs"][0]["results"]
    (note,) = [result for result in results if result["ruleId"] == "dtype-differs"]
    assert note["level"] == "note"
    assert note["message"]["text"].startswith("the draft's config records torch_dtype float32, its target's bfloat16")
