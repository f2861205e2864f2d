"""The engine: analyzer order, fault isolation, and finding the class an architecture names."""

from __future__ import annotations

from pathlib import Path

from rca.analyzers import registry
from rca.configs import TargetConfig, load_config
from rca.engine import SideContext, ordered, run_side
from rca.facts import CaptureSet, CapturedTaps, DraftInput
from rca.sources import SourceTree

from .conftest import LLAMA_8B, write_json, write_tree


def context(tmp_path: Path, files: dict[str, str], side: str = "serving") -> SideContext:
    target = TargetConfig(load_config("target", write_json(tmp_path / "target.json", LLAMA_8B)))
    ctx = SideContext(side, SourceTree(side, "test", write_tree(tmp_path / "src", files)), target)
    ctx.prepare(registry().anchors(side))
    return ctx


def test_facts_are_produced_before_they_are_required() -> None:
    for side in ("serving", "training"):
        seen: set[type] = set()
        for analyzer in ordered(registry().for_side(side)):
            assert all(kind in seen for kind in analyzer.requires if any(kind in other.provides for other in registry().for_side(side))), analyzer.name
            seen.update(analyzer.provides)
    assert {CaptureSet, CapturedTaps, DraftInput} <= seen


def test_the_registered_class_wins_over_a_namesake(tmp_path: Path) -> None:
    ctx = context(tmp_path, {
        "pkg/multimodal/encoders/llama.py": "class LlamaForCausalLM(TextEncoder):\n    pass\n",
        "pkg/srt/models/llama.py": "class LlamaForCausalLM(nn.Module):\n    def set_eagle3_layers_to_capture(self, ids=None):\n        pass\n\n\nEntryClass = [LlamaForCausalLM]\n",
    })
    found = ctx.find_class("LlamaForCausalLM")
    assert found is not None and found.module.relpath == "pkg/srt/models/llama.py"


def test_a_crashing_analyzer_is_reported_and_the_run_goes_on(tmp_path: Path, monkeypatch) -> None:
    from rca.analyzers.capture_layers import CaptureLayers

    def boom(self, ctx):
        raise RuntimeError("kaboom")
        yield  # pragma: no cover

    monkeypatch.setattr(CaptureLayers, "run", boom)
    ctx = context(tmp_path, {"runner.py": "def f(model):\n    model.set_eagle3_layers_to_capture([1])\n"})
    run_side(ctx)
    assert any("capture-layers failed: RuntimeError: kaboom" in warning for warning in ctx.warnings)
    assert ctx.debug and "Traceback" in ctx.debug[0]
