"""A fix checked in the engine (`--serve-with`), against a server in vLLM's shape whose acceptance
depends on the draft config it serves (`tests/engines/spec_server.py --draft DIR --good-ids ...`):
the founding case's tree diagnosed, served as given and with a copy of the draft that has the fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app
from rca.evidence.engine.verify import _pointed_at, fixed_copy
from rca.model import ConfigEdit, diagnosis_from_json
from tests.conftest import sglang_like_configs
from tests.enginelab import free_port
from tests.test_cli import embed_patch, inputs

SERVER = Path(__file__).parent / "engines" / "spec_server.py"
runner = CliRunner()


@pytest.fixture
def deployment(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> tuple[list[str], Path, Path]:
    """The founding case in the small trees (an embedding slot added), a prompts file, the draft."""
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([[1, 2, 3, 4]] * 3))
    return inputs(sglang_like, speculators_like, draft, target, embed_patch(tmp_path, sglang_like)), prompts, draft


def serve(draft: Path, *good_ids: int) -> list[str]:
    return [sys.executable, str(SERVER), "--port", str(free_port()), "--draft", str(draft.parent), "--good-ids",
            *map(str, good_ids)]  # fmt: skip


def diagnose(*arguments: str):
    return runner.invoke(app, ["diagnose", "--format", "json", *arguments])


def test_the_fix_is_served_from_a_copy_and_verified(deployment) -> None:
    arguments, prompts, draft = deployment
    before = draft.read_text()
    result = diagnose(*arguments, "--serve-with", "--serve-prompts", str(prompts), "--", *serve(draft, 2, 30, 58))
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    engine = report["engine"]
    assert engine["hypothesis"] == "embed-slot-added" and engine["verified"] is True
    assert engine["as_served"]["acceptance"] == 0.125 and engine["with_fix"]["acceptance"] == 0.9375
    assert engine["summary"] == "fix verified in the engine: acceptance 0.12 -> 0.94"
    assert report["verdict"]["summary"].endswith("; fix verified in the engine: acceptance 0.12 -> 0.94")
    assert report["hypotheses"][0]["fix_edit"]["value"] == [2, 30, 58]
    assert draft.read_text() == before  # the user's draft is untouched
    assert "serving the draft with the fix" in result.stderr
    kept = diagnosis_from_json(report)
    assert kept.engine == engine and kept.hypotheses[0].fix_edit == ConfigEdit(
        ("eagle_config", "eagle_aux_hidden_state_layer_ids"), [2, 30, 58]
    )


def test_a_fix_the_engine_does_not_confirm_is_said_so(deployment) -> None:
    arguments, prompts, draft = deployment
    result = diagnose(*arguments, "--serve-with", "--serve-prompts", str(prompts), "--", *serve(draft, 9, 9, 9))
    engine = json.loads(result.stdout)["engine"]
    assert engine["verified"] is False
    assert engine["summary"].startswith("fix not verified in the engine: acceptance 0.12 -> 0.12 with it")


def test_a_launch_that_does_not_name_the_draft_is_measured_as_served_only(deployment, tmp_path: Path) -> None:
    arguments, prompts, draft = deployment
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "config.json").write_text(draft.read_text())
    result = diagnose(*arguments, "--serve-with", "--serve-prompts", str(prompts), "--", *serve(other / "x", 2, 30, 58))
    engine = json.loads(result.stdout)["engine"]
    assert engine["with_fix"] is None and engine["verified"] is None
    assert "the launch command does not name the draft directory" in engine["not_served"]
    assert "acceptance in the engine as served: 0.12 (the fix was not served" in engine["summary"]


def test_the_text_report_shows_what_the_engine_measured(deployment) -> None:
    arguments, prompts, draft = deployment
    result = runner.invoke(
        app, ["diagnose", *arguments, "--serve-with", "--serve-prompts", str(prompts), "--", *serve(draft, 2, 30, 58)]
    )
    text = result.stdout
    assert "\nIn the engine\n  fix verified in the engine: acceptance 0.12 -> 0.94\n" in text
    assert "  as served: 18 of 144 draft tokens accepted (0.125), mean acceptance length 1.38" in text


def test_serving_needs_a_command_and_prompts(deployment) -> None:
    arguments, prompts, _ = deployment
    result = diagnose(*arguments, "--serve-with", "--serve-prompts", str(prompts))
    assert result.exit_code == 2 and "--serve-with needs the launch command" in result.stderr
    result = diagnose(*arguments, "--serve-with", "--", "vllm", "serve")
    assert result.exit_code == 2 and "--serve-with needs prompts to send" in result.stderr
    result = diagnose(*arguments, "--", "vllm", "serve")  # without --serve-with, the launch is an input: the
    assert "rca: read from the launch: " in result.stderr and result.exit_code != 2  # options given win over it


def test_a_case_records_its_launch_and_its_report_shows_the_figures(deployment, tmp_path: Path) -> None:
    arguments, prompts, draft = deployment
    case = tmp_path / "case"
    command = serve(draft, 2, 30, 58)
    result = runner.invoke(
        app, ["case", "new", str(case), *arguments, "--serve-with", "--serve-prompts", str(prompts), "--", *command]
    )
    assert result.exit_code == 1, result.output
    recorded = (case / "case.toml").read_text()
    held = [argument if argument != str(draft.parent) else "{draft}" for argument in command]
    assert (case / "draft" / "config.json").is_file()  # a config-only draft travels with the case ...
    assert f"[serve]\ncommand = {json.dumps(held)}" in recorded  # ... and the launch serves the case's copy
    assert 'prompts = "prompts.json"' in recorded
    assert "- fix verified in the engine: acceptance 0.12 -&gt; 0.94" in (case / "report.md").read_text()
    again = runner.invoke(app, ["case", "run", str(case), "--serve-with"])  # the recorded command, served again
    assert again.exit_code == 1, again.output
    assert json.loads((case / "diagnosis.json").read_text())["engine"]["verified"] is True
    (case / "case.toml").write_text(recorded.replace(f"command = {json.dumps(held)}", 'command = "vllm serve"'))
    bad = runner.invoke(app, ["case", "run", str(case), "--serve-with"])
    assert bad.exit_code == 2 and "[serve] command is 'vllm serve', not a non-empty list of strings" in bad.stderr


def test_the_fixed_copy_copies_the_weights_and_points_the_launch_at_itself(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"eagle_config": {"ids": [0]}, "x": 1}))
    (draft / "model.safetensors").write_bytes(b"weights")
    with fixed_copy(draft / "config.json", ConfigEdit(("eagle_config", "ids"), [1, 2])) as copy:
        assert json.loads((copy / "config.json").read_text()) == {"eagle_config": {"ids": [1, 2]}, "x": 1}
        assert not (copy / "model.safetensors").is_symlink() and (copy / "model.safetensors").read_bytes() == b"weights"
        pointed = _pointed_at([f'{{"model": "{draft}"}}', f"{draft}/", f"{draft}x", "--tp"], draft, copy)
        assert pointed == [f'{{"model": "{copy}"}}', f"{copy}/", f"{draft}x", "--tp"]
    assert not copy.exists() and json.loads((draft / "config.json").read_text())["eagle_config"] == {"ids": [0]}
