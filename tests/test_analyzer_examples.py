"""Every analyzer's own VALID and INVALID examples, collected from the registry (like Fixit)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rca.analyzers.teacher_targets import TeacherTargets
from rca.knowledge import catalog

from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.draft import load_draft
from rca.inputs.launch import read_launch_settings, read_training_settings
from rca.inputs.sources import SourceTree
from rca.model import Location, Step, StepKind, Tap, Wiring
from rca.static.analyzer import Analyzer, Example, registry
from rca.static.context import SideContext
from rca.static.engine import ordered, run_side
from rca.static.facts import CapturedTaps, DraftWidth
from rca.static.wiring import resolve_wiring
from tests.conftest import write_json, write_safetensors, write_tree


def _cases() -> list:
    params = []
    for analyzer in registry().analyzers:
        for kind in ("VALID", "INVALID"):
            for index, example in enumerate(getattr(analyzer, kind)):
                params.append(pytest.param(analyzer, kind, example, id=f"{analyzer.name}-{kind}-{index}"))
    return params


def _side(analyzer: type[Analyzer]) -> str:
    return "serving" if "serving" in analyzer.sides else "training"  # both-sided analyzers run as serving


def _analyze(tmp_path: Path, analyzer: type[Analyzer], example: Example, side: str | None = None) -> SideContext:
    side = side or ("training" if example.serving_files else _side(analyzer))
    files = example.serving_files if side == "serving" and example.serving_files else example.files
    root = write_tree(tmp_path / f"{side}-src", files)
    target_file = tmp_path / ("target/config.json" if example.target_weights else "target.json")
    target = TargetConfig(load_config("target", write_json(target_file, example.target)))
    if example.target_weights:
        write_safetensors(tmp_path / "target" / "model.safetensors", example.target_weights)
    if example.weights:
        write_safetensors(tmp_path / "model.safetensors", example.weights)
    draft = load_draft(write_json(tmp_path / "draft.json", example.draft)) if example.draft else None
    parent = None
    if example.parent_weights and example.draft:
        write_safetensors(tmp_path / "parent" / "model.safetensors", example.parent_weights)
        parent = load_draft(write_json(tmp_path / "parent" / "config.json", example.draft), tmp_path, "--parent-draft")
    dumps = None
    if example.dumps:
        dumps = tmp_path / "dumps"
        for name, content in example.dumps.items():
            write_json(dumps / name, content)
    engine = (
        SourceTree("engine", "example engine", write_tree(tmp_path / "engine", example.engine))
        if example.engine
        else None
    )
    if example.tokenizer_config is not None:
        write_json(target_file.parent / "tokenizer_config.json", example.tokenizer_config)
    tree = SourceTree(side, "example", root)
    settings = None
    if side == "training" and example.training_args:
        settings = read_training_settings(example.training_args, None, tree)
    elif example.settings and (side == "serving" or not example.serving_files):
        settings = read_launch_settings(example.settings, None, tree)
    ctx = SideContext(side, tree, target, draft, dumps, engine, settings=settings, parent=parent)
    run_side(ctx)
    return ctx


@pytest.mark.parametrize(("analyzer", "kind", "example"), _cases())
def test_example(tmp_path: Path, analyzer: type[Analyzer], kind: str, example: Example) -> None:
    ctx = _analyze(tmp_path, analyzer, example)
    assert not [note for note in ctx.notes if "failed" in note.text], ctx.notes + ctx.debug
    produced = [fact for fact in ctx.facts if fact.analyzer == analyzer.name]
    own = [finding for finding in ctx.findings if finding.code == analyzer.code]
    if example.serving_files:  # both sides: what each established, compared
        serving = _analyze(tmp_path, analyzer, example, "serving")
        assert [fact for fact in serving.facts if fact.analyzer == analyzer.name], serving.notes
        own += analyzer().across(resolve_wiring(ctx), resolve_wiring(serving))
    elif ctx.side == "serving":  # compared with a training side given no source: serving's own record stands
        own += analyzer().across(Wiring("training", (), None), resolve_wiring(ctx))
    assert produced or own or not analyzer.provides, f"{analyzer.name} established nothing: {ctx.notes}"
    if example.captured is not None:
        captured = ctx.fact(CapturedTaps)
        assert captured is not None, ctx.notes
        assert [str(tap) for tap in captured.taps] == list(example.captured)
    if example.slots is not None:
        wiring = resolve_wiring(ctx)
        assert [str(tap) for tap in wiring.slots] == list(example.slots), wiring.notes
        assert wiring.verifier_last == (Tap.parse(example.verifier_last) if example.verifier_last else None)
    if example.fc_slots is not None:
        width = ctx.fact(DraftWidth)
        assert width is not None and width.slots == example.fc_slots
    if kind == "VALID":
        assert not own, [finding.message for finding in own]
    else:
        assert [finding.name for finding in own] == [example.finding]
        assert own[0].message == example.message
        assert own[0].location.path == example.path or own[0].location.path.endswith(
            "/" + example.path
        )  # configs are shown by path
        assert own[0].location.line == example.line
    for finding in ctx.findings:  # whatever ran: every finding is one its analyzer declares, for a catalog hypothesis
        declared = {
            (report.name, report.hypothesis)
            for other in registry().analyzers
            if other.code == finding.code
            for report in other.reports
        }
        assert (finding.name, finding.hypothesis) in declared, finding


@pytest.mark.parametrize("analyzer", registry().analyzers, ids=lambda analyzer: analyzer.name)
def test_analyzer_contract(analyzer: type[Analyzer]) -> None:
    assert analyzer.code.startswith(("RCA-S", "RCA-T")) and analyzer.code[5:].isdigit()
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
        assert all(example.message and example.path and example.line for example in examples), (
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
    ctx = _analyze(tmp_path, TeacherTargets, example)
    fingerprinted = Step(Location("dumps", "dumps/data_0.pt", 1, 1), "fingerprinted", kind=StepKind.DUMP)
    wiring = resolve_wiring(ctx)
    settled = replace(wiring, verifier_last=Tap.parse(observed), steps=(*wiring.steps, fingerprinted))
    again = list(TeacherTargets().settled(ctx, settled))
    assert [finding.name for finding in again] == findings
    if "teacher-state-not-last" in findings:
        assert again[0].location == fingerprinted.location
