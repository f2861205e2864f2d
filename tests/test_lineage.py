"""--parent-draft: the draft a fine-tune started from, and the bad inputs of that option."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app
from rca.diagnose import Inputs, diagnose
from tests.conftest import CASES

runner = CliRunner()
CASE = CASES / "vocab-map-regenerated-on-vllm"


def test_a_parent_that_does_not_exist_is_one_line_naming_the_option(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["diagnose", "--case", str(CASE), "--parent-draft", str(tmp_path / "nowhere"), "--no-cache", "-q"]
    )
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("rca: error: ") and "--parent-draft path does not exist" in line, line


@pytest.mark.release
def test_a_parent_without_weights_is_not_compared_and_the_notes_say_so(tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    shutil.copy(CASE / "parent" / "config.json", parent / "config.json")
    run = diagnose(
        Inputs(
            serving="vllm==0.33.0", draft=str(CASE / "draft"), target=str(CASE / "target"), parent_draft=str(parent)
        ),
        parallel=False,
    )
    assert all(h.id != "vocab-map-regenerated" for h in run.diagnosis.hypotheses)
    assert any(
        "not compared with the parent's: its parent has no readable d2t" in note
        for note in run.diagnosis.wirings["serving"].notes
    ), run.diagnosis.wirings["serving"].notes
