"""Serving taps on every lmdeploy release with EAGLE-3 (0.11.0 on), against what reading each gives.

lmdeploy's config builder chooses the layers the target captures (`(2, L // 2, L - 3)` for Llama,
and for Kimi-K2 from 0.17.0) whatever the draft declares, and its models capture the stream entering
layer k (hk). The expectations below come from reading the releases; the analysis derives them from
the code, with no table of versions inside rca.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.conftest import CASES
from tests.releases import LMDEPLOY

pytestmark = pytest.mark.release

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096}
KIMI_K25 = CASES / "kimi-k25-consistent" / "target"
TRAINED_ON = [1, 15, 28]  # a speculators 0.9 draft's ids (vLLM numbering), other than lmdeploy's (2, 16, 29)
PLACEMENTS = {
    "absent": lambda ids: {},
    "top-level": lambda ids: {"eagle_aux_hidden_state_layer_ids": ids},
    "nested": lambda ids: {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}},
}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _write(path: Path, data: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(data, indent=2))
    return path


def _line_of(root: Path, relpath: str, text: str) -> int:
    """The line of `relpath` in the release that contains `text` (read from the release itself)."""
    lines = (root / relpath).read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1) if text in line)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("version", LMDEPLOY)
def test_llama_targets_capture_the_builders_layers_whatever_the_draft_declares(
    tmp_path: Path, version: str, placement: str
) -> None:
    root = fetch_release("lmdeploy", version)
    draft = _write(
        tmp_path / "draft",
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, **PLACEMENTS[placement](TRAINED_ON)},
    )
    run = diagnose(Inputs(serving=str(root), draft=str(draft), target=str(_write(tmp_path / "target", LLAMA))))
    serving = run.diagnosis.wirings["serving"]
    assert [str(tap) for tap in serving.slots] == ["h2", "h16", "h29"], serving.notes
    assert serving.ids == (2, 16, 29)
    assert serving.fc_slots == 3  # Eagle3LlamaForCausalLM, the class the builder renames the draft to
    builder = "lmdeploy/pytorch/configurations/llama.py"
    line = _line_of(root, builder, "hf_config.aux_hidden_state_layers =")
    assert (builder, line) in {(step.location.path, step.location.line) for step in serving.steps}
    ignored = [f for f in run.sides["serving"].findings if f.name == "draft-ids-ignored"]
    if placement == "absent":
        assert not ignored
    else:
        assert len(ignored) == 1 and (ignored[0].location.path, ignored[0].location.line) == (builder, line)


@pytest.mark.parametrize("version", LMDEPLOY)
def test_kimi_k25_targets_capture_from_0_17(tmp_path: Path, version: str) -> None:
    draft = _write(
        tmp_path / "draft",
        {
            "architectures": ["Eagle3DeepseekV2ForCausalLM"],
            "num_hidden_layers": 1,
            "hidden_size": 7168,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]},
        },
    )
    run = diagnose(Inputs(serving=str(fetch_release("lmdeploy", version)), draft=str(draft), target=str(KIMI_K25)))
    serving = run.diagnosis.wirings["serving"]
    if _release(version) < (0, 17, 0):
        assert not serving.slots, serving.slots
        assert any(f.hypothesis == "draft-arch-unsupported" for f in run.sides["serving"].findings)
        return
    # The input residual each chosen layer returns when asked (`capture_input_residual`): hk.
    assert [str(tap) for tap in serving.slots] == ["h2", "h30", "h58"], serving.notes
    assert serving.fc_slots == 3
    cited = {step.location.path for step in serving.steps}
    assert {"lmdeploy/pytorch/configurations/kimi_k2.py", "lmdeploy/pytorch/models/kimi_k2_language.py"} <= cited


@pytest.mark.parametrize("version", LMDEPLOY[:: len(LMDEPLOY) - 1])
def test_targets_without_an_eagle3_builder_capture_nothing_and_say_which_builder(tmp_path: Path, version: str) -> None:
    draft = _write(tmp_path / "draft", {"architectures": ["LlamaForCausalLM"]})
    run = diagnose(
        Inputs(
            serving=str(fetch_release("lmdeploy", version)), draft=str(draft), target=str(_write(tmp_path / "t", QWEN3))
        )
    )
    serving = run.diagnosis.wirings["serving"]
    assert not serving.slots
    assert any("sets no layers to capture for an EAGLE-3 draft" in note for note in serving.notes), serving.notes


@pytest.mark.parametrize("version", LMDEPLOY[:: len(LMDEPLOY) - 1])
def test_a_draft_named_the_sglang_way_is_not_built(tmp_path: Path, version: str) -> None:
    """lmdeploy prefixes `Eagle3` to the draft's architecture: `LlamaForCausalLMEagle3` names no class."""
    draft = _write(tmp_path / "draft", {"architectures": ["LlamaForCausalLMEagle3"]})
    run = diagnose(
        Inputs(
            serving=str(fetch_release("lmdeploy", version)), draft=str(draft), target=str(_write(tmp_path / "t", LLAMA))
        )
    )
    found = [f for f in run.sides["serving"].findings if f.hypothesis == "draft-arch-unsupported"]
    assert found and "Eagle3LlamaForCausalLM" in found[0].message
    # The fix is the name the builder turns into that class, found by running it on trial configs.
    assert found[0].fix.startswith("declare LlamaForCausalLM in the draft config"), found[0].fix
    assert run.diagnosis.hypotheses[0].id == "draft-arch-unsupported"
