"""Engines rca starts, rca stops: every process they started, in their session or out of it, and
when rca itself is terminated or hung up on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rca.evidence.engine.process import Ended, Launched

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process groups, subreapers and /proc")

# An engine that ignores SIGTERM and SIGINT and starts a worker that leaves its session (setsid),
# also ignoring them; each writes its pid.
STUBBORN = """
import os, signal, sys, time
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, signal.SIG_IGN)
directory = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(os.path.join(directory, "worker"), "w").write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
open(os.path.join(directory, "engine"), "w").write(str(os.getpid()))
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _pids(directory: Path, timeout: float = 30.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {name: (directory / name).read_text() for name in ("engine", "worker") if (directory / name).is_file()}
        if len(found) == 2 and all(found.values()):
            return {name: int(text) for name, text in found.items()}
        time.sleep(0.1)
    raise AssertionError("the engine did not start")


def test_stop_reaches_an_engine_that_ignores_signals_and_a_worker_that_left_its_session(tmp_path: Path) -> None:
    script = tmp_path / "engine.py"
    script.write_text(STUBBORN)
    launched = Launched([sys.executable, str(script), str(tmp_path)], dict(os.environ), echo=False, own_group=True)
    pids = _pids(tmp_path)
    launched.stop(grace=0.5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids.values()):
        time.sleep(0.1)
    assert not [name for name, pid in pids.items() if _alive(pid)]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_rca_terminated_stops_its_engine_first(tmp_path: Path, number: int) -> None:
    """`rca probe served -- LAUNCH` ended by SIGTERM or SIGHUP: the engine and its workers go with
    it, and rca's status is the shell's 128 + N."""
    script = tmp_path / "engine.py"
    script.write_text(STUBBORN)
    runner = textwrap.dedent(
        f"""
        import os, sys, time
        from rca.evidence.engine.process import Launched, stopped_on_signals
        with stopped_on_signals():
            launched = Launched([sys.executable, {str(script)!r}, {str(tmp_path)!r}], dict(os.environ), echo=False,
                                own_group=True)
            try:
                time.sleep(300)
            finally:
                launched.stop(grace=0.5)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", runner])
    pids = _pids(tmp_path)
    process.send_signal(number)
    assert process.wait(timeout=60) == 128 + number
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids.values()):
        time.sleep(0.1)
    assert not [name for name, pid in pids.items() if _alive(pid)]


def test_an_engine_outlives_no_rca_killed_outright(tmp_path: Path) -> None:
    """SIGKILL leaves rca no time: the engine's parent-death signal kills it."""
    script = tmp_path / "engine.py"
    script.write_text(STUBBORN)
    runner = (
        "import os, sys, time\nfrom rca.evidence.engine.process import Launched\n"
        f"Launched([sys.executable, {str(script)!r}, {str(tmp_path)!r}], dict(os.environ), echo=False,\n"
        "         own_group=True)\n"
        "time.sleep(300)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", runner])
    pids = _pids(tmp_path)
    process.kill()
    process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pids["engine"]):
        time.sleep(0.1)
    assert not _alive(pids["engine"])


# The end of vLLM 0.32's output when its engine core cannot start (the worker's error, then the
# engine core's pointer to it), as the lab's engine prints them.
_VLLM_FAILED_START = (
    "(EngineCore_DP0 pid=4242) ERROR 12-05 10:00:01 [core.py:842] EngineCore failed to start.",
    "Traceback (most recent call last):",
    '  File "vllm/v1/worker/cpu_worker.py", line 120, in determine_available_memory',
    "ValueError: No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE` "
    "or decreasing `gpu_memory_utilization`.",
    "Traceback (most recent call last):",
    '  File "vllm/entrypoints/openai/api_server.py", line 1912, in <module>',
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
)


def test_an_engine_that_fails_to_start_is_quoted_by_its_root_cause_not_the_pointer_to_it() -> None:
    ended = Ended(1, _VLLM_FAILED_START)
    assert ended.last_error().startswith("ValueError: No available memory for the cache blocks.")
    pipeline = ("AttributeError: 'CPUModelRunner' object has no attribute 'drafter'", *_VLLM_FAILED_START[-3:])
    assert Ended(1, pipeline).last_error() == "AttributeError: 'CPUModelRunner' object has no attribute 'drafter'"
    # an exception that points nowhere stands, and the last of several such is the one quoted
    assert Ended(1, ("KeyError: 'a'", "RuntimeError: after")).last_error() == "RuntimeError: after"
    assert Ended(1, _VLLM_FAILED_START[-1:]).last_error().startswith("RuntimeError: Engine core initialization")


# The end of vLLM 0.32's output for the lab launched at pipeline parallel 2: the worker's error in
# its own process's log lines, then two pointers to it without a prefix.
_VLLM_PIPELINE_START = (
    "(Worker_PP0 pid=30501) ERROR 12-06 05:43:51 [multiproc_executor.py:1063] Traceback (most recent call last):",
    "(Worker_PP0 pid=30501) ERROR 12-06 05:43:51 [multiproc_executor.py:1063] AttributeError: 'CPUModelRunner' "
    "object has no attribute 'drafter'",
    "(EngineCore pid=30491) ERROR 12-06 05:43:51 [core.py:1510] RuntimeError: Worker failed with error "
    "''CPUModelRunner' object has no attribute 'drafter'', please check the stack trace above for the root cause",
    "RuntimeError: Worker failed with error ''CPUModelRunner' object has no attribute 'drafter'', please check the "
    "stack trace above for the root cause",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
)


def test_a_worker_s_error_in_its_own_log_lines_is_the_root_cause_quoted() -> None:
    assert Ended(1, _VLLM_PIPELINE_START).last_error() == (
        "AttributeError: 'CPUModelRunner' object has no attribute 'drafter'"
    )
