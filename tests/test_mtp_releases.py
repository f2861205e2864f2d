"""A target served as its own multi-token-prediction draft, on real engine releases: whether its
checkpoint holds the MTP layers its config declares (mtp-weights), through the launch line."""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.release

runner = CliRunner()
PUBLISHED = Path(__file__).parent / "published"
CORPUS = tomllib.loads((PUBLISHED / "corpus.toml").read_text(encoding="utf-8"))
VLLM_MTP = ["vllm", "serve", "TARGET", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']
SGLANG_NEXTN = ["python3", "-m", "sglang.launch_server", "--model-path", "TARGET", "--speculative-algorithm", "NEXTN"]


def _diagnose(serving: str, launch: list[str], target: Path) -> tuple[int, dict]:
    words = [str(target) if word == "TARGET" else word for word in launch]
    result = runner.invoke(
        app, ["diagnose", "--format", "json", "--serving", serving, "--offline", "--no-cache", "--", *words]
    )
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}


def _published(name: str, directory: Path) -> Path:
    """A published checkpoint's config and index, as published, in a model directory of their own."""
    source = PUBLISHED / "checkpoints" / name
    target = directory / name
    target.mkdir()
    (target / "config.json").write_bytes((source / "config.json").read_bytes())
    (target / "model.safetensors.index.json").write_bytes(
        lzma.decompress((source / "model.safetensors.index.json.xz").read_bytes())
    )
    return target


def _deepseek_v3(directory: Path, layers: range) -> Path:
    """DeepSeek-V3's published config (61 decoder layers, one MTP layer) with an index naming `layers`."""
    config = json.loads((PUBLISHED / "targets" / "deepseek-ai--DeepSeek-V3.json").read_text())
    target = directory / "DeepSeek-V3"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config))
    weight_map = {f"model.layers.{i}.input_layernorm.weight": "model-00001-of-00001.safetensors" for i in layers}
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return target


@pytest.mark.parametrize(("serving", "launch"), [("vllm==0.33.0", VLLM_MTP), ("sglang==0.5.23", SGLANG_NEXTN)])
def test_a_published_pruned_checkpoint_without_its_mtp_layer_is_the_cause(
    tmp_path: Path, serving: str, launch: list[str]
) -> None:
    """A REAP-pruned Qwen3.5 whose config keeps mtp_num_hidden_layers = 1 and whose index holds no
    mtp.* tensor: drafting with it drafts from uninitialized layers."""
    name = "bryce-hoehn--Qwen3.5-18B-REAP-A3B-Coding"
    assert CORPUS["checkpoints"][name]["source"].startswith("https://github.com/")
    code, data = _diagnose(serving, launch, _published(name, tmp_path))
    verdict, top = data["verdict"], data["hypotheses"][0]
    assert code == 1 and verdict["status"] == "mismatch" and verdict["root_cause"] == "mtp-weights-missing"
    assert "no wiring to check" in verdict["summary"]
    finding = next(item for item in top["evidence"] if item.get("severity") == "cause")
    assert "none of its 15,973 tensors is of a layer past its 40 decoder layers" in finding["summary"]
    cited = [(citation["path"].rsplit("/", 1)[-1], citation["line"]) for citation in finding["citations"]]
    assert cited[0] == ("config.json", 68) and cited[-1] == ("model.safetensors.index.json", 1)


def test_the_engine_s_own_reading_of_the_declared_count_is_cited(tmp_path: Path) -> None:
    _, data = _diagnose("vllm==0.33.0", VLLM_MTP, _published("bryce-hoehn--Qwen3.5-18B-REAP-A3B-Coding", tmp_path))
    citations = [c for item in data["hypotheses"][0]["evidence"] for c in item["citations"]]
    served = [c for c in citations if c["input"] == "serving"]
    assert served and served[0]["path"].endswith("models/qwen3_5_mtp.py"), citations
    assert "mtp_num_hidden_layers" in served[0]["code"]


@pytest.mark.parametrize(("serving", "launch"), [("vllm==0.33.0", VLLM_MTP), ("sglang==0.5.23", SGLANG_NEXTN)])
def test_a_checkpoint_holding_its_mtp_layer_is_not_a_cause(tmp_path: Path, serving: str, launch: list[str]) -> None:
    """DeepSeek-V3's layout: the MTP layer is layer 61, after 61 decoder layers (the control)."""
    code, data = _diagnose(serving, launch, _deepseek_v3(tmp_path, range(62)))
    verdict = data["verdict"]
    assert code == 3 and verdict["status"] == "inconclusive" and not verdict.get("settled_by")
    assert "rca checks that the checkpoint they are loaded from holds their weights" in verdict["summary"]
    assert not [h for h in data["hypotheses"] if h["id"] == "mtp-weights-missing"]


def test_the_same_layout_without_layer_61_is_the_cause(tmp_path: Path) -> None:
    code, data = _diagnose("vllm==0.33.0", VLLM_MTP, _deepseek_v3(tmp_path, range(61)))
    assert code == 1 and data["verdict"]["root_cause"] == "mtp-weights-missing"


def test_the_reports_show_no_wiring_for_an_mtp_launch(tmp_path: Path) -> None:
    """No separate draft, no captured states: neither report shows an empty wiring table or section,
    nor notes of the analyzers that read how a draft is fed captured states (they do not run), nor
    asks for a training source; the markdown verdict says what the launch drafts with instead of
    what each side feeds."""
    target = _published("bryce-hoehn--Qwen3.5-18B-REAP-A3B-Coding", tmp_path)
    words = [str(target) if word == "TARGET" else word for word in VLLM_MTP]
    arguments = ["diagnose", "--serving", "vllm==0.33.0", "--offline", "--no-cache"]
    markdown = runner.invoke(app, [*arguments, "--format", "markdown", "--", *words]).stdout
    text = runner.invoke(app, [*arguments, "--", *words]).stdout
    assert "## The two wirings" not in markdown and "fc slots" not in text
    assert "derives" not in markdown and "note:" not in text, text
    assert (
        "own multi-token-prediction layers (mtp; mtp_num_hidden_layers = 1 in the target's config): no wiring"
        in markdown
    )


def test_an_mtp_checkpoint_named_by_the_launch_is_where_the_layers_are_looked_for_not_a_draft(tmp_path: Path) -> None:
    """vLLM's `speculative_config.model` with an MTP method names the checkpoint the MTP layers are
    loaded from (vllm#37667: an unquantized original beside a quantized target). It is no EAGLE-3
    draft: reading it as one raised a false draft-arch-unsupported. It is the checkpoint checked."""
    target = _published("bryce-hoehn--Qwen3.5-18B-REAP-A3B-Coding", tmp_path)
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_bytes((target / "config.json").read_bytes())

    def launch(source: Path | str) -> list[str]:
        settings = {"method": "mtp", "num_speculative_tokens": 1, "model": str(source)}
        return ["vllm", "serve", "TARGET", "--speculative-config", json.dumps(settings)]

    code, data = _diagnose("vllm==0.33.0", launch(config_only), target)
    verdict = data["verdict"]
    assert code == 3 and not data["hypotheses"], verdict  # no draft-arch-unsupported, nor any other cause
    assert data["launch"]["mtp_source"] == str(config_only) and data["launch"]["draft"] is None
    assert verdict["settled_by"] == (
        f"a local copy of {config_only}'s weights index (model.safetensors.index.json beside its config.json)"
    )
    code, data = _diagnose("vllm==0.33.0", launch(target), _deepseek_v3(tmp_path, range(62)))
    assert code == 1 and data["verdict"]["root_cause"] == "mtp-weights-missing"  # the named source lacks them
    code, data = _diagnose("vllm==0.33.0", launch("zai-org/GLM-4.7"), target)
    assert code == 3 and data["verdict"]["settled_by"].startswith("a local copy of zai-org/GLM-4.7's weights index")


@pytest.mark.parametrize(("held", "code"), [(range(62), 3), (range(61), 1)])
def test_lmdeploy_s_named_mtp_checkpoint_is_the_one_checked(tmp_path: Path, held: range, code: int) -> None:
    """lmdeploy names the checkpoint of its DeepSeek MTP layers with --speculative-draft-model."""
    target = _deepseek_v3(tmp_path, range(62))
    (tmp_path / "source").mkdir()
    source = _deepseek_v3(tmp_path / "source", held)
    launch = ["lmdeploy", "serve", "api_server", "TARGET", "--speculative-algorithm", "deepseek_mtp"]
    returned, data = _diagnose("lmdeploy==0.18.0", [*launch, "--speculative-draft-model", str(source)], target)
    assert returned == code and data["launch"]["mtp_source"] == str(source), data["verdict"]
    assert [h["id"] for h in data["hypotheses"]] == (["mtp-weights-missing"] if code == 1 else [])


# The fields of zai-org/GLM-4.7's config.json (https://huggingface.co/zai-org/GLM-4.7/blob/main/config.json)
# the MTP checks read: 92 decoder layers and one MTP layer after them (layer 92).
GLM_47 = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "hidden_size": 5120,
    "num_hidden_layers": 92,
    "num_nextn_predict_layers": 1,
    "vocab_size": 151552,
    "rms_norm_eps": 1e-05,
}


def _glm_47(directory: Path) -> Path:
    target = directory / "GLM-4.7"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(GLM_47))
    weight_map = {f"model.layers.{i}.input_layernorm.weight": "model-00001-of-00001.safetensors" for i in range(93)}
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return target


def _vllm_mtp(tokens: int | None) -> list[str]:
    settings = {"method": "mtp", **({"num_speculative_tokens": tokens} if tokens is not None else {})}
    return ["vllm", "serve", "TARGET", "--speculative-config", json.dumps(settings)]


@pytest.mark.parametrize(
    ("serving", "model", "recycled"),
    [
        ("vllm==0.22.0", "deepseek", "vllm/model_executor/models/deepseek_mtp.py"),
        ("vllm==0.30.0", "deepseek", None),
        ("vllm==0.33.0", "glm", "vllm/model_executor/models/glm4_moe_mtp.py"),
        ("vllm==0.34.0", "glm", None),
    ],
)
def test_later_mtp_steps_handed_the_pre_norm_state_are_the_cause_where_the_engine_s_mtp_model_recycles_it(
    tmp_path: Path, serving: str, model: str, recycled: str | None
) -> None:
    """vLLM's DeepSeek MTP layer returned its state before shared_head's norm until it returned the
    pair (pre-norm for the logits, post-norm passed on; by 0.30), its GLM-4.5-4.7 layer until 0.34
    (vllm#47448's contract): with three speculative tokens, steps 2 and 3 were handed a state of
    another scale than step 1, which the target hands after its final norm."""
    target = _deepseek_v3(tmp_path, range(62)) if model == "deepseek" else _glm_47(tmp_path)
    code, data = _diagnose(serving, _vllm_mtp(3), target)
    found = [h for h in data["hypotheses"] if h["id"] == "mtp-recycled-norm-differs"]
    if recycled is None:
        assert code == 3 and not found, data["hypotheses"]
        return
    assert code == 1 and data["verdict"]["root_cause"] == "mtp-recycled-norm-differs"
    finding = next(item for item in found[0]["evidence"] if item.get("severity") == "cause")
    assert finding["summary"].startswith("each of the 2 MTP draft steps after the first is handed the state")
    assert (
        "before any final norm, but the first is handed the target's state after its final norm" in (finding["summary"])
    )
    cited = {(c["path"], c["code"].strip()) for c in finding["citations"]}
    assert (recycled, "hidden_states = residual + hidden_states") in cited, cited
    assert any(path.endswith("config/speculative.py") and "architectures" in code for path, code in cited)


def test_the_same_release_drafting_one_token_per_step_or_not_saying_how_many(tmp_path: Path) -> None:
    """One speculative token chains no step: nothing is recycled. A launch that does not say how
    many steps it chains is warned, not diagnosed."""
    target = _glm_47(tmp_path)
    code, data = _diagnose("vllm==0.33.0", _vllm_mtp(1), target)
    assert code == 3 and not data["hypotheses"]
    code, data = _diagnose("vllm==0.33.0", _vllm_mtp(None), target)
    assert code != 1 and [h["id"] for h in data["hypotheses"]] == ["mtp-recycled-norm-differs"]
    assert {item.get("severity") for item in data["hypotheses"][0]["evidence"]} - {None} == {"warning"}


@pytest.mark.parametrize("model", ["deepseek", "glm"])
def test_sglang_s_nextn_models_pass_their_state_on_after_their_final_norm(tmp_path: Path, model: str) -> None:
    target = _deepseek_v3(tmp_path, range(62)) if model == "deepseek" else _glm_47(tmp_path)
    launch = [*SGLANG_NEXTN, "--speculative-num-steps", "3"]
    code, data = _diagnose("sglang==0.5.23", launch, target)
    assert code == 3 and not data["hypotheses"], data["hypotheses"]
