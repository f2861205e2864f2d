"""The `rca` command line: a thin layer over the typed core (diagnose.py, case.py, reports)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import shutil
import sys
import typing
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from . import resultcache
from .case import load_case
from .errors import ExitCode, InputError, RcaError
from .inputs import Inputs
from .knowledge import catalog
from .model import Diagnosis, Status
from .probes import ProbeInputs
from .report import RENDERERS

app = typer.Typer(
    help="Find out why an EAGLE-3 draft accepts so few tokens: what serving feeds it, what training fed it, and where in the code they differ.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# Options shared by the commands that read a deployment (declared once).
ServingOpt = Annotated[Optional[str], typer.Option("--serving", help="Serving source: a directory, a .py file, an installed package, or pkg==version (e.g. sglang==0.5.12).")]
ServingPatchOpt = Annotated[Optional[Path], typer.Option("--serving-patch", help="Unified diff applied (in memory) on top of the serving source.")]
ServingArgsOpt = Annotated[Optional[str], typer.Option("--serving-args", help="How the server is launched: a script or file holding the launch command, or its flags in quotes (\"--speculative-algorithm EAGLE3 --tp 8\"). Read with the engine's own flag declarations.")]
TrainingOpt = Annotated[Optional[str], typer.Option("--training", help="Training source: a directory, a .py file, an installed package, or pkg==version (e.g. speculators==0.4.0).")]
TrainingEngineOpt = Annotated[Optional[str], typer.Option("--training-engine", help="The engine that captured the training hidden states (e.g. vllm==0.20.0 for speculators 0.5+, sglang==0.5.14 for SpecForge 0.2): its numbering is then read from its code instead of assumed.")]
TrainingPatchOpt = Annotated[Optional[Path], typer.Option("--training-patch", help="Unified diff applied (in memory) on top of the training source.")]
DumpsOpt = Annotated[Optional[Path], typer.Option("--dumps", help="Directory of the training hidden-state dumps (its data_config.json records the captured ids).")]
DraftOpt = Annotated[Optional[Path], typer.Option("--draft", help="The draft's config.json, or its model directory.")]
TargetOpt = Annotated[Optional[Path], typer.Option("--target", help="The target's config.json, or its model directory.")]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help=f"Output format: {', '.join(RENDERERS)}.")]
OutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of standard output.")]
CaseOpt = Annotated[Optional[Path], typer.Option("--case", help="A case directory: its case.toml gives the inputs (options given here override them).")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress messages on standard error.")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Analyze again even if the inputs are unchanged since a previous run.")]
ProbeOpt = Annotated[bool, typer.Option("--probe", help="Let the agent run tensor probes on --dumps (and the weights in a --target model directory) to settle what training fed.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="Where probes run: auto (the GPU when there is one), cpu or cuda.")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", min=1, help="How many dump tokens probes read.")]

INPUT_OPTIONS = {
    "serving": ServingOpt, "serving_patch": ServingPatchOpt, "serving_args": ServingArgsOpt, "training": TrainingOpt, "training_patch": TrainingPatchOpt,
    "training_engine": TrainingEngineOpt, "dumps": DumpsOpt, "draft": DraftOpt, "target": TargetOpt,
}


@dataclasses.dataclass(frozen=True)
class Probing:
    """The probe options of a command: whether the agent may run probes, where, on how many tokens."""

    probe: bool = False
    device: str = "auto"
    max_tokens: int = 1024


PROBING_OPTIONS = {"probe": ProbeOpt, "device": DeviceOpt, "max_tokens": MaxTokensOpt}


def option_group(options: dict[str, object], into: str, defaults: Callable[[], object], build: Callable[[dict], object]) -> Callable[[Callable], Callable]:
    """A decorator giving a command a group of options declared once (`options`: name ->
    annotated type); the command receives them built into one value, as the parameter `into`."""
    default = defaults()

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command)
        hints = typing.get_type_hints(command, include_extras=True)  # a set __signature__ is not evaluated again: resolve here
        kept = [parameter.replace(annotation=hints[name]) for name, parameter in signature.parameters.items() if name != into]
        added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=getattr(default, name, None), annotation=annotation) for name, annotation in options.items()]
        where = next((index for index, parameter in enumerate(kept) if parameter.name in ("format", "output", "quiet", "debug", *PROBING_OPTIONS)), len(kept))

        @functools.wraps(command)
        def wrapper(*args: object, **kwargs: object) -> object:
            return command(*args, **{into: build({name: kwargs.pop(name, getattr(default, name, None)) for name in options})}, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=[*kept[:where], *added, *kept[where:]])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**{name: hint for name, hint in hints.items() if name != into}, **options}
        return wrapper

    return decorate


with_inputs = option_group(INPUT_OPTIONS, "given", lambda: None, lambda values: values)
with_probing = option_group(PROBING_OPTIONS, "probing", Probing, lambda values: Probing(**values))


EXIT_CODES = {Status.CONSISTENT: ExitCode.CONSISTENT, Status.MISMATCH: ExitCode.MISMATCH, Status.INCONCLUSIVE: ExitCode.INCONCLUSIVE}


def _absolute(key: str, value: str) -> str:
    """Paths given on the command line are relative to the working directory, not the case."""
    if key in ("serving", "training", "training_engine", "serving_args") and not Path(value).exists():
        return value  # a release (pkg==version), an installed package name, or launch flags
    return str(Path(value).resolve())


def _given_paths(given: dict[str, object]) -> dict[str, str]:
    """The input options given on the command line, paths made absolute."""
    return {key: _absolute(key, str(value)) for key, value in given.items() if value is not None}


def _fail(message: str, code: ExitCode) -> typer.Exit:
    typer.echo(f"rca: error: {message}", err=True)
    return typer.Exit(int(code))


@app.command("diagnose")
@with_inputs
@with_probing
def diagnose_command(
    given: dict[str, object],
    format: FormatOpt = "text",
    output: OutputOpt = None,
    case: CaseOpt = None,
    debug: DebugOpt = False,
    quiet: QuietOpt = False,
    no_cache: NoCacheOpt = False,
    probing: Probing = Probing(),
) -> None:
    """Resolve what training fed the draft and what serving feeds it, and explain the difference.

    Exit status: 0 consistent, 1 mismatch diagnosed, 2 bad input, 3 inconclusive, 4 internal error.
    """

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        inputs = dataclasses.replace(load_case(case).inputs if case is not None else Inputs(), **_given_paths(given))
        if inputs.serving is None and inputs.training is None:
            raise InputError("nothing to diagnose", fix="pass --serving and --training (sources), --draft and --target (configs), or --case DIR")
        probe_inputs = _probe_inputs(inputs, probing) if probing.probe else None
        diagnosis = _diagnosis(inputs, progress, use_cache=not (no_cache or debug or probing.probe), debug=debug, probing=probe_inputs)
        return diagnosis, int(EXIT_CODES[diagnosis.verdict.status])

    _run(work, RENDERERS, format, output, quiet, debug)


def _probe_inputs(inputs: Inputs, probing: Probing) -> ProbeInputs:
    if inputs.dumps is None:
        raise InputError("--probe reads the training dumps, but no --dumps was given", fix="pass --dumps DIR (and --target MODEL_DIR with the weights)")
    return ProbeInputs(inputs.path(inputs.dumps), inputs.path(inputs.target), probing.device, probing.max_tokens, inputs.base)


def _diagnosis(inputs: Inputs, progress: Callable[[str], None] | None, use_cache: bool, debug: bool, probing: ProbeInputs | None = None) -> Diagnosis:
    """The diagnosis of `inputs`: remembered from an earlier run on the same inputs, or computed
    (the analysis is imported only then; a remembered answer needs none of it)."""
    key = resultcache.result_key(inputs) if use_cache else None
    if key is not None:
        remembered = resultcache.load(key)
        if remembered is not None:
            if progress:
                progress("inputs unchanged since an earlier run: its diagnosis is reused (--no-cache analyzes again)")
            return remembered
    from .diagnose import diagnose

    run = diagnose(inputs, progress, parallel=not debug, probing=probing)
    if debug:
        for side in run.sides.values():
            for trace in side.debug:
                typer.echo(trace, err=True)
    if key is not None:
        resultcache.store(key, run.diagnosis)
    return run.diagnosis


RepoOpt = Annotated[Path, typer.Option("--repo", help="The git repository: a framework fork, or a deployment repo that vendors configs, patches and launch scripts.")]
ChangesFormatOpt = Annotated[str, typer.Option("--format", "-f", help="Output format: text, markdown (a pull-request comment), json or sarif (2.1.0).")]


def _repository_inputs(given: dict[str, object]) -> Inputs:
    """Context options as given: relative paths stay relative, to be looked up in the repository."""
    return Inputs(**{key: str(value) for key, value in given.items() if value is not None})


def _run(work: Callable[[Callable[[str], None] | None], tuple[object, int]], renderers: dict[str, Callable], format: str, output: Path | None, quiet: bool, debug: bool) -> None:
    """What the commands that write a report share: the format check, errors, the output, the exit status."""
    if format not in renderers:
        raise _fail(f"unknown format {format!r} (use {', '.join(renderers)})", ExitCode.BAD_INPUT)
    progress = _progress(quiet)

    def job() -> None:
        result, code = work(progress)
        text = renderers[format](result)
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text, encoding="utf-8")
            if progress:
                progress(f"wrote {output}")
        else:
            typer.echo(text, nl=False)
        raise typer.Exit(code)

    _guarded(job, debug)


def _progress(quiet: bool) -> Callable[[str], None] | None:
    return None if quiet else (lambda message: typer.echo(f"rca: {message}", err=True))


def _guarded(job: Callable[[], None], debug: bool) -> None:
    """Run a command's work: a domain error is one line with its exit status, anything else is ours."""
    try:
        job()
    except RcaError as error:
        raise _fail(str(error), error.exit_code) from None
    except typer.Exit:
        raise
    except Exception as error:  # noqa: BLE001 - anything else is our bug: say so, briefly
        if debug:
            raise
        raise _fail(f"internal error: {type(error).__name__}: {error} (rerun with --debug for the traceback, and please report it)", ExitCode.INTERNAL) from None


@app.command("diff")
@with_inputs
def diff_command(
    given: dict[str, object],
    rev_range: Annotated[Optional[str], typer.Argument(metavar="[REV_RANGE]", help="A..B, a single commit (against its parent), or nothing (the working tree against HEAD).")] = None,
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
    from .changes import diff
    from .report.changes import DIFF_RENDERERS
    from .revisions import Context, Repository

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        repository = Repository(repo)
        base, head = repository.range(rev_range)
        context = Context.of(repository, _repository_inputs(given), head if head.sha else base)
        change = diff(repository, context, base, head, progress)
        code = ExitCode.MISMATCH if change.effect == "introduces" else ExitCode.INCONCLUSIVE if change.effect == "inconclusive" else ExitCode.CONSISTENT
        return change, int(code)

    _run(work, DIFF_RENDERERS, format, output, quiet, debug)


@app.command("history")
@with_inputs
def history_command(
    given: dict[str, object],
    repo: RepoOpt = Path("."),
    since: Annotated[Optional[str], typer.Option("--since", help="Start after this revision (default: from the first commit).")] = None,
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
    from .changes import history
    from .report.changes import HISTORY_RENDERERS
    from .revisions import Context, Repository

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        repository = Repository(repo)
        head = repository.revision(until)
        start = repository.revision(since) if since else None
        return history(repository, Context.of(repository, _repository_inputs(given), head), start, head, progress), 0

    _run(work, HISTORY_RENDERERS, format, output, quiet, debug)


@app.command("explain")
def explain_command(hypothesis: Annotated[str, typer.Argument(help="A hypothesis id, e.g. embed-slot-added. Without one, lists them all.")] = "") -> None:
    """Print what a hypothesis means, what evidence bears on it, and its fix."""
    entries = catalog()
    if not hypothesis:
        width = max(len(key) for key in entries)
        for key, entry in entries.items():
            typer.echo(f"{key:{width}}  {entry.title}")
        return
    if hypothesis not in entries:
        raise _fail(f"unknown hypothesis {hypothesis!r} (known: {', '.join(entries)})", ExitCode.BAD_INPUT)
    typer.echo(entries[hypothesis].render())


@app.command("graph")
@with_inputs
def graph_command(
    given: dict[str, object],
    side: Annotated[str, typer.Option("--side", help="Whose dataflow graph: serving or training.")] = "serving",
    format: Annotated[str, typer.Option("--format", "-f", help="mermaid, dot or json (rca.graph/1).")] = "mermaid",
    output: OutputOpt = None,
    case: CaseOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Export the dataflow graph a side was resolved on: every statement and config key the ids flowed through, and the flows between them."""
    from .report.diagram import graph_dot, graph_json, graph_mermaid

    renderers: dict[str, Callable] = {"mermaid": graph_mermaid, "dot": graph_dot, "json": lambda graph: graph_json(graph, side)}
    if side not in ("serving", "training"):
        raise _fail(f"unknown side {side!r} (use serving or training)", ExitCode.BAD_INPUT)

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        from .diagnose import diagnose

        inputs = dataclasses.replace(load_case(case).inputs if case is not None else Inputs(), **_given_paths(given))
        if getattr(inputs, side) is None:
            raise InputError(f"no {side} source to draw", fix=f"pass --{side} (and --draft, --target), or --case DIR")
        run = diagnose(inputs, progress, parallel=False)
        ctx = run.sides[side].ctx
        assert ctx is not None
        return ctx.graph, 0

    _run(work, renderers, format, output, quiet, debug)


case_app = typer.Typer(help="Case directories: a diagnosis with its inputs, report, evidence and transcript, re-run as evidence arrives.", no_args_is_help=True)
app.add_typer(case_app, name="case")
CaseDirArg = Annotated[Path, typer.Argument(metavar="DIR", help="The case directory.")]


def _case_run(directory: Path, changed: dict[str, str], probing: Probing, quiet: bool, debug: bool) -> None:
    """Diagnose a case (with its remembered evidence), write its outputs, print the new transcript entry."""
    from .case import read_diagnosis, read_evidence, record_run, update_inputs
    from .diagnose import diagnose
    from .report.markdown import render as render_markdown

    case = load_case(directory)
    inputs = dataclasses.replace(case.inputs, **changed)
    previous = read_diagnosis(directory)
    remembered = read_evidence(directory)
    probe_inputs = _probe_inputs(inputs, probing) if probing.probe or (remembered and inputs.dumps) else None
    run = diagnose(inputs, _progress(quiet), parallel=not debug, probing=probe_inputs, remembered=remembered)
    if changed:  # only once the new inputs were read without error
        update_inputs(directory, changed)
    result = record_run(case, run.diagnosis, previous, changed, render_markdown)
    typer.echo(result.entry.rstrip("\n"))
    typer.echo(f"\nrca: wrote {directory / 'report.md'}, {directory / 'diagnosis.json'} and {directory / 'transcript.md'}", err=True)
    raise typer.Exit(int(EXIT_CODES[run.diagnosis.verdict.status]))


@case_app.command("new")
@with_inputs
@with_probing
def case_new_command(
    given: dict[str, object],
    directory: CaseDirArg,
    title: Annotated[Optional[str], typer.Option("--title", help="What the case is about (default: the directory name).")] = None,
    probing: Probing = Probing(),
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Create a case from the inputs of a diagnosis, and run it: case.toml, diagnosis.json, report.md, transcript.md."""
    from .case import create_case

    def job() -> None:
        inputs = Inputs(**_given_paths(given))
        if inputs.serving is None and inputs.training is None:
            raise InputError("nothing to diagnose", fix="pass --serving and --training (sources), --draft and --target (configs)")
        existed = directory.exists()
        create_case(directory, inputs, title or directory.name)
        try:
            _case_run(directory, {}, probing, quiet, debug)
        except RcaError:  # an input that cannot be read leaves no half-made case behind
            shutil.rmtree(directory)
            if existed:
                directory.mkdir()
            raise

    _guarded(job, debug)


@case_app.command("run")
@with_inputs
@with_probing
def case_run_command(
    given: dict[str, object],
    directory: CaseDirArg,
    probing: Probing = Probing(),
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run a case again: inputs given here replace the case's (new dumps, a patched source), earlier evidence is kept, and the transcript says what changed."""

    def job() -> None:
        changed = _given_paths(given)
        _case_run(directory, changed, probing, quiet, debug)

    _guarded(job, debug)


@case_app.command("show")
def case_show_command(directory: CaseDirArg, format: FormatOpt = "text", debug: DebugOpt = False) -> None:
    """Print a case's last diagnosis (without running it again)."""
    from .case import read_diagnosis

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        load_case(directory)
        diagnosis = read_diagnosis(directory)
        if diagnosis is None:
            raise InputError("the case has not been run (no readable diagnosis.json)", where=str(directory), fix=f"run it: rca case run {directory}")
        return diagnosis, int(EXIT_CODES[diagnosis.verdict.status])

    _run(work, RENDERERS, format, None, True, debug)


@case_app.command("check")
def case_check_command(
    directories: Annotated[Optional[list[Path]], typer.Argument(metavar="[DIR]...", help="Cases to check (default: every case under ./cases).")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="Output format: text or markdown (the table).")] = "text",
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run cases with expected verdicts and print a table: case, expected, got, rank of the expected root cause, time. Exit 1 on any miss."""
    from .case import CASE_FILE, check_case
    from .diagnose import diagnose

    def job() -> None:
        cases = directories or sorted(path for path in Path("cases").glob("*") if (path / CASE_FILE).is_file())
        if not cases:
            raise InputError("no cases to check", where="cases/", fix="pass case directories, or run where a cases/ directory is")
        progress = _progress(quiet)
        results = []
        for directory in cases:
            if progress:
                progress(f"checking {directory}")
            results.append(check_case(directory, lambda inputs: diagnose(inputs, parallel=not debug).diagnosis))
        typer.echo(_check_table(results, format))
        raise typer.Exit(int(ExitCode.MISMATCH) if any(not result.passed for result in results) else 0)

    _guarded(job, debug)


def _check_table(results: list, format: str) -> str:
    rows = [(r.name, r.expected, r.got, "-" if r.rank is None else str(r.rank), f"{r.seconds:.1f} s", "ok" if r.passed else "MISS") for r in results]
    header = ("case", "expected", "got", "rank", "time", "")
    passed = sum(result.passed for result in results)
    summary = f"{passed} of {len(results)} cases reach their expected verdict"
    misses = [f"{r.name}: {'; '.join(r.misses)}" for r in results if not r.passed]
    if format == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join([*lines, "", summary, *misses])
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join([*lines, "", summary, *misses])


probe_app = typer.Typer(help="Run one tensor probe on training dumps and print what it observed.", no_args_is_help=True)
app.add_typer(probe_app, name="probe")
ProbeDumpsOpt = Annotated[Path, typer.Option("--dumps", help="Directory (or file) of training hidden-state dumps: speculators data_*.pt or hs_*.safetensors, SpecForge *.ckpt[.gz], or safetensors.")]
ProbeTargetOpt = Annotated[Optional[Path], typer.Option("--target", help="The target's model directory (config.json and *.safetensors weights).")]
ProbeFormatOpt = Annotated[str, typer.Option("--format", "-f", help="Output format: text or json.")]


PROBE_RENDERERS: dict[str, Callable] = {
    "text": lambda observation: f"rca probe {observation.probe}: {observation.summary}\n",
    "json": lambda observation: json.dumps({"schema": f"rca.{observation.probe}/1", **observation.data, "summary": observation.summary}, indent=2) + "\n",
}


def _run_probe(name: str, dumps: Path, target: Path | None, device: str, max_tokens: int, format: str, output: Path | None, quiet: bool, debug: bool) -> None:
    from .analyzers import probes

    inputs = ProbeInputs(dumps.resolve(), target.resolve() if target else None, device, max_tokens, Path.cwd())
    probe = probes()[name]()

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        reason = probe.unavailable(inputs)
        if reason is not None:
            raise InputError(f"{name} cannot run: {reason}", fix="pass --dumps DIR and --target MODEL_DIR with the weights")
        return probe.run(inputs, progress), 0

    _run(work, PROBE_RENDERERS, format, output, quiet, debug)


@probe_app.command("shape")
def probe_shape_command(dumps: ProbeDumpsOpt, format: ProbeFormatOpt = "text", output: OutputOpt = None, quiet: QuietOpt = False, debug: DebugOpt = False) -> None:
    """How many slots the dumps hold, in which format (reads one file)."""
    _run_probe("dump-shape", dumps, None, "cpu", 1024, format, output, quiet, debug)


@probe_app.command("embedding")
def probe_embedding_command(dumps: ProbeDumpsOpt, target: ProbeTargetOpt = None, max_tokens: MaxTokensOpt = 1024, format: ProbeFormatOpt = "text", output: OutputOpt = None, quiet: QuietOpt = False, debug: DebugOpt = False) -> None:
    """Which dump slots equal embed_tokens[token_ids], reading only those rows of the checkpoint."""
    _run_probe("embedding-rows", dumps, target, "cpu", max_tokens, format, output, quiet, debug)


@probe_app.command("fingerprint")
def probe_fingerprint_command(dumps: ProbeDumpsOpt, target: ProbeTargetOpt = None, device: DeviceOpt = "auto", max_tokens: MaxTokensOpt = 1024, format: ProbeFormatOpt = "text", output: OutputOpt = None, quiet: QuietOpt = False, debug: DebugOpt = False) -> None:
    """Name each dump slot's tap by running the target on the dump's tokens (cosine against h0..hN, hN+norm)."""
    _run_probe("fingerprint", dumps, target, device, max_tokens, format, output, quiet, debug)


@probe_app.command("acceptance")
def probe_acceptance_command(
    dumps: ProbeDumpsOpt,
    target: ProbeTargetOpt = None,
    wiring: Annotated[Optional[list[str]], typer.Option("--wiring", help="A wiring to measure, as comma-separated taps (h0,h3,h31); repeat for several (what serving feeds, a candidate fix).")] = None,
    draft: Annotated[Optional[Path], typer.Option("--draft", help="The draft checkpoint to measure (config.json and *.safetensors, speculators' Eagle3 layout); without it a surrogate head is trained on the dumps.")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Training steps of the surrogate draft head.")] = 1000,
    device: DeviceOpt = "auto",
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=16, help="How many dump tokens to train and measure on.")] = 32768,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Measure first-token acceptance under each --wiring (what a mismatch costs): of the --draft checkpoint, or of a surrogate head trained on the dumps."""
    from .acceptance import measure_acceptance

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        if target is None:
            raise InputError("the acceptance probe runs the target", fix="pass --target MODEL_DIR with the weights")
        wirings = [tuple(tap.strip() for tap in item.split(",") if tap.strip()) for item in wiring or ()]
        return measure_acceptance(dumps.resolve(), target.resolve(), wirings, device, max_tokens, steps, base=Path.cwd(), progress=progress, draft=draft.resolve() if draft else None), 0

    renderers = {"text": lambda report: f"rca probe acceptance: {report.summary}\n", "json": lambda report: json.dumps(report.to_json(), indent=2) + "\n"}
    _run(work, renderers, format, output, quiet, debug)


@probe_app.command("compare")
def probe_compare_command(
    capture: Annotated[Path, typer.Option("--capture", help="What rca capture wrote: its directory or one capture_r<rank>_<n>.safetensors file.")],
    dumps: Annotated[Optional[Path], typer.Option("--dumps", help="Training dumps; without --target the capture must replay one of their prompts.")] = None,
    target: ProbeTargetOpt = None,
    device: DeviceOpt = "auto",
    max_tokens: MaxTokensOpt = 1024,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Match the slots serving fed the draft (a capture) to the training slots or the target's taps: the shift or permutation, and whether TP ranks agree."""
    from .compare import compare

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        return compare(capture.resolve(), dumps.resolve() if dumps else None, target.resolve() if target else None, device, max_tokens, Path.cwd(), progress), 0

    renderers = {
        "text": lambda result: f"rca probe compare: {result.summary}\n" + (f"  tensor-parallel ranks: {result.ranks['summary']}\n" if result.ranks else ""),
        "json": lambda result: json.dumps(result.to_json(), indent=2) + "\n",
    }
    _run(work, renderers, format, output, quiet, debug)


@app.command("capture", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def capture_command(
    ctx: typer.Context,
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory for the capture files.")] = Path("rca-capture"),
    requests: Annotated[int, typer.Option("--requests", min=1, help="How many draft inputs to save per process.")] = 4,
    min_tokens: Annotated[int, typer.Option("--min-tokens", min=1, help="Save only batches of at least this many tokens (prefills).")] = 8,
) -> None:
    """Run a serving engine's launch command (after --) with a hook that saves what the EAGLE-3 draft receives.

    Example: rca capture --output cap -- python -m sglang.launch_server --model-path ... --speculative-algorithm EAGLE3 ...
    then send a request, stop the server, and run rca probe compare --capture cap --dumps DUMPS (or --target MODEL_DIR).
    """
    from .capture import run_capture

    try:
        status, files = run_capture(list(ctx.args), output, requests, min_tokens)
    except RcaError as error:
        raise _fail(str(error), error.exit_code) from None
    if files:
        typer.echo(f"rca: captured {len(files)} draft input(s) in {output}: {', '.join(file.name for file in files)}", err=True)
    else:
        typer.echo(f"rca: nothing captured in {output}: send the server a prompt of at least {min_tokens} tokens before stopping it (the draft model must be an EAGLE-3 module of SGLang or vLLM)", err=True)
    raise typer.Exit(status)


def main() -> None:
    """The console entry point. It leaves without tearing down the interpreter: freeing the
    syntax trees of a large release one object at a time takes longer than some analyses."""
    try:
        app()
        code: object = 0
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:
        typer.echo("rca: interrupted", err=True)
        code = 130
    if isinstance(code, str):
        typer.echo(code, err=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0)
