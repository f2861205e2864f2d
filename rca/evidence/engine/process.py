"""A launched engine: its output passed through as it comes and its last lines kept, so that when it
fails rca can say how, and a way to stop it and everything it started."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from rca.errors import InputError, printable

KEPT_LINES = 200  # of the engine's output, for the error lines shown when it fails
LINE_BYTES = 8192  # read of an engine's line at a time: of a longer one, only its head is kept
QUOTED_CHARS = 300  # of an engine's line, in an error line of rca's
SHOWN_LINES = 8
_LAUNCH_FIX = "pass the launch command as you would run it, after --"
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b.*")
# An exception that only points at another (vLLM's "Engine core initialization failed. See root cause
# above."): the one it points at says why.
_POINTS_ABOVE = re.compile(r"\b(?:see|check)\b[^.]*\babove\b|\broot cause above\b", re.IGNORECASE)
# What vLLM writes before a line of a process of its own (a worker's, the engine core's): the
# process and, for a logged line, its level, time and source.
_PROCESS_PREFIX = re.compile(
    r"^(?:\([\w.-]+ pid=\d+\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+[\d-]+\s+[\d:.]+\s+\[[^\]]*\]\s*)?"
)


@dataclass(frozen=True)
class Ended:
    """How a launched command ended: its exit status (128 + N for signal N, as a shell reports it)
    and its last lines of output."""

    status: int
    last_lines: tuple[str, ...]

    def error_lines(self) -> tuple[str, ...]:
        """The lines that say why it failed, quoted: from the last traceback or error on, else the last few."""
        lines = [quoted(line) for line in self.last_lines if line.strip()]
        for index in range(len(lines) - 1, -1, -1):
            if lines[index].startswith("Traceback (most recent call last)"):
                tail = lines[index:]
                return tuple(tail[:2] + tail[-(SHOWN_LINES - 2) :]) if len(tail) > SHOWN_LINES else tuple(tail)
        return tuple(lines[-SHOWN_LINES:])

    def last_error(self) -> str:
        """The one line that says most about why it failed, quoted: the last exception's (passing
        over those that only point at an earlier one, whose cause it is), else its last line."""
        lines = [_PROCESS_PREFIX.sub("", line.strip()) for line in self.last_lines if line.strip()]
        errors = [line for line in lines if _EXCEPTION.match(line)]
        causes = [line for line in errors if not _POINTS_ABOVE.search(line)]
        return quoted((causes or errors)[-1] if errors else (lines[-1] if lines else ""))

    def describe(self) -> str:
        if self.status > 128 and self.status - 128 in signal.valid_signals():
            return f"was killed by {signal.Signals(self.status - 128).name} (exit status {self.status})"
        return f"exited with status {self.status}"


def quoted(line: str) -> str:
    """A line an engine wrote, as rca quotes it in a line of its own: its control characters
    (colour codes, terminal escapes) escaped, at most QUOTED_CHARS characters."""
    line = printable(line)
    return line if len(line) <= QUOTED_CHARS else line[: QUOTED_CHARS - 3] + "..."


_LIVE: set[Launched] = set()  # the commands started and not yet stopped, for stop_all


def stop_all(grace: float = 5.0) -> None:
    """Stop every command this process started and has not stopped (rca is ending)."""
    for launched in list(_LIVE):
        with contextlib.suppress(Exception):
            launched.stop(grace)


@contextlib.contextmanager
def stopped_on_signals() -> Iterator[None]:
    """While inside: SIGTERM and SIGHUP end rca as SIGINT does (an exception, so that the code that
    stops its engines runs), with the shell's status 128 + N. Outside the main thread, nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ended(number: int, _frame: object) -> None:
        raise SystemExit(128 + number)

    previous = {number: signal.signal(number, ended) for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _set_subreaper() -> None:
    """Make this process the one orphans of its descendants are handed to (Linux): an engine's
    worker that left its session (`setsid`) and lost its parent is still rca's to stop."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _die_with_parent() -> Callable[[], None] | None:
    """What the launched command runs before its program (between fork and exec, where nothing may
    be imported): ask to be killed when rca dies (Linux's parent-death signal). None elsewhere."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _descendants(root: int) -> list[int]:
    """Every living process below `root` (children, theirs, ...), read from /proc, deepest first."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier and pid not in found]
        found += children
        frontier = children
    return found[::-1]


class Launched:
    """A command started with `environment`, its stdout and stderr copied to rca's own (unless
    `echo` is off) and its last lines kept. With `own_group`, it runs in a session of its own, is
    killed if rca dies (a parent-death signal), and `stop` reaches every process it started (its
    session's, and any that left it: rca is their subreaper)."""

    def __init__(
        self, command: Sequence[str], environment: Mapping[str, str], echo: bool = True, own_group: bool = False
    ) -> None:
        if not command:
            raise InputError("no launch command given", fix=_LAUNCH_FIX)
        self.command = list(command)
        self.lines: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._lock = threading.Lock()
        self.own_group = own_group
        if own_group:
            _set_subreaper()
        try:
            self.process = subprocess.Popen(
                self.command,
                env=dict(environment),
                stdin=subprocess.DEVNULL if own_group else None,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=own_group,
                preexec_fn=_die_with_parent() if own_group else None,
            )
        except FileNotFoundError:
            raise InputError(f"command not found: {command[0]}", fix=_LAUNCH_FIX) from None
        except OSError as error:  # not executable, a directory, ...
            raise InputError(f"cannot run {command[0]} ({error.strerror})", fix=_LAUNCH_FIX) from None
        self._readers = [
            threading.Thread(target=self._copy, args=(stream, sink if echo else None), daemon=True)
            for stream, sink in ((self.process.stdout, sys.stdout), (self.process.stderr, sys.stderr))
        ]
        for reader in self._readers:
            reader.start()
        _LIVE.add(self)

    def _copy(self, stream, sink) -> None:
        """Pass the output on as it comes and keep its last lines, reading LINE_BYTES at most at a
        time: a line of hundreds of megabytes is passed on in pieces, and only its head is kept."""
        inside_line = False  # the last piece read ended before its line did
        for raw in iter(lambda: stream.readline(LINE_BYTES), b""):
            if not inside_line:
                with self._lock:
                    self.lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
            inside_line = not raw.endswith(b"\n")
            if sink is not None:
                try:
                    sink.buffer.write(raw) if hasattr(sink, "buffer") else sink.write(raw.decode("utf-8", "replace"))
                    sink.flush()
                except (OSError, ValueError):
                    pass
        stream.close()

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float | None = None) -> Ended:
        status = self.process.wait(timeout)
        for reader in self._readers:
            reader.join(timeout=5)
        if status < 0:  # killed by a signal: the shell's convention, 128 + the signal's number
            status = 128 - status
        with self._lock:
            return Ended(status, tuple(self.lines))

    def stop(self, grace: float = 30.0) -> Ended:
        """Ask the command to stop (SIGINT, as Ctrl-C does), then terminate and kill what is left:
        with `own_group`, every process below it too, in its session or not."""
        _LIVE.discard(self)
        below = _descendants(self.process.pid) if self.own_group else []
        for sent, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if not self.running():
                break
            self._signal(sent)
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        if self.own_group:  # workers the engine left behind, in its session or out of it
            self._signal(signal.SIGKILL)
            others = {launched.process.pid for launched in _LIVE if launched.own_group}
            killed = []
            for pid in {*below, *_descendants(os.getpid())} - {os.getpid()}:
                if pid in below or (_orphaned_here(pid) and _session(pid) not in others):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
            for pid in killed:  # those handed to rca are its children now: collected, no zombie left
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        return self.wait()

    def _signal(self, sent: signal.Signals) -> None:
        try:
            if self.own_group:
                os.killpg(self.process.pid, sent)
            else:
                self.process.send_signal(sent)
        except (ProcessLookupError, PermissionError):
            pass


def _orphaned_here(pid: int) -> bool:
    """A process handed to rca as subreaper (a descendant whose parent died): not one rca started
    itself, which would be in its own process group's session or a thread of rca's work."""
    with contextlib.suppress(OSError):
        return os.getsid(pid) != os.getsid(0) and os.getpgid(pid) != os.getpgid(0)
    return False


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
