"""The report's diagram as a reader sees it: drawn by released Mermaid bundles in headless Chromium,
small enough to read at a glance, with what differs drawn red and shaded (tests/browser.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app
from rca.report.diagram import sides_mermaid
from tests.browser import MERMAID, render
from tests.conftest import CASES
from tests.test_diagram import _wiring

pytestmark = pytest.mark.browser
runner = CliRunner()


def _founding_report_diagram() -> str:
    result = runner.invoke(app, ["diagnose", "--case", str(CASES / "kimi-k25-embed-slot"), "-f", "markdown", "-q"])
    assert result.exit_code == 1, result.output
    found = re.search(r"```mermaid\n(.*?)```", result.stdout, re.DOTALL)
    assert found, result.stdout
    return found[1]


@pytest.mark.release
@pytest.mark.parametrize("version", MERMAID)
def test_the_founding_case_s_report_diagram_draws_both_sides_in_one_screen(tmp_path: Path, version: str) -> None:
    drawn = render(_founding_report_diagram(), version, tmp_path)
    assert drawn.width < 1100 and drawn.height < 600, (drawn.width, drawn.height)  # one screen, at scale 1
    assert {"h0", "h3", "h31", "h59", "h61", "slot 0", "slot 1", "slot 2", "verifier-last"} <= set(drawn.nodes)
    (patched,) = [node for node in drawn.nodes if node.startswith("serving, patched:")]
    assert "sglang/srt/models/deepseek_v2.py:2545-2547" in patched
    assert sorted(drawn.edge_labels) == ["serving"] * 3 + ["training"] * 4
    assert drawn.red_edges == 6  # both sides' edges into the three differing slots
    assert sorted(drawn.shaded) == ["h0", "h59"]  # what only one side feeds
    assert set(drawn.clusters) == {"target hidden states", "draft inputs"}


@pytest.mark.parametrize("version", MERMAID)
def test_a_wide_shifted_draft_stays_readable_and_a_consistent_one_marks_nothing(tmp_path: Path, version: str) -> None:
    """Eight slots, every one shifted by a layer: 16 states fed by one side only and the verifier's,
    one row each, no wider than the founding case's and under 100 px a row."""
    layers = list(range(1, 60, 7))[:8]
    shifted = sides_mermaid(_wiring("training", [n + 1 for n in layers]), _wiring("serving", layers))
    wide = render(shifted, version, tmp_path)
    assert wide.width < 1100 and wide.height < 17 * 100, (wide.width, wide.height)
    assert wide.red_edges == 16 and len(wide.shaded) == 16 and "h61" not in wide.shaded
    consistent = sides_mermaid(_wiring("training", [2, 16, 29], 32), _wiring("serving", [2, 16, 29], 32))
    same = render(consistent, version, tmp_path)
    assert same.height < 500 and same.red_edges == 0 and not same.shaded
    assert same.edge_labels == ("both",) * 4
