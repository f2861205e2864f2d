"""The engine: analyzer order, fault isolation, and finding the class an architecture names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rca.cases.casefile import load_case
from rca.errors import ParseFailure
from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.sources import SourceTree
from rca.static.analyzer import registry
from rca.static.context import SideContext
from rca.static.engine import ordered, run_side
from rca.static.facts import CapturedTaps, CaptureSet, DraftInput
from tests.conftest import CASES, LLAMA_8B, TREES, sglang_like_configs, write_json, write_tree


def context(tmp_path: Path, files: dict[str, str], side: str = "serving") -> SideContext:
    target = TargetConfig(load_config("target", write_json(tmp_path / "target.json", LLAMA_8B)))
    ctx = SideContext(side, SourceTree(side, "test", write_tree(tmp_path / "src", files)), target)
    ctx.prepare(registry().anchors(side))
    return ctx


def test_facts_are_produced_before_they_are_required() -> None:
    for side in ("serving", "training"):
        seen: set[type] = set()
        for analyzer in ordered(registry().for_side(side)):
            assert all(
                kind in seen
                for kind in analyzer.requires
                if any(kind in other.provides for other in registry().for_side(side))
            ), analyzer.name
            seen.update(analyzer.provides)
    assert {CaptureSet, CapturedTaps, DraftInput} <= seen


@pytest.mark.release
@pytest.mark.parametrize("name", ["draft-built-for-2k-on-sglang", "kimi-k25-embed-slot", "nemo-draft-on-sglang"])
def test_the_diagnosis_does_not_depend_on_the_order_analyzers_run_in(name: str, monkeypatch) -> None:
    """Analyzers free to run in either order (no fact between them) give the same diagnosis in
    both, up to the order of the notes: on SGLang, the RoPE reader allows a config module the
    capture reader was refused before."""
    from rca.diagnose import diagnose
    from rca.report.json_report import render
    from rca.static import engine

    def diagnosed() -> dict:
        report = json.loads(render(diagnose(load_case(CASES / name).inputs).diagnosis))
        for side in report["wiring"].values():
            side["notes"].sort()
        return report

    as_ranked = diagnosed()
    monkeypatch.setattr(engine, "_rank", lambda analyzer: tuple(-ord(letter) for letter in analyzer.code))
    assert diagnosed() == as_ranked


def test_the_registered_class_wins_over_a_namesake(tmp_path: Path) -> None:
    ctx = context(
        tmp_path,
        {
            "pkg/multimodal/encoders/llama.py": "class LlamaForCausalLM(TextEncoder):\n    pass\n",
            "pkg/srt/models/llama.py": "class LlamaForCausalLM(nn.Module):\n    def "
            "set_eagle3_layers_to_capture(self, ids=None):\n        pass\n\n\nEntryClass "
            "= [LlamaForCausalLM]\n",
        },
    )
    found = ctx.find_class("LlamaForCausalLM")
    assert found is not None and found.module.relpath == "pkg/srt/models/llama.py"


def test_a_crashing_analyzer_is_reported_and_the_run_goes_on(tmp_path: Path, monkeypatch) -> None:
    from rca.analyzers.serving_capture.capture_layers import CaptureLayers

    def boom(self, ctx):
        raise RuntimeError("kaboom")
        yield  # pragma: no cover

    monkeypatch.setattr(CaptureLayers, "run", boom)
    ctx = context(tmp_path, {"runner.py": "def f(model):\n    model.set_eagle3_layers_to_capture([1])\n"})
    run_side(ctx)
    assert any("capture-layers failed: RuntimeError: kaboom" in note.text for note in ctx.notes)
    assert ctx.debug and "Traceback" in ctx.debug[0]


def test_the_training_side_in_a_forked_process_gives_the_same_diagnosis(tmp_path: Path) -> None:
    from rca.diagnose import Inputs, diagnose

    case = load_case(CASES / "kimi-k25-consistent").inputs
    inputs = Inputs(
        serving=str(TREES / "sglang_like"),
        training=str(TREES / "speculators_like"),
        draft=str(case.path(case.draft)),
        target=str(case.path(case.target)),
    )
    together, apart = diagnose(inputs, parallel=True), diagnose(inputs, parallel=False)
    assert together.diagnosis.to_json() == apart.diagnosis.to_json()
    assert together.diagnosis.wirings["training"].slots  # resolved in the other process
    assert together.sides["training"].ctx is None and apart.sides["training"].ctx is not None


def test_an_error_on_the_forked_side_reaches_the_user(tmp_path: Path) -> None:
    from rca.diagnose import Inputs, diagnose

    training = Path(shutil.copytree(TREES / "speculators_like", tmp_path / "training"))
    reader = training / "speculators" / "data_generation" / "custom_worker.py"
    reader.write_text(reader.read_text().replace("def ", "def (", 1))
    case = load_case(CASES / "kimi-k25-consistent").inputs
    inputs = Inputs(
        serving=str(TREES / "sglang_like"),
        training=str(training),
        draft=str(case.path(case.draft)),
        target=str(case.path(case.target)),
    )
    for parallel in (True, False):
        with pytest.raises(ParseFailure, match=r"custom_worker\.py"):
            diagnose(inputs, parallel=parallel)


def test_a_construct_the_evaluator_does_not_model_is_a_note_of_the_wiring(tmp_path: Path) -> None:
    from rca.diagnose import Inputs, diagnose

    serving = Path(shutil.copytree(TREES / "sglang_like", tmp_path / "serving"))
    model = serving / "sglang" / "srt" / "models" / "deepseek_like.py"
    text = model.read_text()
    anchor = "        aux_hidden_states = []\n"
    model.write_text(
        text.replace(
            anchor, anchor + "        match forward_batch.forward_mode:\n            case _:\n                pass\n", 1
        )
    )
    line = text[: text.index(anchor)].count("\n") + 2
    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    inputs = Inputs(
        serving=str(serving), training=str(TREES / "speculators_like"), draft=str(draft), target=str(target)
    )
    wiring = diagnose(inputs, parallel=False).diagnosis.wirings["serving"]
    assert f"serving: `match` at sglang/srt/models/deepseek_like.py:{line}-{line + 2} not evaluated" in wiring.notes
    assert [str(tap) for tap in wiring.slots] == ["h3", "h31", "h59"]  # the rest of the path is still followed


def test_a_native_crash_in_the_forked_analysis_names_the_file_it_was_parsing(monkeypatch) -> None:
    """Should a parser ever kill the process (libcst does on input it cannot take), the user learns
    which file, as bad input: the forked side leaves its parent the path it was parsing."""
    import faulthandler
    import os
    import signal

    from rca.diagnose import Inputs, diagnose
    from rca.static import codeindex

    parse = codeindex.parse_text

    def crashing(text: str):
        if "def _patched_forward" in text:  # the speculators-shaped worker, read on the training side only
            faulthandler.disable()  # pytest's would print the crashing process's stack into a green run
            os.kill(os.getpid(), signal.SIGSEGV)
        return parse(text)

    monkeypatch.setattr(codeindex, "parse_text", crashing)
    case = load_case(CASES / "kimi-k25-consistent").inputs
    inputs = Inputs(
        serving=str(TREES / "sglang_like"),
        training=str(TREES / "speculators_like"),
        draft=str(case.path(case.draft)),
        target=str(case.path(case.target)),
    )
    with pytest.raises(
        ParseFailure, match=r"killed by signal 11 while parsing speculators/data_generation/custom_worker\.py"
    ):
        diagnose(inputs, parallel=True)
