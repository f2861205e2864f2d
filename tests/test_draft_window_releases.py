"""A draft's sliding-window attention against the window each vLLM release builds it with.

A speculators-format Qwen3 draft declares a 2,048-token window for its one layer
(`transformer_layer_config.layer_types`). vLLM 0.24 brought the Qwen3 EAGLE-3 draft class, whose
layer built its attention without `per_layer_sliding_window` up to 0.25, so the attention took the
served model's window (https://github.com/vllm-project/speculators/pull/684); earlier releases
serve the draft with the Llama class. The test tells which releases pass the window by reading
the release's qwen3_eagle3.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.conftest import write_json
from tests.releases import VLLM, VLLM_DRAFT_WINDOW

pytestmark = pytest.mark.release

TARGET = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 151936,
    "sliding_window": None,
    "use_sliding_window": False,
}
LAYER = {
    "model_type": "qwen3",
    "hidden_size": 4096,
    "head_dim": 128,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 1,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "vocab_size": 151936,
    "sliding_window": 2048,
    "use_sliding_window": True,
    "max_window_layers": 0,
}
RELEASES = sorted({*VLLM, VLLM_DRAFT_WINDOW[1]}, key=lambda v: tuple(int(p) for p in v.split(".")))


def _draft(kind: str) -> dict:
    return {
        "architectures": ["Eagle3DraftModel"],
        "draft_vocab_size": 32000,
        "eagle_aux_hidden_state_layer_ids": [2, 18, 33],
        "speculators_config": {
            "algorithm": "eagle3",
            "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": "Qwen/Qwen3-8B"},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": {**LAYER, "layer_types": [kind]},
    }


def _ignores_window(root: Path) -> bool | None:
    """Whether the release's Qwen3 EAGLE-3 draft layer builds its attention without the draft's
    window, read from its file; None where the release has no such class."""
    path = root / "vllm/model_executor/models/qwen3_eagle3.py"
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    layer = re.search(r"class Qwen3Eagle3DecoderLayer\b.*?\n    def forward", text, re.DOTALL)
    assert layer is not None
    return "per_layer_sliding_window" not in layer.group(0)


@pytest.mark.parametrize("kind", ["sliding_attention", "full_attention"])
@pytest.mark.parametrize("version", RELEASES)
def test_a_draft_window_is_flagged_where_the_release_builds_the_draft_without_it(
    tmp_path: Path, version: str, kind: str
) -> None:
    root = fetch_release("vllm", version)
    write_json(tmp_path / "draft" / "config.json", _draft(kind))
    write_json(tmp_path / "target.json", TARGET)
    run = diagnose(
        Inputs(serving=f"vllm=={version}", draft=str(tmp_path / "draft"), target=str(tmp_path / "target.json")),
        parallel=False,
    )
    found = [h for h in run.diagnosis.hypotheses if h.id == "window-ignored"]
    if kind == "full_attention" or not _ignores_window(root):
        assert not found, [h.reason for h in found]
        return
    (top,) = found
    assert (
        top.rank == 1 and "Qwen3Eagle3DecoderLayer builds its attention without per_layer_sliding_window" in top.reason
    )
    cited = {(step.location.path, step.location.line) for step in top.citations}
    fallback = next(
        n
        for n, line in enumerate(
            (root / "vllm/model_executor/layers/attention/attention.py").read_text().splitlines(), 1
        )
        if "sliding_window = cache_config.sliding_window" in line
    )
    assert ("vllm/model_executor/layers/attention/attention.py", fallback) in cited, cited
