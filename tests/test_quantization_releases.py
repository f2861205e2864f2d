"""Which quantization config every pinned vLLM release builds an EAGLE-3 draft's layers with.

vLLM 0.11.0's `llama_eagle3.LlamaDecoderLayer` takes `vllm_config.quant_config`, the engine-wide
config made from the target's (https://github.com/vllm-project/vllm/pull/25883 replaced it with
`get_draft_quant_config`, the draft's own, in 0.11.1); 0.9.2 hands its layers no quantization
config at all. The test tells which a release does by reading its draft module, and checks that an
unquantized draft beside an FP8 target is diagnosed as built with the target's quantization there,
and only there; beside an unquantized target, on every release, nothing is said.

Every pinned SGLang release builds the draft with the launch's `--quantization` when the draft's
checkpoint declares none (https://github.com/sgl-project/sglang/pull/28196, open): an unquantized
draft launched with `--quantization awq` fails to load on all of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.conftest import write_json, write_safetensors
from tests.releases import SGLANG, VLLM

pytestmark = pytest.mark.release

DRAFT_FILE = "vllm/model_executor/models/llama_eagle3.py"
_VERIFIERS = re.compile(r"^\s*quant_config = vllm_config\.quant_config$", re.MULTILINE)
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 64}
DRAFT = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 1,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "rms_norm_eps": 1e-5,
    "vocab_size": 64,
}
PLAIN = {
    "fc.weight": ("BF16", (1, 12288), None),
    "lm_head.weight": ("BF16", (64, 1), None),
    "layers.0.mlp.down_proj.weight": ("BF16", (1, 1), None),
}
QUANTIZED = {
    **PLAIN,
    "layers.0.mlp.down_proj.weight": ("F8_E4M3", (1, 1), None),
    "layers.0.mlp.down_proj.weight_scale": ("F32", (1,), None),
}
SCENARIOS = {  # target quantized, draft quantized
    "plain-draft-fp8-target": (True, False),
    "plain-draft-plain-target": (False, False),
    "fp8-draft-plain-target": (False, True),
    "fp8-draft-fp8-target": (True, True),
}


def _diagnose(tmp_path: Path, version: str, target_fp8: bool, draft_fp8: bool):
    architecture = "Eagle3LlamaForCausalLM" if version == "0.9.2" else "LlamaForCausalLMEagle3"
    draft = {**DRAFT, "architectures": [architecture], **({"quantization_config": FP8} if draft_fp8 else {})}
    write_json(tmp_path / "draft" / "config.json", draft)
    write_safetensors(tmp_path / "draft" / "model.safetensors", QUANTIZED if draft_fp8 else PLAIN)
    write_json(tmp_path / "target.json", {**TARGET, **({"quantization_config": FP8} if target_fp8 else {})})
    inputs = Inputs(serving=f"vllm=={version}", draft=str(tmp_path / "draft"), target=str(tmp_path / "target.json"))
    return diagnose(inputs, parallel=False).diagnosis


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("version", VLLM)
def test_draft_quantization_on_every_vllm_release(tmp_path: Path, version: str, scenario: str) -> None:
    root = fetch_release("vllm", version)
    text = (root / DRAFT_FILE).read_text(encoding="utf-8")
    verifiers = _VERIFIERS.search(text)
    target_fp8, draft_fp8 = SCENARIOS[scenario]
    diagnosis = _diagnose(tmp_path, version, target_fp8, draft_fp8)
    found = [h for h in diagnosis.hypotheses if h.id == "quant-inherited"]
    if verifiers is None or target_fp8 == draft_fp8:
        # the draft's own quantization config (0.11.1 on), none at all (0.9.2), or both models alike
        assert found == [], (version, found[0].reason if found else None)
        if verifiers is None:
            assert "get_draft_quant_config" in text or "quant_config: Optional[QuantizationConfig] = None" in text
        return
    assert diagnosis.hypotheses[0].id == "quant-inherited", [h.id for h in diagnosis.hypotheses]
    assert diagnosis.verdict.status.value == "mismatch"
    line = text.count("\n", 0, verifiers.start()) + 1
    cited = {(step.location.path, step.location.line) for step in found[0].citations}
    assert (DRAFT_FILE, line) in cited, sorted(cited)
    assert any(step.location.path.endswith("draft/config.json") for step in found[0].citations)
    assert "verifier's quantization config" in found[0].reason


def test_the_fix_is_in_0_11_1_and_the_bug_in_0_11_0() -> None:
    """The releases the bundled cases are set on, read from their draft modules."""
    assert _VERIFIERS.search((fetch_release("vllm", "0.11.0") / DRAFT_FILE).read_text(encoding="utf-8"))
    fixed = (fetch_release("vllm", "0.11.1") / DRAFT_FILE).read_text(encoding="utf-8")
    assert _VERIFIERS.search(fixed) is None and "get_draft_quant_config(vllm_config)" in fixed


SGLANG_CONFIG = "sglang/srt/configs/model_config.py"
_DRAFT_BRANCH = re.compile(r"elif self\.is_draft_model\b")
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128}
LAUNCHES = {  # launch flags, draft quantized
    "awq-launch-plain-draft": ("--quantization awq", False),
    "awq-launch-fp8-draft": ("--quantization awq", True),
    "awq-launch-draft-unquant": ("--quantization awq --speculative-draft-model-quantization unquant", False),
    "no-launch-flag-plain-draft": ("", False),
    "fp8-launch-plain-draft": ("--quantization fp8", False),
}


@pytest.mark.parametrize("launch", sorted(LAUNCHES))
@pytest.mark.parametrize("version", SGLANG)
def test_draft_quantization_on_every_sglang_release(tmp_path: Path, version: str, launch: str) -> None:
    """SGLang builds the draft with the launch's --quantization (copied onto
    speculative_draft_model_quantization from 0.5.10, where `unquant` clears it) unless the
    draft's checkpoint declares its own method, which wins from 0.5.10 (a branch for a draft in the
    model config's check) and fails the load before. AWQ needs the checkpoint's own config file;
    FP8 quantizes a plain checkpoint on load."""
    root = fetch_release("sglang", version)
    config_text = (root / SGLANG_CONFIG).read_text(encoding="utf-8")
    flags, draft_fp8 = LAUNCHES[launch]
    has_option = "speculative_draft_model_quantization" in config_text
    if "unquant" in flags and not has_option:
        pytest.skip("no --speculative-draft-model-quantization in this release")
    draft = {
        **DRAFT,
        "architectures": ["LlamaForCausalLMEagle3"],
        **({"quantization_config": FP8} if draft_fp8 else {}),
    }
    write_json(tmp_path / "draft" / "config.json", draft)
    write_safetensors(tmp_path / "draft" / "model.safetensors", QUANTIZED if draft_fp8 else PLAIN)
    write_json(tmp_path / "target.json", {**TARGET, "quantization_config": AWQ})
    inputs = Inputs(
        serving=f"sglang=={version}",
        draft=str(tmp_path / "draft"),
        target=str(tmp_path / "target.json"),
        serving_args=f"--speculative-algorithm EAGLE3 {flags}".strip(),
    )
    diagnosis = diagnose(inputs, parallel=False).diagnosis
    found = [h for h in diagnosis.hypotheses if h.id == "quant-inherited"]
    expected = launch == "awq-launch-plain-draft" or (
        launch == "awq-launch-fp8-draft" and not _DRAFT_BRANCH.search(config_text)
    )
    if not expected:
        assert found == [], (version, found[0].reason if found else None)
        return
    assert diagnosis.hypotheses[0].id == "quant-inherited", [h.id for h in diagnosis.hypotheses]
    cited = {(step.location.path, step.location.line) for step in found[0].citations}
    read = re.search(r"quantization=server_args\.quantization|^\s+quantization = \($", config_text, re.MULTILINE)
    assert read is not None
    line = config_text.count("\n", 0, read.start()) + 1 + (1 if read[0].startswith("\n") else 0)
    assert any(path == SGLANG_CONFIG and cited_line == line for path, cited_line in cited), (line, sorted(cited))
    assert "--quantization awq" in found[0].reason
