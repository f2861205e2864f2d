"""Every analyzer's own VALID and INVALID examples, collected from the registry (like Fixit) and run
by the harness analyzers are written with (`rca.sdk.testing`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rca.analyzers.training_capture.teacher_targets import TeacherTargets
from rca.knowledge import catalog

from rca.model import Location, Step, StepKind, Tap
from rca.sdk.testing import analyze_example, check_example, expected_line
from rca.static.analyzer import Analyzer, Example, registry
from rca.static.engine import ordered
from rca.static.wiring import resolve_wiring


def _cases() -> list:
    params = []
    for analyzer in registry().analyzers:
        for kind in ("VALID", "INVALID"):
            for index, example in enumerate(getattr(analyzer, kind)):
                params.append(pytest.param(analyzer, kind, example, id=f"{analyzer.name}-{kind}-{index}"))
    return params


@pytest.mark.parametrize(("analyzer", "kind", "example"), _cases())
def test_example(tmp_path: Path, analyzer: type[Analyzer], kind: str, example: Example) -> None:
    check_example(tmp_path, analyzer, kind, example)


@pytest.mark.parametrize("analyzer", registry().analyzers, ids=lambda analyzer: analyzer.name)
def test_analyzer_contract(analyzer: type[Analyzer]) -> None:
    assert analyzer.code[:5] in ("RCA-S", "RCA-T", "RCA-D", "RCA-X") and analyzer.code[5:].isdigit()
    assert analyzer.name == analyzer.name.lower() and " " not in analyzer.name
    assert analyzer.sides and analyzer.sides <= {"serving", "training"}
    assert analyzer.VALID, "every analyzer carries at least one VALID example"
    assert analyzer.__doc__ and "## " in analyzer.__doc__, "the docstring is the analyzer's documentation page"
    assert analyzer.provides or analyzer.reports, "an analyzer establishes a kind of fact, or reports findings"


@pytest.mark.parametrize(
    "analyzer", [analyzer for analyzer in registry().analyzers if analyzer.reports], ids=lambda analyzer: analyzer.name
)
def test_every_finding_an_analyzer_reports_is_a_catalog_hypothesis_with_an_invalid_example(
    analyzer: type[Analyzer],
) -> None:
    names = [report.name for report in analyzer.reports]
    assert len(names) == len(set(names))
    for report in analyzer.reports:
        assert report.name == report.name.lower() and " " not in report.name
        assert report.hypothesis in catalog(), f"{report.name}: {report.hypothesis} is not in the catalog"
        examples = [example for example in analyzer.INVALID if example.finding == report.name]
        assert examples, f"{analyzer.name} reports {report.name} with no INVALID example"
        assert all(example.message and example.path and expected_line(example) for example in examples), (
            "pinned to its message, path and line"
        )
    assert {example.finding for example in analyzer.INVALID} <= set(names)


@pytest.mark.parametrize("side", ["serving", "training"])
def test_analyzers_that_provide_the_same_fact_have_an_explicit_precedence(side: str) -> None:
    analyzers = registry().for_side(side)
    for first in analyzers:
        for second in analyzers:
            if first is not second and set(first.provides) & set(second.provides):
                assert first.precedence != second.precedence, (
                    f"{first.name} and {second.name} both provide {set(first.provides) & set(second.provides)}"
                )
    order = ordered(analyzers)
    for index, analyzer in enumerate(order):
        for later in order[index + 1 :]:
            if set(analyzer.provides) & set(later.provides):
                assert analyzer.precedence < later.precedence


@pytest.mark.parametrize(
    ("observed", "findings"),
    [
        ("h32+norm", []),  # the dumps hold the normed state: a teacher without a norm is right
        ("h32", ["teacher-from-unnormed-state"]),  # as the code says
        ("h31", ["teacher-state-not-last", "teacher-from-unnormed-state"]),  # one layer early, cited at the dumps
    ],
)
def test_the_teacher_is_checked_again_on_the_last_state_the_dumps_show(
    tmp_path: Path, observed: str, findings: list[str]
) -> None:
    (example,) = [e for e in TeacherTargets.INVALID if e.finding == "teacher-from-unnormed-state"]
    ctx = analyze_example(tmp_path, TeacherTargets, example)
    fingerprinted = Step(Location("dumps", "dumps/data_0.pt", 1, 1), "fingerprinted", kind=StepKind.DUMP)
    wiring = resolve_wiring(ctx)
    settled = replace(wiring, verifier_last=Tap.parse(observed), steps=(*wiring.steps, fingerprinted))
    again = list(TeacherTargets().settled(ctx, settled))
    assert [finding.name for finding in again] == findings
    if "teacher-state-not-last" in findings:
        assert again[0].location == fingerprinted.location


def test_an_example_names_its_line_by_a_marker_or_a_config_key() -> None:
    marked = Example(
        files={"model.py": "x = 1\ny = read(x)  # finding: value-unread\n"},
        target={},
        finding="value-unread",
        path="model.py",
    )
    assert expected_line(marked) == 2
    keyed = Example(files={}, target={}, draft={"architectures": ["X"], "torch_dtype": "float16"}, path="draft.json")
    assert expected_line(replace(keyed, key=("torch_dtype",))) == 5  # as the harness writes draft.json
    with pytest.raises(ValueError, match=r"not in draft\.json"):
        expected_line(replace(keyed, key=("dtype",)))
    with pytest.raises(ValueError, match="2 lines marked"):
        expected_line(replace(marked, files={"model.py": "a  # finding: value-unread\nb  # finding: value-unread\n"}))
