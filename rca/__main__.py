"""`python -m rca`, the same as the `rca` command."""

from .cli import main

main()
