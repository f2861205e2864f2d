"""Training taps on every NVIDIA ModelOpt and NeMo Automodel release with EAGLE-3 training, against
what reading each gives.

Both hook the target's decoder layers: a forward hook on layer k keeps the stream after it (h(k+1)).
ModelOpt (its HF path, from 0.35.0) appends what each hooked layer returns in the order the layers
run, takes the ids from its EAGLE config (exported as `eagle_config.eagle_aux_hidden_state_layer_ids`)
and defaults to [1, N//2-1, N-4]; NeMo Automodel (from 0.5.0) keeps them by id in the ids' order,
defaults to the same ids and records them only in its cache's manifest.json. The expectations come
from reading the releases; the analysis derives them from the code, with no table of versions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.conftest import CASES, write_json
from tests.releases import MODELOPT, NEMO_AUTOMODEL

pytestmark = pytest.mark.release

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096}
KIMI_K25 = CASES / "kimi-k25-consistent" / "target"  # 61 decoder layers, in text_config
DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096}
RECORDED = [3, 17, 25]  # ids other than the defaults, to tell a read from a default


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _hook_line(root: Path, relpaths: list[str], text: str) -> tuple[str, int]:
    """The file and line of the release that registers the capture hook (read from the release)."""
    for relpath in relpaths:
        path = root / relpath
        if path.is_file():
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if text in line:
                    return relpath, number
    raise AssertionError(f"no {text!r} in {relpaths}")


def _training(root: Path, tmp_path: Path, draft: dict, target: Path | dict, dumps: dict | None = None):
    target_path = target if isinstance(target, Path) else write_json(tmp_path / "target" / "config.json", target)
    dump_dir = None
    if dumps is not None:
        dump_dir = tmp_path / "dumps"
        write_json(dump_dir / "manifest.json", dumps)
    run = diagnose(
        Inputs(
            training=str(root),
            draft=str(write_json(tmp_path / "draft" / "config.json", draft)),
            target=str(target_path),
            dumps=str(dump_dir) if dump_dir else None,
        ),
        parallel=False,
    )
    return run.diagnosis.wirings["training"]


MODELOPT_HOOKS = [
    "modelopt/torch/speculative/plugins/hf_eagle.py",
    "modelopt/torch/speculative/plugins/transformers.py",
]


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "default"])
@pytest.mark.parametrize("version", MODELOPT)
def test_modelopt_hooks_the_output_of_each_layer_it_records(tmp_path: Path, version: str, recorded: bool) -> None:
    root = fetch_release("nvidia-modelopt", version)
    draft = {**DRAFT, "eagle_config": {"eagle_aux_hidden_state_layer_ids": RECORDED}} if recorded else DRAFT
    training = _training(root, tmp_path, draft, LLAMA)
    if _release(version) < (0, 35, 0):  # its HF path has the EAGLE-3 fields but trains on the last state only
        assert not training.slots, training.slots
        assert any("no hidden states fed to the draft were found" in note for note in training.notes)
        return
    ids = RECORDED if recorded else [1, 15, 28]
    assert [str(tap) for tap in training.slots] == [f"h{k + 1}" for k in ids], training.notes
    assert str(training.verifier_last) == "h32+norm"
    cited = {(step.location.path, step.location.line) for step in training.steps}
    assert _hook_line(root, MODELOPT_HOOKS, "register_forward_hook(self._collect_aux_hidden_states") in cited
    if recorded:
        [read] = [step for step in training.steps if step.location.input == "draft"]
        assert read.note.startswith("eagle_config.eagle_aux_hidden_state_layer_ids = [3, 17, 25]"), read.note


@pytest.mark.parametrize("version", MODELOPT[-1:])
def test_modelopt_counts_the_layers_of_a_multimodal_targets_text_config(tmp_path: Path, version: str) -> None:
    training = _training(fetch_release("nvidia-modelopt", version), tmp_path, DRAFT, KIMI_K25)
    assert [str(tap) for tap in training.slots] == ["h2", "h30", "h58"], training.notes  # [1, 61//2-1, 61-4]


NEMO_HOOKS = ["nemo_automodel/components/speculative/eagle/target.py"]


@pytest.mark.parametrize("source", ["default", "manifest"])
@pytest.mark.parametrize("version", NEMO_AUTOMODEL)
def test_nemo_automodel_hooks_its_ids_and_concatenates_them_in_order(tmp_path: Path, version: str, source: str) -> None:
    root = fetch_release("nemo-automodel", version)
    manifest = {"format_version": 2, "aux_layer_ids": [25, 3, 17]} if source == "manifest" else None
    training = _training(root, tmp_path, {**DRAFT, "architectures": ["LlamaEagle3DraftModel"]}, LLAMA, manifest)
    if _release(version) < (0, 5, 0):
        assert not training.slots
        assert any("has no EAGLE-3 path" in note for note in training.notes), training.notes
        return
    ids = [25, 3, 17] if manifest else [1, 15, 28]  # kept by id: the draft input follows the ids' order
    assert [str(tap) for tap in training.slots] == [f"h{k + 1}" for k in ids], training.notes
    assert str(training.verifier_last) == "h32+norm"
    cited = {(step.location.path, step.location.line) for step in training.steps}
    assert _hook_line(root, NEMO_HOOKS, ".register_forward_hook(_make_hook(layer_id))") in cited
    if manifest:
        assert any(step.location.input == "dumps" for step in training.steps)


@pytest.mark.parametrize("version", NEMO_AUTOMODEL[-1:])
def test_nemo_automodel_counts_the_layers_of_a_multimodal_targets_text_config(tmp_path: Path, version: str) -> None:
    training = _training(fetch_release("nemo-automodel", version), tmp_path, DRAFT, KIMI_K25)
    assert [str(tap) for tap in training.slots] == ["h2", "h30", "h58"], training.notes


def test_the_recorded_ids_are_the_ones_modelopt_exports(tmp_path: Path) -> None:
    """The key rca reads the ids from is the one ModelOpt's own exporter writes them under."""
    root = fetch_release("nvidia-modelopt", MODELOPT[-1])
    exporter = (root / "modelopt/torch/export/plugins/hf_spec_configs.py").read_text()
    assert '"eagle_config"' in exporter and '"eagle_aux_hidden_state_layer_ids"' in exporter
