"""A warm rca for the next command.

Engineers iterate: they change a draft config, a launch flag or a patch and ask again. Each `rca`
process starts Python and imports rca, libcst and every analyzer before it reads anything, about
0.4 s, half of a run on a release already seen. So once a command has answered, rca leaves a
server behind: a detached process holding those imports, one per rca version (by content) and
Python, listening on a socket that only its user can open, gone after `$RCA_SERVER_IDLE` seconds
(default 900) without a command.

The next `rca` command hands the server its command line, working directory, environment and its
standard input, output and error (the descriptors themselves). The server forks a copy of itself
that runs the command as the process would have, writing to the same terminal or pipe, and the
command exits with the copy's status; Ctrl-C reaches the copy. Nothing of one command stays in
the server: each runs in a copy of its own, and the server itself never analyzes anything. When
no server answers (none running, another rca version, `RCA_SERVER=off`), the command runs in its
own process, as always.

A command runs in a copy of the server only as its caller would run it. The copy would have the
server's credentials, capabilities, resource limits, cgroup and namespaces, not the caller's; so
the server reads both from the kernel (`/proc/PID/status`, `limits`, `cgroup`, `ns/` of the peer
`SO_PEERCRED` names, and its own) and, where anything differs or cannot be read, refuses: the
command runs in its own process, as itself. The caller's streams are sent only once the server has
answered that question, a peer that sends nothing is dropped after two seconds, a command waits
five seconds at most for a server to start it (then runs itself, saying so), and a copy whose
client dies before its answer (SIGKILL, the OOM killer) stops the engines it launched and is killed
with its process group. Measured on the development machine: `rca explain` takes 0.05 s through
the server and 0.24 s in its own process; the check costs 0.3 ms. That is why the server stays
the default: it saves a fifth of a second on every command, and with the check it grants a
command nothing its caller does not have. `RCA_SERVER=off` turns it off.

`rca server` shows and stops it.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the parser is imported where parses are held, never at a command's start
    from rca.static.parsing import Derived

DEFAULT_IDLE = 900.0
_HEADER = struct.Struct("!I")
_READ_SECONDS = 2.0  # the server waits no longer for a request: a peer that sends nothing stalls no one
_STARTED_SECONDS = 5.0  # a command waits no longer for the server to start it, then runs itself
_GONE_GRACE = 10.0  # a copy whose client died: seconds its engines get to stop, then it is killed
_MAX_REQUEST = 4 * 1024 * 1024  # a command line and an environment
_SUN_PATH_MAX = 100  # sockaddr_un holds 108 bytes on Linux, 104 on macOS


def enabled() -> bool:
    """Whether commands may be handed to a server (and leave one behind): Linux only (the copy is
    made with fork), and not with `RCA_SERVER=off`."""
    value = os.environ.get("RCA_SERVER", "").strip().lower()
    return sys.platform == "linux" and hasattr(socket, "send_fds") and value not in ("0", "off", "no", "false")


def idle_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get("RCA_SERVER_IDLE", DEFAULT_IDLE)))
    except ValueError:
        return DEFAULT_IDLE


def address() -> Path | None:
    """The socket of the server for this rca, this Python and this cache directory: under the
    cache directory, or where that path is too long for a socket, in a directory of this user's
    own under `$XDG_RUNTIME_DIR` or the temporary directory; None when neither fits."""
    import tempfile

    from rca.fingerprint import cache_dir, code_digest

    cache = cache_dir()
    identity = hashlib.sha256(f"{code_digest()}\0{sys.executable}\0{sys.version}\0{cache}".encode()).hexdigest()[:20]
    runtime = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    for directory in (cache / "server", runtime / f"rca-{os.getuid()}"):
        path = directory / f"{identity}.sock"
        if len(os.fsencode(path)) <= _SUN_PATH_MAX:
            return path
    return None


def _private(directory: Path) -> bool:
    """Whether `directory` is this user's alone (a directory, not a link, no access for others):
    a socket anyone else could have put there is never spoken to, nor listened on."""
    try:
        status = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and not status.st_mode & 0o077


# -- messages: a length, then JSON ---------------------------------------------------------------


def _send(connection: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    payload = json.dumps(message).encode()
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        sent = socket.send_fds(connection, [data], fds)
        data = data[sent:]
    connection.sendall(data)


def _receive(connection: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]] | None:
    """One message and the descriptors sent with it; None when the peer closed first."""
    fds: list[int] = []
    if max_fds:
        data, fds, _, _ = socket.recv_fds(connection, _HEADER.size + 65536, max_fds)
    else:
        data = connection.recv(_HEADER.size)
    if not data:
        return None
    buffer = bytearray(data)
    try:
        while len(buffer) < _HEADER.size:
            more = connection.recv(_HEADER.size - len(buffer))
            if not more:
                raise ConnectionError("the message was cut short")
            buffer += more
        (length,) = _HEADER.unpack_from(buffer)
        if length > _MAX_REQUEST:
            raise ConnectionError(f"a message of {length} bytes")
        while len(buffer) < _HEADER.size + length:
            more = connection.recv(_HEADER.size + length - len(buffer))
            if not more:
                raise ConnectionError("the message was cut short")
            buffer += more
        message = json.loads(bytes(buffer[_HEADER.size : _HEADER.size + length]))
        if not isinstance(message, dict):
            raise ConnectionError("a message that is not an object")
    except (ConnectionError, ValueError):
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def _connect(path: Path, timeout: float = 1.0) -> socket.socket | None:
    """A connection to the server at `path`, when one of this user's own listens there."""
    if not _private(path.parent):
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(timeout)
    try:
        client.connect(os.fsencode(path))
        if not _same_user(client):
            raise ConnectionRefusedError(path)
    except OSError:
        client.close()
        return None
    client.settimeout(None)
    return client


def _server() -> socket.socket | None:
    """A connection to this rca's server, when one is running."""
    path = address()
    return _connect(path) if path is not None else None


# -- the client: every rca command ------------------------------------------------------------------


def forward(argv: list[str]) -> int | None:
    """Run the command `argv` in the server, if one answers: its exit status, or None when no
    server took the command (the caller runs it itself)."""
    try:
        cwd = os.getcwd()
    except OSError:  # deleted under the caller: run here, where the command says so
        return None
    connection = _server()
    if connection is None:
        return None
    with connection:
        streams = {}
        for name in ("stdin", "stdout", "stderr"):
            stream = getattr(sys, name)
            streams[name] = {
                "encoding": getattr(stream, "encoding", None) or "utf-8",
                "errors": getattr(stream, "errors", None) or "strict",
            }
        request = {"run": argv, "cwd": cwd, "env": dict(os.environ), "streams": streams}
        connection.settimeout(_STARTED_SECONDS)
        try:
            # The streams go only to a server that answered first: a listener that never reads
            # would otherwise hold this command's output open.
            _send(connection, {"hello": os.getpid()})
            ready = _receive(connection)
            if ready is None or ready[0].get("ready") is not True:
                return None  # refused (this process's credentials or limits differ from the server's), or garbage
            _send(connection, request, [0, 1, 2])
            started = _receive(connection)
        except TimeoutError:
            sys.stderr.write(
                f"rca: the rca server did not answer within {_STARTED_SECONDS:.0f} s; running the command here\n"
            )
            return None
        except (OSError, ValueError):
            return None  # a server going away (idle, or another starting), or no server of ours: run here
        if started is None or not isinstance(started[0].get("pid"), int):
            return None
        pid = started[0]["pid"]
        connection.settimeout(None)  # the command takes as long as it takes
        answer = None  # the copy died without saying, unless it answers
        with _forwarded_signals(pid), contextlib.suppress(OSError, ValueError):
            answer = _receive(connection)
    if answer is None or not isinstance(answer[0].get("exit"), int):
        sys.stderr.write(
            "rca: error: the rca server's process for this command ended without an exit status "
            "(fix: rerun with RCA_SERVER=off to run it in this process)\n"
        )
        return 4  # not 1, which says a mismatch was diagnosed
    return answer[0]["exit"]


@contextlib.contextmanager
def _forwarded_signals(pid: int) -> Iterator[None]:
    """Ctrl-C, a hangup or a termination of this process reach the command's process."""

    def relay(number: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, number)

    previous = {number: signal.signal(number, relay) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def start_detached() -> None:
    """Leave a server behind for the next command, unless one is running (or starting), holding
    the parses this command used."""
    path = address()
    if path is None or _connect(path, timeout=0.2) is not None:
        return
    import subprocess

    with contextlib.suppress(OSError):
        server = subprocess.Popen(
            [sys.executable, "-m", "rca.cli.warm", os.fsdecode(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in the terminal's process group: Ctrl-C is for the command
            close_fds=True,
        )
        assert server.stdin is not None
        with server.stdin:
            server.stdin.write(json.dumps(_parses_to_hold() or {}).encode())  # a few KiB: the pipe takes them


def request(message: dict[str, Any]) -> dict[str, Any] | None:
    """Ask the running server (`status`, `stop`); None when none answers."""
    connection = _server()
    if connection is None:
        return None
    with connection:
        connection.settimeout(_STARTED_SECONDS)
        try:
            _send(connection, message)
            answer = _receive(connection)
        except (OSError, ValueError):
            return None
    return answer[0] if answer is not None else None


# -- the server ---------------------------------------------------------------------------------------


def serve(path: Path, run: Callable[[list[str]], int], hold: dict[str, Any] | None = None) -> None:
    """Listen at `path` until idle, running each command in a forked copy with `run`; `hold` names
    the parses of the command that started it, to hold for the next."""
    import fcntl

    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.parent.stat().st_uid == os.getuid():
            os.chmod(path.parent, 0o700)
    if not _private(path.parent):
        return
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another server has this address
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # left by a server that did not end cleanly (we hold the lock)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.fsencode(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    identity = os.stat(path).st_ino
    gc.freeze()  # what the imports built is shared with every copy, never collected again
    started = last = time.monotonic()
    served = 0
    idle = idle_seconds()
    pending: dict[tuple[str, str], tuple[Derived, float]] = {}  # parses to hold: wanted state, deadline
    _to_hold(hold or {}, pending)
    try:
        while True:
            _reap()
            if time.monotonic() - last > idle or not _still_at(path, identity):
                return
            ready, _, _ = select.select([listener], [], [], 0.1 if pending else 1.0)
            if not ready:
                _held(pending)
                continue
            connection, _ = listener.accept()
            with connection:
                connection.settimeout(_READ_SECONDS)
                if not _same_user(connection):
                    continue
                try:
                    received = _receive(connection, max_fds=3)
                except (OSError, ValueError):
                    continue
                if received is None:
                    continue
                message, fds = received
                checked = False  # a command runs here only after its caller's context was found the server's
                if "hello" in message:  # a command: it sends its streams once told to
                    differs = _context_differs(connection)
                    try:
                        _send(connection, {"refused": differs} if differs else {"ready": True})
                        received = None if differs else _receive(connection, max_fds=3)
                    except (OSError, ValueError):
                        continue
                    if received is None:
                        continue  # refused: the command runs in its own process, as itself
                    message, fds = received
                    checked = True
                if "run" in message and len(fds) == 3 and checked:
                    last = time.monotonic()  # idle counts from the last command (asking the state is none)
                    child = os.fork()
                    if child == 0:
                        listener.close()
                        _run_copy(connection, message, fds, run)  # never returns
                    served += 1
                    with contextlib.suppress(OSError):
                        _send(connection, {"pid": child})
                elif "status" in message:
                    _send(
                        connection,
                        {
                            "pid": os.getpid(),
                            "address": os.fsdecode(path),
                            "up_seconds": round(time.monotonic() - started, 1),
                            "commands": served,
                            "parses_held": _parses_held(),
                            "parses_pending": len(pending),
                            "idle_limit_seconds": idle,
                        },
                    )
                elif "hold" in message:
                    _to_hold(message, pending)
                elif "stop" in message:
                    _send(connection, {"stopped": os.getpid()})
                    return
                for fd in fds:
                    os.close(fd)
    finally:
        listener.close()
        if _still_at(path, identity):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.close(lock)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _still_at(path: Path, identity: int) -> bool:
    """Whether the socket file is still this server's (not removed, nor replaced by another)."""
    try:
        return os.stat(path).st_ino == identity
    except OSError:
        return False


def _peer(connection: socket.socket) -> tuple[int, int, int]:
    """The connected process's pid, uid and gid, as the kernel saw them when it connected."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", credentials)
    return pid, uid, gid


def _same_user(connection: socket.socket) -> bool:
    return _peer(connection)[1] == os.getuid()


# What a process may do, from the kernel's own account of it: identities and groups, capabilities,
# the no-new-privileges and seccomp state, umask (/proc/PID/status); every resource limit; its
# cgroup; its namespaces. A command runs in the server's copy only where all are the caller's.
_STATUS_FIELDS = (
    "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Umask",
)  # fmt: skip
_NAMESPACES = ("mnt", "pid", "net", "user", "ipc", "uts", "cgroup")


def _context(pid: int | str) -> dict[str, str]:
    """The execution context of a process (`self`, or a pid): what the kernel says it may do."""
    proc = Path("/proc") / str(pid)
    fields = {}
    for line in (proc / "status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in _STATUS_FIELDS:
            fields[name] = " ".join(value.split())
    fields["limits"] = (proc / "limits").read_text()
    fields["cgroup"] = (proc / "cgroup").read_text()
    for namespace in _NAMESPACES:
        with contextlib.suppress(FileNotFoundError):  # a kernel without that namespace
            fields[f"ns:{namespace}"] = os.readlink(proc / "ns" / namespace)
    return fields


def _context_differs(connection: socket.socket) -> str:
    """What differs between the caller and the server (empty when nothing does): a command that ran
    in a copy of the server would run with the server's credentials, limits, cgroup and namespaces,
    not the caller's. A context that cannot be read differs."""
    try:
        peer, own = _context(_peer(connection)[0]), _context("self")
    except OSError as error:
        return f"the caller's process could not be read ({error.strerror})"
    differing = [name for name in sorted(set(peer) | set(own)) if peer.get(name) != own.get(name)]
    return ", ".join(differing)


def _run_copy(
    connection: socket.socket, message: dict[str, Any], fds: list[int], run: Callable[[list[str]], int]
) -> None:
    """In the forked copy: become the client's process (its streams, directory, environment and
    command line), run the command, send its exit status and leave."""
    code = 1
    try:
        os.setpgid(0, 0)  # a group of its own: the client's signals go to it and its helpers alone
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        streams = message.get("streams") or {}
        for number, name in enumerate(("stdin", "stdout", "stderr")):
            given = streams.get(name) or {}
            stream = _text_stream(number, str(given.get("encoding") or "utf-8"), str(given.get("errors") or "strict"))
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        os.chdir(str(message["cwd"]))
        os.environ.clear()
        os.environ.update({str(key): str(value) for key, value in dict(message["env"]).items()})
        argv = [str(item) for item in message["run"]]
        sys.argv = ["rca", *argv]
        from rca import signed
        from rca.static import filecache

        filecache.after_answer = True  # written by this copy once it has answered (see _after_answer)
        signed.forget()  # since the server read them, a cache may have been cleared or moved
        _die_with_client(connection)
        code = run(argv)
    except BaseException:  # the command's own errors are handled by `run`; this is the copy's setup
        with contextlib.suppress(Exception):
            import traceback

            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        _ANSWERED.append(True)
        with contextlib.suppress(Exception):
            _send(connection, {"exit": code})
        with contextlib.suppress(Exception):
            _after_answer()
        with contextlib.suppress(Exception):
            _report_parses()
        os._exit(code)


_ANSWERED: list[bool] = []  # in a copy: set once it sends its exit status (its client may then go)


def _die_with_client(connection: socket.socket) -> None:
    """The client never sends after its request: when its end of the connection closes before the
    command answered (the client was killed, by SIGKILL or the OOM killer), the engines the copy
    started are stopped, then the copy is killed with its process group."""
    import threading

    def watch() -> None:
        with contextlib.suppress(OSError, ValueError):
            select.select([connection], [], [])
            if _ANSWERED or connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return  # the command answered, or the client speaks (not an end)
            engines = sys.modules.get("rca.evidence.engine.process")  # loaded only where it launched some
            if engines is not None:
                engines.stop_all(grace=_GONE_GRACE)
            os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def _after_answer() -> None:
    """Let go of the client's streams (whatever reads them sees their end now), then write what
    the command left for after its answer: a copy outlives its answer, so it writes the analysis
    cache itself rather than start a process to (two forks of a large process, before answering)."""
    null = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(null, stream)
    from rca.static import filecache

    filecache.flush_owed()


def _parses_to_hold() -> dict[str, Any] | None:
    """The parses this command used (each with what the analysis cache holds of it) and the cache
    they are in: for the server to hold in memory for the next command, as reading them from the
    cache is a fifth of a run on a release seen before. None when it parsed nothing."""
    if "rca.static.parsing" not in sys.modules:
        return None
    from rca.static import filecache, parsing

    root = filecache.directory()
    kept = parsing.kept()
    return {"hold": kept, "root": os.fsdecode(root)} if root is not None and filecache.enabled() and kept else None


def _report_parses() -> None:
    """Tell the server which parses the command used (after its answer)."""
    message = _parses_to_hold()
    connection = _server() if message is not None else None
    if connection is not None and message is not None:
        with connection:
            _send(connection, message)


def _to_hold(message: dict[str, Any], pending: dict[tuple[str, str], tuple[Derived, float]]) -> None:
    """Add the parses a `hold` message names to those pending."""
    parses = message.get("hold")
    if not isinstance(parses, dict):
        return
    deadline = time.monotonic() + 30  # a command's entries are written after its answer
    for key, wanted in parses.items():
        if isinstance(wanted, list) and wanted and all(isinstance(number, int) for number in wanted):
            pending[(str(message.get("root")), str(key))] = (tuple(wanted), deadline)


def _parses_held() -> int:
    from rca.static import parsing

    return parsing.held()


def _held(pending: dict[tuple[str, str], tuple[Derived, float]], budget: float = 0.05) -> None:
    """Load pending parses into memory for about `budget` seconds (the next command waits no
    longer); those the analysis cache does not have yet are tried again until their deadline."""
    from rca.static import parsing

    start = time.monotonic()
    loaded = False
    for (root, key), (wanted, deadline) in list(pending.items()):
        if time.monotonic() - start > budget:
            break
        held = parsing.hold(key, wanted, Path(root))
        loaded = loaded or bool(held)
        if held or time.monotonic() > deadline:
            del pending[(root, key)]
    if loaded:  # like the imports: never walked by a copy's collector (its pages stay shared)
        gc.freeze()


def _text_stream(fd: int, encoding: str, errors: str) -> io.TextIOWrapper:
    """A standard stream over `fd`, as Python makes one: line-buffered on a terminal, stderr always."""
    try:
        terminal = os.isatty(fd)
    except OSError:
        terminal = False
    if fd == 0:
        return io.TextIOWrapper(io.BufferedReader(io.FileIO(fd, "r", closefd=False)), encoding, errors)
    return io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(fd, "w", closefd=False)),
        encoding,
        "backslashreplace" if fd == 2 else errors,
        line_buffering=terminal or fd == 2,
    )
