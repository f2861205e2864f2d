"""`python -m rca`, the same as the `rca` command."""

from rca.cli import main

main()
