"""The `rca` command line: a thin layer over the typed core, one module per command group.

`options` declares the shared options once, `runner` holds what every command does around its
work (errors, progress, output, exit status); the commands are registered here, in help order.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:  # typer vendors click from 0.20 on; before, it used click itself
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - older typer
    from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

from rca.caller import OutputError, guarded_output, said, working_directory_error
from rca.cli import cache, case, diagnose, history, probe, server
from rca.errors import ExitCode
from rca.static import filecache

HELP = ("-h", "--help")


class _Commands(TyperGroup):
    """The command tree, with the conventions of the tools people know: a usage error is one line
    with the fix (not a boxed panel), and an interrupt is one line with status 130."""

    def main(  # type: ignore[override]  # click's keyword parameters pass through **extra
        self,
        args: Any = None,
        prog_name: Any = None,
        complete_var: Any = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as error:
            command = " ".join(["rca", *error.ctx.command_path.split()[1:]]) if error.ctx is not None else "rca"
            typer.echo(f"rca: error: {error.format_message()} (fix: see {command} --help)", err=True)
            result = int(ExitCode.BAD_INPUT)
        except ClickException as error:
            typer.echo(f"rca: error: {error.format_message()}", err=True)
            result = error.exit_code
        except (typer.Abort, KeyboardInterrupt):
            typer.echo("rca: interrupted", err=True)
            result = 130
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) else 0)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version  # 35 ms: only when asked

        try:
            installed = version("rca")
        except PackageNotFoundError:  # run from a source tree
            installed = "unknown"
        typer.echo(f"rca {installed}")
        raise typer.Exit()


app = typer.Typer(
    cls=_Commands,
    help="Find out why an EAGLE-3 draft accepts so few tokens: what serving feeds it, what training fed it, and "
    "where in the code they differ.",
    context_settings={"help_option_names": list(HELP)},
    pretty_exceptions_show_locals=False,
)


@app.callback(invoke_without_command=True)
def _root(
    context: typer.Context,
    show_version: Annotated[
        bool, typer.Option("--version", "-V", is_eager=True, callback=_version, help="Print rca's version and exit.")
    ] = False,
) -> None:
    """Find out why an EAGLE-3 draft accepts so few tokens: what serving feeds it, what training fed it, and
    where in the code they differ."""
    if context.invoked_subcommand is None:  # `rca` alone: what it can do
        typer.echo(context.get_help())
        raise typer.Exit()


app.command("diagnose", context_settings={"allow_extra_args": True}, options_metavar="[OPTIONS] [-- LAUNCH...]")(
    diagnose.diagnose_command
)
app.command("diff")(history.diff_command)
app.command("history")(history.history_command)
app.command("explain")(diagnose.explain_command)
app.command("graph", context_settings={"allow_extra_args": True}, options_metavar="[OPTIONS] [-- LAUNCH...]")(
    diagnose.graph_command
)
app.add_typer(case.app, name="case")
app.add_typer(probe.app, name="probe")
probe.app.command("served", context_settings={"allow_extra_args": True})(probe.probe_served_command)
app.command("capture", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    probe.capture_command
)
app.add_typer(cache.app, name="cache")
app.add_typer(server.app, name="server")


@functools.cache
def command() -> Any:
    """The click command typer builds from `app`, once per process; a flag's help shows no value
    type (typer would write `<bool>` after every switch, which takes no value)."""
    built = typer.main.get_command(app)

    def untyped(option: Any) -> Any:
        if getattr(option, "is_flag", False) and option.metavar is None:
            option.metavar = ""
        return option

    def untyped_flags(node: Any) -> None:
        for parameter in node.params:
            untyped(parameter)
        help_option = node.get_help_option  # made when help is asked for
        node.get_help_option = lambda context, made=help_option: untyped(made(context))
        for child in getattr(node, "commands", {}).values():
            untyped_flags(child)

    untyped_flags(built)
    return built


def prepare() -> None:
    """Build the command tree and every parameter's converter now, as the rca server does before
    it forks a copy per command: typer builds them on first use (with pydantic, imported then),
    about a tenth of a second of every command otherwise."""

    def converters(node: Any) -> None:
        for parameter in node.params:
            if hasattr(parameter, "get_runtime_param"):  # typer's own parameters (0.2x): built lazily
                parameter.get_runtime_param()
        for child in getattr(node, "commands", {}).values():
            converters(child)

    converters(command())


def run(argv: list[str]) -> int:
    """Run the command line `argv` (without the program name) and return its exit status, having
    flushed its output. Libraries' warnings are not shown beside rca's own messages. A working
    directory deleted under rca and an output that cannot be written are one line each, status 2."""
    warnings.filterwarnings("ignore")
    filecache.background = True  # the analysis cache is written after the answer, by a process of its own
    gone = working_directory_error()
    if gone is not None:
        return said(gone)
    sys.stdout = guarded_output(sys.stdout)
    if argv[:1] == ["diagnose"] and "rca.diagnose" not in sys.modules:  # a fresh process, with the imports to do
        diagnose.search_ahead_of(argv[1:])
    try:
        command()(args=argv, prog_name="rca")
        code: object = 0
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:
        typer.echo("rca: interrupted", err=True)
        code = 130
    except OutputError as lost:  # from a command that prints its answer itself (explain, history, ...)
        code = said(lost)
    if isinstance(code, str):
        typer.echo(code, err=True)
        code = 1
    try:
        sys.stdout.flush()
    except OutputError as lost:  # the answer's last bytes, written only now
        code = said(lost)
    with contextlib.suppress(OSError, AttributeError):  # closed (None to Python), or full: nothing can be said
        sys.stderr.flush()
    return code if isinstance(code, int) else 0
