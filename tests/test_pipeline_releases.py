"""EAGLE-3 captures under pipeline parallelism, read from every vLLM release the tests pin.

With `--pipeline-parallel-size 2` each stage runs the target's forward over its own layers (split by
the release's `get_pp_indices`) and the draft runs on the last stage. Up to 0.22 the model files
number a stage's layers from 0 and hand on only hidden states and residual: the last stage
captures layers counted from its own first layer (https://github.com/vllm-project/vllm/pull/50514
fixed both). The test tells which releases number globally by reading the release's llama.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from rca.model import Tap
from tests.conftest import write_json
from tests.releases import VLLM

pytestmark = pytest.mark.release

TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 64}
IDS = [2, 16, 29]
DRAFT = {
    "architectures": ["Eagle3LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": 1,
    "vocab_size": 64,
    "eagle_aux_hidden_state_layer_ids": IDS,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": IDS},
}


def _numbers_globally(root: Path) -> bool:
    """Whether the release's Llama forward numbers a stage's layers from the stage's first layer
    and hands an earlier stage's captures on, read from its file."""
    text = (root / "vllm/model_executor/models/llama.py").read_text(encoding="utf-8")
    return "start=self.start_layer" in text and "pack_local_aux_hidden_states" in text


def _serve(tmp_path: Path, version: str, stages: int):
    write_json(tmp_path / "draft" / "config.json", DRAFT)
    write_json(tmp_path / "target.json", TARGET)
    run = diagnose(
        Inputs(
            serving=f"vllm=={version}",
            draft=str(tmp_path / "draft"),
            target=str(tmp_path / "target.json"),
            serving_args=f"--pipeline-parallel-size {stages}",
        ),
        parallel=False,
    )
    return run.sides["serving"]


@pytest.mark.parametrize("version", VLLM)
def test_two_pipeline_stages_feed_what_one_stage_does_only_where_layers_are_numbered_globally(
    tmp_path: Path, version: str
) -> None:
    root = fetch_release("vllm", version)
    one = _serve(tmp_path / "one", version, 1)
    two = _serve(tmp_path / "two", version, 2)
    single, staged = one.wiring.slots, two.wiring.slots
    found = [f for f in two.findings if f.hypothesis == "pp-stage-local-layers"]
    assert not [f for f in one.findings if f.hypothesis == "pp-stage-local-layers"]
    if _numbers_globally(root):
        assert staged == single, (staged, single)
        assert not found
        return
    # counted within the last stage (layers 16-31): each served tap is a one-stage tap moved by 16
    assert found and staged != single, (staged, single)
    assert staged and all(tap.layer is not None and tap.layer >= 16 for tap in staged), staged
    assert {Tap(tap.layer - 16) for tap in staged if tap.layer is not None} <= set(single) | {Tap(16)}, staged
    assert found[0].steps[1].location.path == "vllm/distributed/utils.py"
