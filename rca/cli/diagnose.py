"""`rca diagnose`, `rca explain` and `rca graph`: one deployment, its hypotheses, its dataflow graph."""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from rca.cases.casefile import load_case
from rca.cli.options import (
    CaseOpt,
    DebugOpt,
    FormatOpt,
    NoCacheOpt,
    OfflineOpt,
    OutputOpt,
    Probing,
    QuietOpt,
    Serve,
    ServingOpt,
    TrainingOpt,
    given_paths,
    with_inputs,
    with_probing,
    with_serve,
)
from rca.cli.runner import EXIT_CODES, diagnosis_of, fail, probe_inputs_of, run_report, serve_with_of
from rca.errors import ExitCode, InputError, RcaError
from rca.inputs import Inputs
from rca.inputs.launchline import complete
from rca.inputs.sources import search_ahead
from rca.knowledge import CatalogError, catalog
from rca.report import RENDERERS


def search_ahead_of(argv: list[str]) -> None:
    """For a `diagnose` command line run in a fresh process: start the text searches on the trees it
    names (`--serving`, `--training`, or its case's) before the command line is parsed, which
    alone takes a tenth of a second of the time the searches have while the analysis is imported
    (`sources.search_ahead`). The option names are those declared; a value that names nothing is
    left for the command to report."""
    names = {"serving": ServingOpt, "training": TrainingOpt, "case": CaseOpt, "no_cache": NoCacheOpt}
    flags = {flag: name for name, option in names.items() for flag in _flags(option)}
    given: dict[str, str] = {}
    for position, word in enumerate(argv):
        flag, equals, value = word.partition("=")
        if flag in flags:
            if not equals and position + 1 < len(argv):
                value = argv[position + 1]
            given.setdefault(flags[flag], value)
    if "no_cache" in given:
        return  # no analysis cache to search into
    case = None
    if "case" in given:
        with contextlib.suppress(RcaError, OSError, ValueError):
            case = load_case(Path(given["case"])).inputs
    for side in ("serving", "training"):
        if given.get(side):  # given beside a case, it wins, as it does for the command
            search_ahead([(side, given[side])], None)
        elif case is not None:
            search_ahead([(side, getattr(case, side))], case.base)


def _flags(option: object) -> list[str]:
    """The long flags an option is declared with."""
    info = typing.get_args(option)[1]
    return [name for name in (info.default, *info.param_decls) if isinstance(name, str) and name.startswith("--")]


@with_inputs
@with_probing
@with_serve
def diagnose_command(
    ctx: typer.Context,
    given: dict[str, object],
    format: FormatOpt = "text",
    output: OutputOpt = None,
    case: CaseOpt = None,
    debug: DebugOpt = False,
    quiet: QuietOpt = False,
    no_cache: NoCacheOpt = False,
    offline: OfflineOpt = False,
    probing: Probing = Probing(),
    serve: Serve = Serve(),
) -> None:
    """Resolve what training fed the draft and what serving feeds it, and explain the difference. The
    launch that serves the draft, after --, says the engine, its release, the target and the draft
    (`rca diagnose -- vllm serve ORG/TARGET --speculative-config '{...}'`). With --serve-with, also
    serve the draft as given and with the proposed fix, and measure both.

    Exit status: 0 consistent, 1 mismatch diagnosed, 2 bad input, 3 inconclusive, 4 internal error.
    """

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        loaded = load_case(case) if case is not None else None
        inputs = (loaded.inputs if loaded is not None else Inputs()).with_values(given_paths(given))
        inputs, launch = complete(
            inputs, list(ctx.args), serve_with=serve.serve_with, no_network=offline, progress=progress
        )
        if launch is not None and progress:
            progress(launch.summary())
        if inputs.serving is None and inputs.training is None:
            raise InputError(
                "nothing to diagnose",
                fix="pass the launch after -- (rca diagnose -- vllm serve ...), --serving and --training (sources) "
                "with --draft and --target, or --case DIR",
            )
        engine = serve_with_of(serve, list(ctx.args), inputs, loaded)  # bad prompts are said before the analysis
        probe_inputs = probe_inputs_of(inputs, probing) if probing.wanted else None
        diagnosis = diagnosis_of(
            inputs,
            progress,
            use_cache=not (no_cache or debug or probing.wanted),
            debug=debug,
            probing=probe_inputs,
            analysis_cache=not no_cache,
        )
        if engine is not None:
            from rca.evidence.engine.verify import with_engine_check

            diagnosis = with_engine_check(diagnosis, inputs.path(inputs.draft), engine, progress)
        if launch is not None:
            diagnosis = dataclasses.replace(diagnosis, launch=launch.to_json())
        return diagnosis, int(EXIT_CODES[diagnosis.verdict.status])

    run_report(work, RENDERERS, format, output, quiet, debug)


def explain_command(
    hypothesis: Annotated[
        str, typer.Argument(help="A hypothesis id, e.g. embed-slot-added. Without one, lists them all.")
    ] = "",
) -> None:
    """Print what a hypothesis means, what evidence bears on it, and its fix."""
    try:
        entries = catalog()
    except CatalogError as error:  # a catalog file edited wrong: one line, naming it
        raise fail(str(error), error.exit_code) from None
    if not hypothesis:
        width = max(len(key) for key in entries)
        for key, entry in entries.items():
            typer.echo(f"{key:{width}}  {entry.title}")
        return
    if hypothesis not in entries:
        raise fail(f"unknown hypothesis {hypothesis!r} (fix: name one of {', '.join(entries)})", ExitCode.BAD_INPUT)
    typer.echo(entries[hypothesis].render())


@with_inputs
def graph_command(
    ctx: typer.Context,
    given: dict[str, object],
    side: Annotated[str, typer.Option("--side", help="Whose dataflow graph: serving or training.")] = "serving",
    format: Annotated[
        str, typer.Option("--format", "-f", help="mermaid, dot, json (rca.graph/1) or graphml.")
    ] = "mermaid",
    output: OutputOpt = None,
    case: CaseOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Export the dataflow graph a side was resolved on: every statement and config key the ids flowed through,
    and the flows between them. The launch that serves the draft may follow --, as for rca diagnose."""
    from rca.report.diagram import graph_dot, graph_graphml, graph_json, graph_mermaid

    renderers: dict[str, Callable] = {
        "mermaid": graph_mermaid,
        "dot": graph_dot,
        "json": lambda graph: graph_json(graph, side),
        "graphml": graph_graphml,
    }
    if side not in ("serving", "training"):
        raise fail(f"unknown side {side!r} (fix: use serving or training)", ExitCode.BAD_INPUT)

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        from rca.diagnose import diagnose

        inputs = (load_case(case).inputs if case is not None else Inputs()).with_values(given_paths(given))
        inputs, launch = complete(inputs, list(ctx.args), progress=progress)
        if launch is not None and progress:
            progress(launch.summary())
        if getattr(inputs, side) is None:
            raise InputError(f"no {side} source to draw", fix=f"pass --{side} (and --draft, --target), or --case DIR")
        run = diagnose(inputs, progress, parallel=False)
        analyzed = run.sides[side].ctx
        assert analyzed is not None
        return analyzed.graph, 0

    run_report(work, renderers, format, output, quiet, debug)
