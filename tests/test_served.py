"""Acceptance as the engine measures it (`rca probe served`), against servers in vLLM's and SGLang's
shape (`tests/engines/spec_server.py`): what is read, the figures, and every bad input as one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app
from rca.evidence.engine.served import (
    SGLANG_FIELDS,
    VLLM_COUNTERS,
    launch_url,
    parse_metrics,
    sglang_counts,
    vllm_counts,
)
from tests.enginelab import free_port

SERVER = Path(__file__).parent / "engines" / "spec_server.py"
runner = CliRunner()


def _server_command(port: int, *extra: str) -> list[str]:
    return [sys.executable, str(SERVER), "--port", str(port), *extra]


@pytest.fixture
def serving(request):
    """A server in the shape asked for (engine, mode), started and stopped around the test."""
    port = free_port()
    process = subprocess.Popen(_server_command(port, *request.param))
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield url
    process.kill()
    process.wait()


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps({"prompts": [[1, 5, 9, 12]] * 4}))
    return path


def _served(*arguments: str):
    return runner.invoke(app, ["probe", "served", *arguments])


@pytest.mark.parametrize("serving", [("--engine", "vllm")], indirect=True)
def test_vllm_counters_give_acceptance_by_position_and_length(serving: str, prompts: Path) -> None:
    result = _served("--url", serving, "--prompts", str(prompts), "--max-new-tokens", "8", "--format", "json", "-q")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "rca.served-acceptance/1" and report["engine"] == "vllm" and report["prompts"] == 4
    assert (report["drafts"], report["draft_tokens"], report["accepted_tokens"]) == (64, 192, 120)
    assert report["acceptance"] == round(120 / 192, 4) and report["by_position"] == [0.9375, 0.625, 0.3125]
    assert report["mean_acceptance_length"] == round(1 + 120 / 64, 4) and report["generated_tokens"] == 32
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in report["read"]


@pytest.mark.parametrize(
    ("serving", "by_position"),
    [(("--engine", "sglang"), [0.9375, 0.625, 0.3125]), (("--engine", "sglang", "--old"), [])],
    indirect=["serving"],
    ids=["sglang-0.5.12", "sglang-0.4"],
)
def test_sglang_requests_carry_their_own_counts(serving: str, prompts: Path, by_position: list) -> None:
    """From 0.5.12 each answer counts its correct and proposed drafts; before, rca derives them from
    the verify steps, the tokens generated and the server's speculative steps."""
    result = _served("--url", serving, "--prompts", str(prompts), "--max-new-tokens", "48", "--format", "json", "-q")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["engine"] == "sglang" and report["drafts"] == 64 and report["draft_tokens"] == 192
    expected = 120 if by_position else 4 * (48 - 1 - 16)  # completion tokens less the prefill's and one per verify
    assert report["accepted_tokens"] == expected and report["by_position"] == by_position


def test_prometheus_text_is_read_with_its_labels() -> None:
    text = (
        '# HELP x\nvllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3.0\n'
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 4.0\nbroken line\n'
    )
    assert parse_metrics(text)[0] == ("vllm:spec_decode_num_drafts_total", {"engine": "0", "model_name": "m"}, 3.0)
    counts = vllm_counts(text)
    assert counts is not None and counts.drafts == 5 and counts.per_position == (4,)
    assert vllm_counts("vllm:num_requests_running 1\n") is None
    assert sglang_counts([{"completion_tokens": 9}], 3) is None


def test_where_a_launched_server_answers() -> None:
    assert launch_url(["vllm", "serve", "m", "--port", "9001"]) == "http://127.0.0.1:9001"
    assert launch_url(["python", "-m", "sglang.launch_server", "--host=0.0.0.0"]) == "http://127.0.0.1:30000"
    assert launch_url(["vllm", "serve", "m", "--host", "10.0.0.2"]) == "http://10.0.0.2:8000"


def test_a_launched_server_is_measured_and_stopped(prompts: Path) -> None:
    port = free_port()
    result = _served("--prompts", str(prompts), "--format", "json", "--", *_server_command(port, "--engine", "vllm"))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["acceptance"] == 0.625 and report["startup_seconds"] is not None
    assert report["launch"][-2:] == ["--engine", "vllm"]
    assert "launching the engine" in result.stderr and "answered at" in result.stderr
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)  # stopped with everything it started


def _refused(result, *phrases: str) -> None:
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("rca: error:")]
    assert all(phrase in line for phrase in phrases), line
    assert "Traceback" not in result.output


def test_a_url_where_nothing_answers(prompts: Path) -> None:
    _refused(
        _served("--url", f"http://127.0.0.1:{free_port()}", "--prompts", str(prompts)),
        "nothing answers at --url",
        "start the server first",
    )
    _refused(_served("--url", "localhost:8000", "--prompts", str(prompts)), "not an http(s) URL")


@pytest.mark.parametrize("serving", [("--engine", "vllm", "--mode", "no-spec")], indirect=True)
def test_a_server_without_speculative_decoding(serving: str, prompts: Path) -> None:
    _refused(_served("--url", serving, "--prompts", str(prompts)), "serves without a draft", "--speculative-config")


@pytest.mark.parametrize("serving", [("--engine", "sglang", "--mode", "no-spec")], indirect=True)
def test_an_sglang_server_without_speculative_decoding(serving: str, prompts: Path) -> None:
    _refused(_served("--url", serving, "--prompts", str(prompts)), "serves without a draft", "EAGLE3")


@pytest.mark.parametrize("serving", [("--engine", "vllm", "--mode", "frozen")], indirect=True)
def test_counters_that_never_move(serving: str, prompts: Path) -> None:
    _refused(_served("--url", serving, "--prompts", str(prompts)), "did not move while 4 prompts were served")


def test_a_launch_command_that_exits_at_once(prompts: Path) -> None:
    fails = "import sys; print('ValueError: no such model', file=sys.stderr); sys.exit(3)"
    _refused(
        _served("--prompts", str(prompts), "--", sys.executable, "-c", fails),
        "the launched engine exited with status 3 before it answered",
        "ValueError: no such model",
    )


def test_prompts_that_cannot_be_sent(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([[1, 2], [3, -1]]))
    _refused(_served("--url", "http://127.0.0.1:1", "--prompts", str(bad)), "prompt 2 is neither text nor")
    _refused(_served("--url", "http://127.0.0.1:1", "--prompts", str(tmp_path)), "--prompts is not a file")
    _refused(_served("--url", "http://127.0.0.1:1"), "--prompts FILE or --dumps DIR")
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    _refused(_served("--url", "http://127.0.0.1:1", "--prompts", str(empty)), "holds no prompts")
    lines = tmp_path / "lines.txt"
    lines.write_text("first prompt\nsecond prompt\n")
    _refused(_served("--prompts", str(lines)), "no server to measure")


@pytest.mark.release
@pytest.mark.parametrize(
    ("name", "version", "path", "names"),
    [
        *[
            ("vllm", version, "vllm/v1/spec_decode/metrics.py", VLLM_COUNTERS.values())
            for version in ("0.22.0", "0.33.0")
        ],
        ("sglang", "0.5.12", "sglang/srt/managers/tokenizer_manager.py", SGLANG_FIELDS),
        ("sglang", "0.5.23", "sglang/srt/managers/tokenizer_manager.py", SGLANG_FIELDS),
    ],
)
def test_what_the_probe_reads_is_what_the_engines_write(name: str, version: str, path: str, names) -> None:
    """The counters and fields `rca probe served` reads are those the engines' own code defines (read,
    never imported)."""
    from rca.inputs.sources import fetch_release

    text = (fetch_release(name, version) / path).read_text()
    assert all(f'"{field}"' in text for field in names), [field for field in names if f'"{field}"' not in text]
