"""Small hostile conditions, each one line with the documented exit status and nothing of the
user's touched: a second capture into a directory that holds one, a capture of another model's
width, an engine that writes into its model directory, an engine's escape sequences, a working
directory deleted under rca, a standard output that cannot be written, an engine's endless line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app
from rca.errors import InputError
from rca.evidence.engine.process import Ended, Launched
from rca.model import CheckpointEdit, ConfigEdit

runner = CliRunner()
ESCAPES = "\x1b[31mRuntimeError: CUDA out of memory\x1b[0m\x07\x1b]0;pwned\x07"
ESCAPED = "\\x1b[31mRuntimeError: CUDA out of memory\\x1b[0m\\x07\\x1b]0;pwned\\x07"


def _raw_controls(text: str) -> list[str]:
    return [
        character for character in text if (ord(character) < 32 and character not in "\t\n") or ord(character) == 127
    ]


# -- 1. a second capture into the same directory ---------------------------------------------------


def _writes_a_capture(content: str, marker: Path) -> list[str]:
    """A launch command that saves a capture file as the hook does, and leaves `marker` to show it ran."""
    script = (
        "import os, pathlib; pathlib.Path(os.environ['RCA_CAPTURE_DIR'], 'capture_r0_0.safetensors')"
        f".write_text({content!r}); pathlib.Path({str(marker)!r}).touch()"
    )
    return [sys.executable, "-c", script]


def test_a_second_capture_into_a_directory_that_holds_one_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    first = runner.invoke(app, ["capture", "--output", str(out), "--", *_writes_a_capture("first", tmp_path / "1")])
    assert first.exit_code == 0 and "captured 1 draft input(s)" in first.stderr, first.stderr
    second = runner.invoke(app, ["capture", "--output", str(out), "--", *_writes_a_capture("second", tmp_path / "2")])
    assert second.exit_code == 2
    assert second.stderr.splitlines() == [
        f"rca: error: {out}: holds an earlier capture (capture_r0_0.safetensors) (fix: pass another --output for "
        "this capture, or remove that directory to capture again)"
    ]
    assert (out / "capture_r0_0.safetensors").read_text() == "first" and not (tmp_path / "2").exists()


# -- 2. a capture of another width than the target's ----------------------------------------------


def test_a_capture_of_another_width_than_the_target_is_bad_input(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.torch import save_file

    from tests.tinymodels import save_model, tiny_model

    target = save_model(tiny_model("llama", 2), tmp_path / "target")  # 64 wide
    capture = tmp_path / "cap"
    capture.mkdir()
    save_file(
        {"hidden_states": torch.randn(20, 3, 32), "input_ids": torch.arange(20)},
        str(capture / "capture_r0_0.safetensors"),
    )
    result = runner.invoke(
        app, ["probe", "compare", "--capture", str(capture), "--target", str(target), "--device", "cpu", "--quiet"]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"rca: error: {capture / 'capture_r0_0.safetensors'}: the captured hidden states are 32 ")
    assert "the target's hidden size is 64" in line and "(fix: pass --target the model the engine served" in line


# -- 3. an engine that writes into its model directory -----------------------------------------------


def _draft(directory: Path) -> Path:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"eagle_config": {"ids": [0]}}))
    (directory / "tokenizer.json").write_text("{}")
    save_file(
        {"fc.weight": torch.ones(2, 2), "embed_tokens.weight": torch.ones(4, 2)}, str(directory / "model.safetensors")
    )
    (directory / "checkpoint-100").mkdir()  # a training run's: not part of the model an engine loads
    (directory / "checkpoint-100" / "optimizer.pt").write_text("state")
    return directory


@pytest.mark.parametrize(
    "edit",
    [ConfigEdit(("eagle_config", "ids"), [1, 2]), CheckpointEdit({}, dropped=("embed_tokens.weight",))],
    ids=["config-edit", "checkpoint-edit"],
)
def test_an_engine_writing_into_its_model_directory_never_writes_the_users_files(tmp_path: Path, edit) -> None:
    from rca.evidence.engine.verify import fixed_copy

    draft = _draft(tmp_path / "draft")
    before = {path.name: path.read_bytes() for path in draft.iterdir() if path.is_file()}
    with fixed_copy(draft / "config.json", edit) as copy:
        assert sorted(path.name for path in copy.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            with open(copy / name, "w") as engine:  # as an engine that saves into its model directory would
                engine.write("the engine's")
    assert {path.name: path.read_bytes() for path in draft.iterdir() if path.is_file()} == before


# -- 4. an engine's escape sequences in rca's error lines ----------------------------------------------


def test_an_engines_escape_sequences_are_escaped_in_rcas_lines() -> None:
    ended = Ended(1, ("Traceback (most recent call last):", f"\t{ESCAPES}"))
    assert ended.last_error() == ESCAPED
    assert ended.error_lines() == ("Traceback (most recent call last):", f"\t{ESCAPED}")  # a tab stays a tab


def test_a_failed_capture_quotes_the_engines_last_lines_escaped(tmp_path: Path) -> None:
    crash = f"import sys; print({ESCAPES!r}, file=sys.stderr); sys.exit(1)"
    result = runner.invoke(app, ["capture", "--output", str(tmp_path / "cap"), "--", sys.executable, "-c", crash])
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    start = lines.index("rca: the command exited with status 1; its last lines:")
    ours = [line for line in lines[start:] if line.startswith(("rca:", "  "))]  # not the engine's echoed output
    assert f"  {ESCAPED}" in ours and not _raw_controls("\n".join(ours))


def test_the_capture_hooks_failures_are_quoted_escaped(tmp_path: Path) -> None:
    from rca.evidence.capture import hook_failures

    log = tmp_path / "hook-errors.log"
    log.write_text(f"pid 7 the fc hook: {ESCAPES}\n    detail\n")
    assert hook_failures(log) == (f"pid 7 the fc hook: {ESCAPED}",)


def test_an_engine_check_that_failed_quotes_the_engine_escaped(monkeypatch) -> None:
    from rca.evidence.engine import verify

    def fails(*_args, **_kwargs):
        raise InputError(f"the launched engine exited with status 1 before it answered ({ESCAPES})")

    monkeypatch.setattr(verify, "measure_launched", fails)
    check = verify.check_in_engine(None, None, verify.ServeWith(("vllm", "serve"), prompts=None))  # type: ignore[arg-type]
    assert ESCAPED in check.summary and not _raw_controls(check.summary)


# -- 5. a working directory deleted under rca, a standard output that cannot be written --------------


def _rca(shell: str, environment: dict[str, str]) -> subprocess.CompletedProcess:
    """`shell` run by sh with "$RCA" standing for `python -m rca`."""
    return subprocess.run(
        ["sh", "-c", shell],
        env={**environment, "RCA": f"{sys.executable} -m rca"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def served_environment() -> Iterator[dict[str, str]]:
    """The server on, its cache and socket the test's own; stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="rca-") as scratch:
        (Path(scratch) / "run").mkdir(mode=0o700)
        environment = {
            **os.environ,
            "RCA_CACHE_DIR": str(Path(scratch) / "cache"),
            "XDG_RUNTIME_DIR": str(Path(scratch) / "run"),
            "RCA_SERVER": "on",
            "RCA_SERVER_IDLE": "60",
        }
        yield environment
        _rca("$RCA server stop", environment)


def _commands_served(environment: dict[str, str]) -> int | None:
    """How many commands the running server ran (None when none runs)."""
    server = json.loads(_rca("$RCA server status --json", environment).stdout)["server"]
    return None if server is None else server["commands"]


def _server_running(environment: dict[str, str]) -> None:
    """Leave a server behind (any command does) and wait until it answers."""
    assert _rca("$RCA explain embed-slot-added >/dev/null", environment).returncode == 0
    deadline = time.monotonic() + 30
    while _commands_served(environment) is None:
        assert time.monotonic() < deadline, "no rca server started"
        time.sleep(0.2)


def _one_error_line(done: subprocess.CompletedProcess, text: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("rca: error: ") and text in done.stderr and "(fix: " in done.stderr


GONE = 'mkdir "$GONE" && cd "$GONE" && rmdir "$GONE" && '  # then the command, in a directory deleted under it


@pytest.mark.parametrize("server", ["off", "on"])
def test_a_deleted_working_directory_is_one_line(tmp_path: Path, server: str, request) -> None:
    environment = {**os.environ, "RCA_SERVER": "off"}
    if server == "on":
        environment = request.getfixturevalue("served_environment")
        _server_running(environment)  # the client asks a running server, which needs the directory
    environment = {**environment, "GONE": str(tmp_path / "gone")}
    version = _rca(GONE + "$RCA --version", environment)
    assert version.returncode == 0 and version.stdout.startswith("rca ") and not version.stderr
    explained = _rca(GONE + "$RCA explain embed-slot-added", environment)
    _one_error_line(explained, "the working directory cannot be read (No such file or directory)")
    assert "cd to a directory that exists" in explained.stderr and not explained.stdout


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("server", ["off", "on"])
@pytest.mark.parametrize(
    ("redirect", "reason"), [(">/dev/full", "No space left on device"), (">&-", "Bad file descriptor")]
)
@pytest.mark.parametrize("command", ["explain embed-slot-added", "--version"])
def test_an_output_that_cannot_be_written_is_one_line(
    server: str, redirect: str, reason: str, command: str, request
) -> None:
    environment = {**os.environ, "RCA_SERVER": "off"}
    if server == "on":
        environment = request.getfixturevalue("served_environment")
        _server_running(environment)
    done = _rca(f"$RCA {command} {redirect}", environment)
    _one_error_line(done, f"cannot write to standard output ({reason})")
    if server == "on" and command != "--version":  # answered by the server's copy, with the same closed output
        assert _commands_served(environment) == 1


def test_a_reader_that_stops_reading_is_no_error() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "rca", "explain", "embed-slot-added"],
        env={**os.environ, "RCA_SERVER": "off"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # before rca writes: its write meets a pipe nobody reads
    assert process.stderr.read() == b"" and process.wait(timeout=120) == 0


# -- 6. an engine's endless line ------------------------------------------------------------------


def test_an_engines_endless_line_costs_no_memory_of_its_size() -> None:
    size = 50_000_000
    script = f"import sys; sys.stdout.write('x' * {size} + '\\n'); sys.stdout.flush(); print('RuntimeError: after')"
    tracemalloc.start()
    try:
        ended = Launched([sys.executable, "-c", script], os.environ, echo=False).wait()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size // 10, peak
    assert max(len(line) for line in ended.last_lines) <= 8192
    assert ended.last_lines[-1] == "RuntimeError: after" and ended.last_error() == "RuntimeError: after"
