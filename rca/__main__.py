"""`python -m rca`, the same as the `rca` command.

`rca --version` is answered here, before the command line (typer and every command's module) is
imported: it is what scripts and shells ask most often, and it should cost no more than starting
Python.
"""

import sys


def main() -> None:
    if sys.argv[1:] in (["--version"], ["-V"]):
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("rca")
        except PackageNotFoundError:  # run from a source tree
            installed = "unknown"
        sys.stdout.write(f"rca {installed}\n")
        sys.stdout.flush()
        return
    from rca.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()
