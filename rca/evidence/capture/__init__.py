"""`rca capture`: run a serving engine's launch command with the capture hook enabled.

The hook (`site/sitecustomize.py`) is loaded by every Python process the command starts, through
PYTHONPATH, and writes what the draft receives to the output directory as safetensors that the
probes read like any dump (`rca probe fingerprint --dumps OUT`, `rca probe compare --capture OUT`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rca.errors import InputError

SITE = Path(__file__).parent / "site"
SHUTDOWN_SECONDS = 30  # how long an interrupted server may take to exit before it is terminated


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


def run_capture(command: list[str], output: Path, requests: int = 4, min_tokens: int = 8) -> tuple[int, list[Path]]:
    """Run `command` with the hook; return its exit status (128 + N when signal N killed it, as a
    shell reports it) and the capture files written."""
    if not command:
        raise InputError(
            "no launch command to capture from",
            fix="put the engine's launch command after --, e.g. rca capture --output cap -- python -m "
            "sglang.launch_server ...",
        )
    if output.exists() and not output.is_dir():
        raise InputError(
            "--output names a file, not a directory", where=str(output), fix="pass a directory for the captures"
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
    before = set(output.glob("capture_*.safetensors"))
    try:
        process = subprocess.Popen(command, env=capture_environment(output.resolve(), requests, min_tokens))
    except FileNotFoundError:
        raise InputError(
            f"command not found: {command[0]}", fix="pass the launch command as you would run it, after --"
        ) from None
    except OSError as error:  # not executable, a directory, ...
        raise InputError(
            f"cannot run {command[0]} ({error.strerror})", fix="pass the launch command as you would run it, after --"
        ) from None
    try:
        status = process.wait()
    except KeyboardInterrupt:  # a server is usually stopped this way; it got the interrupt too, so let it shut down
        try:
            status = process.wait(timeout=SHUTDOWN_SECONDS)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            process.terminate()
            status = process.wait()
    if status < 0:  # killed by a signal: the shell's convention, 128 + the signal's number
        status = 128 - status
    return status, sorted(set(output.glob("capture_*.safetensors")) - before)
