"""What the commands share around their work: the format check, progress, one-line errors with the
documented exit status, the output file, and the remembered diagnosis of unchanged inputs."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer

from rca.cases import resultcache
from rca.cli.options import DUMP_PROMPT_LENGTH, Probing, Serve
from rca.errors import ExitCode, InputError, RcaError
from rca.evidence.probes import ProbeInputs
from rca.inputs import Inputs
from rca.inputs.files import resolved
from rca.inputs.sources import search_ahead
from rca.model import Diagnosis, Status

Progress = Callable[[str], None]

# The exit status of a verdict (errors have their own, in ExitCode).
EXIT_CODES = {
    Status.CONSISTENT: ExitCode.CONSISTENT,
    Status.MISMATCH: ExitCode.MISMATCH,
    Status.INCONCLUSIVE: ExitCode.INCONCLUSIVE,
}


def fail(message: str, code: ExitCode) -> typer.Exit:
    typer.echo(f"rca: error: {message}", err=True)
    return typer.Exit(int(code))


def probe_inputs_of(inputs: Inputs, probing: Probing) -> ProbeInputs:
    if inputs.dumps is None and inputs.parent_draft is None and probing.capture is None:
        raise InputError(
            "--probe reads the training dumps, but no --dumps was given",
            fix="pass --dumps DIR (and --target MODEL_DIR with the weights), or --capture DIR",
        )
    if probing.capture is not None and not probing.capture.exists():
        raise InputError(
            "no such capture", where=str(probing.capture), fix="pass the directory rca capture --output wrote"
        )
    return ProbeInputs(
        inputs.path(inputs.dumps),
        inputs.path(inputs.target),
        probing.device,
        probing.max_tokens,
        inputs.base,
        inputs.path(inputs.draft),
        inputs.path(inputs.parent_draft),
        capture=resolved(probing.capture) if probing.capture is not None else None,
    )


def serve_with_of(serve: Serve, command: list[str], inputs: Inputs, case: Any = None) -> Any:
    """How to serve the draft for `--serve-with` (rca.evidence.engine.verify.ServeWith): the launch
    command after -- or the case's, its prompts (given, the case's, else the dumps' tokens); None
    when the engine is not asked for."""
    if not serve.serve_with:
        return None
    from rca.evidence.engine.served import prompts_from_dumps, read_prompts
    from rca.evidence.engine.verify import ServeWith

    recorded = getattr(case, "serve", None)
    launch = command or (recorded.launch(inputs) if recorded is not None else [])
    if not launch:
        raise InputError(
            "--serve-with needs the launch command that serves the draft",
            fix="put it after --, e.g. --serve-with -- vllm serve TARGET --speculative-config '{...}', or record one "
            "in the case's [serve] table",
        )
    requests = serve.serve_requests if recorded is None or recorded.requests is None else recorded.requests
    tokens = serve.serve_max_new_tokens
    if recorded is not None and recorded.max_new_tokens is not None:
        tokens = recorded.max_new_tokens
    prompts_file = serve.serve_prompts or (recorded.prompts if recorded is not None else None)
    dumps = inputs.path(inputs.dumps)
    if prompts_file is not None:
        prompts = read_prompts(prompts_file, requests, tokens, inputs.base)
    elif dumps is not None:
        prompts = prompts_from_dumps(dumps, requests, DUMP_PROMPT_LENGTH, tokens, inputs.base)
    else:
        raise InputError(
            "--serve-with needs prompts to send", fix="pass --serve-prompts FILE, or --dumps (their tokens are sent)"
        )
    return ServeWith(tuple(launch), prompts, serve.serve_url or (recorded.url if recorded is not None else None))


def diagnosis_of(
    inputs: Inputs,
    progress: Callable[[str], None] | None,
    use_cache: bool,
    debug: bool,
    probing: ProbeInputs | None = None,
    analysis_cache: bool = True,
) -> Diagnosis:
    """The diagnosis of `inputs`: remembered from an earlier run on the same inputs, or computed
    (the analysis is imported only then; a remembered answer needs none of it). Without
    `analysis_cache`, nothing derived from the sources is read from or kept in the analysis cache."""
    key = resultcache.result_key(inputs) if use_cache else None
    if key is not None:
        remembered = resultcache.load(key)
        if remembered is not None:
            if progress:
                progress("inputs unchanged since an earlier run: its diagnosis is reused (--no-cache analyzes again)")
            return remembered
    from rca.static import filecache

    with filecache.turned_off(not analysis_cache):
        if "rca.diagnose" not in sys.modules:  # its imports to come: the text searches start meanwhile
            search_ahead((("serving", inputs.serving), ("training", inputs.training)), inputs.base)
        from rca.diagnose import diagnose

        run = diagnose(inputs, progress, parallel=not debug, probing=probing)
    if debug:
        for side in run.sides.values():
            for trace in side.debug:
                typer.echo(trace, err=True)
    if key is not None:
        resultcache.store(key, run.diagnosis)
    return run.diagnosis


_WRITABLE = "pass --output a file path in a directory you can write to"


def writable(output: Path) -> None:
    """Refuse an --output that names a directory or cannot be created, before any work is done."""
    if output.is_dir():
        raise InputError("--output names a directory, not a file", where=str(output), fix=_WRITABLE)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(
            f"cannot create the directory of --output ({error.strerror})", where=str(output), fix=_WRITABLE
        ) from None
    if not os.access(output.parent, os.W_OK) or (output.exists() and not os.access(output, os.W_OK)):
        raise InputError("--output cannot be written", where=str(output), fix=_WRITABLE)


def run_report(
    work: Callable[[Callable[[str], None] | None], tuple[object, int]],
    renderers: Mapping[str, Callable],
    format: str,
    output: Path | None,
    quiet: bool,
    debug: bool,
) -> None:
    """What the commands that write a report share: the format check, errors, the output, the exit status."""
    if format not in renderers:
        raise fail(f"unknown format {format!r} (fix: use one of {', '.join(renderers)})", ExitCode.BAD_INPUT)
    progress = progress_printer(quiet)

    def job() -> None:
        if output is not None:
            writable(output)  # before the work, which may take minutes
        result, code = work(progress)
        text = renderers[format](result)
        if output is not None:
            try:
                output.write_text(text, encoding="utf-8")
            except OSError as error:
                raise InputError(
                    f"cannot write the report ({error.strerror})", where=str(output), fix=_WRITABLE
                ) from None
            if progress:
                progress(f"wrote {output}")
        else:
            typer.echo(text, nl=False)
        raise typer.Exit(code)

    guarded(job, debug)


def progress_printer(quiet: bool) -> Callable[[str], None] | None:
    return None if quiet else (lambda message: typer.echo(f"rca: {message}", err=True))


def guarded(job: Callable[[], None], debug: bool) -> None:
    """Run a command's work: a domain error is one line with its exit status, anything else is ours."""
    try:
        job()
    except RcaError as error:
        raise fail(str(error), error.exit_code) from None
    except typer.Exit:
        raise
    except Exception as error:
        if debug:
            raise
        raise fail(
            f"internal error: {type(error).__name__}: {error} (rerun with --debug for the traceback, and please "
            f"report it)",
            ExitCode.INTERNAL,
        ) from None
