"""`rca server [status|stop]`: the warm rca that runs the next commands (see rca.server)."""

from __future__ import annotations

import json

import typer

from rca.cli.options import JsonOpt

app = typer.Typer(
    help="The rca server that runs commands without starting Python and importing rca again: whether one "
    "is running, and stopping it (RCA_SERVER=off runs every command in its own process).",
    invoke_without_command=True,
)


def _status(as_json: bool) -> None:
    from rca import server

    if not server.enabled():
        answer = None
        state = "off (RCA_SERVER=off, or a system without fork)"
    else:
        answer = server.request({"status": True})
        state = "running" if answer is not None else "not running (the next command starts one)"
    if as_json:
        typer.echo(json.dumps({"running": answer is not None, "server": answer}, indent=2))
        return
    typer.echo(f"rca server: {state}")
    if answer is not None:
        typer.echo(f"  process {answer['pid']}, at {answer['address']}")
        typer.echo(
            f"  up {answer['up_seconds']:.0f} s, {answer['commands']} commands run; it leaves after "
            f"{answer['idle_limit_seconds']:.0f} s without one (RCA_SERVER_IDLE)"
        )


@app.callback()
def server_command(
    context: typer.Context,
    as_json: JsonOpt = False,
) -> None:
    """Show whether an rca server is running for this rca, and where (the default)."""
    if context.invoked_subcommand is None:
        _status(as_json)


@app.command("status")
def status_command(as_json: JsonOpt = False) -> None:
    """Show whether an rca server is running for this rca, and where."""
    _status(as_json)


@app.command("stop")
def stop_command() -> None:
    """Stop the rca server of this rca (the commands it is running go on)."""
    from rca import server

    answer = server.request({"stop": True}) if server.enabled() else None
    typer.echo(f"stopped the rca server (process {answer['stopped']})" if answer else "no rca server was running")
