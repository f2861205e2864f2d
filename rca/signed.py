"""A directory of entries rca keeps between runs and must be able to trust: the analysis cache and
the remembered diagnoses.

A cache is input like any other: its directory may be shared, set by a variable to a directory of
the user's own, or hold what someone else put there. So a store

- is used only in a directory owned by this user that no one else can write (its own, made with
  mode 0700, are tightened to that when an older rca or a loose umask left them open), marked as
  rca's by a CACHEDIR.TAG (https://bford.info/cachedir/); a directory holding files rca did not
  make is refused, with one line saying why, and the cache is off;
- reads an entry only when it is a regular file of this user, not a link, under a size bound,
  opened without waiting (a FIFO never hangs a run), and believes it only when it carries an
  HMAC-SHA256 of its name and payload under the store's secret (a file only its owner can read);
- deletes only what it can prove it wrote: files with its entry names and its signature header,
  never through a link.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

TAG_NAME = "CACHEDIR.TAG"
TAG = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This directory is a cache made by rca; see https://bford.info/cachedir/\n"
)
_SECRET = "secret"
_ENTRIES = "entries"
_LOCK = ".evict.lock"
_MAC_BYTES = 32
_NAME = re.compile(r"[0-9a-f]{64}")
_TEMPORARY = ".tmp-"
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def read_bounded(path: Path | str, limit: int, dir_fd: int | None = None) -> bytes | None:
    """The bytes of `path` when it is a regular file of this user, not a link, of at most `limit`
    bytes; None otherwise (missing, a FIFO, a device, someone else's, too large)."""
    try:
        handle = os.open(path, _READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or status.st_size > limit:
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(handle, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(handle)


@dataclass
class SignedStore:
    """Entries named by 64-hex digests under `root`/entries, each `magic` + HMAC + payload."""

    root: Path
    what: str  # "the analysis cache": how a refusal names it
    setting: str  # the variable that moves it: how a refusal's fix names it
    magic: bytes
    max_entry_bytes: int
    legacy: Callable[[str], bool] = lambda name: False  # other names an older rca left in a store it made
    _secret: bytes | None = field(default=None, init=False, repr=False)
    _refused: str | None = field(default=None, init=False, repr=False)

    # -- the directory -------------------------------------------------------------------------

    def secret(self, create: bool) -> bytes | None:
        """The store's secret, when its directory may be used (made, with the secret, if `create`)."""
        if self._secret is not None or self._refused is not None:
            return self._secret
        try:
            problem = self._check(create)
        except OSError as error:
            problem = f"it cannot be used ({error.strerror or error})"
        if problem is not None:
            if problem:
                self._refuse(problem)
            return None
        self._secret = self._key(create)
        return self._secret

    def _check(self, create: bool) -> str | None:
        """Why the directory may not be used ('' when it is simply absent and not to be made);
        None when it may."""
        root = Path(os.path.realpath(self.root))
        if not root.exists():
            if not create:
                return ""
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = _owned(root)
        if problem is not None:
            return problem
        tag = read_bounded(root / TAG_NAME, 4096)
        if tag is None or not tag.startswith(TAG[:43]):
            strangers = [name for name in os.listdir(root) if not self._ours(root, name)]
            if strangers:
                return f"it holds files rca did not make ({', '.join(sorted(strangers)[:3])})"
            if not create:
                return ""
            _write_whole(root / TAG_NAME, TAG)  # empty, or laid out by an older rca: rca's from now on
        entries = root / _ENTRIES
        if not entries.exists():
            if not create:
                return ""
            entries.mkdir(mode=0o700, exist_ok=True)
        return _tightened(root) or _owned(entries, "its entries directory") or _tightened(entries)

    def _ours(self, root: Path, name: str) -> bool:
        """A file rca leaves in a store it made (the newest rca's or an older one's); a `secret`
        only when it is one (a file of the user's by that name is never taken, nor replaced)."""
        if name == _SECRET:
            secret = read_bounded(root / name, _MAC_BYTES)
            return secret is not None and len(secret) == _MAC_BYTES
        return name.startswith((_TEMPORARY, ".secret-")) or name in (_ENTRIES, _LOCK) or self.legacy(name)

    def _refuse(self, problem: str) -> None:
        self._refused = problem
        sys.stderr.write(
            f"rca: {self.what} at {self.root} is not used: {problem} "
            f"(fix: point {self.setting} at a new directory, or one rca made)\n"
        )

    def _key(self, create: bool) -> bytes | None:
        path = self.root / _SECRET
        data = read_bounded(path, _MAC_BYTES)
        if data is not None and len(data) == _MAC_BYTES:
            return data
        if not create:
            return None
        data = os.urandom(_MAC_BYTES)
        try:
            handle, temporary = tempfile.mkstemp(dir=self.root, prefix=".secret-")  # mode 0600
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            try:
                os.link(temporary, path)  # the first writer's secret wins; the others read it
            except FileExistsError:
                existing = read_bounded(path, _MAC_BYTES)
                if existing is not None and len(existing) == _MAC_BYTES:
                    data = existing
                else:  # a damaged secret in rca's own directory: replaced (its entries derived again)
                    os.replace(temporary, path)
            except OSError:  # no hard links here: the last writer's wins (earlier entries are then rebuilt)
                os.replace(temporary, path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
        except OSError:
            return None
        return data

    # -- entries -------------------------------------------------------------------------------

    def _mac(self, secret: bytes, name: str, payload: bytes) -> bytes:
        return hmac.new(secret, name.encode() + b"\0" + payload, hashlib.sha256).digest()

    def read(self, name: str) -> bytes | None:
        """The payload of entry `name`, or None when it is missing or does not prove rca wrote it
        for this name (truncated, corrupt, written without the secret, not a plain file)."""
        secret = self.secret(create=False)
        if secret is None or not _NAME.fullmatch(name):
            return None
        with self._entries() as directory:
            if directory is None:
                return None
            data = read_bounded(name, self.max_entry_bytes, dir_fd=directory)
            head = len(self.magic) + _MAC_BYTES
            if data is None or len(data) < head or not data.startswith(self.magic):
                return None
            payload = data[head:]
            if not hmac.compare_digest(self._mac(secret, name, payload), data[len(self.magic) : head]):
                return None
            with contextlib.suppress(OSError):
                os.utime(name, dir_fd=directory, follow_symlinks=False)  # recently used: evicted last
        return payload

    def write(self, name: str, payload: bytes) -> bool:
        """Write an entry whole (best effort: a read-only or full disk only costs the speed-up)."""
        secret = self.secret(create=True)
        if secret is None or not _NAME.fullmatch(name) or len(payload) > self.max_entry_bytes:
            return False
        folder = self.root / _ENTRIES
        try:
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=_TEMPORARY)
            try:
                with os.fdopen(handle, "wb") as file:
                    file.write(self.magic + self._mac(secret, name, payload) + payload)
                os.replace(temporary, folder / name)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        except OSError:
            return False
        return True

    @contextlib.contextmanager
    def _entries(self) -> Iterator[int | None]:
        """The entries directory, opened without following a link (None when it cannot be)."""
        try:
            handle = os.open(self.root / _ENTRIES, _DIRECTORY_FLAGS)
        except OSError:
            yield None
            return
        try:
            yield handle
        finally:
            os.close(handle)

    def listing(self, stale: float | None = None) -> list[tuple[float, int, str]]:
        """The entries (time of last use, size, name): regular files with entry names; with `stale`,
        also the temporary files of writers that ended before renaming them, left for longer than
        that many seconds."""
        if self.secret(create=False) is None:
            return []
        found = []
        with self._entries() as directory:
            if directory is None:
                return []
            for name in os.listdir(directory):
                is_entry = bool(_NAME.fullmatch(name))
                if not is_entry and not (stale is not None and name.startswith(_TEMPORARY)):
                    continue
                with contextlib.suppress(OSError):
                    status = os.stat(name, dir_fd=directory, follow_symlinks=False)
                    if stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid():
                        if is_entry:
                            found.append((status.st_mtime, status.st_size, name))
                        elif status.st_mtime < time.time() - (stale or 0):
                            found.append((0.0, status.st_size, name))
        return found

    def delete(self, names: list[str]) -> int:
        """Delete the entries `names` that prove they are rca's (an entry name and its signature
        header, or an abandoned temporary file); the count deleted."""
        count = 0
        with self._entries() as directory:
            if directory is None:
                return 0
            for name in names:
                if _NAME.fullmatch(name):
                    head = _head(name, len(self.magic), directory)
                    if head != self.magic:
                        continue
                elif not name.startswith(_TEMPORARY):
                    continue
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=directory)
                    count += 1
        return count

    def evict(self, limit: int) -> None:
        """Keep the store under `limit` bytes: delete the least recently used entries (one process
        at a time; another already doing it is left to it)."""
        entries = self.listing()
        if sum(size for _, size, _ in entries) <= limit:
            return
        from filelock import FileLock, Timeout

        try:
            with FileLock(str(self.root / _LOCK), timeout=0):
                doomed = []
                entries = sorted(self.listing(stale=3600))
                total = sum(size for _, size, _ in entries)
                for _, size, name in entries:
                    if total <= limit * 0.8:
                        break
                    doomed.append(name)
                    total -= size
                self.delete(doomed)
        except (Timeout, OSError):
            return

    def clear(self) -> int:
        """Delete every entry and the secret (the next run makes another); the count deleted."""
        if self.secret(create=False) is None:
            return 0
        count = self.delete([name for _, _, name in self.listing(stale=0)])
        with contextlib.suppress(OSError):
            os.unlink(self.root / _SECRET)
        self._secret = None
        return count


_OPENED: dict[Path, SignedStore] = {}


def opened(
    root: Path,
    what: str,
    setting: str,
    magic: bytes,
    max_entry_bytes: int,
    legacy: Callable[[str], bool] = lambda name: False,
) -> SignedStore:
    """The store at `root`, one per directory and process: its directory is checked, and its
    secret read, once (a refusal is said once)."""
    if root not in _OPENED:
        _OPENED[root] = SignedStore(root, what, setting, magic, max_entry_bytes, legacy)
    return _OPENED[root]


def forget() -> None:
    """Check the stores' directories, and read their secrets, afresh on next use."""
    _OPENED.clear()


def _owned(directory: Path, called: str = "it") -> str | None:
    """Why `directory` may not hold a store (None when it may): a link, not a directory, another
    user's."""
    status = os.lstat(directory)
    if stat.S_ISLNK(status.st_mode) or not stat.S_ISDIR(status.st_mode):
        return f"{called} is not a directory"
    if status.st_uid != os.geteuid():
        return f"{called} belongs to another user"
    return None


def _tightened(directory: Path) -> str | None:
    """Make a store's directory writable by its owner alone (an older rca, or a loose umask, may
    have left it open); why it cannot be, else None."""
    mode = stat.S_IMODE(os.lstat(directory).st_mode)
    if mode & 0o022:
        try:
            os.chmod(directory, mode & ~0o022)
        except OSError:
            return f"{directory.name} is writable by others"
    return None


def _head(name: str, size: int, directory: int) -> bytes | None:
    try:
        handle = os.open(name, _READ_FLAGS, dir_fd=directory)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return None
        return os.read(handle, size)
    except OSError:
        return None
    finally:
        os.close(handle)


def _write_whole(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=_TEMPORARY)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
