"""The `rca` command line: a thin layer over the typed core, one module per command group.

`options` declares the shared options once, `runner` holds what every command does around its
work (errors, progress, output, exit status); the commands are registered here, in help order.
"""

from __future__ import annotations

import os
import sys

import typer

from rca.cli import case, diagnose, history, probe

app = typer.Typer(
    help="Find out why an EAGLE-3 draft accepts so few tokens: what serving feeds it, what training fed it, and "
    "where in the code they differ.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

app.command("diagnose")(diagnose.diagnose_command)
app.command("diff")(history.diff_command)
app.command("history")(history.history_command)
app.command("explain")(diagnose.explain_command)
app.command("graph")(diagnose.graph_command)
app.add_typer(case.app, name="case")
app.add_typer(probe.app, name="probe")
app.command("capture", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    probe.capture_command
)


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
