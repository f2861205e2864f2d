"""Reading a file the user named: only a regular file, only up to a size that fits what it is, decoded
strictly. A directory, a device (`/dev/zero`), a pipe (which would block), a symlink loop, an
unreadable or oversized file is refused with one line naming the file and the fix."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from rca.errors import InputError
from rca.fingerprint import cache_dir  # noqa: F401  (where the readers find it)

KIB = 1024
MIB = 1024 * KIB


def unreadable(path: Path, what: str, error: OSError, fix: str) -> InputError:
    """The error for a file that exists but cannot be read: a permission is fixed by a permission,
    anything else by `fix`."""
    if error.errno in (errno.EACCES, errno.EPERM):
        fix = "make it readable by this user (chmod u+r), or run rca as a user who may read it"
    return InputError(f"{what} cannot be read ({error.strerror})", where=str(path), fix=fix)


@contextmanager
def opened(path: Path, what: str, fix: str) -> Iterator[BinaryIO]:
    """A regular file opened for reading bytes; one that cannot be is refused by name."""
    regular_file(path, what, fix)
    try:
        handle = path.open("rb")
    except OSError as error:
        raise unreadable(path, what, error, fix) from None
    with handle:
        yield handle


def readable(path: Path, what: str, fix: str) -> Path:
    """`path`, once this user may open it: for a library that opens the file itself, and would call
    a file it may not read corrupt."""
    with opened(path, what, fix):
        return path


def regular_file(path: Path, what: str, fix: str) -> os.stat_result:
    """The file's status, when it is a regular file that can be opened (a symlink is followed)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{what} does not exist", where=str(path), fix=fix) from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise InputError(f"{what} is a symlink loop", where=str(path), fix=fix) from None
        raise unreadable(path, what, error, fix) from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{what} is a directory, not a file", where=str(path), fix=fix)
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{what} is not a regular file (a device, pipe or socket)", where=str(path), fix=fix)
    return info


def read_bytes(path: Path, what: str, *, limit: int, fix: str) -> bytes:
    """At most `limit` bytes of a regular file; a larger one is refused, not truncated."""
    with opened(path, what, fix) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise InputError(f"{what} is {size:,} bytes; at most {limit:,} are read", where=str(path), fix=fix)
        try:
            data = handle.read(limit + 1)
        except OSError as error:  # an I/O error
            raise unreadable(path, what, error, fix) from None
    if len(data) > limit:  # it grew while we looked
        raise InputError(f"{what} is larger than {limit:,} bytes", where=str(path), fix=fix)
    return data


def read_text(path: Path, what: str, *, limit: int, fix: str, encoding: str = "utf-8") -> str:
    """A regular file's text, decoded strictly (`utf-8-sig` also takes a byte-order mark)."""
    data = read_bytes(path, what, limit=limit, fix=fix)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        raise InputError(f"{what} is not UTF-8 text (byte {error.start})", where=str(path), fix=fix) from None


def resolved(path: Path) -> Path:
    """The absolute path with symlinks resolved, or (for a symlink loop) without: never raises."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def hub_places(directory: Path) -> list[Path]:
    """Where the files of a model directory may be: in it, and, for a snapshot of a Hugging Face hub
    download (`models--ORG--NAME/snapshots/REV`, each file a link to `../../blobs/HASH`), in its
    repository's blobs. A link anywhere else leaves the checkpoint."""
    places = [directory]
    repository = directory.parent.parent
    if (
        directory.parent.name == "snapshots"
        and repository.name.startswith("models--")
        and (repository / "blobs").is_dir()
    ):
        places.append(repository / "blobs")
    return places


def within_model(path: Path, directory: Path) -> bool:
    """Whether `path`, its links followed, is a file of the model `directory` (see hub_places)."""
    real = resolved(path)
    return any(real.is_relative_to(place) for place in hub_places(resolved(directory)))


def model_file(path: Path, what: str) -> Path:
    """`path`, a file of the model directory holding it, unless a link takes it out of that directory
    (and, for a hub download, out of its repository's blobs): a model someone else prepared must not
    make rca read, and cite, a file elsewhere."""
    if not within_model(path, path.parent):
        raise InputError(
            f"{what} is a link out of its model directory (to {resolved(path)})",
            where=str(path),
            fix="put the file itself in the model directory; a hub download's links into its own blobs are read",
        )
    return path
