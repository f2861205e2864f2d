"""`python -m rca`, the same as the `rca` command.

`rca --version` is answered here, before the command line (typer and every command's module) is
imported: it is what scripts and shells ask most often, and it should cost no more than starting
Python. Every other command is handed to the rca server when one is running (`rca.server`: the
imports are done there already), else run here, leaving a server behind for the next one.
"""

import os
import sys


def main() -> None:
    """The console entry point. It leaves without tearing down the interpreter: freeing the syntax
    trees of a large release one object at a time takes longer than some analyses."""
    from rca.caller import OutputError, guarded_output, hold_closed_descriptors, said

    hold_closed_descriptors()  # before any file or socket is opened
    argv = sys.argv[1:]
    if argv in (["--version"], ["-V"]):
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("rca")
        except PackageNotFoundError:  # run from a source tree
            installed = "unknown"
        output = guarded_output(sys.stdout)
        try:
            output.write(f"rca {installed}\n")
            output.flush()
        except OutputError as lost:
            os._exit(said(lost))
        return
    from rca import server

    served = server.enabled() and argv[:1] != ["server"]  # `rca server` itself talks to it
    code = server.forward(argv) if served else None
    if code is None:
        from rca.cli import run

        code = run(argv)
        if served:
            server.start_detached()
    os._exit(code)


if __name__ == "__main__":
    main()
