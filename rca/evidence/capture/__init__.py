"""`rca capture`: run a serving engine's launch command with the capture hook enabled.

The hook (`site/sitecustomize.py`) is loaded by every Python process the command starts, through
PYTHONPATH, and writes what the draft receives to the output directory as safetensors that the
probes read like any dump (`rca probe fingerprint --dumps OUT`, `rca probe compare --capture OUT`).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rca.errors import InputError
from rca.evidence.engine.process import Ended, Launched, quoted, stopped_on_signals

SITE = Path(__file__).parent / "site"
CAPTURE_FILES = "capture_*.safetensors"  # as the hook names them: capture_r<rank>_<n>.safetensors
HOOK_ERRORS = "hook-errors.log"  # the hook's own failures, one line each (and a few of traceback)
SHUTDOWN_SECONDS = 30  # how long an interrupted server may take to exit before it is terminated


@dataclass(frozen=True)
class CaptureRun:
    ended: Ended
    files: tuple[Path, ...]  # the capture files this run wrote
    hook_errors: tuple[str, ...]  # the first line of each failure the hook recorded
    interrupted: bool  # stopped by the user (Ctrl-C), as a server usually is

    @property
    def engine_failed(self) -> bool:
        return self.ended.status != 0 and not self.interrupted


def capture_environment(
    output: Path, requests: int, min_tokens: int, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The launch command's environment with the hook enabled."""
    env = dict(os.environ if environ is None else environ)
    env["PYTHONPATH"] = os.pathsep.join(part for part in (str(SITE), env.get("PYTHONPATH", "")) if part)
    env["RCA_CAPTURE_DIR"] = str(output)
    env["RCA_CAPTURE_REQUESTS"] = str(requests)
    env["RCA_CAPTURE_MIN_TOKENS"] = str(min_tokens)
    return env


def prepare_output(output: Path) -> None:
    """Make the output directory, refusing one that holds a capture already: the hook numbers its
    files from 0 in every run, so a second run would overwrite the first, and the probes read
    every capture file in the directory as one capture."""
    if output.exists() and not output.is_dir():
        raise InputError(
            "--output names a file, not a directory", where=str(output), fix="pass a directory for the captures"
        )
    held = sorted(output.glob(CAPTURE_FILES)) if output.is_dir() else []
    if held:
        raise InputError(
            f"holds an earlier capture ({held[0].name}{f' and {len(held) - 1} more' if len(held) > 1 else ''})",
            where=str(output),
            fix="pass another --output for this capture, or remove that directory to capture again",
        )
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / ".rca-writable"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise InputError(
            f"the output directory cannot be written ({error.strerror})",
            where=str(output),
            fix="pass a directory you can write to",
        ) from None


def run_capture(command: list[str], output: Path, requests: int = 4, min_tokens: int = 8) -> CaptureRun:
    """Run `command` with the hook until it exits (a server: until it is stopped) and say what it
    captured, how it ended and what went wrong in the hook."""
    if not command:
        raise InputError(
            "no launch command to capture from",
            fix="put the engine's launch command after --, e.g. rca capture --output cap -- python -m "
            "sglang.launch_server ...",
        )
    prepare_output(output)
    errors = output / HOOK_ERRORS
    errors_before = errors.stat().st_size if errors.is_file() else 0
    interrupted = False
    with stopped_on_signals():  # a SIGTERM or SIGHUP of rca stops the command too
        launched = Launched(command, capture_environment(output.resolve(), requests, min_tokens))
        try:
            ended = launched.wait()
        except KeyboardInterrupt:  # a server is usually stopped so; it got the interrupt too: let it shut down
            interrupted = True
            try:
                ended = launched.wait(timeout=SHUTDOWN_SECONDS)
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                ended = launched.stop(grace=0)
        except SystemExit:
            launched.stop(grace=0)
            raise
    files = tuple(sorted(output.glob(CAPTURE_FILES)))
    return CaptureRun(ended, files, hook_failures(errors, errors_before), interrupted)


def hook_failures(log: Path, offset: int = 0) -> tuple[str, ...]:
    """The failures the hook recorded in `log` after `offset` bytes (their first lines, quoted:
    the hook writes what the engine raised)."""
    if not log.is_file():
        return ()
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read(1 << 20).decode("utf-8", "replace")
    return tuple(quoted(line) for line in text.splitlines() if line.startswith("pid "))
