"""Start a new analyzer: `python scripts/new_analyzer.py FAMILY NAME [--hypothesis ID] [--severity S]`.

Writes `analyzers/FAMILY/NAME.py` (NAME in kebab case, the file in snake case) with the next free
code of the family, a class against `rca.sdk` and empty examples for you to fill in, and, where
the hypothesis it reports is new, `knowledge/hypotheses/ID.toml` for a break of the contract.
Nothing existing is overwritten. Then follow docs/adding-an-analyzer.md: write `run`, the
examples, the docstring, and regenerate the docs (`python scripts/document.py`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rca.model import Severity  # noqa: E402
from rca.static.analyzer import FAMILIES, registry  # noqa: E402

SIDES = {"training_capture": "training", "across": "serving, training"}  # the others read the serving side
_KEBAB = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")

ANALYZER = '''"""{summary}"""

from __future__ import annotations

from collections.abc import Iterator

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Reports, Severity, SideContext


class {cls}(Analyzer):
    """{summary}

    ## What it reads
    Which config keys and which code it reads, on which side.

    ## Why it matters
    What the draft sees when served that it did not see in training, and what that does to acceptance.
    """

    code = "{code}"
    name = "{name}"
    sides = frozenset({{{sides}}})
    compares = Compares(
        training="the fact that stands for what the draft learned in training",
        serving="the fact that stands for what serving gives it",
    )
    reports = (Reports("{finding}", hypothesis="{hypothesis}", severity=Severity.{severity}),)
    VALID = ()  # at least one: a draft served as it was trained, reported by no finding
    INVALID = ()  # one per finding: Example(..., finding="{finding}", message=..., path=..., key=(...))

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        return iter(())
'''

HYPOTHESIS = '''id = "{hypothesis}"
title = "What serving gives the draft, unlike what it was trained on"
prior = 0.02
scope = "contract"
generator = "contract"
summary = """
What differs between training and serving, and where each side decides it."""
why = "What it does to acceptance, and why nothing reports it."
evidence_for = ["what the finding shows"]
evidence_against = ["what a draft served as trained shows"]
fix = "What the user changes, in which file."
references = ["https://a public report or the engine's code that shows it"]
'''


def next_code(prefix: str) -> str:
    """The family's next code: above every code it gave, now or formerly (codes are never reused)."""
    given = [
        int(code[len(prefix) :])
        for analyzer in registry().analyzers
        for code in (analyzer.code, *analyzer.formerly)
        if code.startswith(prefix)
    ]
    return f"{prefix}{max(given, default=100) + 1}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("name", help="kebab case, naming what it checks (draft-dtype)")
    parser.add_argument("--hypothesis", help="the catalog hypothesis its finding is evidence for (default: NAME)")
    parser.add_argument("--severity", choices=[severity.value for severity in Severity], default="cause")
    args = parser.parse_args(argv)
    if not _KEBAB.match(args.name):
        parser.error(f"{args.name!r} is not kebab case (lowercase words joined by '-')")
    if any(analyzer.name == args.name for analyzer in registry().analyzers):
        parser.error(f"an analyzer named {args.name!r} exists")
    prefix, sides = FAMILIES[args.family], SIDES.get(args.family, "serving")
    snake = args.name.replace("-", "_")
    path = ROOT / "analyzers" / args.family / f"{snake}.py"
    if path.exists() or path.with_suffix("").is_dir():
        parser.error(f"{path.relative_to(ROOT)} exists")
    hypothesis = args.hypothesis or args.name
    cls = "".join(part.capitalize() for part in args.name.split("-"))
    path.write_text(
        ANALYZER.format(
            summary=f"Whether {args.name.replace('-', ' ')} is served as the draft was trained.",
            cls=cls,
            code=next_code(prefix),
            name=args.name,
            sides=", ".join(f'"{side}"' for side in sides.split(", ")),
            finding=args.name,
            hypothesis=hypothesis,
            severity=Severity(args.severity).name,
        ),
        encoding="utf-8",
    )
    print(f"wrote {path.relative_to(ROOT)}")
    toml = ROOT / "knowledge" / "hypotheses" / f"{hypothesis}.toml"
    if not toml.exists():
        toml.write_text(HYPOTHESIS.format(hypothesis=hypothesis), encoding="utf-8")
        print(f"wrote {toml.relative_to(ROOT)}")
    print(
        "next: write run() and the examples, then python scripts/document.py and "
        f"python -m pytest -q tests/test_analyzer_examples.py -k {args.name} (docs/adding-an-analyzer.md)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
