"""The analysis cache: what rca derives from one source file, kept on disk between runs.

A release is read again and again while a user iterates on a draft config, a launch flag or a
patch; what the code index derives from a file's text alone (its parse, the line ranges of the
defs a report cites, which files hold an analyzer's anchor) does not change with them. Each entry
is keyed by a digest of what produced it: the derivation's name, the file's content (or, for a
listing, the tree's identity), the Python that parsed it, libcst's version and rca's own code and
catalog, by content, so that a changed rca never reads an entry an older one wrote. A run with a
new draft config or patch on a release already seen re-derives only what depends on them.

Where: `$RCA_ANALYSIS_CACHE` when set (`off` turns the cache off), else `analysis/` under the
rca cache directory (`$RCA_CACHE_DIR`, ...). Entries are written whole (a temporary file renamed
into place), so concurrent runs read an entry complete or not at all; the cache is kept under
`$RCA_ANALYSIS_CACHE_MB` (default 512 MiB) by deleting the entries least recently used, one
process at a time (the file lock the release cache uses). `rca cache` shows and clears it.

An entry is trusted only when it proves it was written by rca for this key (an HMAC-SHA256 of its
key and payload under a secret made once per cache directory, readable by its owner only), and the
directory only when it is the user's own and rca's (`rca.signed`): an entry that is truncated,
corrupt, written for another key or by anyone without the secret is derived again, never read.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import importlib.util
import io
import json
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rca import signed
from rca.fingerprint import code_digest
from rca.signed import SignedStore

SCHEMA = "rca.analysis/1"
_MAGIC = b"RCAA1\n"
_DEFAULT_MB = 512
_MAX_ENTRY_BYTES = 256 << 20  # a parse of the largest source file is a few MiB

_enabled = True
# Set by the command line: entries are written by a process of their own, after the answer, so
# that filling the cache costs a first run nothing (a library caller writes them in `flush`).
background = False
# Set in a server's copy of itself, which outlives its answer: the first `flush` leaves the
# entries to `flush_owed`, called once the command has answered (no process of their own to start
# first); a command of many diagnoses (`rca history`) writes from its second `flush` on, as before.
after_answer = False
_owed = False


def directory() -> Path | None:
    """Where entries are kept; None when the cache is turned off."""
    explicit = os.environ.get("RCA_ANALYSIS_CACHE")
    if explicit:
        if explicit.lower() in ("0", "off", "no", "false", "none"):
            return None
        return Path(explicit).expanduser()
    from rca.inputs.files import cache_dir

    return cache_dir() / "analysis"


def enabled() -> bool:
    return _enabled and directory() is not None


@contextlib.contextmanager
def turned_off(off: bool = True) -> Iterator[None]:
    """Neither read nor write the cache inside the block (`--no-cache`)."""
    global _enabled
    before = _enabled
    _enabled = before and not off
    try:
        yield
    finally:
        _enabled = before


def limit_bytes() -> int:
    try:
        return max(1, int(os.environ.get("RCA_ANALYSIS_CACHE_MB", _DEFAULT_MB))) * 1024 * 1024
    except ValueError:
        return _DEFAULT_MB * 1024 * 1024


# -- keys --------------------------------------------------------------------------------------


def _producer() -> str:
    return f"{SCHEMA}\0{sys.version_info[:3]}\0libcst {_libcst_version()}\0{code_digest()}"


@functools.cache
def _libcst_version() -> str:
    """libcst by its version file's content, read, not imported: a process that only searches
    text has no use for the parser."""
    spec = importlib.util.find_spec("libcst")
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    try:
        return hashlib.sha256((Path(locations[0]) / "_version.py").read_bytes()).hexdigest()[:16]
    except (IndexError, OSError):  # pragma: no cover - a libcst laid out otherwise
        return "?"


def key(kind: str, *parts: str | bytes) -> str:
    """The digest naming the entry of derivation `kind` from `parts` (a file's content digest,
    a tree's identity), by this rca."""
    digest = hashlib.sha256(f"{_producer()}\0{kind}".encode())
    for part in parts:
        digest.update(b"\0" + (part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass")))
    return digest.hexdigest()


# -- entries -----------------------------------------------------------------------------------


def _store(root: Path) -> SignedStore:
    return signed.opened(root, "the analysis cache", "RCA_ANALYSIS_CACHE", _MAGIC, _MAX_ENTRY_BYTES)


def _read(name: str, root: Path | None = None) -> bytes | None:
    """The payload of entry `name` (in the cache in use, or the one at `root`), or None when it is
    missing or does not prove it was written by rca for this name."""
    root = root if root is not None else directory()
    if not _enabled or root is None:
        return None
    return _store(root).read(name)


def _write(name: str, payload: bytes, into: Path | None = None) -> bool:
    """Write an entry whole (best effort: a read-only or full disk only costs the speed-up), into
    the cache directory in use, or only into `into` when that is still the one in use."""
    if not enabled():
        return False
    root = directory()
    if root is None or (into is not None and into != root):
        return False
    return _store(root).write(name, payload)


def load_json(name: str) -> Any:
    """A plain-data entry (None when absent or untrusted)."""
    payload = _read(name)
    if payload is None:
        return None
    try:
        return json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def store_json(name: str, value: Any, into: Path | None = None) -> bool:
    return _write(name, json.dumps(value, separators=(",", ":")).encode("utf-8"), into)


def derived(kind: str, content_digest: str, compute: Callable[[], Any]) -> Any:
    """What `compute` derives from one file's content alone, as plain JSON data (lists, dicts,
    strings, numbers): read from the cache when this rca derived it before, else computed and
    kept. Any analyzer may use it for a per-file derivation that does not depend on the configs."""
    name = key(kind, content_digest)
    cached = load_json(name)
    if isinstance(cached, dict) and "value" in cached:
        return cached["value"]
    value = compute()
    store_json(name, {"value": value})
    return value


_FLUSHERS: list[Callable[[bool], int]] = []


def flusher(write: Callable[[bool], int]) -> Callable[[bool], int]:
    """Register `write(really)`, which keeps what this process derived that the cache lacks (the
    number of entries written), or with `really` false only marks it kept (a detached writer
    has it): derivations accumulate during a run and are written once, by `flush`."""
    _FLUSHERS.append(write)
    return write


def flush() -> int:
    """Write what this run derived (after a diagnosis), then keep the cache under its limit; with
    `background`, in a detached process while this one goes on (the number written here)."""
    global _owed
    if not enabled():
        return 0
    if after_answer and not _owed:
        _owed = True
        return 0
    if background and _detached():
        for write in list(_FLUSHERS):  # the writer has them: not written again by this process
            write(False)
        return 0
    written = sum(write(True) for write in list(_FLUSHERS))
    if written:
        evict()
    return written


def flush_owed() -> int:
    """Write what `flush` left for after the answer (the number written)."""
    global after_answer, background, _owed
    after_answer = background = False
    if not _owed:
        return 0
    _owed = False
    return flush()


def _detached() -> bool:
    """In the caller: True once a detached writer process has the work (False when none could be
    started: the caller writes). The writer itself writes and exits; it holds none of the
    caller's files or pipes, so nothing waits for it (a pipe reading rca's output, a parent
    process's result channel)."""
    if not hasattr(os, "fork"):
        return False
    try:
        first = os.fork()
    except OSError:
        return False
    if first:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(first, 0)  # the intermediate process exits at once: no zombie is left
        return True
    try:  # the intermediate process: start the writer, orphaned, and leave
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for stream in (0, 1, 2):
            os.dup2(null, stream)
        os.closerange(3, 65536)
        global background
        background = False
        flush()
    finally:
        os._exit(0)


# -- parsed syntax trees -----------------------------------------------------------------------


class _TreeUnpickler(pickle.Unpickler):
    """Rebuilds only syntax trees: libcst's nodes, the standard parser's nodes and the record
    classes the caller names. Any other global a payload names is refused, so even a payload that
    passed the HMAC check cannot make the unpickler call anything else."""

    def __init__(self, data: io.BytesIO, records: tuple[type, ...]) -> None:
        super().__init__(data)
        self.records = {(record.__module__, record.__qualname__): record for record in records}

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in ("Ellipsis", "complex", "frozenset", "set"):
            return getattr(__import__("builtins"), name)
        if module == "ast" or module.startswith("libcst."):
            found = getattr(sys.modules.get(module), name, None)
            if isinstance(found, type) and _tree_class(found):
                return found
        if (module, name) in self.records:
            return self.records[module, name]
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a syntax tree")


def _tree_class(cls: type) -> bool:
    import ast

    import libcst as cst
    from libcst._maybe_sentinel import MaybeSentinel

    return issubclass(cls, (ast.AST, cst.CSTNode)) or (issubclass(cls, enum.Enum) and cls is MaybeSentinel)


def load_tree(name: str, records: tuple[type, ...] = (), root: Path | None = None) -> Any:
    """A syntax tree entry written by `store_tree` (None when absent or untrusted), which may hold
    instances of the dataclasses `records` besides syntax trees; from the cache in use, or the one
    at `root`.

    Syntax trees are the one thing kept with pickle: libcst's nodes have no plain-data form, and
    rebuilding them from pickle takes a fraction of parsing the text again. It is safe here
    because only an entry this cache wrote is unpickled (its HMAC under the cache's secret is
    checked first), and the unpickler rebuilds syntax-tree classes only (`_TreeUnpickler`)."""
    payload = _read(name, root)
    if payload is None:
        return None
    try:
        return _TreeUnpickler(io.BytesIO(payload), records).load()
    except Exception:  # a payload this rca cannot rebuild: derive it again
        return None


def store_tree(name: str, value: Any) -> bool:
    try:
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, RecursionError, AttributeError):
        return False
    return _write(name, payload)


# -- size, listing, clearing -------------------------------------------------------------------


def evict() -> None:
    """Keep the cache under its limit (the least recently used entries go first)."""
    root = directory()
    if enabled() and root is not None:
        _store(root).evict(limit_bytes())


def summary() -> dict[str, Any]:
    """Where the cache is, how many entries it holds and their size."""
    root = directory()
    entries = _store(root).listing() if root is not None else []
    return {
        "location": str(root) if root is not None else None,
        "entries": len(entries),
        "bytes": sum(size for _, size, _ in entries),
        "limit_bytes": limit_bytes(),
    }


def clear() -> int:
    """Delete every entry rca wrote (and the secret: the next run makes another); the count deleted."""
    root = directory()
    return _store(root).clear() if root is not None else 0
