"""How a change in a repository changes what the draft is fed: `rca diff` and `rca history`.

Each revision is diagnosed like `rca diagnose` would, from the files read out of git (see
revisions.py). A diff compares the two verdicts and wirings and points at the changed lines the
new diagnosis cites; a history re-diagnoses only the commits that touch a file the previous
diagnosis read (or a Python file holding one of the analyzers' anchors), and remembers each
diagnosis by the blob ids of those files, so a revert costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rca.errors import RcaError
from rca.history.revisions import TREE_INPUTS, ChangedFile, Context, Repository, Revision, Snapshot
from rca.knowledge import catalog
from rca.model import Diagnosis, Status, Step, Tap

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Responsible:
    """A line the new diagnosis cites that the change wrote, and the commit that wrote it."""

    path: str  # repository-relative
    line: int
    code: str
    note: str
    commit: Revision | None


@dataclass(frozen=True)
class WiringChange:
    base: Revision
    head: Revision
    before: Diagnosis
    after: Diagnosis
    effect: str  # "introduces", "removes", "changes", "keeps", "none", "inconclusive"
    responsible: tuple[Responsible, ...] = ()
    changed_files: tuple[str, ...] = ()

    @property
    def contract_added(self) -> tuple[str, ...]:
        """Breaks of the draft's contract with its engine the change brings."""
        return tuple(sorted(contract_breaks(self.after) - contract_breaks(self.before)))

    @property
    def contract_removed(self) -> tuple[str, ...]:
        return tuple(sorted(contract_breaks(self.before) - contract_breaks(self.after)))

    @property
    def slots_changed(self) -> dict[str, tuple[tuple[Tap, ...], tuple[Tap, ...]]]:
        changed = {}
        for side in ("serving", "training"):
            old, new = self.before.wirings.get(side), self.after.wirings.get(side)
            old_slots, new_slots = (old.slots if old else ()), (new.slots if new else ())
            if old_slots != new_slots:
                changed[side] = (old_slots, new_slots)
        return changed


@dataclass(frozen=True)
class History:
    since: Revision | None
    head: Revision
    commits: int  # commits in the range
    analyzed: int  # commits re-diagnosed (the others touched nothing on the wiring path)
    changes: tuple[WiringChange, ...] = field(default_factory=tuple)


def contract_breaks(diagnosis: Diagnosis) -> frozenset[str]:
    """The contract hypotheses a diagnosis ranks: each is there only when an analyzer found its break."""
    entries = catalog()
    return frozenset(h.id for h in diagnosis.hypotheses if h.id in entries and entries[h.id].contract)


def effect_of(before: Diagnosis, after: Diagnosis) -> str:
    old, new = before.verdict, after.verdict
    if Status.INCONCLUSIVE in (old.status, new.status):
        return "inconclusive"
    if new.status is Status.MISMATCH and old.status is not Status.MISMATCH:
        return "introduces"
    if old.status is Status.MISMATCH and new.status is not Status.MISMATCH:
        return "removes"
    if new.status is Status.MISMATCH:
        same = (
            old.root_cause == new.root_cause
            and contract_breaks(before) == contract_breaks(after)
            and all(
                before.wirings[side].slots == after.wirings[side].slots
                for side in after.wirings
                if side in before.wirings
            )
        )
        return "keeps" if same else "changes"
    return "none"


# -- diff -----------------------------------------------------------------------------------------


def diff(
    repository: Repository, context: Context, base: Revision, head: Revision, progress: Progress | None = None
) -> WiringChange:
    from rca.diagnose import diagnose

    changed = repository.changes(base, head)
    with Snapshot(repository, context) as snapshot:
        diagnoses = []
        for revision in (base, head):
            if progress:
                progress(f"diagnosing {revision.short}")
            try:
                inputs = snapshot.inputs_at(base) if revision is base else snapshot.trained_at(base, head)
                diagnoses.append(diagnose(inputs, parallel=False).diagnosis)
            except RcaError as error:
                raise snapshot.in_repository_terms(error, revision) from None
    before, after = diagnoses
    return _change(repository, context, base, head, before, after, changed)


def _change(
    repository: Repository,
    context: Context,
    base: Revision,
    head: Revision,
    before: Diagnosis,
    after: Diagnosis,
    changed: list[ChangedFile],
) -> WiringChange:
    effect = effect_of(before, after)
    # Lines the change wrote that the new diagnosis cites (or, for a removal, that it removed and
    # the old one cited), with the commit responsible: the change itself when it is one commit;
    # within a range, the commit blame names for a written line (a removal is not attributed).
    removal = effect == "removes"
    cited_in, at = (before, base) if removal else (after, head)
    by_path = {item.path: item.removed if removal else item.added for item in changed}
    single = head.sha is not None and _parent_is(repository, head, base)
    responsible: dict[tuple[str, int], Responsible] = {}
    added = contract_breaks(after) - contract_breaks(before)
    for step in _cited(cited_in, added if not removal else frozenset()):
        for path, lines in _repo_lines(repository, context, step, at):
            written = sorted(set(lines) & by_path.get(path, frozenset()))
            if not written or (path, written[0]) in responsible:
                continue
            line = written[0]
            commit = head if single else None if removal or head.sha is None else repository.blame(head, path, line)
            responsible[(path, line)] = Responsible(path, line, step.code, step.note, commit)
    return WiringChange(
        base, head, before, after, effect, tuple(responsible.values()), tuple(item.path for item in changed)
    )


def _parent_is(repository: Repository, head: Revision, base: Revision) -> bool:
    parents = repository.repo.commit(head.sha).parents
    return bool(parents) and parents[0].hexsha == base.sha


def _cited(diagnosis: Diagnosis, added: frozenset[str] = frozenset()) -> list[Step]:
    """The steps a reader would follow: the top hypothesis's citations, those of the contract
    breaks the change `added`, then each wiring's steps."""
    steps: list[Step] = list(diagnosis.hypotheses[0].citations) if diagnosis.hypotheses else []
    steps += [step for h in diagnosis.hypotheses[1:] if h.id in added for step in h.citations]
    for wiring in diagnosis.wirings.values():
        steps.extend(wiring.steps)
    return steps


def _repo_lines(repository: Repository, context: Context, step: Step, at: Revision) -> list[tuple[str, list[int]]]:
    """Where a cited step is in the repository, as (path, lines): a source file of a tree that
    lives in it, an input file of it, or, for a line a vendored patch adds, the patch's own line."""
    location = step.location
    lines = list(range(location.line, location.end_line + 1))
    if step.patched:
        patch = context.in_repo.get(f"{location.input}_patch")
        if patch is None:
            return []
        text = (repository.read(at, patch) or b"").decode("utf-8", "replace").splitlines()
        wanted = step.code.strip()
        added = [
            number
            for number, line in enumerate(text, start=1)
            if line.startswith("+")
            and not line.startswith("+++")
            and line[1:].strip()
            and wanted.startswith(line[1:].strip())
        ]
        return [(patch, added[:1])] if added else []
    if location.input in TREE_INPUTS and location.input in context.in_repo:
        root = context.in_repo[location.input]
        candidate = location.path if root in (".", "") else f"{root.rstrip('/')}/{location.path}"
        return [(candidate, lines)] if repository.exists(at, candidate) else []
    inside = any(
        location.path == path or location.path.startswith(path.rstrip("/") + "/")
        for path in context.files()
        if path not in (".", "")
    )
    return [(location.path, lines)] if inside and repository.exists(at, location.path) else []


# -- history --------------------------------------------------------------------------------------


def history(
    repository: Repository, context: Context, since: Revision | None, head: Revision, progress: Progress | None = None
) -> History:
    from rca.diagnose import diagnose
    from rca.static.analyzer import registry

    commits = repository.commits(since, head)
    if not commits:
        return History(since, head, 0, 0)
    anchors = sorted({anchor.encode() for side in ("serving", "training") for anchor in registry().anchors(side)})
    remembered: dict[tuple, tuple[Diagnosis, frozenset[str]]] = {}
    changes: list[WiringChange] = []
    analyzed = 0
    with Snapshot(repository, context) as snapshot:
        start = since if since is not None else commits[0][0]

        def diagnosed(revision: Revision, files: frozenset[str]) -> tuple[Diagnosis, frozenset[str]]:
            """The diagnosis at `revision`, training recorded by the draft config where the walk starts
            (a later edit of it, and its revert, are read against that record)."""
            nonlocal analyzed
            inputs = snapshot.trained_at(start, revision)
            recorded = inputs.trained_draft is not None
            key = (repository.blob_ids(revision, files | set(context.files())), recorded)
            if key not in remembered:
                analyzed += 1
                if progress:
                    progress(f"diagnosing {revision.short} {revision.subject[:60]}")
                try:
                    run = diagnose(inputs, parallel=False)
                except RcaError as error:
                    raise snapshot.in_repository_terms(error, revision) from None
                read = frozenset(_files_read(context, run))
                remembered[(repository.blob_ids(revision, read | set(context.files())), recorded)] = (
                    run.diagnosis,
                    read,
                )
                return run.diagnosis, read
            return remembered[key]

        # Without --since, the first commit is the starting point.
        current, read = diagnosed(start, frozenset())
        for revision, touched in commits if since is not None else commits[1:]:
            if not _touches_wiring(repository, revision, touched, read, context, anchors):
                continue
            after, read = diagnosed(revision, read)
            if _differs(current, after):
                parent = repository.parent(revision)
                changes.append(
                    _change(repository, context, parent, revision, current, after, repository.changes(parent, revision))
                )
            current = after
    return History(since, head, len(commits), analyzed, tuple(changes))


def _differs(before: Diagnosis, after: Diagnosis) -> bool:
    if before.verdict.status != after.verdict.status or before.verdict.root_cause != after.verdict.root_cause:
        return True
    if contract_breaks(before) != contract_breaks(after):
        return True
    return any(
        before.wirings.get(side) is None or before.wirings[side].slots != wiring.slots
        for side, wiring in after.wirings.items()
    )


def _files_read(context: Context, run) -> set[str]:
    """Repository paths of the source files the diagnosis parsed (its sides' code indexes)."""
    found: set[str] = set()
    for name, side in run.sides.items():
        if side.ctx is None or side.ctx.index is None or name not in context.in_repo:
            continue
        root = context.in_repo[name]
        prefix = "" if root in (".", "") else root.rstrip("/") + "/"
        found.update(prefix + relpath for relpath in side.ctx.index.modules)
    return found


def _touches_wiring(
    repository: Repository,
    revision: Revision,
    touched: tuple[str, ...],
    read: frozenset[str],
    context: Context,
    anchors: list[bytes],
) -> bool:
    """A commit matters when it touches an input file, a source file the last diagnosis read, or
    a Python file (in a source tree in the repository) holding an analyzer's anchor."""
    inputs = context.files()
    trees = [context.in_repo[name] for name in TREE_INPUTS if name in context.in_repo]
    for path in touched:
        if path in read or any(
            path == item or path.startswith(item.rstrip("/") + "/") for item in inputs if item not in trees
        ):
            return True
        if path.endswith(".py") and any(root in (".", "") or path.startswith(root.rstrip("/") + "/") for root in trees):
            data = repository.read(revision, path)
            if data is not None and any(anchor in data for anchor in anchors):
                return True
    return False
