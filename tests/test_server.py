"""The rca server: a command it runs answers as the command run in its own process would, in the
user's directory, environment and streams, with its exit status; it leaves when idle or stopped,
and a socket it left behind never stops a command."""

from __future__ import annotations

import contextlib
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


# -- hostile conditions: other credentials or limits, stalled peers, killed clients ----------------


def rca_limited(environment: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """rca run with a lower limit on open files than the server was started with."""
    import resource

    def lower() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512) - 1, hard))

    return subprocess.run(
        [sys.executable, "-m", "rca", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lower,
    )


def test_a_command_whose_limits_differ_from_the_servers_runs_in_its_own_process(
    environment: dict[str, str], stopped: None
) -> None:
    """A copy of the server would run with the server's limits, capabilities and cgroup: a caller
    whose own differ is refused and runs the command itself, under its own limits."""
    rca(environment, "cache", "show")
    assert running(environment)["commands"] == 0
    same = rca(environment, "explain", "layer-offset")
    assert same.returncode == 0 and status(environment)["commands"] == 1
    limited = rca_limited(environment, "explain", "layer-offset")
    assert (limited.returncode, limited.stdout) == (same.returncode, same.stdout)
    assert status(environment)["commands"] == 1  # not the server's: the caller's own process ran it


def test_a_peer_that_sends_nothing_stalls_no_command(environment: dict[str, str], stopped: None) -> None:
    import socket

    rca(environment, "cache", "show")
    found = running(environment)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(found["address"])  # and never sends
    try:
        started = time.monotonic()
        answer = rca(environment, "explain", "layer-offset")
        assert answer.returncode == 0 and time.monotonic() - started < 15
        assert status(environment)["commands"] == 1
    finally:
        silent.close()


@pytest.mark.parametrize("answer", [None, b"\x00\x00\x00\x05junk!"], ids=["never-answers", "garbage"])
def test_a_listener_that_is_no_server_of_ours_is_passed_by(environment: dict[str, str], answer: bytes | None) -> None:
    """A process listening at the server's address that never answers, or answers garbage: the
    command runs in its own process, with its own exit status, within a few seconds."""
    import socket
    import threading

    rca(environment, "cache", "show")
    address = Path(running(environment)["address"])
    rca(environment, "server", "stop")
    environment = {**environment, "RCA_SERVER_IDLE": "1"}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(address))
    listener.listen(4)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listener.accept()
                held.append(connection)
                if answer is not None:
                    connection.sendall(answer)

    threading.Thread(target=accept, daemon=True).start()
    try:
        started = time.monotonic()
        result = rca(environment, "explain", "layer-offset")
        assert result.returncode == 0 and "layer-offset" in result.stdout, result.stderr
        assert time.monotonic() - started < 20
        if answer is None:
            assert "did not answer within" in result.stderr
    finally:
        listener.close()
        for connection in held:
            connection.close()


def test_a_client_killed_takes_its_command_with_it(tmp_path: Path, environment: dict[str, str], stopped: None) -> None:
    """`timeout -s KILL`, the OOM killer: the client dies without a word, and the server's copy that
    runs its command, and what that command started, go with it."""
    import signal

    rca(environment, "cache", "show")
    running(environment)
    marker = tmp_path / "pid"
    sleeper = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rca",
            "capture",
            "--output",
            str(tmp_path / "cap"),
            "--",
            sys.executable,
            "-c",
            sleeper,
        ],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (marker.is_file() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = int(marker.read_text())
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def test_a_command_sent_without_asking_first_is_never_run(environment: dict[str, str], stopped: None) -> None:
    """The caller's context is checked when it asks to send its streams: a request that skips the
    question (a process of the user's impersonating a command) is not run."""
    import socket

    from rca.server import _receive, _send

    rca(environment, "cache", "show")
    found = running(environment)
    reader, writer = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(found["address"])
            request = {"run": ["explain", "layer-offset"], "cwd": "/", "env": dict(os.environ), "streams": {}}
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the server may close first
                _send(client, request, [reader, writer, writer])
                assert _receive(client) is None  # closed without a word
    finally:
        os.close(reader)
        os.close(writer)
    assert status(environment)["commands"] == 0
