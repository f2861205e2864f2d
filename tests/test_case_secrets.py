"""Case files carry no secrets: a new case copies only the files of a model directory rca reads,
and keeps launches (flags, launch files, the [serve] command, the engine's record) with each
credential redacted, its flag kept; the first run still serves the launch as given."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cases.casefile import create_case, load_case
from rca.cli import app
from rca.evidence.engine.served import Prompts
from rca.evidence.engine.verify import ServeWith
from rca.inputs import Inputs
from rca.inputs.launch import redact_secrets
from tests.conftest import sglang_like_configs, write_json
from tests.enginelab import free_port
from tests.test_cli import embed_patch, inputs

SERVER = Path(__file__).parent / "engines" / "spec_server.py"
SECRETS = ("sk-123", "hf_abc", "hf_x", "pw@", "PRIVATE")
runner = CliRunner()


def founding(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> tuple[list[str], Path]:
    """The founding case's inputs, its draft given as the directory of a config-only draft."""
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    return inputs(sglang_like, speculators_like, draft.parent, target, embed_patch(tmp_path, sglang_like)), draft


def secrets_in(case: Path) -> list[str]:
    """Every file of the case that holds one of SECRETS."""
    return [
        f"{path.name}: {secret}"
        for path in case.rglob("*")
        if path.is_file()
        for secret in SECRETS
        if secret in path.read_text(errors="replace")
    ]


def test_a_new_case_copies_only_the_model_files_rca_reads(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    arguments, draft = founding(tmp_path, sglang_like, speculators_like)
    write_json(draft.parent / "tokenizer_config.json", {"chat_template": "{{ messages }}"})
    for name in ("api_keys.json", ".credentials.json", "hf_token.json"):
        write_json(draft.parent / name, {"token": "PRIVATE"})
    case = tmp_path / "case"
    result = runner.invoke(app, ["case", "new", str(case), *arguments, "--quiet"])
    assert result.exit_code == 1, result.output
    assert sorted(path.name for path in (case / "draft").iterdir()) == ["config.json", "tokenizer_config.json"]
    assert not secrets_in(case)


def test_launch_flags_are_kept_with_their_secrets_redacted(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    arguments, _ = founding(tmp_path, sglang_like, speculators_like)
    plain = (
        "--max-num-batched-tokens 8 --num-speculative-tokens 3 --tokenizer /models/t --speculative-draft-model-path /d"
    )
    flags = f"--api-key sk-123 --hf-token hf_abc {plain} --admin-api-key=sk-123 --url http://u:pw@host:8000"
    case = tmp_path / "case"
    result = runner.invoke(app, ["case", "new", str(case), *arguments, "--serving-args", flags, "--quiet"])
    assert result.exit_code == 1, result.output
    recorded = (case / "case.toml").read_text()
    kept = f"--api-key *** --hf-token *** {plain} --admin-api-key=*** --url http://u:***@host:8000"
    assert f"serving_args = {json.dumps(kept)}" in recorded
    again = runner.invoke(app, ["case", "run", str(case), "--serving-args", "--api-key=sk-123 --tp 2", "--quiet"])
    assert again.exit_code == 1, again.output
    assert 'serving_args = "--api-key=*** --tp 2"' in (case / "case.toml").read_text()
    assert "`serving_args` = `--api-key=*** --tp 2`" in (case / "transcript.md").read_text()
    assert not secrets_in(case)


def test_a_copied_launch_file_keeps_its_lines_but_not_its_secrets(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    arguments, _ = founding(tmp_path, sglang_like, speculators_like)
    launch = tmp_path / "serve.sh"
    launch.write_text(
        "# serve the draft\n"
        "HF_TOKEN=hf_x python -m sglang.launch_server \\\n"
        "  --api-key \\\n"
        "  sk-123 --tp 2 \\\n"
        "  --num-speculative-tokens 3\n"
    )
    case = tmp_path / "case"
    result = runner.invoke(app, ["case", "new", str(case), *arguments, "--serving-args", str(launch), "--quiet"])
    assert result.exit_code == 1, result.output
    assert (case / "serve.sh").read_text() == (
        "# serve the draft\n"
        "HF_TOKEN=*** python -m sglang.launch_server \\\n"
        "  --api-key \\\n"
        "  *** --tp 2 \\\n"
        "  --num-speculative-tokens 3\n"
    )
    assert not secrets_in(case)


def test_the_serve_launch_is_recorded_redacted_and_first_served_as_given(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    """The launch serves only with a token longer than `***` (a wrapper checks): the first run measures the
    engine, while case.toml and diagnosis.json keep `HF_TOKEN=***`; serving the recorded launch again
    asks for the command, in one line."""
    arguments, draft = founding(tmp_path, sglang_like, speculators_like)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([[1, 2, 3, 4]] * 3))
    server = [sys.executable, str(SERVER), "--port", str(free_port()), "--draft", str(draft.parent)]
    command = ["env", "HF_TOKEN=hf_x_long", "sh", "-c", '[ "${#HF_TOKEN}" -gt 3 ] && exec "$@"', "sh", *server]
    command += ["--good-ids", "2", "30", "58"]
    case = tmp_path / "case"
    serve = ["--serve-with", "--serve-prompts", str(prompts)]
    result = runner.invoke(app, ["case", "new", str(case), *arguments, *serve, "--", *command])
    assert result.exit_code == 1, result.output
    recorded = (case / "case.toml").read_text()
    assert '"HF_TOKEN=***"' in recorded
    assert '"--draft", "{draft}"' in recorded  # the case's own copy, served as before
    assert "fix verified in the engine" in (case / "report.md").read_text()
    assert "HF_TOKEN=***" in json.loads((case / "diagnosis.json").read_text())["engine"]["as_served"]["launch"]
    assert not secrets_in(case)
    again = runner.invoke(app, ["case", "run", str(case), "--serve-with"])
    assert again.exit_code == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "[serve] launch had a secret" in again.stderr and "--serve-with -- LAUNCH" in again.stderr


def test_the_serve_url_is_recorded_without_its_password(tmp_path: Path) -> None:
    served = ServeWith(("vllm", "serve", "--api-key", "sk-123"), Prompts(([1, 2],)), "http://u:pw@host:8000")
    case = create_case(tmp_path / "case", Inputs(serving="sglang==0.5.12"), "a password in the url", served)
    recorded = (case / "case.toml").read_text()
    assert 'command = ["vllm", "serve", "--api-key", "***"]' in recorded
    assert 'url = "http://u:***@host:8000"' in recorded
    assert load_case(case).serve.redacted


@pytest.mark.parametrize(
    ("launch", "kept"),
    [
        ("--api-key sk-123 --tp 2", "--api-key *** --tp 2"),
        ("--api-key=sk-123", "--api-key=***"),
        (
            "--hf-token hf_abc --token=t --hub_token t --db-password p",
            "--hf-token *** --token=*** --hub_token *** --db-password ***",
        ),
        ("vllm serve --url http://u:pw@host:8000", "vllm serve --url http://u:***@host:8000"),
        ("pip install git+https://hf_abc@hf.co/r", "pip install git+https://***@hf.co/r"),
        ("HF_TOKEN=hf_x OPENAI_API_KEY='sk 1' vllm serve m", "HF_TOKEN=*** OPENAI_API_KEY=*** vllm serve m"),
        (
            "export HF_TOKEN=hf_x\nvllm serve m --admin-api-key 'a b'",
            "export HF_TOKEN=***\nvllm serve m --admin-api-key ***",
        ),
        ("# needs --token\nvllm serve m", "# needs --token\nvllm serve m"),  # a value never on the next command
        ("--token --port 8", "--token --port 8"),  # a flag given without a value
    ],
)
def test_redact_secrets(launch: str, kept: str) -> None:
    assert redact_secrets(launch) == kept


def test_settings_and_paths_that_merely_look_secret_are_kept() -> None:
    launch = (
        "TOKENIZERS_PARALLELISM=false vllm serve m --tokenizer t --max-num-batched-tokens 8 "
        "--num-speculative-tokens 3 --speculative-draft-model-path /d --eos-token '</s>' --api-keys keys.json "
        "--ssl-keyfile key.pem --chat-template=t.jinja git@github.com:o/r http://host/p@v1"
    )
    assert redact_secrets(launch) == launch


def test_a_command_keeps_one_argument_per_argument() -> None:
    command = ["vllm", "serve", "{draft}", "--api-key=sk 1", "--hf-token", "hf abc", "http://u:p'w@h", "--tp", "2"]
    assert shlex.split(redact_secrets(shlex.join(command))) == [
        "vllm", "serve", "{draft}", "--api-key=***", "--hf-token", "***", "http://u:***@h", "--tp", "2"
    ]  # fmt: skip
