"""`rca cache [show|clear]`: what rca keeps between runs besides the releases it downloaded."""

from __future__ import annotations

import json

import typer

from rca.cli.options import JsonOpt

app = typer.Typer(
    help="The analysis cache and the remembered diagnoses: where they are, how large, and clearing them "
    "(downloaded releases are kept).",
    invoke_without_command=True,
)


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _show(as_json: bool) -> None:
    from rca.cases import resultcache
    from rca.inputs.files import cache_dir
    from rca.static import filecache

    analysis = filecache.summary()
    results = resultcache.summary()
    if as_json:
        typer.echo(
            json.dumps({"analysis": analysis, "results": results, "releases": str(cache_dir() / "src")}, indent=2)
        )
        return
    if analysis["location"] is None:
        typer.echo("analysis cache: off (RCA_ANALYSIS_CACHE=off)")
    else:
        typer.echo(f"analysis cache: {analysis['location']}")
        limit = _size(analysis["limit_bytes"])
        typer.echo(
            f"  {analysis['entries']} entries, {_size(analysis['bytes'])} (kept under {limit}; RCA_ANALYSIS_CACHE_MB)"
        )
    typer.echo(f"remembered diagnoses: {results['location']}")
    typer.echo(f"  {results['entries']} entries, {_size(results['bytes'])}")
    typer.echo(f"releases (kept by rca cache clear): {cache_dir() / 'src'}")


@app.callback()
def cache_command(
    context: typer.Context,
    as_json: JsonOpt = False,
) -> None:
    """Show the analysis cache (what rca derived from source files: parses, line ranges, text searches)
    and the remembered diagnoses: location, entries and size."""
    if context.invoked_subcommand is None:
        _show(as_json)


@app.command("show")
def show_command(as_json: JsonOpt = False) -> None:
    """Show the caches' location, entries and size (the default)."""
    _show(as_json)


@app.command("clear")
def clear_command() -> None:
    """Delete the analysis cache and the remembered diagnoses: only what rca wrote there (downloaded
    releases are kept)."""
    from rca.cases import resultcache
    from rca.static import filecache

    removed = filecache.clear()
    forgotten = resultcache.clear()
    typer.echo(f"cleared {removed} analysis entries and {forgotten} remembered diagnoses")
