"""`rca case new|run|show|check`: case directories, re-run as evidence arrives."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from rca.cases.casefile import load_case
from rca.cli.options import (
    CaseDirArg,
    DebugOpt,
    FormatOpt,
    Probing,
    QuietOpt,
    Serve,
    given_paths,
    with_inputs,
    with_probing,
    with_serve,
)
from rca.cli.runner import EXIT_CODES, guarded, probe_inputs_of, progress_printer, run_report, serve_with_of
from rca.errors import ExitCode, InputError, RcaError
from rca.inputs import Inputs
from rca.inputs.launchline import complete
from rca.report import RENDERERS

app = typer.Typer(
    help="Case directories: a diagnosis with its inputs, report, evidence and transcript, re-run as evidence arrives.",
    no_args_is_help=True,
)


def _case_run(
    directory: Path,
    changed: dict[str, str],
    probing: Probing,
    quiet: bool,
    debug: bool,
    serve: Serve = Serve(),
    command: list[str] | None = None,
    notes: tuple[str, ...] = (),
) -> None:
    """Diagnose a case (with its remembered evidence; in the engine too with `serve`), write its
    outputs, print the new transcript entry and, once written, `notes` on the case. New launch flags
    are taken without their secrets, as the case keeps them."""
    from rca.cases.casefile import CASE_FILE, kept_input, read_diagnosis, read_evidence, record_run, update_inputs
    from rca.diagnose import diagnose
    from rca.report.markdown import render as render_markdown

    case = load_case(directory)
    changed = {key: kept_input(key, value) for key, value in changed.items()}
    if serve.serve_with and not command and case.serve is not None and case.serve.redacted:
        raise InputError(
            "the case's [serve] launch had a secret, which the case does not keep (*** stands in its place)",
            where=str(directory / CASE_FILE),
            fix=f"pass the launch command after --: rca case run {directory} --serve-with -- LAUNCH ...",
        )
    inputs = case.inputs.with_values(changed)
    engine = serve_with_of(serve, command or [], inputs, case)
    previous = read_diagnosis(directory)
    remembered = read_evidence(directory)
    probe_inputs = probe_inputs_of(inputs, probing) if probing.wanted or (remembered and inputs.dumps) else None
    progress = progress_printer(quiet)
    run = diagnose(inputs, progress, parallel=not debug, probing=probe_inputs, remembered=remembered)
    diagnosis = run.diagnosis
    if engine is not None:
        from rca.evidence.engine.verify import with_engine_check

        diagnosis = with_engine_check(diagnosis, inputs.path(inputs.draft), engine, progress)
    if changed:  # only once the new inputs were read without error
        update_inputs(directory, changed)
    result = record_run(case, diagnosis, previous, changed, render_markdown)
    typer.echo(result.entry.rstrip("\n"))
    typer.echo(
        f"\nrca: wrote {directory / 'report.md'}, {directory / 'diagnosis.json'} and {directory / 'transcript.md'}",
        err=True,
    )
    for note in notes:
        typer.echo(f"rca: {note}", err=True)
    raise typer.Exit(int(EXIT_CODES[diagnosis.verdict.status]))


def _check_configs(inputs: Inputs) -> None:
    from rca.inputs.configs import load_config

    for key in ("draft", "target"):
        path = inputs.path(getattr(inputs, key))
        if path is not None:
            load_config(key, path)


@app.command("new", context_settings={"allow_extra_args": True})
@with_inputs
@with_probing
@with_serve
def case_new_command(
    ctx: typer.Context,
    given: dict[str, object],
    directory: CaseDirArg,
    title: Annotated[
        str | None, typer.Option("--title", help="What the case is about (default: the directory name).")
    ] = None,
    probing: Probing = Probing(),
    serve: Serve = Serve(),
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Create a case from the inputs of a diagnosis, and run it: case.toml, diagnosis.json, report.md, transcript.md.
    With --serve-with -- LAUNCH, the launch command and its prompts are recorded too, and the draft is measured in
    the engine."""
    from rca.cases.casefile import create_case, left_out, served_as_given

    def job() -> None:
        inputs, launch = complete(Inputs().with_values(given_paths(given)), list(ctx.args), serve_with=serve.serve_with)
        if launch is not None and not quiet:
            typer.echo(f"rca: {launch.summary()}", err=True)
        if inputs.serving is None and inputs.training is None:
            raise InputError(
                "nothing to diagnose",
                fix="pass the launch after --, --serving and --training (sources), --draft and --target (configs)",
            )
        _check_configs(inputs)  # before they are copied: an error names the user's file, not the copy
        engine = serve_with_of(serve, list(ctx.args), inputs)
        existed = directory.exists()
        create_case(directory, inputs, title or directory.name, engine)
        notes = tuple(
            f"left {named} out of the case: the launch names it, but a case copies only the chat templates and "
            "configs it names"
            for named in left_out(inputs)
        )
        try:
            served = served_as_given(directory, inputs, engine) if engine is not None else None
            _case_run(directory, {}, probing, quiet, debug, serve, served, notes)
        except RcaError:  # an input that cannot be read leaves no half-made case behind
            shutil.rmtree(directory, ignore_errors=True)
            if existed:
                directory.mkdir(exist_ok=True)
            raise

    guarded(job, debug)


@app.command("run", context_settings={"allow_extra_args": True})
@with_inputs
@with_probing
@with_serve
def case_run_command(
    ctx: typer.Context,
    given: dict[str, object],
    directory: CaseDirArg,
    probing: Probing = Probing(),
    serve: Serve = Serve(),
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run a case again: inputs given here replace the case's (new dumps, a patched source), earlier evidence is
    kept, and the transcript says what changed. With --serve-with (and the case's \\[serve] command, or one after
    --), the draft is measured in the engine as served and with the fix."""

    def job() -> None:
        if ctx.args and not serve.serve_with:
            raise InputError(
                f"unexpected arguments: {' '.join(ctx.args[:4])}{' ...' if len(ctx.args) > 4 else ''}",
                fix="to serve the draft with a launch command, pass --serve-with -- LAUNCH ...; otherwise drop them",
            )
        changed = given_paths(given)
        _case_run(directory, changed, probing, quiet, debug, serve, list(ctx.args))

    guarded(job, debug)


@app.command("show")
def case_show_command(directory: CaseDirArg, format: FormatOpt = "text", debug: DebugOpt = False) -> None:
    """Print a case's last diagnosis (without running it again)."""
    from rca.cases.casefile import read_diagnosis

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        load_case(directory)
        diagnosis = read_diagnosis(directory)
        if diagnosis is None:
            raise InputError(
                "the case has not been run (no readable diagnosis.json)",
                where=str(directory),
                fix=f"run it: rca case run {directory}",
            )
        return diagnosis, int(EXIT_CODES[diagnosis.verdict.status])

    run_report(work, RENDERERS, format, None, True, debug)


@app.command("check")
def case_check_command(
    directories: Annotated[
        list[Path] | None,
        typer.Argument(metavar="DIR", help="Cases to check (default: every case under ./cases)."),
    ] = None,
    format: Annotated[
        str, typer.Option("--format", "-f", help="Output format: text or markdown (the table).")
    ] = "text",
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run cases with expected verdicts and print a table: case, expected, got, rank of the expected root cause,
    time. Exit 1 on any miss."""
    from rca.cases.casefile import CASE_FILE, check_case
    from rca.diagnose import diagnose

    def job() -> None:
        cases = directories or sorted(path for path in Path("cases").glob("*") if (path / CASE_FILE).is_file())
        if not cases:
            raise InputError(
                "no cases to check", where="cases/", fix="pass case directories, or run where a cases/ directory is"
            )
        progress = progress_printer(quiet)
        results = []
        for directory in cases:
            if progress:
                progress(f"checking {directory}")
            results.append(check_case(directory, lambda inputs: diagnose(inputs, parallel=not debug).diagnosis))
        typer.echo(_check_table(results, format))
        raise typer.Exit(int(ExitCode.MISMATCH) if any(not result.passed for result in results) else 0)

    guarded(job, debug)


def _check_table(results: list, format: str) -> str:
    rows = [
        (
            r.name,
            r.expected,
            r.got,
            "-" if r.rank is None else str(r.rank),
            f"{r.seconds:.1f} s",
            "ok" if r.passed else "MISS",
        )
        for r in results
    ]
    header = ("case", "expected", "got", "rank", "time", "")
    passed = sum(result.passed for result in results)
    summary = f"{passed} of {len(results)} cases reach their expected verdict"
    misses = [f"{r.name}: {'; '.join(r.misses)}" for r in results if not r.passed]
    if format == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(row) + " |" for row in rows
        ]
        return "\n".join([*lines, "", summary, *misses])
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join([*lines, "", summary, *misses])
