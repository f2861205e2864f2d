"""Source specs and the trees they name: a local path, an installed package, or `pkg==version`.

Releases are fetched once with `pip download --no-deps` into the user cache and unpacked (Python
files only); nothing is installed, imported or executed. A patch is applied in memory, as an
overlay on the tree, so neither the cache nor a user's checkout is ever modified.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import select
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from packaging.version import InvalidVersion, Version

from rca.errors import InputError, SourceFetchError
from rca.inputs.files import MIB, cache_dir, read_text, resolved
from rca.inputs.patching import apply_patch
from rca.inputs.textsearch import search_files
from rca.inputs.versions import nearest_releases
from rca.static import filecache

_RELEASE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
_PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SKIP_DIRS = {
    "__pycache__",
    ".git",
    ".hg",
    ".svn",
    "node_modules",
    ".venv",
    "venv",
    ".tox",
    ".mypy_cache",
    "build",
    "dist",
}
_MAX_SOURCE_BYTES = 4 * 1024 * 1024  # larger .py files are generated data, not code to read
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")  # PEP 263
_MAX_PATCH_BYTES = 32 * MIB  # a patch to a framework: even a whole-tree diff is smaller
# Platforms tried, in order, when a release has no wheel for this interpreter (e.g. cp311-only
# wheels seen from another Python): the Python files inside are the same.
_WHEEL_TARGETS = [
    (python, platform)
    for python in ("3.11", "3.12", "3.10", "3.13")
    for platform in ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_28_aarch64")
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SourceSpec:
    """What the user named as a source, before anything is fetched."""

    text: str
    kind: str  # "path", "release" or "installed"
    path: Path | None = None
    name: str | None = None
    version: str | None = None

    @classmethod
    def parse(cls, text: str, flag: str, base: Path | None = None) -> SourceSpec:
        text = text.strip()
        release = _RELEASE.match(text)
        if release:
            try:  # the cache keeps a release under its version: one spelling each, checked before any download
                version = str(Version(release["version"]))
            except InvalidVersion:
                raise InputError(
                    f"{flag} release {text!r}: {release['version']!r} is not a valid version (PEP 440)",
                    fix=f"write the version as it is published, in the form {release['name']}==0.5.12",
                ) from None
            return cls(text, "release", name=release["name"], version=version)
        candidate = Path(text).expanduser()
        if not candidate.is_absolute() and base is not None:
            candidate = base / candidate
        if candidate.exists():
            return cls(text, "path", path=candidate)
        if _PACKAGE.match(text):
            try:
                spec = importlib.util.find_spec(text)  # locates only; a top-level find imports nothing
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.submodule_search_locations:
                return cls(text, "installed", path=Path(next(iter(spec.submodule_search_locations))), name=text)
        raise InputError(
            f"{flag} source {text!r} is neither an existing path, an installed package nor pkg==version",
            fix=f"pass a directory, a .py file, or a release such as sglang==0.5.12 to {flag}",
        )


@dataclass
class SourceTree:
    """The Python files of one side, read through an optional patch overlay."""

    input: str  # "serving" or "training"
    label: str  # the spec as the user wrote it
    root: Path  # paths are reported relative to this directory
    include: tuple[str, ...] = ()  # relative sub-paths to list; empty means the whole root
    overlay: dict[str, str | None] = field(default_factory=dict)
    patch_name: str | None = None
    warnings: list[str] = field(default_factory=list)
    _files: list[str] | None = None
    _readable: set[str] = field(default_factory=set)  # listed files found to be regular files inside the tree
    _inside: dict[str, bool] = field(default_factory=dict)  # directory -> whether it resolves inside the tree
    _bytes: dict[str, bytes] = field(default_factory=dict)
    _patched_lines: dict[str, set[int]] = field(default_factory=dict)
    _grepped: dict[str, list[str]] = field(default_factory=dict)
    _on_disk_files: list[str] = field(default_factory=list)
    _grep_entry: dict | None = None  # what the analysis cache remembers of its text searches ({}: nothing)

    def files(self) -> list[str]:
        if self._files is None:
            if not self._on_disk_files and not self._listed():
                self._on_disk_files = self._walk()  # before any patch: what the analysis cache's searches cover
            found = set(self._on_disk_files)
            found.update(path for path, text in self.overlay.items() if text is not None and path.endswith(".py"))
            found.difference_update(path for path, text in self.overlay.items() if text is None)
            self._files = sorted(found)
        return self._files

    def top_package(self) -> str | None:
        """The package the tree is, where its files sit under one top-level directory (`sglang`)."""
        tops = {path.split("/", 1)[0] for path in self.files() if "/" in path}
        return tops.pop() if len(tops) == 1 else None

    def _walk(self) -> list[str]:
        found: set[str] = set()
        for sub in self.include or ("",):
            start = self.root / sub
            if start.is_file():
                found.add(PurePosixPath(sub).as_posix())
                continue
            root = str(self.root)
            for directory, dirnames, filenames in os.walk(start, followlinks=False):
                dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
                relative = os.path.relpath(directory, root).replace(os.sep, "/")
                prefix = "" if relative == "." else relative + "/"
                for relpath in (prefix + filename for filename in filenames if filename.endswith(".py")):
                    reason = self._unread_because(relpath)
                    if reason is None:
                        found.add(relpath)
                        self._readable.add(relpath)
                    else:
                        self.warnings.append(f"{relpath}: {reason}")
        return sorted(found)

    def _release(self) -> str | None:
        """What names a release's unpacked files (they never change once complete), or None when
        this tree is not one."""
        marker = self.root / ".complete"
        try:
            if self.include or self.root.parent != cache_dir() / "src" or not marker.is_file():
                return None
            return f"release\0{self.root.name}\0{marker.read_text()}\0{marker.stat().st_mtime_ns}"
        except OSError:
            return None

    def _listed(self) -> bool:
        """Whether a release's listing came from the analysis cache (its thousands of files then
        need no walk); when it did not, the walk made now is kept there for the next run."""
        if not filecache.enabled():
            return False
        release = self._release()
        if release is None:
            return False
        _searched_ahead(self.input)
        name = filecache.key("listing", release)
        data = filecache.load_json(name)
        if (
            isinstance(data, dict)
            and isinstance(data.get("files"), list)
            and isinstance(data.get("warnings"), list)
            and all(isinstance(item, str) for item in [*data["files"], *data["warnings"]])
        ):
            self._on_disk_files = data["files"]
            self._readable.update(data["files"])
            self.warnings.extend(data["warnings"])
            return True
        before = len(self.warnings)
        self._on_disk_files = self._walk()
        listing = {"files": self._on_disk_files, "warnings": self.warnings[before:]}
        _PENDING[name] = (filecache.directory(), lambda: listing)
        return True

    def exists(self, relpath: str) -> bool:
        if relpath in self.overlay:
            return self.overlay[relpath] is not None
        return (self.root / relpath).is_file()

    def raw(self, relpath: str) -> bytes | None:
        """File bytes, or None (with a warning) for a file too large or unreadable, a link out of the
        tree, or not a regular file."""
        if relpath in self.overlay:
            text = self.overlay[relpath]
            return None if text is None else text.encode("utf-8")
        return self._on_disk(relpath)

    def _on_disk(self, relpath: str) -> bytes | None:
        """The file's bytes on disk, as they are before any patch."""
        cached = self._bytes.get(relpath)
        if cached is not None:
            return cached
        if relpath not in self._readable:  # a path a patch names, not found by listing the tree
            reason = self._unread_because(relpath)
            if reason is not None:
                self.warnings.append(f"{relpath}: {reason}")
                return None
        try:
            data = _read_at_most(os.path.join(self.root, relpath), _MAX_SOURCE_BYTES)
        except OSError as error:
            self.warnings.append(f"{relpath}: unreadable ({error.strerror})")
            return None
        if isinstance(data, int):
            self.warnings.append(f"{relpath}: skipped, {data} bytes is too large for a source file")
            return None
        self._bytes[relpath] = data
        return data

    def _unread_because(self, relpath: str) -> str | None:
        """Why a file of the tree is left unread (None: it is read). The tree is what the user
        gave: a link out of it would read another file, and a pipe or device named *.py would
        block the run. Links are resolved only where there is one (a directory's answer is kept):
        a release's thousands of files each cost one lstat."""
        path = self.root / relpath
        try:
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode) or not self._resolves_inside(path.parent):
                real = path.resolve(strict=True)
                if not real.is_relative_to(self._real_root):
                    return f"skipped, a link to {real}, outside the source tree"
                info = real.stat()
        except RuntimeError:  # a symlink loop, before Python 3.13
            return "unreadable (a symlink loop)"
        except OSError as error:
            return f"unreadable ({error.strerror})"
        if not stat.S_ISREG(info.st_mode):
            return "skipped, not a regular file (a pipe, device or socket)"
        return None

    def _resolves_inside(self, directory: Path) -> bool:
        key = str(directory)
        if key not in self._inside:
            self._inside[key] = resolved(directory).is_relative_to(self._real_root)
        return self._inside[key]

    @functools.cached_property
    def _real_root(self) -> Path:
        return resolved(self.root)

    def read(self, relpath: str) -> str | None:
        data = self.raw(relpath)
        if data is None:
            return None
        if b"\x00" in data[:8192]:
            self.warnings.append(f"{relpath}: skipped, binary content in a .py file")
            return None
        return self._decoded(relpath, data)

    def _decoded(self, relpath: str, data: bytes) -> str:
        """The text as Python reads it (UTF-8, or the encoding a PEP 263 comment declares); a file
        that is neither is read as latin-1, with a warning, rather than dropped: its code is ASCII,
        only its strings and comments can come out wrong."""
        declared = next((found[1] for line in data.splitlines()[:2] if (found := _CODING.match(line))), None)
        encoding = declared.decode("ascii") if declared else "utf-8"
        try:
            return data.decode(encoding)
        except LookupError:
            reason = f"its coding declaration names an unknown encoding ({encoding})"
        except UnicodeDecodeError as error:
            reason = f"not {encoding} text (byte {error.start})"
        self.warnings.append(f"{relpath}: {reason}; read as latin-1")
        return data.decode("latin-1")

    def grep(self, needles: Iterable[str]) -> dict[str, list[str]]:
        """Which files contain each needle, by a plain byte search (cheap, no parsing); analyzers
        ask for the same needles again, so answers are kept, and for a tree the analysis cache
        knows (a release, or a local tree unchanged since), kept across runs: then only the
        files a patch changes are searched."""
        needles = list(needles)
        wanted = {needle: needle.encode("utf-8") for needle in needles if needle not in self._grepped}
        if wanted:
            _asked(self.input, wanted)
            remembered = self._remembered_grep()
            if remembered is not None:
                self._grepped.update(self._grep_with(remembered, wanted))
            else:
                self._grepped.update(search_files(self.files(), self.raw, wanted))
        return {needle: list(self._grepped[needle]) for needle in needles}

    def _grep_with(self, remembered: dict, wanted: dict[str, bytes]) -> dict[str, list[str]]:
        """Answers from the files as they are on disk (remembered, or searched now and added to
        what is remembered), with the patched files searched as the patch left them."""
        listed = self.files()
        if not remembered.get("replayed"):  # what reading the files said, said as if they were read now
            remembered["replayed"] = True
            for relpath in listed:
                if relpath not in self.overlay:
                    self.warnings.extend(remembered["warnings"].get(relpath, ()))
        missing = {needle: raw for needle, raw in wanted.items() if needle not in remembered["hits"]}
        if missing:

            def read(relpath: str) -> bytes | None:
                """The file on disk, with what reading it said kept for the runs that remember."""
                before = len(self.warnings)
                data = self._on_disk(relpath)
                if len(self.warnings) > before:
                    remembered["warnings"].setdefault(relpath, self.warnings[before:])
                    if relpath in self.overlay:  # read as the patch left it: its file on disk is not read
                        del self.warnings[before:]
                return data

            remembered["hits"].update(search_files(self._on_disk_files, read, missing))
            _PENDING[remembered["name"]] = (
                remembered["directory"],
                lambda: {"hits": remembered["hits"], "warnings": remembered["warnings"]},
            )
        listed_set = set(listed)
        patched = [relpath for relpath in listed if relpath in self.overlay]
        answers: dict[str, list[str]] = {}
        for needle, raw in wanted.items():
            hits = [
                relpath
                for relpath in remembered["hits"][needle]
                if relpath in listed_set and relpath not in self.overlay
            ]
            hits.extend(relpath for relpath in patched if raw in (self.raw(relpath) or b""))
            answers[needle] = sorted(hits)
        return answers

    def _remembered_grep(self) -> dict | None:
        """This tree's entry of the analysis cache for text searches (an empty one when there is
        none yet), or None when the cache is off or the tree cannot be identified cheaply."""
        if self._grep_entry is not None:
            return self._grep_entry or None
        self._grep_entry = {}
        if not filecache.enabled():
            return None
        _searched_ahead(self.input)
        identity = self._identity()
        if identity is None:
            return None
        name = filecache.key("grep", identity)
        data = filecache.load_json(name)
        valid = (
            isinstance(data, dict)
            and isinstance(data.get("hits"), dict)
            and isinstance(data.get("warnings"), dict)
            and all(
                isinstance(hits, list) and all(isinstance(item, str) for item in hits) for hits in data["hits"].values()
            )
            and all(
                isinstance(said, list) and all(isinstance(item, str) for item in said)
                for said in data["warnings"].values()
            )
        )
        self._grep_entry = {
            "name": name,
            "directory": filecache.directory(),  # written there only (a run may change the cache in use)
            "hits": data["hits"] if valid else {},
            "warnings": data["warnings"] if valid else {},
        }
        return self._grep_entry

    def _identity(self) -> str | None:
        """What names the files of this tree as they are on disk: a release by its name, version
        and unpacking (published files never change), a local tree by the path, size and time
        of every Python file in it."""
        self.files()
        release = self._release()
        if release is not None:
            return release
        parts = [f"tree\0{resolved(self.root)}\0{self.include}"]
        try:
            for relpath in self._on_disk_files:
                status = (self.root / relpath).stat()
                parts.append(f"{relpath}\0{status.st_size}\0{status.st_mtime_ns}")
        except OSError:
            return None
        return "\n".join(parts)

    def grep_in(self, needle: str, files: Iterable[str]) -> list[str]:
        """Which of `files` contain `needle` (a search confined to files already chosen)."""
        if needle in self._grepped:
            known = set(self._grepped[needle])
            return [relpath for relpath in files if relpath in known]
        raw = needle.encode("utf-8")
        return [relpath for relpath in files if raw in (self.raw(relpath) or b"")]

    def is_patched(self, relpath: str) -> bool:
        return relpath in self.overlay

    def patched_lines(self, relpath: str) -> set[int]:
        """Lines of the patched file that the patch added or changed (1-based)."""
        if relpath not in self._patched_lines:
            lines: set[int] = set()
            new = self.overlay.get(relpath)
            if new is not None:
                original = (
                    (self._on_disk(relpath) or b"").decode("utf-8", "replace").splitlines()
                    if (self.root / relpath).is_file()
                    else []
                )
                changed = new.splitlines()
                # The lines before the first difference and after the last are the patch's context:
                # compared one by one, not by difflib, which takes a tenth of a second on a large module.
                head, shortest = 0, min(len(original), len(changed))
                while head < shortest and original[head] == changed[head]:
                    head += 1
                tail = 0
                while tail < shortest - head and original[-1 - tail] == changed[-1 - tail]:
                    tail += 1
                matcher = difflib.SequenceMatcher(
                    None, original[head : len(original) - tail], changed[head : len(changed) - tail], autojunk=False
                )
                for tag, _, _, start, end in matcher.get_opcodes():
                    if tag in ("replace", "insert"):
                        lines.update(range(head + start + 1, head + end + 1))
            self._patched_lines[relpath] = lines
        return self._patched_lines[relpath]

    def apply(self, patch_file: Path, display: str) -> None:
        """Apply a unified diff on top of this tree (in memory)."""
        text = read_text(patch_file, "patch file", limit=_MAX_PATCH_BYTES, fix="pass the path of a unified diff")
        changes = apply_patch(text, display, self.exists, lambda rel: self.read(rel) or "")
        self.overlay.update(changes)
        self.patch_name = display
        self._files = None
        self._grepped.clear()


# Analysis-cache entries of listings and text searches, written after the run: name -> (the cache
# directory it is for, its value when written).
_PENDING: dict[str, tuple[Path | None, Callable[[], object]]] = {}


@filecache.flusher
def _write_pending(really: bool = True) -> int:
    written = 0
    for name, (directory, value) in list(_PENDING.items()) if really else ():
        written += filecache.store_json(name, value(), into=directory)
    _PENDING.clear()
    _ASKED.clear()
    return written


# -- searching ahead ---------------------------------------------------------------------------------
# A process started for one command spends its first few tenths of a second importing the analysis;
# a first run on a release then spends as long again reading its thousands of files for the text
# searches. So the searches the last run of each side asked for are made meanwhile, by a forked
# process on the other core, into the analysis cache, where this process then finds them.

_ASKED: dict[str, set[str]] = {}  # input -> the needles this run searched its tree for
_AHEAD: dict[str, tuple[int, int]] = {}  # input -> its searching process: a pipe's read end (EOF when done), pid


def _asked(input_name: str, needles: Iterable[str]) -> None:
    """Note needles searched, for the next run to search ahead."""
    if not filecache.enabled():
        return
    asked = _ASKED.setdefault(input_name, set())
    asked.update(needles)
    _PENDING[needles_entry(input_name)] = (filecache.directory(), lambda: sorted(asked))


def needles_entry(input_name: str) -> str:
    """The entry of the needles one side's last run searched for."""
    return filecache.key("needles", input_name)


def search_ahead(sides: Iterable[tuple[str, str | None]], base: Path | None) -> None:
    """Start the text searches the last run asked for on these trees (`(input, spec)` pairs:
    releases already downloaded, local trees), each in a forked process, for a process that has
    its imports still to do. Nothing is reported from there: a bad spec is the diagnosis's to
    report."""
    if not filecache.enabled() or not hasattr(os, "fork"):
        return
    for input_name, text in sides:
        try:
            spec = SourceSpec.parse(text, f"--{input_name}", base) if text and input_name not in _AHEAD else None
        except InputError:
            continue
        if spec is None or (spec.kind == "release" and not _complete(release_dir(spec.name or "", spec.version or ""))):
            continue  # none, or to be downloaded first (with its progress shown)
        needles = filecache.load_json(needles_entry(input_name))
        if isinstance(needles, list) and needles and all(isinstance(needle, str) for needle in needles):
            _fork_search(input_name, spec, needles)


def _fork_search(input_name: str, spec: SourceSpec, needles: list[str]) -> None:
    reader, writer = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(reader)
        os.close(writer)
        return
    if pid:
        os.close(writer)
        _AHEAD[input_name] = (reader, pid)
        return
    try:  # the searching process: none of the command's streams or files, only the pipe it closes at exit
        null = os.open(os.devnull, os.O_RDWR)
        for stream in (0, 1, 2):
            os.dup2(null, stream)
        os.closerange(3, writer)
        os.closerange(writer + 1, 65536)
        materialize(spec, input_name).grep(needles)
        _write_pending(True)
    finally:
        os._exit(0)


def _searched_ahead(input_name: str, timeout: float = 30.0) -> None:
    """Wait until the searches started ahead on this side's tree are in the analysis cache (or
    their process is gone)."""
    if input_name not in _AHEAD:
        return
    reader, pid = _AHEAD.pop(input_name)
    done = False
    try:
        done = bool(select.select([reader], [], [], timeout)[0])
    finally:
        os.close(reader)
        with contextlib.suppress(ChildProcessError):  # a forked side's analysis: not its child
            os.waitpid(pid, 0 if done else os.WNOHANG)  # done: it is exiting, reaped now


def materialize(spec: SourceSpec, input_name: str, progress: Progress | None = None) -> SourceTree:
    """Turn a spec into a readable tree, fetching a release into the cache when needed."""
    if spec.kind == "release":
        assert spec.name and spec.version
        root = fetch_release(spec.name, spec.version, progress)
        return SourceTree(input_name, spec.text, root)
    assert spec.path is not None
    path = resolved(spec.path)
    if path.is_file():
        if path.suffix != ".py":
            raise InputError(
                "source file is not a .py file", where=str(spec.path), fix="pass a Python file or a directory"
            )
        return SourceTree(input_name, spec.text, path.parent, include=(path.name,))
    if (path / "__init__.py").is_file():  # a package directory: report paths as pkg/...
        return SourceTree(input_name, spec.text, path.parent, include=(path.name,))
    return SourceTree(input_name, spec.text, path)


def release_dir(name: str, version: str) -> Path:
    """Where the Python files of `name==version` are kept (complete once `.complete` is there)."""
    return cache_dir() / "src" / f"{name.lower()}-{version}"


def fetch_release(name: str, version: str, progress: Progress | None = None) -> Path:
    """Download the wheel of `name==version` once and keep only its Python files, in the cache.
    A release published only as a source archive is fetched from PyPI as a file and unpacked
    the same way: pip would run its build backend to read its metadata, and nothing of a
    release is ever run. Without a `progress` callback, progress goes to the `rca.inputs.sources` logger."""
    progress = progress or logging.getLogger(__name__).info
    dest = release_dir(name, version)

    def make() -> None:
        wheel_dir = cache_dir() / "wheels" / f"{name.lower()}-{version}"
        try:
            _fetch(name, version, wheel_dir, dest, progress)
        finally:
            shutil.rmtree(wheel_dir, ignore_errors=True)  # the Python files are all we read; wheels can be GBs
            with contextlib.suppress(OSError):
                wheel_dir.parent.rmdir()  # when no other release is being fetched

    return made_once(dest, f"{name.lower()}-{version}", make)


def made_once(dest: Path, lock: str, make: Callable[[], None]) -> Path:
    """`dest` in the cache, complete (its `.complete` marker is there): made by `make`, which leaves
    it so, unless it already is. Several rca processes may want it at once (a CI matrix, pytest -n):
    one makes it, the others wait for it and find it complete."""
    if _complete(dest):
        return dest
    from filelock import FileLock  # with urllib, imported by the runs that download only

    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    lock_file = locks / f"{lock}.lock"
    with FileLock(str(lock_file)):
        if not _complete(dest):
            try:
                make()
            except BaseException:
                lock_file.unlink(missing_ok=True)  # nothing was made (a release the index lacks): no trace of it
                raise
    return dest


def _complete(dest: Path) -> bool:
    """Whether `dest` was made whole (its `.complete` marker, written last, is there)."""
    return (dest / ".complete").is_file()


def _fetch(name: str, version: str, wheel_dir: Path, dest: Path, progress: Progress | None) -> None:
    """Download the release into `wheel_dir` and unpack its Python files into `dest`."""
    archive = _find_wheel(wheel_dir) or _find_sdist(wheel_dir)
    if archive is None:
        if progress:
            progress(
                f"fetching {name}=={version} with pip download --no-deps (once: its Python files are kept in {dest})"
            )
        try:
            _pip_download(name, version, wheel_dir, progress)
        except SourceFetchError as error:
            if "No matching distribution" not in error.what and "Could not find a version" not in error.what:
                raise
            if progress:
                progress(f"no wheel of {name}=={version}: fetching its source archive from PyPI")
            _download_sdist(name, version, wheel_dir, error, progress)
        archive = _find_wheel(wheel_dir) or _find_sdist(wheel_dir)
        if archive is None:
            raise SourceFetchError(
                f"pip left no wheel for {name}=={version} in {wheel_dir}",
                fix="check the release on PyPI or pass a local path",
            )
    if progress:
        progress(f"unpacking the Python files of {archive.name} ({_size(archive.stat().st_size)})")
    kept = _unpack_python_files(archive, dest)
    if progress:
        progress(f"kept {kept:,} Python files of {name}=={version} in {dest}")


def _size(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e6 else f"{count / 1e3:.0f} kB"


def _find_wheel(directory: Path) -> Path | None:
    wheels = sorted(directory.glob("*.whl")) if directory.is_dir() else []
    return wheels[0] if wheels else None


def _find_sdist(directory: Path) -> Path | None:
    archives = sorted(directory.glob("*.tar.gz")) if directory.is_dir() else []
    return archives[0] if archives else None


def _download_sdist(
    name: str, version: str, directory: Path, no_wheel: SourceFetchError, progress: Progress | None = None
) -> None:
    """The release's .tar.gz from PyPI's JSON API ($RCA_PYPI_URL), checked against its sha256."""
    import urllib.request

    index = os.environ.get("RCA_PYPI_URL", "https://pypi.org").rstrip("/")
    fix = "pass a local path to the package's source, or check the name, version and network"
    try:
        with urllib.request.urlopen(f"{index}/pypi/{name}/json", timeout=60) as response:
            project = json.load(response)
        files = [
            entry
            for entry in project.get("releases", {}).get(version, [])
            if entry.get("packagetype") == "sdist" and entry.get("filename", "").endswith(".tar.gz")
        ]
        if not files:
            raise SourceFetchError(
                f"{name}=={version} has neither a wheel nor a source archive on PyPI ({no_wheel.what})", fix=fix
            )
        entry = files[0]
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / PurePosixPath(entry["filename"]).name
        if progress:
            size = entry.get("size")
            progress(f"downloading {target.name}" + (f" ({_size(size)})" if isinstance(size, int) else ""))
        with urllib.request.urlopen(entry["url"], timeout=300) as response:
            data = response.read()
    except (OSError, ValueError) as error:
        raise SourceFetchError(
            f"could not fetch the source archive of {name}=={version} from {index}: {error}", fix=fix
        ) from None
    expected = entry.get("digests", {}).get("sha256")
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise SourceFetchError(
            f"the source archive of {name}=={version} does not match its published sha256",
            fix="retry; if it persists, check the network path to PyPI",
        )
    target.write_bytes(data)


def _pip_download(name: str, version: str, wheel_dir: Path, progress: Progress | None = None) -> None:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    base = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        "--dest",
        str(wheel_dir),
        f"{name}=={version}",
    ]
    attempts = [base] + [
        [*base, "--python-version", python, "--platform", platform] for python, platform in _WHEEL_TARGETS
    ]
    last_error = ""
    for number, command in enumerate(attempts):
        try:
            returncode, stderr = _run_pip(command, progress)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SourceFetchError(
                f"could not run pip to download {name}=={version}: {error}",
                fix="check that pip works, or pass a local path",
            ) from None
        if returncode == 0 and _find_wheel(wheel_dir):
            return
        lines = [line for line in stderr.splitlines() if line.startswith("ERROR")]
        last_error = lines[-1] if lines else (stderr.strip().splitlines() or ["pip failed"])[-1]
        if "No matching distribution" not in last_error and "Could not find a version" not in last_error:
            break
        if number == 0:
            _refuse_unknown_release(name, version, stderr)
    raise SourceFetchError(
        f"pip could not download a wheel of {name}=={version}: {last_error.removeprefix('ERROR: ')}",
        fix="check the name and version on PyPI and the network, or pass a local path",
    )


_PIP_VERSIONS = re.compile(r"\(from versions: ([^)]*)\)")
_PIP_DOWNLOADING = re.compile(r"^\s*Downloading (\S+\.(?:whl|tar\.gz)) \(([^)]+)\)")
_PIP_TIMEOUT = 900  # seconds: a wheel of several hundred MB on a slow link


def _run_pip(command: list[str], progress: Progress | None) -> tuple[int, str]:
    """Run pip, passing on the name and size of each archive it starts to download."""
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)

        def relay() -> None:
            for line in process.stdout:  # type: ignore[union-attr]
                found = _PIP_DOWNLOADING.match(line)
                if found and progress:
                    progress(f"downloading {found[1]} ({found[2]})")

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        try:
            returncode = process.wait(timeout=_PIP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        finally:
            reader.join(timeout=5)
        errors.seek(0)
        return returncode, errors.read().decode("utf-8", "replace")


def _refuse_unknown_release(name: str, version: str, pip_output: str) -> None:
    """A release pip lists no file of for this platform may still exist elsewhere (wheels for
    other platforms, a source archive): ask the index once, and refuse at once what it does not
    have, rather than trying every platform first."""
    listed = _PIP_VERSIONS.search(pip_output)
    if listed and version in [item.strip() for item in listed.group(1).split(",")]:
        return
    import urllib.error
    import urllib.request

    index = os.environ.get("RCA_PYPI_URL", "https://pypi.org").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/pypi/{name}/json", timeout=30) as response:
            releases = json.load(response).get("releases", {})
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise SourceFetchError(
                f"there is no package {name!r} on the package index",
                fix="check the package name (e.g. sglang, vllm, speculators, specforge), or pass a local path",
            ) from None
        return
    except (OSError, ValueError):
        return  # the index cannot be asked: let pip try the other platforms
    if version not in releases:
        known = nearest_releases(version, [item for item in releases if releases[item]])
        shown = f"nearest: {', '.join(known.nearest)}; latest: {known.latest}" if known.latest else "none"
        raise SourceFetchError(
            f"{name} has no release {version} on the package index ({shown})",
            fix=f"pass a release that exists, e.g. {name}=={known.closest}"
            if known.closest
            else "check the name, or pass a local path",
        )


def _unpack_python_files(archive: Path, dest: Path) -> int:
    """The Python files of a wheel (or of a source archive, without its `name-version/` folder),
    staged beside `dest` and moved into place whole."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        kept = 0
        with _python_members(archive) as members:
            for parts, open_member in members:
                target = staging.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open_member() as source, open(target, "wb") as sink:
                    shutil.copyfileobj(source, sink)
                kept += 1
        (staging / ".complete").write_text(archive.name + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
        return kept
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _python_members(archive: Path) -> Iterator[Iterator[tuple[tuple[str, ...], Callable[[], IO[bytes]]]]]:
    """Each regular `.py` member of the archive that stays inside it: its path parts and an opener."""

    def inside(name: PurePosixPath) -> bool:
        return name.suffix == ".py" and not name.is_absolute() and ".." not in name.parts

    fix = f"delete {archive.parent} and retry"
    if archive.suffix == ".whl":
        try:
            wheel = zipfile.ZipFile(archive)
        except zipfile.BadZipFile:
            raise SourceFetchError(f"{archive.name} is not a valid wheel", where=str(archive), fix=fix) from None
        with wheel:
            yield (
                (PurePosixPath(member.filename).parts, functools.partial(wheel.open, member))
                for member in wheel.infolist()
                if not member.is_dir() and inside(PurePosixPath(member.filename))
            )
        return
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError):
        raise SourceFetchError(f"{archive.name} is not a valid source archive", where=str(archive), fix=fix) from None
    with tar:
        yield (
            (PurePosixPath(member.name).parts[1:], functools.partial(tar.extractfile, member))  # type: ignore[misc]
            for member in tar.getmembers()
            if member.isfile() and inside(PurePosixPath(member.name)) and len(PurePosixPath(member.name).parts) > 1
        )


def _read_at_most(path: str, limit: int) -> bytes | int:
    """A file's bytes, or its size when that is over `limit`: one open, one fstat and one read
    (a first run reads every file of a release, thousands of them, for its text searches)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            return size
        data = os.read(fd, size + 1)
        if len(data) < size:  # a short read: the rest, to the end
            chunks = [data]
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)
