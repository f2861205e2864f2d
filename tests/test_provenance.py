"""The trainer a published draft's config names, when no --training is given: which keys say so,
which release is analyzed, and the one-line errors for configs that cannot be trusted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rca.diagnose import Inputs, diagnose
from rca.errors import InputError
from rca.inputs.draft import load_draft
from rca.inputs.provenance import assume_training, infer_trainer
from tests.conftest import CASES, write_json

LLAMA_TARGET = CASES / "speculators-top-level-ids-on-vllm" / "target"
IDS_KEY = "eagle_aux_hidden_state_layer_ids"

# The keys each trainer's exporter writes (shapes of real exports; values made up).
SPECULATORS_0_9 = {
    "architectures": ["Eagle3DraftModel"],
    "draft_vocab_size": 32000,
    "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
    "embed_requires_grad": False,
    "fc_norm": False,
    "norm_before_fc": True,
    "norm_output": True,
    "speculators_config": {
        "algorithm": "eagle3",
        "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1}],
        "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B", "architectures": ["LlamaForCausalLM"]},
    },
    "speculators_model_type": "eagle3",
    "speculators_version": "0.9.0",
    "transformer_layer_config": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1},
}
MODELOPT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 1,
    "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 15, 28],
        "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True,
        "use_last_layernorm": True,
        "use_mtp_layernorm": False,
        "next_layer_regular": True,
        "parallel_draft_step": 1,
    },
}
NEMO = {
    "architectures": ["LlamaEagle3DraftModel"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "draft_vocab_size": 32000,
    "target_hidden_size": 4096,
    "fc_norm": False,
    "norm_output": False,
    "parallel_drafting": False,
}


def _draft(tmp_path: Path, data: dict[str, Any]):
    return load_draft(write_json(tmp_path / "draft" / "config.json", data))


def _line_of(tmp_path: Path, key: str) -> int:
    lines = (tmp_path / "draft" / "config.json").read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1) if f'"{key}"' in line)


def _without(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in keys}


@pytest.mark.parametrize(
    ("data", "spec", "recorded", "cited"),
    [
        (SPECULATORS_0_9, "speculators==0.9.0", True, ["speculators_config", "speculators_version"]),
        ({**SPECULATORS_0_9, "speculators_version": "0.9.0.dev12"}, "speculators==0.9.0", False, []),
        (_without(SPECULATORS_0_9, "speculators_version"), "speculators==0.9.0", False, ["fc_norm", "norm_output"]),
        (
            _without(SPECULATORS_0_9, "speculators_version", "fc_norm", "norm_output"),
            "speculators==0.6.0",
            False,
            ["norm_before_fc"],
        ),
        (MODELOPT, "nvidia-modelopt==0.47.0", False, ["eagle_config.next_layer_regular"]),
        (
            {
                **MODELOPT,
                "eagle_config": _without(MODELOPT["eagle_config"], "next_layer_regular", "parallel_draft_step"),
            },
            "nvidia-modelopt==0.40.0",
            False,
            ["eagle_config.use_last_layernorm"],
        ),
        (NEMO, "nemo-automodel==0.7.0", False, ["architectures", "fc_norm"]),
        (_without(NEMO, "fc_norm", "norm_output"), "nemo-automodel==0.5.0", False, ["architectures"]),
    ],
)
def test_the_trainer_and_release_a_draft_config_names(
    tmp_path: Path, data: dict, spec: str, recorded: bool, cited: list[str]
) -> None:
    provenance, _ = infer_trainer(_draft(tmp_path, data))
    assert provenance is not None and provenance.spec == spec and provenance.recorded is recorded
    lines = (tmp_path / "draft" / "config.json").read_text().splitlines()
    cited_lines = {lines[step.location.line - 1] for step in provenance.steps}
    for key in cited:
        assert any(f'"{key.split(".")[-1]}"' in line for line in cited_lines), (key, cited_lines)


def test_a_development_build_is_analyzed_as_its_release_and_says_so(tmp_path: Path) -> None:
    provenance, _ = infer_trainer(_draft(tmp_path, {**SPECULATORS_0_9, "speculators_version": "0.9.0.dev12"}))
    assert provenance is not None
    assert (provenance.summary, provenance.how) == (
        "speculators 0.9.0",
        "its speculators_version is 0.9.0.dev12, a development build: the release 0.9.0 is analyzed",
    )


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (
            {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1]}},
            "the draft config names no trainer",
        ),
        (
            {**SPECULATORS_0_9, "architectures": ["Eagle3Speculator"]},
            "converted to speculators's format (architectures ['Eagle3Speculator']",
        ),
    ],
)
def test_a_config_that_names_no_trainer_says_why(tmp_path: Path, data: dict, says: str) -> None:
    provenance, why = infer_trainer(_draft(tmp_path, data))
    assert provenance is None and says in why, why


@pytest.mark.parametrize(
    ("data", "says", "at_version"),
    [
        (
            {**MODELOPT, "speculators_config": {"algorithm": "eagle3"}},
            "the draft config's provenance is contradictory: eagle_config.use_input_layernorm_in_first_layer",
            False,
        ),
        ({**SPECULATORS_0_9, "speculators_version": "latest"}, "speculators_version is 'latest', which names no", True),
        ({**SPECULATORS_0_9, "speculators_version": 9}, "speculators_version is 9, which names no release", True),
    ],
)
def test_a_config_whose_provenance_cannot_be_trusted_is_one_line_with_its_fix(
    tmp_path: Path, data: dict, says: str, at_version: bool
) -> None:
    with pytest.raises(InputError) as raised:
        infer_trainer(_draft(tmp_path, data))
    error = raised.value
    assert says in error.what and "pass --training SRC" in error.fix, str(error)
    if at_version:
        assert error.where.endswith(f"config.json:{_line_of(tmp_path, 'speculators_version')}"), error.where


def test_without_a_draft_config_that_names_its_trainer_the_report_says_what_would_settle_it(tmp_path: Path) -> None:
    """A config of no draft family whose layout implies its training: nothing is assumed."""
    draft = write_json(tmp_path / "draft" / "config.json", {"architectures": ["LlamaForCausalLM"]})
    run = diagnose(Inputs(draft=str(draft), target=str(LLAMA_TARGET)), parallel=False)
    assert run.diagnosis.trainer is None
    assert run.diagnosis.wirings["training"].notes == (
        "training: no source given (--training), and the draft config names no trainer (no key that one trainer's "
        "export alone writes), and its config is of no draft family whose layout implies the layers trained on",
    )


@pytest.mark.parametrize(
    ("data", "taps", "said"),
    [
        ({}, ["h2", "h16", "h29"], "trained on the default layers of the EAGLE-3 trainers that record no ids"),
        (
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}},
            ["h2", "h16", "h29"],
            "its eagle_config.eagle_aux_hidden_state_layer_ids [1, 15, 28] are written in SGLang's numbering",
        ),
        (
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}, IDS_KEY: [2, 16, 29]},
            ["h2", "h16", "h29"],
            "its eagle_config.eagle_aux_hidden_state_layer_ids [1, 15, 28] are written in SGLang's numbering",
        ),
    ],
    ids=["no-ids", "nested-ids", "both-agree"],
)
def test_a_config_that_names_no_trainer_is_assumed_trained_as_its_layout_implies(
    tmp_path: Path, data: dict, taps: list[str], said: str
) -> None:
    draft = _draft(tmp_path, {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000, **data})
    assumed, why = assume_training(draft, 32)
    assert assumed is not None, why
    assert [str(tap) for tap in assumed.taps] == taps and assumed.assumption.startswith(said)
    assumption = assumed.steps[-1]
    assert assumption.kind.value == "assumption" and assumption.location.input == "draft"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({IDS_KEY: [1, 15, 28]}, "its eagle_aux_hidden_state_layer_ids [1, 15, 28] records no numbering"),
        (
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}, IDS_KEY: [1, 15, 28]},
            "name different layers under their own numberings",
        ),
        ({"eagle_config": {"use_aux_hidden_state": False}}, "trained on the target's last state"),
        (
            {"architectures": ["Eagle3Speculator"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}},
            "speculators's converter wrote it",
        ),
    ],
    ids=["top-level-alone", "both-disagree", "aux-off", "converted"],
)
def test_a_layout_that_does_not_say_what_was_trained_on_is_assumed_nothing(
    tmp_path: Path, data: dict, why: str
) -> None:
    draft = _draft(tmp_path, {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000, **data})
    assumed, reason = assume_training(draft, 32)
    assert assumed is None and why in reason, reason


def test_a_trainer_less_draft_served_as_its_layout_implies_is_consistent_with_the_assumption_listed(
    tmp_path: Path,
) -> None:
    draft = write_json(tmp_path / "draft" / "config.json", {"architectures": ["LlamaForCausalLMEagle3"]})
    run = diagnose(Inputs(draft=str(draft), target=str(LLAMA_TARGET)), parallel=False)
    training = run.diagnosis.wirings["training"]
    assert [str(tap) for tap in training.slots] == ["h2", "h16", "h29"]
    assert any(
        item.startswith("the trainer is not recorded: trained on the default layers")
        for item in run.diagnosis.verdict.assumptions
    )


@pytest.mark.release
def test_a_published_speculators_draft_is_analyzed_with_the_release_it_records(tmp_path: Path) -> None:
    draft = write_json(tmp_path / "draft" / "config.json", SPECULATORS_0_9)
    run = diagnose(Inputs(draft=str(draft), target=str(LLAMA_TARGET)), parallel=False)
    training = run.diagnosis.wirings["training"]
    assert [str(tap) for tap in training.slots] == ["h2", "h16", "h29"], training.notes
    assert run.diagnosis.trainer is not None and run.diagnosis.trainer["source"] == "speculators==0.9.0"
    first = training.steps[0]
    assert (first.location.input, first.note) == ("draft", "speculators_config: written by speculators's export")
    assert training.notes[0] == (
        "training: the trainer is inferred from the draft config: speculators 0.9.0 (its speculators_version is 0.9.0)"
    )
    document = run.diagnosis.to_json()
    assert document["trainer"]["citations"][-1]["line"] == _line_of(tmp_path, "speculators_version")
    assert run.diagnosis.verdict.summary.endswith("; training inferred from the draft config (speculators 0.9.0)")


@pytest.mark.release
def test_a_trainer_release_that_cannot_be_fetched_is_one_line_naming_the_config(tmp_path: Path) -> None:
    draft = write_json(tmp_path / "draft" / "config.json", {**SPECULATORS_0_9, "speculators_version": "9.9.9"})
    serving = tmp_path / "engine"
    serving.mkdir()
    (serving / "engine.py").write_text("def serve():\n    pass\n")
    environment = {**os.environ, "RCA_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "rca", "diagnose", "-q", "--serving", str(serving), "--draft", str(draft)]
    command += ["--target", str(LLAMA_TARGET)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    where = f"{draft}:{_line_of(tmp_path, 'speculators_version')}"
    assert line.startswith(f"rca: error: {where}: the draft config names speculators 9.9.9 "), line
    assert "which cannot be fetched: speculators has no release 9.9.9 on the package index" in line
    assert "(fix: pass --training SRC with the trainer's code" in line
    assert json.loads(draft.read_text())["speculators_version"] == "9.9.9"  # nothing written to the user's files


def test_a_contradictory_provenance_stops_the_cli_with_one_line_and_exit_2(tmp_path: Path) -> None:
    draft = write_json(tmp_path / "draft" / "config.json", {**MODELOPT, "speculators_config": {"algorithm": "eagle3"}})
    serving = tmp_path / "engine"
    serving.mkdir()
    (serving / "engine.py").write_text("def serve():\n    pass\n")
    command = [sys.executable, "-m", "rca", "diagnose", "-q", "--serving", str(serving), "--draft", str(draft)]
    result = subprocess.run([*command, "--target", str(LLAMA_TARGET)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"rca: error: {draft}: the draft config's provenance is contradictory: "), line
    assert "names NVIDIA ModelOpt" in line and "names speculators" in line and "(fix: pass --training SRC" in line
