"""How each release's draft module builds and feeds the decoder layers after the first, for a draft
config declaring two, and the diagnosis where a trainer and an engine do it apart. Every
expectation is read from the release's own lines; the analysis reads the same code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rca.analyzers.across.later_layer_feed.layers import LayerFeed

from rca.diagnose import Inputs, diagnose
from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.draft import load_draft
from rca.inputs.sources import SourceTree, fetch_release
from rca.model import StepKind
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.wiring import resolve_wiring
from tests.conftest import write_json
from tests.releases import LMDEPLOY, NEMO_AUTOMODEL, SGLANG, SPECFORGE, SPECULATORS, VLLM

pytestmark = pytest.mark.release

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096}
ENGINE_FILES = {
    "sglang": "sglang/srt/models/llama_eagle3.py",
    "vllm": "vllm/model_executor/models/llama_eagle3.py",
    "lmdeploy": "lmdeploy/pytorch/models/llama_eagle3.py",
}
TRAINER_FILES = {
    "speculators": "speculators/models/eagle3/core.py",
    "specforge": "specforge/modeling/draft/llama3_eagle.py",
    "nemo-automodel": "nemo_automodel/components/speculative/eagle/draft_llama.py",
}
# how a release names the draft's architecture (lmdeploy's builder prefixes `Eagle3` to the declared one)
ARCHITECTURES = {"lmdeploy": "LlamaForCausalLM", "nemo-automodel": "LlamaEagle3DraftModel"}
_REFUSES = re.compile(r"if (?:self\.)?config\.num_hidden_layers != 1:\s*\n\s*raise")
_PER_COUNT = re.compile(
    r"for \w+ in range\((?:1, )?(?:self\.)?(?:config\.num_hidden_layers|num_layers|num_hidden_layers)\)"
)
_FIRST_WIDE = re.compile(r"2 \* self\.hidden_size if (?:layer_idx == 0|self\.is_input_layer) else self\.hidden_size")
_FIRST_TEST = re.compile(r"if (?:self\.layer_idx == 0|self\.is_input_layer):")
_SINGLE = re.compile(r"self\.midlayer = \w+\(|self\.layers = nn\.ModuleList\(\s*\[\s*\n?\s*LlamaDecoderLayer\(")
_PARALLEL_ONLY = re.compile(r'if getattr\(config, "parallel_drafting", False\):\n\s+num_layers = ')


def _draft(tmp_path: Path, package: str, layers: int | None) -> Path:
    config = {
        "architectures": [ARCHITECTURES.get(package, "LlamaForCausalLMEagle3")],
        "model_type": "llama",
        "hidden_size": 4096,
        "vocab_size": 128256,
        "draft_vocab_size": 32000,
        "rms_norm_eps": 1e-5,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
    }
    if layers is not None:
        config["num_hidden_layers"] = layers
    return write_json(tmp_path / "draft" / "config.json", config)


def _feed(tmp_path: Path, side: str, package: str, version: str, layers: int | None):
    root = fetch_release(package, version)
    target = TargetConfig(load_config("target", write_json(tmp_path / "target.json", LLAMA)))
    draft = load_draft(_draft(tmp_path, package, layers))
    ctx = SideContext(side, SourceTree(side, f"{package} {version}", root), target, draft)
    run_side(ctx, only={"later-layer-feed"})
    return root, ctx, resolve_wiring(ctx).aspect("draft_layers")


def _line(root: Path, relpath: str, pattern: re.Pattern[str]) -> int:
    text = (root / relpath).read_text()
    found = pattern.search(text)
    assert found is not None, (relpath, pattern.pattern)
    return text.count("\n", 0, found.start()) + 1


def _cited(feed: LayerFeed, relpath: str) -> set[int]:
    return {line for step in feed.steps if step.location.path == relpath for line in (step.location.line,)}


ENGINES = (
    [("sglang", v) for v in SGLANG]
    + [("vllm", v) for v in VLLM if v != "0.9.2"]  # 0.9 names the draft otherwise
    + [("lmdeploy", v) for v in LMDEPLOY]
)
TRAINERS = (
    [("speculators", v) for v in SPECULATORS]
    + [("specforge", v) for v in SPECFORGE]
    + [("nemo-automodel", v) for v in NEMO_AUTOMODEL if v != "0.4.0"]  # no EAGLE-3 recipe in 0.4
)


@pytest.mark.parametrize(("package", "version"), ENGINES)
def test_an_engine_refuses_builds_one_or_feeds_later_layers_the_hidden_state_as_its_code_says(
    tmp_path: Path, package: str, version: str
) -> None:
    root, ctx, feed = _feed(tmp_path, "serving", package, version, 2)
    assert feed is not None, ctx.notes
    relpath = ENGINE_FILES[package]
    code = (root / relpath).read_text()
    if _REFUSES.search(code):
        assert feed.feed == LayerFeed.REFUSED, (version, feed)
        assert _line(root, relpath, _REFUSES) in _cited(feed, relpath)
        assert any("fails at launch" in note.text for note in ctx.notes)
    elif _PER_COUNT.search(code) and _FIRST_WIDE.search(code):
        assert feed.feed == LayerFeed.HIDDEN, (version, feed)
        assert _line(root, relpath, _FIRST_TEST) in _cited(feed, relpath)  # the layer's forward, down layer 1's branch
    else:
        assert _SINGLE.search(code), version
        assert feed.feed == LayerFeed.ONE, (version, feed)
        assert _line(root, relpath, _SINGLE) in _cited(feed, relpath)


@pytest.mark.parametrize(("package", "version"), TRAINERS)
def test_a_trainer_builds_one_layer_or_feeds_later_layers_the_hidden_state_as_its_code_says(
    tmp_path: Path, package: str, version: str
) -> None:
    root, ctx, feed = _feed(tmp_path, "training", package, version, 2)
    assert feed is not None, ctx.notes
    relpath = TRAINER_FILES[package]
    code = (root / relpath).read_text()
    if _SINGLE.search(code) or _PARALLEL_ONLY.search(code):  # one layer (NeMo stacks more for P-EAGLE only)
        assert feed.feed == LayerFeed.ONE, (version, feed)
        return
    assert _PER_COUNT.search(code) and "first_layer_class" in code, version
    assert feed.feed == LayerFeed.HIDDEN, (version, feed)
    cat = re.compile(r"hidden_states = torch\.cat\(\[input_embeds, hidden_states\], dim=-1\)")
    assert _line(root, relpath, cat) in _cited(feed, relpath)


@pytest.mark.parametrize("layers", [1, None], ids=["one", "undeclared"])
@pytest.mark.parametrize(
    ("side", "package", "version"),
    [("serving", p, v) for p, v in ENGINES] + [("training", p, v) for p, v in TRAINERS],
)
def test_a_one_layer_draft_is_never_read(
    tmp_path: Path, side: str, package: str, version: str, layers: int | None
) -> None:
    _, ctx, feed = _feed(tmp_path, side, package, version, layers)
    assert feed is None
    assert not [note for note in ctx.notes if "decoder layer" in note.text]


@pytest.mark.parametrize(
    ("training", "serving", "layers", "finding"),
    [
        ("specforge==0.2.0", "vllm==0.33.0", 2, "later-layers-never-trained"),
        ("specforge==0.2.0", "sglang==0.5.23", 2, "later-layers-never-trained"),
        ("specforge==0.1.0", "vllm==0.22.0", 3, "later-layers-never-trained"),
        ("speculators==0.9.0", "vllm==0.11.0", 2, "later-layers-never-served"),
        ("speculators==0.9.0", "vllm==0.33.0", 2, None),
        ("speculators==0.4.0", "sglang==0.5.12", 2, None),
        ("speculators==0.9.0", "sglang==0.5.10", 2, None),  # refused at launch: a note
        ("specforge==0.2.0", "vllm==0.11.0", 2, None),  # one layer on both sides
        ("specforge==0.2.0", "vllm==0.33.0", 1, None),
        ("speculators==0.9.0", "vllm==0.11.0", None, None),
    ],
)
def test_the_diagnosis_where_trainer_and_engine_build_the_later_layers_apart(
    tmp_path: Path, training: str, serving: str, layers: int | None, finding: str | None
) -> None:
    package, version = training.split("==")
    draft = _draft(tmp_path, package, layers)
    target = write_json(tmp_path / "target.json", LLAMA)
    run = diagnose(Inputs(serving=serving, training=training, draft=str(draft), target=str(target)), parallel=False)
    found = [h for h in run.diagnosis.hypotheses if h.id == "later-layers-wired-differently"]
    assert not [f for f in run.sides["training"].findings if f.hypothesis == "later-layers-wired-differently"]
    if finding is None:
        assert not found, found[0].reason
        return
    assert found and found[0].params["findings"] == [finding], run.diagnosis.hypotheses
    root = fetch_release(package, version)
    relpath = TRAINER_FILES[package]
    cited = [step for step in found[0].citations if step.location.input == "training"]
    construction = _SINGLE if finding == "later-layers-never-trained" else re.compile(r"self\.layers = ")
    assert (cited[0].location.path, cited[0].location.line) == (relpath, _line(root, relpath, construction))
    config = [step for step in found[0].citations if step.kind == StepKind.CONFIG]
    assert config and config[0].location.input == "draft"
    served = {step.location.path for step in found[0].citations if step.location.input == "serving"}
    assert served == {ENGINE_FILES[serving.split("==")[0]]}
