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
    assert counts is not None and counts.drafts == 5 and counts.per_position == (0, 4)  # position 1: the second
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


# -- a server is untrusted input: whatever it answers is one line and exit 2, never a figure ----------


@pytest.mark.parametrize(
    ("serving", "phrases"),
    [
        (("--engine", "vllm", "--hostile", "nan"), ["vllm:spec_decode_num_drafts_total is nan, not a count"]),
        (("--engine", "vllm", "--hostile", "inf"), ["vllm:spec_decode_num_drafts_total is inf, not a count"]),
        (("--engine", "vllm", "--hostile", "position-label"), ['has position="x", not a draft position']),
        (("--engine", "vllm", "--hostile", "error-second-metrics"), ["/metrics: answered HTTP 500"]),
        (("--engine", "vllm", "--hostile", "cut"), ["/v1/completions: cut its answer short"]),
        (("--engine", "vllm", "--hostile", "not-json"), ["/v1/completions: answered something other than JSON"]),
        (("--engine", "vllm", "--hostile", "redirect"), ["HTTP 302 to http://elsewhere.invalid/", "not followed"]),
        (
            ("--engine", "vllm", "--hostile", "impossible"),
            ["vllm:spec_decode_num_accepted_tokens says 384 accepted of 192 draft tokens"],
        ),
        (("--engine", "vllm", "--hostile", "decreasing"), ["vllm:spec_decode_num_drafts went down from 1,600 to"]),
        (("--engine", "sglang", "--hostile", "string-counts"), ["meta_info.spec_verify_ct is '16', not a count"]),
        (
            ("--engine", "sglang", "--hostile", "negative-histogram"),
            ["meta_info.spec_correct_drafts_histogram is -5, not a count"],
        ),
        (("--engine", "sglang", "--hostile", "wide-histogram"), ["spec_correct_drafts_histogram is not a list of"]),
        (("--engine", "sglang", "--hostile", "impossible"), ["meta_info.spec_num_correct_drafts says 384 accepted"]),
    ],
    indirect=["serving"],
    ids=lambda value: value[-1] if isinstance(value, tuple) else None,
)
def test_a_server_answering_as_no_engine_would_is_one_line_and_no_figure(
    serving: str, prompts: Path, phrases: list[str]
) -> None:
    started = time.monotonic()
    _refused(_served("--url", serving, "--prompts", str(prompts)), *phrases)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    ("serving", "setting", "phrase"),
    [
        (("--engine", "vllm", "--hostile", "trickle"), ("METRICS_SECONDS", 2.0), "gave no whole answer within 2 s"),
        (("--engine", "vllm", "--hostile", "huge"), ("METRICS_BYTES", 1 << 20), "more than the 1,048,576 bytes"),
    ],
    indirect=["serving"],
    ids=["trickle", "huge"],
)
def test_a_server_that_never_finishes_its_answer_is_cut_off(
    serving: str, prompts: Path, setting: tuple[str, float], phrase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadline for the whole answer, not each read; a bound on its size, not the memory's."""
    from rca.evidence.engine import served

    monkeypatch.setattr(served, *setting)
    started = time.monotonic()
    result = _served("--url", serving, "--prompts", str(prompts))
    assert time.monotonic() - started < 15
    # /metrics is read first to tell the engine; a server whose /metrics cannot be read is no vLLM
    _refused(result, "as neither vLLM")
    with pytest.raises(served.ServerFault, match=phrase):
        served._vllm_counts_at(serving)


def test_a_launch_on_an_impossible_port_and_a_deep_prompts_file(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _refused(_served("--url", "http://127.0.0.1:1", "--prompts", str(deep)), "--prompts is nested too deeply")
    prompts = tmp_path / "prompts.json"
    prompts.write_text('["hello"]')
    _refused(
        _served("--prompts", str(prompts), "--", "vllm", "serve", "m", "--port", "70000"),
        "the launch's --port 70000 is not a TCP port",
    )
    _refused(_served("--url", "http://127.0.0.1:70000", "--prompts", str(prompts)), "nothing answers at --url")


def test_histogram_sums_take_linear_time() -> None:
    metas = [{"spec_verify_ct": 4, "spec_correct_drafts_histogram": [0] + [1] * 1024}] * 64
    started = time.monotonic()
    counts = sglang_counts(metas, 3)
    assert counts is not None and counts.per_position[0] == 64 * 1024 and counts.per_position[-1] == 64
    assert time.monotonic() - started < 1
