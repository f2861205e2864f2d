"""The rca server's process, `python -m rca.cli.warm ADDRESS` (started by `rca.server`): what
commands import, imported once, then the server loop."""

import sys
from pathlib import Path

from rca.cli import run
from rca.diagnose import diagnose  # noqa: F401  (imported for the commands the server runs)
from rca.server import serve
from rca.static.analyzer import registry

if __name__ == "__main__" and len(sys.argv) == 2:
    registry()  # every analyzer
    serve(Path(sys.argv[1]), run)
