"""How each release's draft takes its token embeddings (their scale, and whether its first layer
normalizes them), and the diagnosis where a trainer's stand-in drops a Gemma target's embedding
scale. Every expectation is read from the release's own lines; the analysis reads the same code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rca.analyzers.across.embedding_scale import EmbedUse

from rca.diagnose import Inputs, diagnose
from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.draft import load_draft
from rca.inputs.sources import SourceTree, fetch_release
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.wiring import resolve_wiring
from tests.conftest import write_json
from tests.releases import MODELOPT, NEMO_AUTOMODEL, SGLANG, SPECFORGE, SPECULATORS, VLLM

pytestmark = pytest.mark.release

GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "num_hidden_layers": 34,
    "hidden_size": 2560,
    "vocab_size": 262208,
}
ENGINE_DRAFT = {"sglang": "sglang/srt/models/llama_eagle3.py", "vllm": "vllm/model_executor/models/llama_eagle3.py"}
ENGINE_GEMMA3 = {"sglang": "sglang/srt/models/gemma3_causal.py", "vllm": "vllm/model_executor/models/gemma3.py"}
FAKE_BASE = "modelopt/torch/speculative/plugins/modeling_fakebase.py"
_SCALE = re.compile(r"\bhidden_size\*\*0\.5")


def _draft(tmp_path: Path, **extra) -> Path:
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 2560,
        "vocab_size": 262208,
        "draft_vocab_size": 32000,
        "rms_norm_eps": 1e-6,
        **extra,
    }
    return write_json(tmp_path / "draft" / "config.json", config)


def _embed_use(tmp_path: Path, side: str, package: str, version: str) -> tuple[Path, EmbedUse | None]:
    root = fetch_release(package, version)
    target = TargetConfig(load_config("target", write_json(tmp_path / "target.json", GEMMA3)))
    ctx = SideContext(side, SourceTree(side, f"{package} {version}", root), target, load_draft(_draft(tmp_path)))
    run_side(ctx, only={"embedding-scale"})
    return root, resolve_wiring(ctx).aspect("draft_embedding")


def _lines(root: Path, relpath: str, pattern: re.Pattern[str]) -> list[int]:
    return [n for n, line in enumerate((root / relpath).read_text().splitlines(), 1) if pattern.search(line)]


@pytest.mark.parametrize(
    ("package", "version"),
    [("sglang", v) for v in SGLANG] + [("vllm", v) for v in VLLM if v != "0.9.2"],  # 0.9 names the draft otherwise
)
def test_an_engine_feeds_its_draft_unscaled_embeddings_that_its_first_layer_normalizes(
    tmp_path: Path, package: str, version: str
) -> None:
    root, use = _embed_use(tmp_path, "serving", package, version)
    assert use is not None
    draft = ENGINE_DRAFT[package]
    normed = _lines(root, draft, re.compile(r"^\s*embeds = self\.input_layernorm\(embeds\)"))
    assert use.normed and use.scale is None, (version, use)
    assert {step.location.path for step in use.steps} == {draft}
    assert use.steps[-1].location.line in normed
    # the target's own factor, where the engine's Gemma-3 model applies it
    assert use.target_steps[0].location.path == ENGINE_GEMMA3[package]
    assert use.target_steps[0].location.line in _lines(root, ENGINE_GEMMA3[package], _SCALE)


@pytest.mark.parametrize("version", MODELOPT)
def test_modelopt_rebuilds_the_embedding_as_a_plain_one_in_its_stand_in_from_0_44(tmp_path: Path, version: str) -> None:
    root, use = _embed_use(tmp_path, "training", "nvidia-modelopt", version)
    has_stand_in = (root / FAKE_BASE).exists()
    if use is None:  # 0.33.1: an EAGLE-1 module (its fc over [embeds, hidden]), no EAGLE-3 first layer
        assert not has_stand_in and "self.fc(torch.cat((inputs_embeds, hidden_states)" in _module_text(root)
        return
    assert use.normed and use.scale in (None, "the target's own"), (version, use)
    plain = _lines(root, FAKE_BASE, re.compile(r"self\.embed_tokens = nn\.Embedding\(")) if has_stand_in else []
    assert use.source.startswith("FakeBaseModel.embed_tokens") is has_stand_in, (version, use)
    if has_stand_in:
        assert (use.steps[0].location.path, use.steps[0].location.line) == (FAKE_BASE, plain[0])
    normed = use.steps[-1]
    assert "norm(" in normed.code and "emb" in normed.code, normed


def _module_text(root: Path) -> str:
    return (root / "modelopt/torch/speculative/plugins/transformers.py").read_text()


@pytest.mark.parametrize(
    ("package", "version"),
    [("specforge", v) for v in SPECFORGE]
    + [("speculators", v) for v in SPECULATORS]
    + [("nemo-automodel", v) for v in NEMO_AUTOMODEL if v != "0.4.0"],  # 0.4.0 has no EAGLE-3 recipe
)
def test_every_trainer_normalizes_the_embeddings_in_its_first_layer(tmp_path: Path, package: str, version: str) -> None:
    _, use = _embed_use(tmp_path, "training", package, version)
    assert use is not None and use.normed, (version, use)
    assert "norm(" in use.steps[-1].code and "emb" in use.steps[-1].code


@pytest.mark.parametrize("serving", ["sglang==0.5.23", "vllm==0.33.0"])
def test_modelopt_stand_in_drops_gemma_scale_without_consequence_for_eagle3(tmp_path: Path, serving: str) -> None:
    """ModelOpt 0.47.0's stand-in drops Gemma's sqrt(hidden_size), and both first layers normalize
    the embeddings: no embedding-scale hypothesis, a note on each side."""
    draft = _draft(tmp_path, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 16, 30]})
    target = write_json(tmp_path / "target.json", GEMMA3)
    run = diagnose(Inputs(serving=serving, training="nvidia-modelopt==0.47.0", draft=str(draft), target=str(target)))
    assert "embed-scale-mismatch" not in [h.id for h in run.diagnosis.hypotheses]
    trained, served = run.diagnosis.wirings["training"], run.diagnosis.wirings["serving"]
    assert trained.aspect("draft_embedding") is not None and served.aspect("draft_embedding") is not None
    assert any("FakeBaseModel.embed_tokens" in note and "cancels" in note for note in trained.notes)
    assert any("hidden_size**0.5" in note and "cancels" in note for note in served.notes)
