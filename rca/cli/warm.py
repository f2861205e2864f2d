"""The rca server's process, `python -m rca.cli.warm ADDRESS` (started by `rca.server`): what
commands import, imported once, then the server loop."""

import json
import sys
from pathlib import Path

from rca.cli import prepare, run
from rca.diagnose import diagnose  # noqa: F401  (imported for the commands the server runs)
from rca.server import serve
from rca.static.analyzer import registry

if __name__ == "__main__" and len(sys.argv) == 2:
    try:  # the parses of the command that started the server: held for the next
        hold = json.loads(sys.stdin.read() or "{}")
    except ValueError:
        hold = {}
    registry()  # every analyzer
    prepare()  # the command line's parser
    serve(Path(sys.argv[1]), run, hold if isinstance(hold, dict) else {})
