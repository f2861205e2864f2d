"""The vocab-map probe: a reduced-vocabulary draft's lm_head rows against the target's, reading only
the rows compared; and the agent running it for the contract once the wiring is settled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from rca.cli import app
from rca.evidence.agent import CandidateWiring, investigate
from rca.evidence.probes import ProbeInputs, registered_probes
from rca.explain.hypotheses import Situation, rank
from rca.model import Tap, Wiring
from tests.tinymodels import VOCAB, save_model, tiny_model

runner = CliRunner()
DRAFT_VOCAB = 64
KEPT = torch.arange(0, VOCAB, VOCAB // DRAFT_VOCAB)  # every fourth target token


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    model = tiny_model("llama", 2)
    return model, save_model(model, tmp_path_factory.mktemp("target"))


def _draft(directory: Path, model, d2t: torch.Tensor | None) -> Path:
    """A draft whose lm_head started from the target's rows of KEPT and was trained a little (noise)."""
    directory.mkdir(parents=True)
    head = model.get_output_embeddings().weight.detach()[KEPT]
    head = head + 0.3 * head.std() * torch.randn(head.shape, generator=torch.Generator().manual_seed(0))
    tensors = {"lm_head.weight": head.contiguous(), "fc.weight": torch.zeros(1, 3)}
    if d2t is not None:
        tensors["d2t"] = d2t
    save_file(tensors, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    return directory


SHUFFLED = KEPT[torch.randperm(DRAFT_VOCAB, generator=torch.Generator().manual_seed(2))] - torch.arange(DRAFT_VOCAB)
MAPS = {
    "right": (KEPT - torch.arange(DRAFT_VOCAB), "mapped", {"vocab-map-invalid": 0.1}),
    "all-zeros": (torch.zeros(DRAFT_VOCAB, dtype=torch.long), "misnamed", {"vocab-map-invalid": 20.0}),
    "absent": (None, "misnamed", {"vocab-map-missing": 20.0}),
    "shuffled": (SHUFFLED, "misnamed", {"vocab-map-invalid": 20.0}),  # in range, each target id once: valid to a reader
}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_the_probe_tells_a_right_map_from_a_zeroed_or_missing_one(tmp_path: Path, target, name: str) -> None:
    model, directory = target
    d2t, observed, bearing = MAPS[name]
    draft = _draft(tmp_path / "draft", model, d2t)
    probe = registered_probes()["vocab-map-rows"]()
    inputs = ProbeInputs(None, directory, draft=draft)
    assert probe.unavailable(inputs) is None
    observation = probe.run(inputs)
    assert observation.value == observed, observation.summary
    assert {
        key: item.likelihood_ratio for key, item in probe.bearing(observation, Wiring("serving", (), None)).items()
    } == bearing
    weights = sum(path.stat().st_size for path in directory.glob("*.safetensors"))
    assert observation.data["rows_compared"] == DRAFT_VOCAB and observation.data["bytes_read"] < weights


def test_a_head_not_started_from_the_targets_says_nothing_of_the_map(tmp_path: Path, target) -> None:
    """Rows that resemble no target row are no evidence against any map: no false alarm."""
    model, directory = target
    draft = _draft(tmp_path / "draft", model, SHUFFLED)
    tensors = {"lm_head.weight": torch.randn(DRAFT_VOCAB, model.config.hidden_size), "d2t": SHUFFLED}
    save_file(tensors, draft / "model.safetensors")
    probe = registered_probes()["vocab-map-rows"]()
    observation = probe.run(ProbeInputs(None, directory, draft=draft))
    assert observation.value == "unaligned" and "resemble no target row" in observation.summary
    assert probe.bearing(observation, Wiring("serving", (), None)) == {}


def _first_ids_draft(directory: Path, model) -> Path:
    """A draft whose head is the target's rows of its first DRAFT_VOCAB tokens, with no d2t."""
    directory.mkdir()
    head = model.get_output_embeddings().weight.detach()[:DRAFT_VOCAB].contiguous()
    save_file({"lm_head.weight": head}, directory / "model.safetensors")
    return directory


def test_a_draft_that_keeps_the_first_target_ids_is_served_right_but_never_selected(tmp_path: Path, target) -> None:
    model, directory = target
    draft = _first_ids_draft(tmp_path / "draft", model)
    probe = registered_probes()["vocab-map-rows"]()
    observation = probe.run(ProbeInputs(None, directory, draft=draft))
    assert observation.value == "identity"
    bearing = probe.bearing(observation, Wiring("serving", (), None))
    assert {key: item.likelihood_ratio for key, item in bearing.items()} == {
        "vocab-map-missing": 0.1,  # served as trained ...
        "vocab-map-invalid": 0.1,
        "vocab-first-ids": 10.0,  # ... but never selected: the other tokens can never be proposed
    }
    assert f"it can never propose one of the other {VOCAB - DRAFT_VOCAB:,}" in observation.summary


def test_the_probe_alone_diagnoses_a_vocabulary_of_the_first_ids(tmp_path: Path, target) -> None:
    """No code finding: the draft has no d2t to check, and its rows say what it was trained on."""
    model, directory = target
    draft = _first_ids_draft(tmp_path / "draft", model)
    taps = (Tap(3), Tap(5))
    investigation = investigate(
        [CandidateWiring(taps, ("the training source",), 1.0)], ProbeInputs(None, directory, draft=draft)
    )
    served = Wiring("serving", taps, None, fc_slots=2)
    hypotheses = rank(Situation(Wiring("training", taps, None), served, [], observed=investigation.evidence(served)))
    assert hypotheses[0].id == "vocab-first-ids" and hypotheses[0].score > 0.5, [(h.id, h.score) for h in hypotheses]
    assert "can never propose one of the other" in hypotheses[0].reason


def test_a_full_vocabulary_draft_whose_rows_are_the_targets_raises_nothing(tmp_path: Path, target) -> None:
    """The control: rows i of a draft that scores the whole vocabulary are simply its tokens."""
    model, directory = target
    draft = tmp_path / "draft"
    draft.mkdir()
    save_file(
        {"lm_head.weight": model.get_output_embeddings().weight.detach().contiguous()}, draft / "model.safetensors"
    )
    probe = registered_probes()["vocab-map-rows"]()
    observation = probe.run(ProbeInputs(None, directory, draft=draft))
    assert observation.value == "identity" and "never propose" not in observation.summary
    assert "vocab-first-ids" not in probe.bearing(observation, Wiring("serving", (), None))


def test_rca_probe_vocab_map_and_its_bad_input(tmp_path: Path, target) -> None:
    model, directory = target
    draft = _draft(tmp_path / "draft", model, KEPT - torch.arange(DRAFT_VOCAB))
    result = runner.invoke(
        app, ["probe", "vocab-map", "--draft", str(draft), "--target", str(directory), "--format", "json", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "rca.vocab-map-rows/1" and report["value"] == "mapped"
    (tmp_path / "config-only").mkdir()
    refused = runner.invoke(
        app, ["probe", "vocab-map", "--draft", str(tmp_path / "config-only"), "--target", str(directory)]
    )
    assert refused.exit_code == 2 and "the draft has no safetensors weights" in refused.stderr


def test_the_agent_runs_it_for_the_contract_once_the_wiring_is_settled(tmp_path: Path, target) -> None:
    model, directory = target
    draft = _draft(tmp_path / "draft", model, None)
    pool = [CandidateWiring((Tap(3), Tap(5)), ("the training source",), 1.0)]
    investigation = investigate(pool, ProbeInputs(None, directory, draft=draft))
    assert [step.probe for step in investigation.steps] == ["vocab-map-rows"]
    assert "bears on vocab-map-missing, vocab-map-invalid" in investigation.steps[0].reason
    assert (
        investigation.evidence(Wiring("serving", (Tap(3), Tap(5)), None))["vocab-map-missing"][0].likelihood_ratio
        == 20.0
    )
    config_only = investigate(pool, ProbeInputs(None, directory, draft=tmp_path / "draft" / "config.json"))
    assert "vocab-map-rows" in [step.probe for step in config_only.steps]  # the config's directory holds the weights
    (tmp_path / "bare").mkdir()
    bare = investigate(pool, ProbeInputs(None, directory, draft=tmp_path / "bare"))
    assert "vocab-map-rows" not in [step.probe for step in bare.steps] + [item.probe for item in bare.missing]


# -- across a fine-tune: the rows where the map changed, against the parent's and the new map's tokens

REGENERATED = KEPT.clone()
REGENERATED[DRAFT_VOCAB // 2 :] += 1  # a fine-tune selected the upper half of the vocabulary again


def _fine_tuned(directory: Path, model, rows_for: torch.Tensor, d2t_targets: torch.Tensor) -> Path:
    """A draft whose map names `d2t_targets` and whose lm_head rows started from the target's `rows_for`
    (with the same seeded noise: a child started from the parent's rows has them exactly)."""
    directory.mkdir(parents=True)
    head = model.get_output_embeddings().weight.detach()[rows_for]
    head = head + 0.3 * head.std() * torch.randn(head.shape, generator=torch.Generator().manual_seed(1))
    d2t = d2t_targets - torch.arange(DRAFT_VOCAB)
    save_file({"lm_head.weight": head.contiguous(), "d2t": d2t}, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    return directory


@pytest.mark.parametrize(
    ("rows_for", "with_target", "observed", "ratio"),
    [
        (KEPT, True, "carried", 20.0),  # the head kept scoring the parent's tokens
        (REGENERATED, True, "retrained", 0.1),  # the head was trained again for the new map
        (KEPT, False, "carried", 3.0),  # without the target: the rows are still the parent's
    ],
    ids=["carried-over", "retrained", "carried-over-without-target"],
)
def test_the_lineage_probe_tells_rows_carried_over_from_rows_retrained(
    tmp_path: Path, target, rows_for: torch.Tensor, with_target: bool, observed: str, ratio: float
) -> None:
    model, directory = target
    parent = _fine_tuned(tmp_path / "parent", model, KEPT, KEPT)
    child = _fine_tuned(tmp_path / "child", model, rows_for, REGENERATED)
    probe = registered_probes()["vocab-map-carried"]()
    inputs = ProbeInputs(None, directory if with_target else None, draft=child, parent_draft=parent)
    assert probe.applies(inputs) and probe.unavailable(inputs) is None
    observation = probe.run(inputs)
    assert observation.value == observed, observation.summary
    assert observation.data["changed"] == DRAFT_VOCAB // 2 and observation.data["rows_compared"] == DRAFT_VOCAB // 2
    [(hypothesis, evidence)] = probe.bearing(observation, Wiring("serving", (), None)).items()
    assert evidence.likelihood_ratio == ratio
    taps = (Tap(3), Tap(5))  # no code finding: the rows alone decide whether the regenerated map is the cause
    situation = Situation(Wiring("training", taps, None), Wiring("serving", taps, None), [])
    situation.observed = {hypothesis: [evidence]}
    ranked = rank(situation)
    assert (ranked[0].id == "vocab-map-regenerated") is (ratio >= 10), [(h.id, h.score) for h in ranked]


def test_the_lineage_probe_runs_alone_from_the_cli(tmp_path: Path, target) -> None:
    model, directory = target
    parent = _fine_tuned(tmp_path / "parent", model, KEPT, KEPT)
    child = _fine_tuned(tmp_path / "child", model, KEPT, REGENERATED)
    command = ["probe", "vocab-lineage", "--draft", str(child), "--parent-draft", str(parent)]
    result = runner.invoke(app, [*command, "--target", str(directory), "--format", "json", "--quiet"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "rca.vocab-map-carried/1" and report["value"] == "carried"
    refused = runner.invoke(app, ["probe", "vocab-lineage", "--draft", str(child), "--parent-draft", str(tmp_path)])
    assert refused.exit_code == 2 and "--parent-draft has no safetensors weights" in refused.stderr


def test_maps_of_different_lengths_are_said_to_differ_not_to_be_the_same(tmp_path: Path, target) -> None:
    """A parent whose d2t holds 10 entries against the draft's 64 agrees with the draft's first ten:
    the maps are still not one map, and no row can be matched with the parent's by its index."""
    model, directory = target
    child = _fine_tuned(tmp_path / "child", model, KEPT, KEPT)
    parent = tmp_path / "parent"
    parent.mkdir()
    save_file({"d2t": (KEPT - torch.arange(DRAFT_VOCAB))[:10].contiguous()}, parent / "model.safetensors")
    (parent / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    command = ["probe", "vocab-lineage", "--draft", str(child), "--parent-draft", str(parent), "--quiet"]
    result = runner.invoke(app, [*command, "--target", str(directory)])
    assert result.exit_code == 0, result.output
    assert "the draft's d2t has 64 entries and its parent's 10" in result.stdout, result.stdout
    assert "is its parent's" not in result.stdout
