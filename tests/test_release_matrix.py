"""Serving taps across SGLang, vLLM and speculators releases, against what reading each release gives.

Each release's wheel is downloaded once (pip download --no-deps) and only its Python files are
kept. The expectations below come from reading the releases; the analysis derives them from the
code, with no table of versions inside rca.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.releases import SGLANG, SGLANG_GPT_OSS, SPECFORGE, SPECULATORS, VLLM

pytestmark = pytest.mark.release

TARGETS = {  # target shape -> (architecture, decoder layers)
    "llama-3.1-8b": ("LlamaForCausalLM", 32),
    "qwen3-30b-a3b": ("Qwen3MoeForCausalLM", 48),
    "deepseek-v3": ("DeepseekV3ForCausalLM", 61),
}
IDS = {  # the ids in the draft config, as a function of the layer count
    "default": lambda n: None,
    "first-id-1": lambda n: [1, n // 2 - 1, n - 4],
    "first-id-2": lambda n: [2, n // 2, n - 3],
}


def expected_taps(version: str, architecture: str, ids: list[int] | None, n: int) -> list[str] | None:
    """What the release's model files capture (id k is h(k+1), DeepSeek's +1 conditional from 0.5.13);
    None where the model cannot capture."""
    release = tuple(int(part) for part in version.split("."))
    if architecture == "DeepseekV3ForCausalLM" and release < (0, 5, 6):
        return None  # no set_eagle3_layers_to_capture before 0.5.6
    if ids is None:
        layers = [2, n // 2, n - 3]
    elif architecture == "DeepseekV3ForCausalLM" and release >= (0, 5, 13) and ids[0] != 1:
        layers = list(ids)  # the conditional +1: only when the first id is 1
    else:
        layers = [k + 1 for k in ids]
    return [f"h{layer}" for layer in layers]


@pytest.mark.parametrize("ids_name", sorted(IDS))
@pytest.mark.parametrize("target_name", sorted(TARGETS))
@pytest.mark.parametrize("version", SGLANG)
def test_sglang_serving_taps(tmp_path: Path, version: str, target_name: str, ids_name: str) -> None:
    architecture, layers = TARGETS[target_name]
    ids = IDS[ids_name](layers)
    target = tmp_path / "target.json"
    target.write_text(
        json.dumps(
            {
                "architectures": [architecture],
                "num_hidden_layers": layers,
                "hidden_size": 4096,
                "first_k_dense_replace": 3,
            }
        )
    )
    draft = tmp_path / "draft.json"
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096}
    if ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    draft.write_text(json.dumps(config, indent=2))
    run = diagnose(Inputs(serving=str(fetch_release("sglang", version)), draft=str(draft), target=str(target)))
    serving = run.diagnosis.wirings["serving"]
    expected = expected_taps(version, architecture, ids, layers)
    release = tuple(int(part) for part in version.split("."))
    if expected is None:
        assert not serving.slots
        assert any("has no set_eagle3_layers_to_capture" in note for note in serving.notes), serving.notes
    else:
        assert [str(tap) for tap in serving.slots] == expected, serving.notes
        assert serving.fc_slots == 3
        # Up to 0.5.10 the graph runner (and from 0.5.6 the dummy run) hand over no
        # ids before the runner applies the configured ones; 0.5.12 applies them first.
        hazard = [f for f in run.sides["serving"].findings if f.name == "graphs-captured-before-ids"]
        assert bool(hazard) == (ids is not None and release <= (0, 5, 10)), [f.message for f in hazard]
        # Captures between layers, before an all-reduce the layer may fuse
        # into the next one: qwen3_moe 0.5.2 (0.5.6 moved its capture into the communicator) and
        # deepseek_v2 0.5.6-0.5.13 (0.5.14 hands the capture list to the layer, whose communicator
        # captures after the reduction).
        partial = [f for f in run.sides["serving"].findings if f.name == "capture-before-allreduce"]
        exposed = (architecture == "Qwen3MoeForCausalLM" and release == (0, 5, 2)) or (
            architecture == "DeepseekV3ForCausalLM" and (0, 5, 6) <= release <= (0, 5, 13)
        )
        assert bool(partial) == exposed, [f.message for f in partial]


@pytest.mark.parametrize("version", SGLANG_GPT_OSS)
def test_gpt_oss_captures_before_a_deferred_allreduce(tmp_path: Path, version: str) -> None:
    """gpt_oss captures between layers and its layer may fuse its all-reduce into
    the next one from 0.5.2 to 0.5.16; 0.5.23 captures at the layer boundaries, after the reduction."""
    target = tmp_path / "target.json"
    target.write_text(
        json.dumps({"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 36, "hidden_size": 2880})
    )
    draft = tmp_path / "draft.json"
    draft.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 2880,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]},
            }
        )
    )
    run = diagnose(Inputs(serving=str(fetch_release("sglang", version)), draft=str(draft), target=str(target)))
    assert [str(tap) for tap in run.diagnosis.wirings["serving"].slots] == ["h2", "h18", "h33"]
    partial = [f for f in run.sides["serving"].findings if f.name == "capture-before-allreduce"]
    assert bool(partial) == (version != "0.5.23"), [f.message for f in partial]
    if partial:
        assert partial[0].location.path == "sglang/srt/models/gpt_oss.py"
        assert "h2~partial, h18~partial, h33~partial" in partial[0].message


PLACEMENT = ["default", "top-level", "nested"]


def expected_vllm(version: str, placement: str, n: int) -> list[str]:
    """vLLM: id k is hk; the top-level key is read from 0.11.1, the nested one from 0.22 by the runner
    of v1 (`v1/worker/gpu_model_runner.py`), which 0.34 removed: its runner (`v1/worker/gpu/`,
    `get_eagle3_aux_layers_from_config`) never reads the nested key."""
    release = tuple(int(part) for part in version.split("."))
    ids = [1, n // 2, n - 2]
    read = (placement == "top-level" and release >= (0, 11, 1)) or (
        placement == "nested" and (0, 22, 0) <= release < (0, 34, 0)
    )
    return [f"h{k}" for k in (ids if read else [2, n // 2, n - 3])]


@pytest.mark.parametrize("placement", PLACEMENT)
@pytest.mark.parametrize("target_name", sorted(TARGETS))
@pytest.mark.parametrize("version", VLLM)
def test_vllm_serving_taps(tmp_path: Path, version: str, target_name: str, placement: str) -> None:
    architecture, layers = TARGETS[target_name]
    target = tmp_path / "target.json"
    target.write_text(
        json.dumps(
            {
                "architectures": [architecture],
                "num_hidden_layers": layers,
                "hidden_size": 4096,
                "first_k_dense_replace": 3,
            }
        )
    )
    config: dict = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096}
    ids = [1, layers // 2, layers - 2]
    if placement == "top-level":
        config["eagle_aux_hidden_state_layer_ids"] = ids
    elif placement == "nested":
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps(config, indent=2))
    run = diagnose(Inputs(serving=str(fetch_release("vllm", version)), draft=str(draft), target=str(target)))
    serving = run.diagnosis.wirings["serving"]
    release = tuple(int(part) for part in version.split("."))
    # The model class implements no EAGLE-3 interface yet: the runner raises or has nothing to call.
    # DeepSeek gained it in 0.18.0 (deepseek_v2.py:1303 `SupportsEagle3`, :1382 the setter).
    unsupported = (architecture == "Qwen3MoeForCausalLM" and release < (0, 11, 1)) or (
        architecture == "DeepseekV3ForCausalLM" and release < (0, 18, 0)
    )
    if unsupported:
        assert not serving.slots
        assert any(
            "has no set_aux_hidden_state_layers" in note or "was not reached" in note for note in serving.notes
        ), serving.notes
        return
    assert [str(tap) for tap in serving.slots] == expected_vllm(version, placement, layers), serving.notes
    concat = [step.location for step in serving.steps if "concatenates" in step.note]
    assert concat and "/models/" not in concat[0].path, concat  # the runner's or drafter's, not another model's


# -- training: speculators, as its data generation and trainer code read --------------------------

TRAINING_IDS = ("default", "recorded")


def expected_training(version: str, ids_name: str, n: int) -> tuple[list[str], str, list[int] | None, list[int] | None]:
    """(slots, verifier-last, draft-config ids, dump-metadata ids) for a speculators release.

    0.3–0.4 capture in a patched vLLM worker after each layer (id k is h(k+1)), defaults
    [2, L//2, L-3, L-1], ids recorded only in the dumps' data_config.json. From 0.5 a vLLM server
    extracts them (id k is hk), the trainer records its ids [2, L//2, L-3] (default) in the draft
    config, and the launcher appends L for the verifier's state.
    """
    if tuple(int(part) for part in version.split(".")) < (0, 5, 0):
        ids = [2, n // 2, n - 3, n - 1] if ids_name == "default" else [1, n // 2 - 1, n - 4, n - 1]
        taps = [f"h{k + 1}" for k in ids]
        return taps[:-1], taps[-1], None, None if ids_name == "default" else ids
    ids = [2, n // 2, n - 3] if ids_name == "default" else [1, n // 2 - 1, n - 4]
    return [f"h{k}" for k in ids], f"h{n}", ids, None


@pytest.mark.parametrize("ids_name", TRAINING_IDS)
@pytest.mark.parametrize("target_name", sorted(TARGETS))
@pytest.mark.parametrize("version", SPECULATORS)
def test_speculators_training_taps(tmp_path: Path, version: str, target_name: str, ids_name: str) -> None:
    architecture, layers = TARGETS[target_name]
    slots, last, config_ids, dump_ids = expected_training(version, ids_name, layers)
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"architectures": [architecture], "num_hidden_layers": layers, "hidden_size": 4096}))
    config: dict = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096}
    if config_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = config_ids
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps(config, indent=2))
    dumps = None
    if dump_ids is not None:
        dumps = tmp_path / "dumps"
        dumps.mkdir()
        (dumps / "data_config.json").write_text(json.dumps({"hidden_states": {"layer_ids": dump_ids}}, indent=2))
    inputs = Inputs(
        training=str(fetch_release("speculators", version)),
        draft=str(draft),
        target=str(target),
        dumps=str(dumps) if dumps else None,
    )
    training = diagnose(inputs).diagnosis.wirings["training"]
    assert [str(tap) for tap in training.slots] == slots, training.notes
    assert str(training.verifier_last) == last
    cited = {step.location.path for step in training.steps}
    reader = "speculators/train/data.py"
    assert reader in cited, cited  # the reader that slices the dumps is cited


@pytest.mark.parametrize("target_name", sorted(TARGETS))
def test_specforge_online_training_taps(tmp_path: Path, target_name: str) -> None:
    """SpecForge 0.1.0 (a source archive only) runs the target under transformers and takes
    hidden_states[1+1], [L//2-1+1] and [L-4+1]: h2, h(L//2), h(L-3)."""
    architecture, layers = TARGETS[target_name]
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"architectures": [architecture], "num_hidden_layers": layers, "hidden_size": 4096}))
    training = diagnose(
        Inputs(training=str(fetch_release("specforge", SPECFORGE[0])), target=str(target))
    ).diagnosis.wirings["training"]
    assert [str(tap) for tap in training.slots] == [f"h{k}" for k in (2, layers // 2, layers - 3)], training.notes
    assert any(
        step.location.path == "specforge/core/eagle3.py" and "concatenates" in step.note for step in training.steps
    )


@pytest.mark.parametrize("ids_name", ("default", "nested"))
@pytest.mark.parametrize("target_name", sorted(TARGETS))
def test_specforge_engine_capture_taps(tmp_path: Path, target_name: str, ids_name: str) -> None:
    """SpecForge 0.2.0 hands SGLang (in process) the run's ids, else the draft's nested ids, else
    [1, L//2-1, L-4]; SGLang adds one (for DeepSeek only when the first id is 1, so the explicit
    ids here start at 1); the final state is the engine's, after its norm."""
    architecture, layers = TARGETS[target_name]
    ids = [1, layers // 2 - 1, layers - 4] if ids_name == "default" else [1, layers // 2, layers - 2]
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"architectures": [architecture], "num_hidden_layers": layers, "hidden_size": 4096}))
    config: dict = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096}
    if ids_name == "nested":
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps(config, indent=2))
    training = diagnose(
        Inputs(training=str(fetch_release("specforge", SPECFORGE[1])), draft=str(draft), target=str(target))
    ).diagnosis.wirings["training"]
    assert [str(tap) for tap in training.slots] == [f"h{k + 1}" for k in ids], training.notes
    assert str(training.verifier_last) == f"h{layers}+norm"
    assert any(step.location.path == "specforge/offline_capture/sglang_backend/capture.py" for step in training.steps)
    assert any("SGLang's numbering is assumed" in note for note in training.notes)


@pytest.mark.parametrize(
    ("training", "engine", "architecture", "layers", "config", "slots", "last", "cited"),
    [
        pytest.param(
            "specforge==0.2.0",
            "sglang==0.5.14",
            "DeepseekV3ForCausalLM",
            61,
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}},
            ["h2", "h30", "h58"],
            "h61+norm",
            "sglang/srt/models/deepseek_v2.py",
            id="specforge-0.2-on-sglang-0.5.14-deepseek",
        ),
        pytest.param(
            "speculators==0.9.0",
            "vllm==0.20.0",
            "LlamaForCausalLM",
            32,
            {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]},
            ["h2", "h16", "h29"],
            "h32",
            "vllm/model_executor/models/interfaces.py",
            id="speculators-0.9-on-vllm-0.20-llama",
        ),
    ],
)
def test_the_training_engine_numbering_is_read_from_its_code(
    tmp_path: Path, training, engine, architecture, layers, config, slots, last, cited
) -> None:
    """With --training-engine, the engine's own code decides the taps: SGLang 0.5.14's DeepSeek adds
    no 1 when the first id is 2 (the assumed numbering would have said h3, h31, h59)."""
    target = tmp_path / "target.json"
    target.write_text(
        json.dumps(
            {
                "architectures": [architecture],
                "num_hidden_layers": layers,
                "hidden_size": 4096,
                "first_k_dense_replace": 3,
            }
        )
    )
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, **config}, indent=2))
    name, version = engine.split("==")
    fetch_release(name, version)
    wiring = diagnose(
        Inputs(training=training, training_engine=engine, draft=str(draft), target=str(target))
    ).diagnosis.wirings["training"]
    assert [str(tap) for tap in wiring.slots] == slots, wiring.notes
    assert str(wiring.verifier_last) == last
    assert not any("numbering is assumed" in note for note in wiring.notes)
    assert any(step.location.input == "engine" and step.location.path == cited for step in wiring.steps)


@pytest.mark.parametrize(
    ("version", "ids", "slots"),
    [
        pytest.param("0.5.16", [24, 30, 36], ["h25", "h31"], id="0.5.16-shifted-and-the-boundary-dropped"),
        pytest.param("0.5.16", [1, 17, 32], ["h2", "h18", "h33"], id="0.5.16-in-range"),
        pytest.param("0.5.23", [24, 30, 36], ["h24", "h30", "h36"], id="0.5.23-boundary-indices"),
        pytest.param("0.5.23", [23, 29, 35], ["h24", "h30", "h36"], id="0.5.23-output-of-layer-ids"),
    ],
)
def test_gpt_oss_ids_at_the_final_boundary(tmp_path: Path, version: str, ids: list[int], slots: list[str]) -> None:
    """On 0.5.16 gpt-oss shifts [24, 30, 36] to [25, 31, 37] and never captures the boundary after
    the last block; 0.5.23 reads the ids as boundaries and captures h36 before the final norm
    (https://github.com/sgl-project/sglang/pull/32334)."""
    target = tmp_path / "target.json"
    target.write_text(
        json.dumps({"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 36, "hidden_size": 2880})
    )
    draft = tmp_path / "draft.json"
    draft.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 2880,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids},
            },
            indent=2,
        )
    )
    serving = diagnose(
        Inputs(serving=str(fetch_release("sglang", version)), draft=str(draft), target=str(target))
    ).diagnosis.wirings["serving"]
    assert [str(tap) for tap in serving.slots] == slots, serving.notes


@pytest.mark.parametrize("architecture", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
@pytest.mark.parametrize("version", SGLANG)
def test_sglang_dense_qwen_targets(tmp_path: Path, version: str, architecture: str) -> None:
    """Dense Qwen2/Qwen3 models capture like Llama: id k is h(k+1). In 0.4.10 qwen2.py has no
    set_eagle3_layers_to_capture yet (llama, qwen3, qwen3_moe and mllama4 do)."""
    layers = 36
    ids = [1, layers // 2 - 1, layers - 4]
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"architectures": [architecture], "num_hidden_layers": layers, "hidden_size": 4096}))
    draft = tmp_path / "draft.json"
    draft.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 4096,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids},
            },
            indent=2,
        )
    )
    serving = diagnose(
        Inputs(serving=str(fetch_release("sglang", version)), draft=str(draft), target=str(target))
    ).diagnosis.wirings["serving"]
    if architecture == "Qwen2ForCausalLM" and version == "0.4.10":
        assert not serving.slots and any("has no set_eagle3_layers_to_capture" in note for note in serving.notes)
        return
    assert [str(tap) for tap in serving.slots] == [f"h{k + 1}" for k in ids], serving.notes
