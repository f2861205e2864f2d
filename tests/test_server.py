"""The rca server: a command it runs answers as the command run in its own process would, in the
user's directory, environment and streams, with its exit status; it leaves when idle or stopped,
and a socket it left behind never stops a command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import sglang_like_configs
from tests.test_cli import embed_patch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the server forks its commands (Linux)")


@pytest.fixture
def environment() -> Iterator[dict[str, str]]:
    """The commands' environment: a cache directory and a runtime directory of the test's own (the
    server's socket lives in one of them: short paths, as a socket's must be), the server on, and
    an idle limit so that none outlives the test by much."""
    with tempfile.TemporaryDirectory(prefix="rca-") as scratch:
        cache, runtime = Path(scratch) / "cache", Path(scratch) / "run"
        cache.mkdir()
        runtime.mkdir(mode=0o700)
        yield {
            **os.environ,
            "RCA_CACHE_DIR": str(cache),
            "XDG_RUNTIME_DIR": str(runtime),
            "RCA_SERVER": "on",
            "RCA_SERVER_IDLE": "60",
        }


def rca(environment: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rca", *args],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def status(environment: dict[str, str]) -> dict | None:
    answer = rca(environment, "server", "status", "--json")
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)["server"]


def running(environment: dict[str, str], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = status(environment)
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError("no rca server started")


@pytest.fixture
def stopped(environment: dict[str, str]):
    yield
    rca(environment, "server", "stop")


def test_a_command_the_server_runs_answers_as_in_its_own_process(
    tmp_path: Path, sglang_like: Path, speculators_like: Path, environment: dict[str, str], stopped: None
) -> None:
    """The diagnosis, a bad input's one-line error and their exit statuses are the same whether the
    command runs in its own process or in the server, and relative paths are the user's."""
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    patch = embed_patch(tmp_path, sglang_like)
    args = ("diagnose", "--no-cache", "--format", "json", "--serving", str(sglang_like), "--serving-patch", patch.name)
    args += ("--training",)
    args += (str(speculators_like), "--draft", draft.parent.name, "--target", str(target))
    alone = rca({**environment, "RCA_SERVER": "off"}, *args, cwd=tmp_path)
    assert alone.returncode == 1, alone.stderr  # the founding mismatch
    assert status(environment) is None  # RCA_SERVER=off leaves none behind

    first = rca(environment, *args, cwd=tmp_path)  # runs here, and leaves a server
    assert (first.returncode, first.stdout) == (alone.returncode, alone.stdout)
    assert running(environment)["commands"] == 0

    served = rca(environment, *args, cwd=tmp_path)
    assert (served.returncode, served.stdout, served.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert json.loads(served.stdout)["verdict"]["root_cause"] == "embed-slot-added"
    assert status(environment)["commands"] == 1

    missing = ("diagnose", "--serving", str(sglang_like), "--draft", "nowhere", "--target", str(target))
    bad_alone, bad_served = (
        rca({**environment, "RCA_SERVER": "off"}, *missing, cwd=tmp_path),
        rca(environment, *missing, cwd=tmp_path),
    )
    assert bad_served.returncode == bad_alone.returncode == 2
    assert bad_served.stderr == bad_alone.stderr and "--draft" in bad_served.stderr
    assert status(environment)["commands"] == 2


def test_the_server_holds_the_parses_of_the_commands_before(
    tmp_path: Path, sglang_like: Path, speculators_like: Path, environment: dict[str, str], stopped: None
) -> None:
    """The command that starts the server hands it the parses it used, and each command the server
    runs reports its own: the server holds them in memory for the next, whose answer is the one
    the command gives in its own process."""
    analysis = {**environment, "RCA_ANALYSIS_CACHE": str(tmp_path / "analysis")}
    args = ["diagnose", "--format", "json", "--serving", str(sglang_like), "--training", str(speculators_like)]
    first_draft, target = sglang_like_configs(tmp_path / "one", [2, 30, 58])
    rca(analysis, *args, "--draft", str(first_draft), "--target", str(target))
    deadline = time.monotonic() + 30
    while (running(analysis)["parses_held"] == 0 or status(analysis)["parses_pending"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    held = status(analysis)["parses_held"]
    assert held > 0

    second_draft, _ = sglang_like_configs(tmp_path / "two", [-1, 2, 30])
    args += ["--draft", str(second_draft), "--target", str(target)]
    served = rca(analysis, *args)
    assert status(analysis)["commands"] == 1
    elsewhere = {**analysis, "RCA_SERVER": "off", "RCA_CACHE_DIR": str(tmp_path / "elsewhere")}  # nothing remembered
    alone = rca(elsewhere, *args)
    assert served.returncode == alone.returncode
    assert json.loads(served.stdout) == json.loads(alone.stdout)


def test_the_environment_is_the_commands_own(tmp_path: Path, environment: dict[str, str], stopped: None) -> None:
    """A command the server runs reads the caller's environment (here, where the analysis cache
    is), not the one the server started with."""
    rca(environment, "cache", "show")  # leaves a server
    running(environment)
    elsewhere = tmp_path / "analysis-elsewhere"
    shown = rca({**environment, "RCA_ANALYSIS_CACHE": str(elsewhere)}, "cache", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["analysis"]["location"] == str(elsewhere)
    assert status(environment)["commands"] >= 1


def test_stop_and_idle_end_the_server(environment: dict[str, str]) -> None:
    rca(environment, "cache", "show")  # leaves a server (`rca server` itself does not)
    found = running(environment)
    socket_file = Path(found["address"])
    assert socket_file.exists() and oct(socket_file.stat().st_mode & 0o777) == "0o600"
    stop = rca(environment, "server", "stop")
    assert stop.returncode == 0 and f"process {found['pid']}" in stop.stdout
    assert status(environment) is None and not socket_file.exists()

    quick = {**environment, "RCA_SERVER_IDLE": "1"}
    rca(quick, "cache", "show")
    running(quick)
    deadline = time.monotonic() + 20
    while status(quick) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert status(quick) is None


def test_a_socket_left_behind_never_stops_a_command(environment: dict[str, str], stopped: None) -> None:
    """A server killed without cleaning up leaves its socket file: the next command runs in its own
    process and a new server takes the address."""
    rca(environment, "cache", "show")  # leaves a server (`rca server` itself does not)
    found = running(environment)
    os.kill(found["pid"], 9)
    time.sleep(0.2)
    assert Path(found["address"]).exists()
    answer = rca(environment, "cache", "show", "--json")
    assert answer.returncode == 0 and json.loads(answer.stdout)["analysis"]
    assert running(environment)["pid"] != found["pid"]


def test_a_cache_directory_too_deep_for_a_socket_puts_it_in_a_private_one(
    environment: dict[str, str], stopped: None
) -> None:
    """A socket's path is limited to about a hundred bytes: under a deep cache directory the server
    listens in a directory of the user's own under $XDG_RUNTIME_DIR; one that others can enter is
    never used (the command runs in its own process, leaving no server)."""
    deep = Path(environment["RCA_CACHE_DIR"]) / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    environment = {**environment, "RCA_CACHE_DIR": str(deep)}
    rca(environment, "cache", "show")
    found = running(environment)
    assert Path(found["address"]).parent == Path(environment["XDG_RUNTIME_DIR"]) / f"rca-{os.getuid()}"
    assert oct(Path(found["address"]).parent.stat().st_mode & 0o777) == "0o700"
    rca(environment, "server", "stop")

    shared = Path(environment["RCA_CACHE_DIR"]) / "shared"
    (shared / f"rca-{os.getuid()}").mkdir(parents=True, mode=0o777)
    (shared / f"rca-{os.getuid()}").chmod(0o777)
    exposed = {**environment, "XDG_RUNTIME_DIR": str(shared)}
    answer = rca(exposed, "cache", "show", "--json")
    assert answer.returncode == 0 and json.loads(answer.stdout)["analysis"]
    time.sleep(2)
    assert status(exposed) is None and not list((shared / f"rca-{os.getuid()}").iterdir())


def test_the_server_builds_the_command_line_parser_before_it_forks(tmp_path: Path) -> None:
    """What typer builds on a command's first use (the command tree, each parameter's converter,
    with pydantic) the server builds once, before it forks: a copy parses its command line with
    nothing left to import, where it took about a tenth of a second of every command."""
    script = (
        "import sys, rca.cli\n"
        "rca.cli.prepare()\n"
        "before = set(sys.modules)\n"
        "code = rca.cli.run(['cache', 'show', '--json'])\n"
        "print(code, sorted({name.split('.')[0] for name in set(sys.modules) - before}), file=sys.stderr)\n"
    )
    answer = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "RCA_SERVER": "off", "RCA_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    code, imported = answer.stderr.strip().splitlines()[-1].split(" ", 1)
    assert code == "0", answer.stderr
    assert "pydantic" not in imported and "pydantic_core" not in imported, imported
