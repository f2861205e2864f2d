"""The draft's contract with the serving engine, read from every SGLang and vLLM release the tests pin.

Every release from SGLang 0.4.10 and vLLM 0.9.2 on loads a checkpoint's `d2t` in the draft class's
`load_weights` (`if "d2t" in name:`) and adds the draft ids to it; the test finds that line in
the release's own file and checks that the finding cites it. `norm_before_fc` is read at the top
level from vLLM 0.18 and in `eagle_config` too from vLLM 0.22 and SGLang 0.5.23; the test tells
which releases read it where by looking at the release's draft module.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.conftest import write_json, write_safetensors
from tests.releases import SGLANG, VLLM, VLLM_HEAD_HANDOVER

pytestmark = pytest.mark.release

TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 64}
DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 4096,
    "num_hidden_layers": 1,
    "vocab_size": 64,
    "draft_vocab_size": 16,
    # The default layers h2, h16, h29 in both placements' numberings, as a draft published for both
    # engines declares them: SGLang reads the nested ids (+1), vLLM the top-level ones first.
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]},
    "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
}
KEPT = [4 * i + 1 for i in range(16)]  # the target ids the draft keeps
MAPS = {
    "absent": ({}, "vocab-map-missing"),
    "all-zeros": ({"d2t": ("I64", (16,), None)}, "vocab-map-invalid"),
    "repeated": ({"d2t": ("I64", (16,), tuple(5 - i for i in range(16)))}, "vocab-map-invalid"),
    "valid": (
        {
            "d2t": ("I64", (16,), tuple(t - i for i, t in enumerate(KEPT))),
            "t2d": ("BOOL", (64,), tuple(t in KEPT for t in range(64))),
        },
        None,
    ),
}
RELEASES = [("sglang", version) for version in SGLANG] + [("vllm", version) for version in VLLM]
# Every other release, the first and the last of each engine included: where a check reads one line
# the same way on every release, half of them hold it to that (CI's time is the budget).
ALTERNATE_RELEASES = [
    (package, version)
    for versions, package in ((SGLANG, "sglang"), (VLLM, "vllm"))
    for index, version in enumerate(versions)
    if index % 2 == 0 or index == len(versions) - 1
]


def _loader_line(root: Path, package: str) -> tuple[str, int]:
    """The draft loader's test on the name `d2t` in the release's llama_eagle3.py, found by reading it."""
    relpath = (
        "sglang/srt/models/llama_eagle3.py" if package == "sglang" else "vllm/model_executor/models/llama_eagle3.py"
    )
    lines = (root / relpath).read_text(encoding="utf-8").splitlines()
    return relpath, next(number for number, line in enumerate(lines, 1) if line.strip() == 'if "d2t" in name:')


@pytest.mark.parametrize("map_name", sorted(MAPS))
@pytest.mark.parametrize(("package", "version"), RELEASES, ids=[f"{p}-{v}" for p, v in RELEASES])
def test_vocab_map_on_every_release(tmp_path: Path, package: str, version: str, map_name: str) -> None:
    root = fetch_release(package, version)
    tensors, expected = MAPS[map_name]
    # vLLM 0.9.2 registers the draft class under its own name only (its EAGLE config prefixes the
    # architecture with Eagle3); later releases map the SGLang-style name to it.
    architecture = "Eagle3LlamaForCausalLM" if (package, version) == ("vllm", "0.9.2") else "LlamaForCausalLMEagle3"
    write_json(tmp_path / "draft" / "config.json", {**DRAFT, "architectures": [architecture]})
    write_safetensors(tmp_path / "draft" / "model.safetensors", {"lm_head.weight": ("F16", (16, 1), None), **tensors})
    write_json(tmp_path / "target.json", TARGET)
    inputs = Inputs(
        serving=f"{package}=={version}", draft=str(tmp_path / "draft"), target=str(tmp_path / "target.json")
    )
    diagnosis = diagnose(inputs, parallel=False).diagnosis
    if expected is None:
        assert diagnosis.verdict.causes == (), [h.id for h in diagnosis.hypotheses]
        # no training source: the wiring is checked against the training the config's layout implies
        assert diagnosis.verdict.status.value == "consistent"
        assert any("the trainer is not recorded" in item for item in diagnosis.verdict.assumptions)
        return
    top = diagnosis.hypotheses[0]
    assert top.id == expected
    assert diagnosis.verdict.status.value == "mismatch" and diagnosis.verdict.root_cause == expected
    assert "the wiring is consistent" in diagnosis.verdict.summary
    relpath, line = _loader_line(root, package)
    cited = {(step.location.path, step.location.line) for step in top.citations if step.location.input == "serving"}
    assert (relpath, line) in cited, sorted(cited)
    assert any(step.location.path.endswith("draft/config.json") for step in top.citations)
    if map_name != "absent":
        assert any(step.location.path.endswith("draft/model.safetensors") for step in top.citations)


def _draft_file(package: str, root: Path) -> str:
    return "sglang/srt/models/llama_eagle3.py" if package == "sglang" else "vllm/model_executor/models/llama_eagle3.py"


@pytest.mark.parametrize("declared", ["top-level", "eagle_config", "weights-only"])
@pytest.mark.parametrize(("package", "version"), RELEASES, ids=[f"{p}-{v}" for p, v in RELEASES])
def test_norm_before_fc_on_every_release(tmp_path: Path, package: str, version: str, declared: str) -> None:
    """A draft trained with norm_before_fc: served with the norm where the release's draft module
    reads the flag from where the draft declares it; dropped otherwise, and always when only the
    weights say so (the flag lost in a conversion)."""
    root = fetch_release(package, version)
    architecture = "Eagle3LlamaForCausalLM" if (package, version) == ("vllm", "0.9.2") else "LlamaForCausalLMEagle3"
    config = {**DRAFT, "architectures": [architecture], "draft_vocab_size": 64}
    if declared == "top-level":
        config["norm_before_fc"] = True
    elif declared == "eagle_config":
        config["eagle_config"] = {**DRAFT["eagle_config"], "norm_before_fc": True}
    write_json(tmp_path / "draft" / "config.json", config)
    tensors = {"input_norm.weight": ("F16", (12288,), None), "lm_head.weight": ("F16", (64, 1), None)}
    write_safetensors(tmp_path / "draft" / "model.safetensors", tensors)
    write_json(tmp_path / "target.json", TARGET)
    inputs = Inputs(
        serving=f"{package}=={version}", draft=str(tmp_path / "draft"), target=str(tmp_path / "target.json")
    )
    diagnosis = diagnose(inputs, parallel=False).diagnosis
    relpath = _draft_file(package, root)
    text = (root / relpath).read_text(encoding="utf-8")  # where the release's draft module reads the flag
    reads_flag = {
        "top-level": 'config, "norm_before_fc"' in text,
        "eagle_config": re.search(r'\.get\(\s*"norm_before_fc"', text) is not None,
        "weights-only": False,
    }[declared]
    if reads_flag:
        assert diagnosis.verdict.causes == (), [h.reason for h in diagnosis.hypotheses]
        return
    top = diagnosis.hypotheses[0]
    assert top.id == "norm-flag-dropped" and diagnosis.verdict.root_cause == "norm-flag-dropped"
    cited = [step for step in top.citations if step.location.input == "serving"]
    assert cited and all(step.location.path == relpath for step in cited), [str(s.location) for s in cited]
    assert any(step.location.path.endswith("draft/model.safetensors") for step in top.citations)
    if "norm_before_fc" not in text:
        assert "never reads the flag" in top.reason or declared == "weights-only"


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip


@pytest.mark.parametrize("draft_rope", ["dropped", "kept"])
@pytest.mark.parametrize(("package", "version"), RELEASES, ids=[f"{p}-{v}" for p, v in RELEASES])
def test_rope_scaling_on_every_release(tmp_path: Path, package: str, version: str, draft_rope: str) -> None:
    """Every release builds the draft's layer with the draft config's RoPE: a draft config that lost
    the llama3 scaling it was trained with (recorded by the config before the edit) is a mismatch,
    cited to the line that reads it; one that kept it is not."""
    fetch_release(package, version)
    architecture = "Eagle3LlamaForCausalLM" if (package, version) == ("vllm", "0.9.2") else "LlamaForCausalLMEagle3"
    trained = {**DRAFT, "architectures": [architecture], "draft_vocab_size": 64, "rope_theta": 500000.0}
    write_json(tmp_path / "trained.json", {**trained, "rope_scaling": LLAMA3_ROPE})
    write_json(
        tmp_path / "draft.json", trained if draft_rope == "dropped" else {**trained, "rope_scaling": LLAMA3_ROPE}
    )
    write_json(tmp_path / "target.json", {**TARGET, "rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE})
    inputs = Inputs(
        serving=f"{package}=={version}",
        draft=str(tmp_path / "draft.json"),
        target=str(tmp_path / "target.json"),
        trained_draft=str(tmp_path / "trained.json"),
    )
    diagnosis = diagnose(inputs, parallel=False).diagnosis
    if draft_rope == "kept":
        assert diagnosis.verdict.causes == (), [h.reason for h in diagnosis.hypotheses]
        return
    top = diagnosis.hypotheses[0]
    assert top.id == "rope-mismatch", [h.id for h in diagnosis.hypotheses]
    assert "positions past 8192 rotate differently" in top.reason
    read = [step for step in top.citations if step.location.input == "serving"]
    assert read and re.search(r"rope_(scaling|parameters)", read[0].code), read


@pytest.mark.parametrize(("package", "version"), ALTERNATE_RELEASES, ids=[f"{p}-{v}" for p, v in ALTERNATE_RELEASES])
def test_a_draft_built_for_2k_positions_on_every_other_release(tmp_path: Path, package: str, version: str) -> None:
    fetch_release(package, version)
    architecture = "Eagle3LlamaForCausalLM" if (package, version) == ("vllm", "0.9.2") else "LlamaForCausalLMEagle3"
    draft = {**DRAFT, "architectures": [architecture], "draft_vocab_size": 64, "max_position_embeddings": 2048}
    write_json(tmp_path / "draft.json", draft)
    write_json(tmp_path / "target.json", {**TARGET, "max_position_embeddings": 131072})
    inputs = Inputs(
        serving=f"{package}=={version}", draft=str(tmp_path / "draft.json"), target=str(tmp_path / "target.json")
    )
    top = diagnose(inputs, parallel=False).diagnosis.hypotheses[0]
    assert top.id == "context-too-short"
    assert "built for 2,048 positions (max_position_embeddings), the target serves 131,072" in top.reason
    read = [step for step in top.citations if step.location.input == "serving"]
    assert read and "max_position_embeddings" in read[0].code, read


@pytest.mark.parametrize(("package", "version"), RELEASES, ids=[f"{p}-{v}" for p, v in RELEASES])
def test_a_draft_without_aux_states_on_every_release(tmp_path: Path, package: str, version: str) -> None:
    """SGLang reads use_aux_hidden_state from 0.5.10 and vLLM from 0.13; earlier releases feed the
    captured layers whatever the draft declares."""
    root = fetch_release(package, version)
    architecture = "Eagle3LlamaForCausalLM" if (package, version) == ("vllm", "0.9.2") else "LlamaForCausalLMEagle3"
    eagle = {**DRAFT["eagle_config"], "use_aux_hidden_state": False}
    write_json(
        tmp_path / "draft.json",
        {**DRAFT, "architectures": [architecture], "draft_vocab_size": 64, "eagle_config": eagle},
    )
    write_json(tmp_path / "target.json", TARGET)
    inputs = Inputs(
        serving=f"{package}=={version}", draft=str(tmp_path / "draft.json"), target=str(tmp_path / "target.json")
    )
    run = diagnose(inputs, parallel=False)
    reads = any('"use_aux_hidden_state"' in path.read_text(encoding="utf-8") for path in root.rglob("*.py"))
    ids = [h.id for h in run.diagnosis.hypotheses]
    if reads:
        assert "aux-flag-ignored" not in ids
        assert any(
            "which" in note and "use_aux_hidden_state false" in note
            for note in run.diagnosis.warnings + run.diagnosis.wirings["serving"].notes
        )
    else:
        assert ids[:1] == ["aux-flag-ignored"], ids
        assert run.diagnosis.hypotheses[0].citations[0].location.path.endswith("draft.json")


def _runner_v2_ignores(root: Path) -> tuple[str, int] | None:
    """Where vLLM's Model Runner V2 turns on the target's auxiliary hidden states for EAGLE-3 with a
    constant (0.22, 0.30), found by reading the release; None where it reads the draft's flag (0.33)."""
    relpath = "vllm/v1/worker/gpu/model_runner.py"
    lines = (root / relpath).read_text(encoding="utf-8").splitlines()
    constant = [n for n, line in enumerate(lines, 1) if line.strip() == "self.use_aux_hidden_state_outputs = True"]
    return (relpath, constant[0]) if constant else None


@pytest.mark.parametrize("runner", ["1", "0", None], ids=["v2", "v1", "unset"])
@pytest.mark.parametrize("version", ["0.22.0", "0.30.0", "0.33.0"])
def test_a_draft_without_aux_states_on_each_model_runner(tmp_path: Path, version: str, runner: str | None) -> None:
    """vLLM's V1 runner reads use_aux_hidden_state (through its proposer); Model Runner V2 sets the
    capture on for EAGLE-3 unconditionally in 0.22 and 0.30, and reads the flag in 0.33. The launch's
    VLLM_USE_V2_MODEL_RUNNER selects which runs; left unset, the engine decides per model: a note."""
    root = fetch_release("vllm", version)
    eagle = {**DRAFT["eagle_config"], "use_aux_hidden_state": False}
    write_json(tmp_path / "draft.json", {**DRAFT, "draft_vocab_size": 64, "eagle_config": eagle})
    write_json(tmp_path / "target.json", TARGET)
    launch = tmp_path / "serve.sh"
    launch.write_text(
        "#!/bin/sh\n"
        + (f"export VLLM_USE_V2_MODEL_RUNNER={runner}\n" if runner is not None else "")
        + 'vllm serve target --speculative-config \'{"method": "eagle3", "model": "draft"}\'\n'
    )
    inputs = Inputs(
        serving=f"vllm=={version}",
        serving_args=str(launch),
        draft=str(tmp_path / "draft.json"),
        target=str(tmp_path / "target.json"),
    )
    run = diagnose(inputs, parallel=False)
    ids = [h.id for h in run.diagnosis.hypotheses]
    notes = [note for note in run.diagnosis.warnings + run.diagnosis.wirings["serving"].notes if "use_aux" in note]
    ignoring = _runner_v2_ignores(root)
    if runner == "1" and ignoring is not None:
        assert ids[:1] == ["aux-flag-ignored"], ids
        top = run.diagnosis.hypotheses[0]
        cited = {(step.location.path, step.location.line) for step in top.citations}
        assert ignoring in cited  # the runner's assignment
        assert (str(launch), 2) in cited  # the export that selects it
        assert top.citations[0].location.path.endswith("draft.json")
        assert "VLLM_USE_V2_MODEL_RUNNER=0" in top.fix
        return
    assert "aux-flag-ignored" not in ids, ids
    if runner is None and ignoring is not None:  # which runs is the engine's choice: say how to pick the V1 runner
        assert any("VLLM_USE_V2_MODEL_RUNNER=0" in note and f"{ignoring[0]}:{ignoring[1]}" in note for note in notes)
    else:
        assert any("use_aux_hidden_state false, which" in note and " reads (" in note for note in notes), notes


@pytest.mark.parametrize(("package", "version"), RELEASES, ids=[f"{p}-{v}" for p, v in RELEASES])
def test_a_draft_named_for_the_other_engine_on_every_release(tmp_path: Path, package: str, version: str) -> None:
    """SGLang builds `LlamaForCausalLMEagle3` only; vLLM builds `Eagle3LlamaForCausalLM`, and maps the
    SGLang name to it from 0.11 on (its registry)."""
    root = fetch_release(package, version)
    other = "Eagle3LlamaForCausalLM" if package == "sglang" else "LlamaForCausalLMEagle3"
    write_json(tmp_path / "draft.json", {**DRAFT, "architectures": [other], "draft_vocab_size": 64})
    write_json(tmp_path / "target.json", TARGET)
    inputs = Inputs(
        serving=f"{package}=={version}", draft=str(tmp_path / "draft.json"), target=str(tmp_path / "target.json")
    )
    ids = [h.id for h in diagnose(inputs, parallel=False).diagnosis.hypotheses]
    registry = root / "vllm/model_executor/models/registry.py"
    mapped = registry.is_file() and f'"{other}"' in registry.read_text(encoding="utf-8")
    if mapped:
        assert "draft-arch-unsupported" not in ids, ids
    else:
        assert ids[:1] == ["draft-arch-unsupported"], ids


HEAD_RELEASES = [("sglang", version) for version in SGLANG] + [("vllm", version) for version in VLLM_HEAD_HANDOVER]


@pytest.mark.parametrize("head", ["own-differs", "own-copy", "absent", "absent-full-vocabulary"])
@pytest.mark.parametrize(("package", "version"), HEAD_RELEASES, ids=[f"{p}-{v}" for p, v in HEAD_RELEASES])
def test_the_drafts_own_head_on_every_release(tmp_path: Path, package: str, version: str, head: str) -> None:
    """vLLM up to 0.11.0 gives an EAGLE-3 draft the target's embedding and head whenever the shapes
    match (0.11.1 on keeps a drafter's own: `has_own_lm_head`, and gives one lacking it the target's
    whole head); SGLang gives it the target's embedding always and its head when the config has no
    draft_vocab_size. A draft without a head is served right only where the target's head is
    handed over and its vocabulary is the target's: a reduced one handed the target's whole head
    scores its token i with the target's row i (the engine lab measures 0.001 accepted so)."""
    root = fetch_release(package, version)
    architecture = "Eagle3LlamaForCausalLM" if (package, version) == ("vllm", "0.9.2") else "LlamaForCausalLMEagle3"
    own = head.startswith("own")
    draft = {**DRAFT, "architectures": [architecture], "draft_vocab_size": 16 if head == "absent" else 64}
    tensors = {"fc.weight": ("F16", (1, 3 * 4096), None)}  # three of the target's states
    if own:
        values = tuple(range(64)) if head == "own-differs" else None
        tensors |= {"lm_head.weight": ("F16", (64, 1), values)}
    elif head == "absent":
        tensors |= {"d2t": ("I64", (16,), tuple(3 * i for i in range(16)))}
    write_json(tmp_path / "draft" / "config.json", draft)
    write_safetensors(tmp_path / "draft" / "model.safetensors", tensors)
    write_json(tmp_path / "target" / "config.json", TARGET)
    write_safetensors(tmp_path / "target" / "model.safetensors", {"lm_head.weight": ("F16", (64, 1), None)})
    inputs = Inputs(serving=f"{package}=={version}", draft=str(tmp_path / "draft"), target=str(tmp_path / "target"))
    diagnosis = diagnose(inputs, parallel=False).diagnosis
    ids = [h.id for h in diagnosis.hypotheses]
    text = "\n".join(path.read_text(encoding="utf-8") for path in root.rglob("*.py") if "spec" in str(path.parent))
    keeps_own = "has_own_lm_head" in text
    shares_same_shape = package == "vllm" and not keeps_own and "lm_head.weight.shape" in text
    if head == "own-differs":
        assert ("head-overwritten" in ids[:1]) == shares_same_shape, ids
    elif head == "own-copy":
        assert "head-overwritten" not in ids, ids
    elif head == "absent":  # a reduced vocabulary: no release serves it a head of its own
        assert ids[:1] == ["head-missing"], ids
        handed = "gives it the target's, whose 64 rows score the target's vocabulary" in diagnosis.hypotheses[0].reason
        assert handed == keeps_own, diagnosis.hypotheses[0].reason
        if handed:  # cited: the hand-over, the draft's columns cut from the wider head, and the d2t mapping
            relpath, (cut, mapped) = _draft_scoring(root)
            cited = {(step.location.path, step.location.line) for step in diagnosis.hypotheses[0].citations}
            assert {(relpath, cut), (relpath, mapped)} <= cited, cited
    else:
        fills = keeps_own or shares_same_shape  # the target's head, for a draft of the target's vocabulary
        assert ("head-missing" in ids[:1]) == (not fills), ids


def _draft_scoring(root: Path) -> tuple[str, tuple[int, int]]:
    """The lines of the release's EAGLE-3 draft that build its logits processor for draft_vocab_size
    columns and map draft ids through d2t, found by reading it."""
    relpath = "vllm/model_executor/models/llama_eagle3.py"
    lines = (root / relpath).read_text(encoding="utf-8").splitlines()
    processor = next(
        n for n, line in enumerate(lines, 1) if "LogitsProcessor(" in line and "draft_vocab_size" in lines[n]
    )
    mapped = next(n for n, line in enumerate(lines, 1) if re.search(r"\+ self\.draft_id_to_target_id", line))
    return relpath, (processor, mapped)


def _embedding_shared_with_one_stage(root: Path) -> tuple[str, int]:
    """The line of the release's proposer that shares the target's embedding, inside its test on
    one pipeline stage, found by reading the release."""
    for path in sorted((root / "vllm" / "v1" / "spec_decode").glob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        tested = [number for number, line in enumerate(lines, 1) if "get_pp_group().world_size == 1" in line]
        shared = [n for n, line in enumerate(lines, 1) if re.search(r"\.embed_tokens = \(?$|\.embed_tokens = \w", line)]
        if tested and shared:
            return str(path.relative_to(root)), min(n for n in shared if n > tested[0])
    raise AssertionError("no proposer shares the target's embedding under a pipeline test")


def test_a_hand_over_the_head_check_does_not_read_is_said_not_checked(tmp_path: Path) -> None:
    """vLLM 0.34's runner hands the target's head and embedding over in module functions: the check
    says it did not look, instead of passing in silence."""
    write_json(tmp_path / "draft" / "config.json", {**DRAFT, "draft_vocab_size": 64})
    write_safetensors(tmp_path / "draft" / "model.safetensors", {"fc.weight": ("F16", (1, 1), None)})
    write_json(tmp_path / "target.json", TARGET)
    inputs = Inputs(serving="vllm==0.34.0", draft=str(tmp_path / "draft"), target=str(tmp_path / "target.json"))
    notes = diagnose(inputs, parallel=False).diagnosis.wirings["serving"].notes
    assert any("where the draft's head comes from was not checked" in note for note in notes), notes


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("version", VLLM_HEAD_HANDOVER)
def test_a_draft_without_embed_tokens_is_filled_on_one_pipeline_stage_only(
    tmp_path: Path, version: str, stages: int
) -> None:
    root = fetch_release("vllm", version)
    relpath, line = _embedding_shared_with_one_stage(root)
    architecture = "Eagle3LlamaForCausalLM" if version == "0.9.2" else "LlamaForCausalLMEagle3"
    write_json(tmp_path / "draft" / "config.json", {**DRAFT, "architectures": [architecture], "draft_vocab_size": 64})
    write_safetensors(tmp_path / "draft" / "model.safetensors", {"lm_head.weight": ("F16", (64, 1), None)})
    write_json(tmp_path / "target.json", TARGET)
    inputs = Inputs(
        serving=f"vllm=={version}",
        draft=str(tmp_path / "draft"),
        target=str(tmp_path / "target.json"),
        serving_args=f"--pipeline-parallel-size {stages}",
    )
    diagnosis = diagnose(inputs, parallel=False).diagnosis
    missing = [h for h in diagnosis.hypotheses if h.id == "head-missing"]
    if stages == 1:
        assert not missing, [h.reason for h in missing]
        return
    (top,) = missing
    # a cause of its own: on releases that number each stage's layers from 0 the wiring is another
    assert top.id in diagnosis.verdict.causes
    assert "no embed_tokens" in top.reason and "the launch serves 2" in top.reason
    cited = {(step.location.path, step.location.line) for step in top.citations}
    assert (relpath, line) in cited and ("--serving-args", 1) in cited


def _layer(prefix: str) -> dict:
    """One decoder layer's tensors under `prefix` (a stand-in: the check reads their names)."""
    parts = ("input_layernorm", "hidden_norm", "self_attn.q_proj", "mlp.down_proj")
    return {f"{prefix}.{part}.weight": ("F16", (1,) if "norm" in part else (1, 1), None) for part in parts}


def _layers_built(root: Path, package: str) -> tuple[str, int] | None:
    """The line of the release's EAGLE-3 draft module that builds one decoder layer per
    `num_hidden_layers` (a comprehension over its range), found by reading the release; None where
    it builds one layer whatever the config says."""
    relpath = _draft_file(package, root)
    lines = (root / relpath).read_text(encoding="utf-8").splitlines()
    pattern = re.compile(r"for \w+ in range\((self\.)?config\.num_hidden_layers\)")
    return next(((relpath, n) for n, line in enumerate(lines, 1) if pattern.search(line)), None)


LAYERS = {  # declared layers, and the checkpoint's layer prefixes
    "two-declared-midlayer-held": (2, ["midlayer"]),
    "two-declared-layer-0-held": (2, ["layers.0"]),
    "one-declared-held": (1, ["midlayer"]),
    "two-declared-both-held": (2, ["layers.0", "layers.1"]),
}


@pytest.mark.parametrize("layers", sorted(LAYERS))
@pytest.mark.parametrize(("package", "version"), RELEASES, ids=[f"{p}-{v}" for p, v in RELEASES])
def test_layers_declared_against_the_layers_held_on_every_release(
    tmp_path: Path, package: str, version: str, layers: str
) -> None:
    """SGLang from 0.5.12 and vLLM from 0.11.1 build one decoder layer per `num_hidden_layers`
    (earlier releases build one whatever the config says) and load the checkpoint's layers by name,
    reading `midlayer.` as `layers.0.`: a config declaring two layers whose checkpoint holds one
    builds the second with its initial weights. A checkpoint holding every layer built is no finding."""
    root = fetch_release(package, version)
    declared, prefixes = LAYERS[layers]
    architecture = "Eagle3LlamaForCausalLM" if (package, version) == ("vllm", "0.9.2") else "LlamaForCausalLMEagle3"
    draft = {**DRAFT, "architectures": [architecture], "draft_vocab_size": 64, "num_hidden_layers": declared}
    tensors = {"fc.weight": ("F16", (1, 3 * 4096), None), "lm_head.weight": ("F16", (64, 1), None)}
    for prefix in prefixes:
        tensors |= _layer(prefix)
    write_json(tmp_path / "draft" / "config.json", draft)
    write_safetensors(tmp_path / "draft" / "model.safetensors", tensors)
    write_json(tmp_path / "target.json", TARGET)
    inputs = Inputs(
        serving=f"{package}=={version}", draft=str(tmp_path / "draft"), target=str(tmp_path / "target.json")
    )
    hypotheses = diagnose(inputs, parallel=False).diagnosis.hypotheses
    built = _layers_built(root, package)
    if built is None or len(prefixes) == declared:
        assert "weights-missing" not in [h.id for h in hypotheses], [h.reason for h in hypotheses]
        return
    top = hypotheses[0]
    assert top.id == "weights-missing", [h.id for h in hypotheses]
    assert "holds weights for layer 0 only: layer 1 is served with the weights it was initialized with" in top.reason
    relpath, line = built
    assert any(
        step.location.path == relpath and step.location.line <= line <= step.location.end_line for step in top.citations
    ), [step.location for step in top.citations]
    assert any(step.location.path.endswith("draft/config.json") for step in top.citations)
    assert any(step.location.path.endswith("draft/model.safetensors") for step in top.citations)
    if prefixes == ["midlayer"]:  # the loader's own renaming, cited where the release writes it
        lines = (root / relpath).read_text(encoding="utf-8").splitlines()
        renamed = next(n for n, text in enumerate(lines, 1) if '"midlayer' in text and '"layers.0' in text)
        assert (relpath, renamed) in {(step.location.path, step.location.line) for step in top.citations}
