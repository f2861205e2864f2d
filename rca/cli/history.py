"""`rca diff` and `rca history`: what commits did to the wiring, read from git without a checkout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from rca.cli.options import ChangesFormatOpt, DebugOpt, OutputOpt, QuietOpt, RepoOpt, with_inputs
from rca.cli.runner import run_report
from rca.errors import ExitCode
from rca.inputs import Inputs


def _repository_inputs(given: dict[str, object]) -> Inputs:
    """Context options as given: relative paths stay relative, to be looked up in the repository."""
    return Inputs().with_values({key: str(value) for key, value in given.items() if value is not None})


@with_inputs
def diff_command(
    given: dict[str, object],
    rev_range: Annotated[
        str | None,
        typer.Argument(
            metavar="REV_RANGE",
            help="A..B, a single commit (against its parent), or nothing (the working tree against HEAD).",
        ),
    ] = None,
    repo: RepoOpt = Path("."),
    format: ChangesFormatOpt = "text",
    output: OutputOpt = None,
    debug: DebugOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """How a change to a repository changes what the draft is fed, read from git without checking anything out.

    Paths relative to the repository are read at both revisions; --serving defaults to the
    repository itself. Exit status: 0 no new mismatch, 1 the change introduces one, 2 bad input,
    3 inconclusive, 4 internal error.
    """
    from rca.history.changes import diff
    from rca.history.revisions import Context, Repository
    from rca.report.commits import DIFF_RENDERERS

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        repository = Repository(repo)
        base, head = repository.range(rev_range)
        context = Context.of(repository, _repository_inputs(given), head if head.sha else base)
        change = diff(repository, context, base, head, progress)
        code = (
            ExitCode.MISMATCH
            if change.effect == "introduces"
            else ExitCode.INCONCLUSIVE
            if change.effect == "inconclusive"
            else ExitCode.CONSISTENT
        )
        return change, int(code)

    run_report(work, DIFF_RENDERERS, format, output, quiet, debug)


@with_inputs
def history_command(
    given: dict[str, object],
    repo: RepoOpt = Path("."),
    since: Annotated[
        str | None, typer.Option("--since", help="Start after this revision (default: from the first commit).")
    ] = None,
    until: Annotated[str, typer.Option("--until", help="End at this revision.")] = "HEAD",
    format: ChangesFormatOpt = "text",
    output: OutputOpt = None,
    debug: DebugOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """The commits where what the draft is fed changed, with the taps before and after.

    Only commits that touch a file on the wiring path are re-analyzed. Exit status: 0 done,
    2 bad input, 4 internal error.
    """
    from rca.history.changes import history
    from rca.history.revisions import Context, Repository
    from rca.report.commits import HISTORY_RENDERERS

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        repository = Repository(repo)
        head = repository.revision(until)
        start = repository.revision(since) if since else None
        return history(repository, Context.of(repository, _repository_inputs(given), head), start, head, progress), 0

    run_report(work, HISTORY_RENDERERS, format, output, quiet, debug)
