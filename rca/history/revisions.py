"""A git repository's revisions as diagnosis inputs, read from git's object store.

`rca diff` and `rca history` read the files a diagnosis needs at each revision straight from the
object database into a scratch snapshot: nothing is checked out, the user's working tree and
index are left alone, and nothing the repository configures runs: every git command is given
overrides that switch off hooks, fsmonitor, external diffs, textconv and the clean, smudge and
process filters its configuration declares (a repository someone else prepared must not be able
to run code through rca). Paths the user gives relative to the repository (a fork's
source tree, a vendored patch, a draft config, a launch script) are read at each revision; paths
outside it are the same for every revision.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from rca.errors import InputError, RcaError
from rca.inputs import Inputs

if TYPE_CHECKING:  # gitpython is imported where a repository is opened (rca diagnose never pays for it)
    from git.objects.blob import Blob

_MAX_BLOB_BYTES = 16 * 1024 * 1024  # larger files are data (weights, dumps), never read statically
# Inputs that name a source tree (only its Python files are read) and inputs that name files.
TREE_INPUTS = ("serving", "training", "training_engine")
FILE_INPUTS = ("serving_patch", "training_patch", "serving_args", "training_args", "dumps", "draft", "target")
# Inputs a deployment can do without: at a revision that lacks one, it is absent, not an error
# (a change that adds a patch compares the tree without it to the tree with it).
OPTIONAL_INPUTS = ("serving_patch", "training_patch", "serving_args", "training_args", "dumps", "training_engine")


@dataclass(frozen=True)
class Revision:
    """A commit, or the working tree (`sha` None)."""

    sha: str | None
    subject: str = ""
    date: str = ""

    @property
    def short(self) -> str:
        return self.sha[:10] if self.sha else "working tree"

    def __str__(self) -> str:
        return self.short


WORKTREE = Revision(None)


@dataclass(frozen=True)
class ChangedFile:
    path: str  # repository-relative, as in the newer revision (the older one's for a deletion)
    status: str  # "A", "M", "D"
    added: frozenset[int]  # lines of the newer revision that the change added or rewrote
    removed: frozenset[int]  # lines of the older revision that the change removed or rewrote


class Repository:
    """A git repository, read only: revisions, their files, and what changed between two."""

    def __init__(self, path: Path) -> None:
        try:
            import git  # gitpython: imported here so that `rca diagnose` never pays for it
        except ImportError as error:  # gitpython is installed, but it found no git executable
            raise InputError(
                f"git cannot be run: {str(error).splitlines()[0]}",
                where="git",
                fix="install git, or set GIT_PYTHON_GIT_EXECUTABLE to its path",
            ) from None

        self._git = git
        try:
            self.repo = git.Repo(path, search_parent_directories=False)
        except git.NoSuchPathError:
            raise InputError(
                "repository path does not exist", where=str(path), fix="pass --repo the top directory of a git clone"
            ) from None
        except git.InvalidGitRepositoryError:
            raise InputError(
                "not a git repository",
                where=str(path),
                fix="pass --repo the top directory of a git clone (the one holding .git)",
            ) from None
        if not self.repo.head.is_valid():
            raise InputError(
                "the repository has no commits yet",
                where=str(path),
                fix="commit something first, or pass another --repo",
            )
        self.repo.git.update_environment(**_inert_git_environment(self.repo))
        self.path = path
        self.root = Path(self.repo.working_tree_dir) if self.repo.working_tree_dir else None
        self.shallow = (Path(self.repo.git_dir) / "shallow").is_file()

    # -- revisions ------------------------------------------------------------------------------

    def revision(self, spec: str) -> Revision:
        try:
            return self._revision(self.repo.commit(spec))  # reads the commit: a shallow clone may lack it
        except (self._git.BadName, self._git.BadObject, ValueError):
            hint = (
                " (this is a shallow clone: fetch more history with git fetch --deepen N or --unshallow)"
                if self.shallow
                else ""
            )
            raise InputError(
                f"unknown revision {spec!r}{hint}",
                where=str(self.path),
                fix="name a commit, branch or tag that `git log` shows",
            ) from None

    def _revision(self, commit) -> Revision:
        return Revision(
            commit.hexsha,
            commit.summary if isinstance(commit.summary, str) else commit.summary.decode("utf-8", "replace"),
            commit.committed_datetime.isoformat(),
        )

    def parent(self, revision: Revision) -> Revision:
        commit = self.repo.commit(revision.sha)
        if not commit.parents:
            if self.shallow:
                raise InputError(
                    f"the parent of {revision.short} is not in this shallow clone",
                    where=str(self.path),
                    fix="fetch more history (git fetch --deepen N or --unshallow)",
                )
            raise InputError(
                f"{revision.short} is the first commit: it has no parent to compare with",
                where=str(self.path),
                fix="give a range A..B",
            )
        try:
            return self._revision(commit.parents[0])
        except ValueError:  # a shallow clone lists the parent but lacks its object
            raise InputError(
                f"the parent of {revision.short} is not in this shallow clone",
                where=str(self.path),
                fix="fetch more history (git fetch --deepen N or --unshallow)",
            ) from None

    def range(self, text: str | None) -> tuple[Revision, Revision]:
        """What `git diff` users mean: nothing (HEAD against the working tree), `A..B`, or `A`
        (the commit against its first parent)."""
        if not text:
            if self.root is None:
                raise InputError(
                    "a bare repository has no working tree to compare with HEAD",
                    where=str(self.path),
                    fix="give a revision range A..B",
                )
            return self.revision("HEAD"), WORKTREE
        if ".." in text:
            if "..." in text:
                raise InputError(f"symmetric ranges are not supported: {text!r}", where="REV_RANGE", fix="give A..B")
            start, _, end = text.partition("..")
            return self.revision(start or "HEAD"), self.revision(end or "HEAD")
        head = self.revision(text)
        return self.parent(head), head

    def commits(self, since: Revision | None, head: Revision) -> list[tuple[Revision, tuple[str, ...]]]:
        """First-parent commits after `since` up to `head`, oldest first, with the paths each touched."""
        span = f"{since.sha}..{head.sha}" if since is not None else head.sha
        log = self.repo.git.log(
            "--first-parent", "--reverse", "--no-renames", "--name-only", "--format=%x00%H%x1f%cI%x1f%s", span
        )
        found: list[tuple[Revision, tuple[str, ...]]] = []
        for record in log.split("\x00")[1:]:
            header, _, names = record.partition("\n")
            sha, date, subject = header.split("\x1f", 2)
            found.append((Revision(sha, subject, date), tuple(name for name in names.splitlines() if name)))
        return found

    # -- contents -------------------------------------------------------------------------------

    def exists(self, revision: Revision, relpath: str) -> bool:
        if revision.sha is None:
            return self.root is not None and (self.root / relpath).exists()
        try:
            self.repo.commit(revision.sha).tree / relpath
            return True
        except KeyError:
            return False

    def read(self, revision: Revision, relpath: str) -> bytes | None:
        if revision.sha is None:
            path = (self.root or self.path) / relpath
            return path.read_bytes() if path.is_file() else None
        try:
            blob = self.repo.commit(revision.sha).tree / relpath
        except KeyError:
            return None
        return blob.data_stream.read() if blob.type == "blob" and blob.size <= _MAX_BLOB_BYTES else None

    def blob_ids(self, revision: Revision, relpaths: Iterable[str]) -> tuple[tuple[str, str], ...]:
        """(path, blob id) of each path at a revision: equal tuples mean equal contents."""
        tree = self.repo.commit(revision.sha).tree
        ids = []
        for relpath in sorted(set(relpaths)):
            try:
                ids.append((relpath, (tree / relpath).hexsha))
            except KeyError:
                ids.append((relpath, ""))
        return tuple(ids)

    def changes(self, base: Revision, head: Revision) -> list[ChangedFile]:
        """Files that differ between two revisions, with the changed lines on each side (from a
        zero-context diff; binary files are listed with no lines). Plumbing only: `git diff`
        against the working tree refreshes the index's file stamps, writing the user's
        .git/index, where `git diff-index` compares the same files and writes nothing."""
        args = ["-p", "--no-renames", "--unified=0", "--no-color", "--no-ext-diff", "--no-textconv", base.sha]
        if head.sha is None:
            text = self.repo.git.diff_index(*args)
        else:
            text = self.repo.git.diff_tree("-r", *args, head.sha)
        changed: list[ChangedFile] = []
        added: set[int] = set()
        removed: set[int] = set()
        path, status = None, "M"
        for line in text.splitlines():
            if line.startswith("diff --git "):
                if path is not None:
                    changed.append(ChangedFile(path, status, frozenset(added), frozenset(removed)))
                path, status, added, removed = line.split(" b/", 1)[-1], "M", set(), set()
            elif line.startswith("new file mode"):
                status = "A"
            elif line.startswith("deleted file mode"):
                status = "D"
            elif line.startswith("@@ ") and path is not None:
                old, new = line.split(" ")[1:3]
                removed |= _line_span(old[1:])
                added |= _line_span(new[1:])
        if path is not None:
            changed.append(ChangedFile(path, status, frozenset(added), frozenset(removed)))
        return changed

    def blame(self, revision: Revision, relpath: str, line: int) -> Revision | None:
        """The commit that last changed one line, as of `revision` (None for uncommitted lines)."""
        try:
            porcelain = self.repo.git.blame(
                "--porcelain", "--no-textconv", "-L", f"{line},{line}", revision.sha or "HEAD", "--", relpath
            )
        except self._git.GitCommandError:
            return None
        sha = porcelain.split(" ", 1)[0]
        return None if set(sha) == {"0"} else self._revision(self.repo.commit(sha))


def _inert_git_environment(repo) -> dict[str, str]:
    """Environment for every git command run on `repo`: configuration overrides that leave
    nothing for git to execute (hooks, fsmonitor, external diff and pager, and the filter and
    diff drivers the repository's configuration names), no system configuration, no prompts, and
    no optional index writes."""
    overrides = {
        "core.hooksPath": os.devnull,
        "core.fsmonitor": "false",
        "core.pager": "cat",
        "core.editor": "true",
        "diff.external": "",
        "core.askPass": "",
        "credential.helper": "",
    }
    from git.exc import GitCommandError

    try:
        declared = repo.git.config("--get-regexp", r"^(filter|diff|merge)\.")
    except GitCommandError:  # exit status 1: nothing declared
        declared = ""
    for line in declared.splitlines():
        key = line.split(" ", 1)[0]
        section, _, rest = key.partition(".")
        driver, _, _ = rest.rpartition(".")
        if not driver:
            continue
        if section == "filter":
            for field in ("clean", "smudge", "process"):
                overrides[f"filter.{driver}.{field}"] = ""
            overrides[f"filter.{driver}.required"] = "false"
        elif section == "diff":
            overrides[f"diff.{driver}.textconv"] = ""
            overrides[f"diff.{driver}.command"] = ""
        elif section == "merge":
            overrides[f"merge.{driver}.driver"] = ""
    environment = {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_EXTERNAL_DIFF": "",
        "GIT_PAGER": "cat",
        "GIT_CONFIG_COUNT": str(len(overrides)),
    }
    for number, (key, value) in enumerate(overrides.items()):
        environment[f"GIT_CONFIG_KEY_{number}"] = key
        environment[f"GIT_CONFIG_VALUE_{number}"] = value
    return environment


def _line_span(spec: str) -> set[int]:
    start, _, count = spec.partition(",")
    first, length = int(start), int(count) if count else 1
    return set(range(first, first + length))


# -- inputs at a revision ----------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """The inputs as the user gave them, with those that live in the repository marked by their
    repository-relative path (read at each revision)."""

    inputs: Inputs
    in_repo: dict[str, str]

    @classmethod
    def of(cls, repository: Repository, inputs: Inputs, head: Revision) -> Context:
        """A relative path that exists in the repository (at `head` or in the working tree) is
        read at each revision; other relative paths are taken from the working directory."""
        if inputs.serving is None:
            inputs = dataclasses.replace(inputs, serving=".")  # a fork: the repository is the serving source
        in_repo: dict[str, str] = {}
        outside: dict[str, str] = {}
        for name in TREE_INPUTS + FILE_INPUTS:
            value = getattr(inputs, name)
            relpath = _repo_relative(repository, value)
            if relpath is not None and (
                relpath == "." or repository.exists(head, relpath) or repository.exists(WORKTREE, relpath)
            ):
                in_repo[name] = relpath
            elif value is not None and Path(value).expanduser().exists():
                outside[name] = str(Path(value).expanduser().resolve())
        return cls(inputs.with_values(outside), in_repo)

    def files(self) -> tuple[str, ...]:
        return tuple(self.in_repo.values())


def _repo_relative(repository: Repository, value: str | None) -> str | None:
    if value is None or "==" in value or value.lstrip().startswith("-"):
        return None  # a release, or launch flags
    path = Path(value).expanduser()
    if path.is_absolute():
        if repository.root is None:
            return None
        try:
            return path.resolve().relative_to(repository.root.resolve()).as_posix() or "."
        except ValueError:
            return None
    return PurePosixPath(path.as_posix()).as_posix()


class Snapshot:
    """A scratch directory holding the repository's files that the inputs name, at one revision
    at a time (Python files of source trees; configs, patches and launch files; dump metadata)."""

    def __init__(self, repository: Repository, context: Context) -> None:
        self.repository = repository
        self.context = context
        self.directory = Path(tempfile.mkdtemp(prefix="rca-rev-"))
        self._written: dict[str, str] = {}  # path -> blob id, what the directory holds now

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        shutil.rmtree(self.directory.parent / f"{self.directory.name}-trained", ignore_errors=True)

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def inputs_at(self, revision: Revision) -> Inputs:
        """The diagnosis inputs at a revision (the working tree is read in place). An optional input
        the revision does not have (a patch a later commit adds) is absent there."""
        if not self.context.in_repo:
            return self.context.inputs
        if revision.sha is None:
            root = self.repository.root or self.repository.path
        else:
            self._fill(revision)
            root = self.directory
        present = {
            name: relpath
            for name, relpath in self.context.in_repo.items()
            if name not in OPTIONAL_INPUTS or relpath == "." or self.repository.exists(revision, relpath)
        }
        absent = dict.fromkeys(set(self.context.in_repo) - set(present))
        return dataclasses.replace(self.context.inputs, base=root, **present, **absent)

    def trained_at(self, base: Revision, head: Revision) -> Inputs:
        """The inputs at `head`, with the draft config at `base` as the record of training where the
        change edited it: an edit of an exported draft's config does not change what it learned (the
        trainer's code, where given, is read with the config it trained with)."""
        inputs = self.inputs_at(head)
        relpath = self.context.in_repo.get("draft")
        if relpath is None:
            return inputs
        config = relpath if relpath.endswith(".json") else f"{relpath.rstrip('/')}/config.json"
        before, after = self.repository.read(base, config), self.repository.read(head, config)
        if before is None or after is None or before == after:
            return inputs
        recorded = self.directory.parent / f"{self.directory.name}-trained" / "config.json"
        recorded.parent.mkdir(exist_ok=True)
        recorded.write_bytes(before)
        return dataclasses.replace(inputs, trained_draft=str(recorded))

    def in_repository_terms(self, error: RcaError, revision: Revision) -> RcaError:
        """An error about a file of the scratch snapshot, said of the repository's file at `revision`."""
        where = error.where.replace(str(self.directory) + "/", "").replace(str(self.directory), ".")
        if where != error.where:
            error.where = f"{where} (at {revision.short})"
        return error

    def _fill(self, revision: Revision) -> None:
        tree = self.repository.repo.commit(revision.sha).tree
        wanted: dict[str, str] = {}
        for name, relpath in self.context.in_repo.items():
            for path, blob in _blobs(tree, relpath, sources=name in TREE_INPUTS):
                wanted[path] = blob.hexsha
                if self._written.get(path) != blob.hexsha:
                    target = self.directory / path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(blob.data_stream.read())
        for path in set(self._written) - set(wanted):
            (self.directory / path).unlink(missing_ok=True)
        self._written = wanted


def _blobs(tree, relpath: str, sources: bool) -> Iterator[tuple[str, Blob]]:
    """The blobs under a path: Python files of a source tree; the small files of a config or
    dump directory (no weights or tensors); the file itself."""
    try:
        item = tree if relpath in (".", "") else tree / relpath
    except KeyError:
        return
    if item.type == "blob":
        if item.size <= _MAX_BLOB_BYTES and item.mode != 0o120000:
            yield relpath, item
        return
    for entry in item.traverse():
        if entry.type != "blob" or entry.mode == 0o120000 or entry.size > _MAX_BLOB_BYTES:
            continue
        name = entry.path
        if sources and not name.endswith(".py"):
            continue
        if not sources and not name.endswith((".json", ".toml", ".sh", ".txt", ".patch", ".diff")):
            continue
        yield name, entry
