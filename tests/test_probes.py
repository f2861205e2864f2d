"""Tensor probes on tiny targets built from configs (seeded random weights, no downloads) and dumps
written in each real format from the target's own taps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rca.analyzers.probes.fingerprint import Fingerprint  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from rca.cli import app  # noqa: E402
from rca.evidence.probes import (  # noqa: E402
    Observation,
    ProbeInputs,
    registered_probes,
)
from rca.model import Wiring  # noqa: E402
from tests.dumpwriters import write_dumps  # noqa: E402
from tests.tinymodels import VOCAB, reference_taps, save_model, tiny_model  # noqa: E402

FORMATS = ("speculators-pt", "speculators-safetensors", "specforge-ckpt", "safetensors")
LAYERS = 8
runner = CliRunner()


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    """One tiny target per architecture, saved as a model directory."""
    root = tmp_path_factory.mktemp("targets")
    return {
        name: (model, save_model(model, root / name))
        for name, model in ((name, tiny_model(name, LAYERS)) for name in ("llama", "qwen3", "deepseek_v3"))
    }


def dumps_from_taps(
    model,
    directory: Path,
    format: str,
    slots: list[str],
    last: str | None,
    samples: int = 2,
    length: int = 24,
    seed: int = 1,
) -> Path:
    generator = torch.Generator().manual_seed(seed)
    token_ids = [torch.randint(0, VOCAB, (length,), generator=generator) for _ in range(samples)]
    taps = [reference_taps(model, ids) for ids in token_ids]
    write_dumps(
        directory,
        format,
        token_ids,
        [[sample[name] for name in slots] for sample in taps],
        [sample[last] for sample in taps] if last else None,
    )
    return directory


def run_probe(name: str, dumps: Path, target: Path | None, **options):
    return registered_probes()[name]().run(ProbeInputs(dumps, target, "cpu", options.get("max_tokens", 1024)))


@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize("architecture", ["llama", "qwen3", "deepseek_v3"])
def test_fingerprint_names_every_slot_with_a_clear_margin(
    tmp_path: Path, targets, architecture: str, format: str
) -> None:
    model, directory = targets[architecture]
    # speculators 0.3 after-layer captures of [2, N//2, N-3] and the pre-norm last state;
    # SpecForge's last state is post-norm
    last = "h8+norm" if format == "specforge-ckpt" else "h8"
    dumps = dumps_from_taps(model, tmp_path / "dumps", format, ["h3", "h5", "h6"], last)
    observation = run_probe("fingerprint", dumps, directory)
    assert observation.value == ("h3", "h5", "h6")
    report = observation.data
    assert report["schema"] == "rca.fingerprint/1" and report["tokens"] == 48
    for slot in report["slots"]:
        assert slot["cosine"] > 0.9999 and slot["margin"] > 0.01, slot
    assert report["verifier_last"]["tap"] == last
    assert observation.reliability > 0.99


def test_fingerprint_tells_a_shift_by_one_and_a_permutation(tmp_path: Path, targets) -> None:
    model, directory = targets["llama"]
    dumps = dumps_from_taps(model, tmp_path / "dumps", "safetensors", ["h6", "h2", "h3"], None)
    observation = run_probe("fingerprint", dumps, directory)
    assert observation.value == ("h6", "h2", "h3")
    assert observation.data["verifier_last"] is None
    assert [slot["runner_up"]["tap"] for slot in observation.data["slots"]][1] in ("h1", "h3")


def test_embedding_probe_refutes_training_used_the_embedding(tmp_path: Path, targets) -> None:
    model, directory = targets["deepseek_v3"]
    trained = dumps_from_taps(model, tmp_path / "trained", "speculators-safetensors", ["h3", "h5", "h7"], "h8")
    observation = run_probe("embedding-rows", trained, directory)
    assert observation.value == frozenset()
    assert max(observation.data["cosines"]) < 0.9
    with_embedding = dumps_from_taps(
        model, tmp_path / "with-embedding", "speculators-safetensors", ["h0", "h3", "h5"], "h8"
    )
    assert run_probe("embedding-rows", with_embedding, directory).value == frozenset({0})


def test_embedding_probe_reads_under_one_percent_of_a_large_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from tests.dumpwriters import random_samples  # noqa: F401 - the helpers write the dumps

    vocab, hidden = 100_000, 512  # bf16: 100 MB of embedding
    embedding = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    model = tmp_path / "model"
    model.mkdir()
    save_file(
        {"model.embed_tokens.weight": embedding, "lm_head.weight": torch.zeros(8, hidden, dtype=torch.bfloat16)},
        model / "model-00001-of-00002.safetensors",
    )
    save_file(
        {"model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}, model / "model-00002-of-00002.safetensors"
    )
    (model / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                    "lm_head.weight": "model-00001-of-00002.safetensors",
                    "model.norm.weight": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    ids = torch.randint(0, vocab, (256,), generator=torch.Generator().manual_seed(1))
    other = torch.randn(256, hidden)
    write_dumps(tmp_path / "dumps", "speculators-pt", [ids], [[embedding[ids].float(), other]], [other])
    observation = run_probe("embedding-rows", tmp_path / "dumps", model)
    assert observation.value == frozenset({0})
    assert observation.data["checkpoint_bytes"] >= 100_000_000
    assert observation.data["bytes_read"] / observation.data["checkpoint_bytes"] < 0.01


def test_probe_cli_json_and_bad_dump(tmp_path: Path, targets) -> None:
    model, directory = targets["qwen3"]
    dumps = dumps_from_taps(model, tmp_path / "dumps", "speculators-pt", ["h2", "h4", "h5"], "h8")
    result = runner.invoke(
        app,
        [
            "probe",
            "fingerprint",
            "--dumps",
            str(dumps),
            "--target",
            str(directory),
            "--device",
            "cpu",
            "--format",
            "json",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "rca.fingerprint/1"
    assert [slot["tap"] for slot in report["slots"]] == ["h2", "h4", "h5"] and report["verifier_last"]["tap"] == "h8"
    beside = runner.invoke(
        app, ["probe", "embedding", "--dumps", str(dumps), "--target", str(directory / "config.json"), "--quiet"]
    )
    assert beside.exit_code == 0 and beside.stdout.startswith(
        "rca probe embedding-rows: no slot equals"
    )  # weights beside the config.json
    (dumps / "data_1.pt").write_bytes(b"not a zip file")
    broken = runner.invoke(app, ["probe", "embedding", "--dumps", str(dumps), "--target", str(directory), "--quiet"])
    assert broken.exit_code == 2
    assert (
        broken.stderr.startswith("rca: error: ")
        and "data_1.pt" in broken.stderr
        and len(broken.stderr.strip().splitlines()) == 1
    )
    no_weights = tmp_path / "config-only"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((directory / "config.json").read_text())
    refused = runner.invoke(
        app, ["probe", "fingerprint", "--dumps", str(dumps), "--target", str(no_weights), "--quiet"]
    )
    assert refused.exit_code == 2 and "the target has no safetensors weights" in refused.stderr


# -- the agent loop ----------------------------------------------------------------------------------


@pytest.fixture
def founding_analogue(tmp_path: Path, targets, sglang_like: Path) -> dict[str, Path]:
    """The founding case on a tiny DeepSeek-V3 target: serving patched to add an embedding slot
    (ids [-1, 2, 4] -> [h0, h3, h5]); training dumped [h3, h5, h7] and kept no training code."""
    from tests.test_cli import embed_patch

    model, saved = targets["deepseek_v3"]
    target = tmp_path / "target"
    target.mkdir()
    for file in saved.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["DeepseekLikeForCausalLM"]  # the serving tree's name for this architecture
    (target / "config.json").write_text(json.dumps(config))
    draft = tmp_path / "draft" / "config.json"
    draft.parent.mkdir()
    draft.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 64,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 4]},
            }
        )
    )
    dumps = dumps_from_taps(model, tmp_path / "dumps", "speculators-pt", ["h3", "h5", "h7"], "h8")
    return {
        "serving": sglang_like,
        "serving_patch": embed_patch(tmp_path, sglang_like),
        "draft": draft,
        "target": target,
        "dumps": dumps,
    }


def diagnose_cli(inputs: dict[str, Path], *extra: str):
    args = [item for key, value in inputs.items() for item in (f"--{key.replace('_', '-')}", str(value))]
    return runner.invoke(app, ["diagnose", "--quiet", "--no-cache", *args, *extra])


def test_static_analysis_alone_is_inconclusive_without_the_training_code(founding_analogue) -> None:
    result = diagnose_cli(founding_analogue, "--format", "json")
    assert result.exit_code == 3, result.output
    assert json.loads(result.stdout)["verdict"]["status"] == "inconclusive"


def test_the_agent_runs_the_probes_that_separate_the_candidates_and_finds_the_root_cause(founding_analogue) -> None:
    result = diagnose_cli(founding_analogue, "--probe", "--device", "cpu", "--format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["wiring"]["serving"]["slots"] == ["h0", "h3", "h5"]
    assert (
        report["wiring"]["training"]["slots"] == ["h3", "h5", "h7"]
        and report["wiring"]["training"]["verifier_last"] == "h8"
    )
    assert report["verdict"]["root_cause"] == "embed-slot-added"
    steps = report["agent"]["steps"]
    # The cheap embedding-row probe first: it refutes "training used the embedding" (what serving
    # feeds, and what the draft config's ids mean under SGLang's k -> h(k+1)).
    assert [step["probe"] for step in steps] == ["embedding-rows", "fingerprint"]
    assert "separates [h0, h3, h5]" in steps[0]["reason"] and "cost 1" in steps[0]["reason"]
    assert steps[0]["data"]["embedding_slots"] == []
    assert steps[0]["belief"][0]["training"] != "[h0, h3, h5]"
    assert steps[1]["belief"][0] == {"training": "[h3, h5, h7]", "posterior": steps[1]["belief"][0]["posterior"]}
    assert steps[1]["belief"][0]["posterior"] >= 0.95
    assert any(
        citation["kind"] == "dump" and citation["path"].endswith("data_0.pt")
        for citation in report["wiring"]["training"]["steps"]
    )
    text = diagnose_cli(founding_analogue, "--probe", "--device", "cpu")
    assert "What the agent did" in text.stdout and "1. embedding-rows: separates" in text.stdout


def test_probes_that_cannot_run_are_named_with_the_command_that_would(founding_analogue, tmp_path: Path) -> None:
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_text((founding_analogue["target"] / "config.json").read_text())
    result = diagnose_cli({**founding_analogue, "target": config_only}, "--probe", "--format", "json")
    assert result.exit_code == 3, result.output
    agent = json.loads(result.stdout)["agent"]
    assert agent["steps"] == []
    missing = {item["probe"]: item for item in agent["missing"]}
    assert set(missing) == {"embedding-rows", "fingerprint"}
    assert "no safetensors weights" in missing["fingerprint"]["reason"] and missing["fingerprint"][
        "command"
    ].startswith("rca probe fingerprint")


PROBE_EXAMPLES = [
    (name, index, example) for name, kind in registered_probes().items() for index, example in enumerate(kind.EXAMPLES)
]


@pytest.mark.parametrize(
    ("name", "index", "example"), PROBE_EXAMPLES, ids=[f"{name}-{index}" for name, index, _ in PROBE_EXAMPLES]
)
def test_probe_examples(tmp_path: Path, targets, name: str, index: int, example) -> None:
    """Each probe's own examples: dumps of the named taps, observed as stated and as predicted."""
    from rca.model import Tap

    model, directory = targets["llama"]
    dumps = dumps_from_taps(
        model,
        tmp_path / "dumps",
        "speculators-safetensors" if example.verifier_last else "safetensors",
        list(example.slots),
        example.verifier_last,
    )
    probe = registered_probes()[name]()
    observation = probe.run(ProbeInputs(dumps, directory, "cpu"))
    assert observation.value == example.observed, example.why
    assert probe.predict(tuple(Tap.parse(tap) for tap in example.slots)) == example.observed, (
        "predict() disagrees with run()"
    )


def test_every_probe_has_examples() -> None:
    """Probes of the training wiring carry dump examples; a probe of the draft's contract (`settles`)
    has its own tests (tests/test_vocab_map_probe.py)."""
    wiring = [kind for kind in registered_probes().values() if not kind.settles]
    assert wiring and all(len(kind.EXAMPLES) >= 2 for kind in wiring)


def test_acceptance_falls_below_half_under_the_founding_wiring(tmp_path: Path) -> None:
    """A surrogate head trained for a few hundred CPU steps on dumps of [h3, h5, h7] accepts less
    than half as often when fed the founding case's serving wiring [h0, h3, h5]."""
    from rca.evidence.reference import ReferenceModel

    model = tiny_model("llama", LAYERS, initializer_range=0.05)  # layers as distinct as a trained model's
    directory = save_model(model, tmp_path / "target")
    reference = ReferenceModel.load(directory, "cpu")
    generator = torch.Generator().manual_seed(0)
    token_ids = [torch.randint(0, VOCAB, (256,), generator=generator) for _ in range(128)]
    taps = [reference.taps(ids) for ids in token_ids]
    write_dumps(
        tmp_path / "dumps",
        "speculators-safetensors",
        token_ids,
        [[t["h3"], t["h5"], t["h7"]] for t in taps],
        [t["h8"] for t in taps],
    )
    result = runner.invoke(
        app,
        [
            "probe",
            "acceptance",
            "--dumps",
            str(tmp_path / "dumps"),
            "--target",
            str(directory),
            "--wiring",
            "h0,h3,h5",
            "--wiring",
            "h3,h5,h6",
            "--device",
            "cpu",
            "--steps",
            "1000",
            "--format",
            "json",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["trained_on"] == ["h3", "h5", "h7"] and report["steps"] == 1000
    rates = {",".join(item["wiring"]): item["acceptance"] for item in report["results"]}
    assert rates["h3,h5,h7"] > 0.3  # the head learned the task (a random guess is 1/256)
    assert rates["h0,h3,h5"] < 0.5 * rates["h3,h5,h7"]
    assert rates["h0,h3,h5"] < rates["h3,h5,h6"] < rates["h3,h5,h7"]  # one slot off costs less than all three
    bad = runner.invoke(
        app,
        [
            "probe",
            "acceptance",
            "--dumps",
            str(tmp_path / "dumps"),
            "--target",
            str(directory),
            "--wiring",
            "h0,h3",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--quiet",
        ],
    )
    assert bad.exit_code == 2 and "has 2 slots, the dumps 3" in bad.stderr


def test_dumps_that_contradict_the_training_source_win_and_the_note_says_so(
    founding_analogue, speculators_like: Path
) -> None:
    static = diagnose_cli({**founding_analogue, "training": speculators_like}, "--format", "json")
    static_slots = json.loads(static.stdout)["wiring"]["training"]["slots"]
    assert static_slots != ["h3", "h5", "h7"]  # the data generator's defaults for this 8-layer target
    result = diagnose_cli(
        {**founding_analogue, "training": speculators_like}, "--probe", "--device", "cpu", "--format", "json"
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    training = report["wiring"]["training"]
    assert training["slots"] == ["h3", "h5", "h7"]
    assert any(
        f"the training source resolves to [{', '.join(static_slots)}], which the dumps contradict" in note
        for note in training["notes"]
    )
    candidates = {item["training"]: item for item in report["agent"]["candidates"]}
    assert "the training source" in candidates[f"[{', '.join(static_slots)}]"]["origins"]
    assert report["agent"]["steps"][-1]["probe"] == "fingerprint"


def test_dumps_that_confirm_the_training_source_keep_its_derivation(
    founding_analogue, speculators_like: Path, tmp_path: Path, targets
) -> None:
    static = json.loads(diagnose_cli({**founding_analogue, "training": speculators_like}, "--format", "json").stdout)[
        "wiring"
    ]["training"]
    model, _ = targets["deepseek_v3"]
    dumps = dumps_from_taps(model, tmp_path / "confirming", "speculators-pt", static["slots"], "h8")
    result = diagnose_cli(
        {**founding_analogue, "training": speculators_like, "dumps": dumps},
        "--probe",
        "--device",
        "cpu",
        "--format",
        "json",
    )
    report = json.loads(result.stdout)
    training = report["wiring"]["training"]
    assert training["slots"] == static["slots"]
    assert training["steps"][: len(static["steps"])] == static["steps"]  # the code's derivation, then the dumps
    assert any(step["kind"] == "dump" for step in training["steps"][len(static["steps"]) :])
    assert report["agent"]["candidates"][0]["posterior"] >= 0.95


def test_a_case_run_again_with_new_dumps_changes_the_ranking_and_the_transcript_says_so(
    founding_analogue, targets, tmp_path: Path
) -> None:
    """First dumps that hold the embedding (training and serving agree), then the real dumps: the
    ranking turns over, the transcript says why, and a third run reuses the evidence."""
    model, _ = targets["deepseek_v3"]
    with_embedding = dumps_from_taps(
        model, tmp_path / "dumps-with-embedding", "speculators-pt", ["h0", "h3", "h5"], "h8"
    )
    case = tmp_path / "case"
    inputs = {**founding_analogue, "dumps": with_embedding}
    args = [item for key, value in inputs.items() for item in (f"--{key.replace('_', '-')}", str(value))]
    first = runner.invoke(app, ["case", "new", str(case), *args, "--probe", "--device", "cpu", "--quiet"])
    assert first.exit_code == 0, first.output
    second = runner.invoke(
        app,
        ["case", "run", str(case), "--dumps", str(founding_analogue["dumps"]), "--probe", "--device", "cpu", "--quiet"],
    )
    assert second.exit_code == 1, second.output
    run2 = second.stdout
    assert "Verdict: mismatch, embed-slot-added" in run2 and "(was: consistent)" in run2
    assert "The training wiring changed: [h0, h3, h5] -> [h3, h5, h7]" in run2
    assert "The ranking changed: wiring-consistent" in run2 and "-> embed-slot-added" in run2
    assert "- embedding-rows: ran it because it separates" in run2
    kept = json.loads((case / "evidence.json").read_text())
    assert {item["key"]["dumps"] for item in kept} == {
        str(with_embedding),
        str(founding_analogue["dumps"]),
    }  # earlier evidence kept
    third = runner.invoke(app, ["case", "run", str(case), "--quiet"])
    assert third.exit_code == 1, third.output
    assert "remembered from an earlier run" in third.stdout and "The ranking is unchanged." in third.stdout
    report = (case / "report.md").read_text()
    assert "## What the agent did" in report and "embed-slot-added" in report.splitlines()[0]


def test_specforge_dumps_without_their_last_state_are_split_by_the_targets_hidden_size(tmp_path: Path, targets) -> None:
    model, directory = targets["qwen3"]
    dumps = dumps_from_taps(model, tmp_path / "dumps", "specforge-ckpt", ["h2", "h4", "h5"], None)
    assert run_probe("dump-shape", dumps, directory).value == 3
    assert run_probe("fingerprint", dumps, directory).value == ("h2", "h4", "h5")


DRAFT_LAYERS = {
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
}


def train_draft(
    model, config: dict, taps: list[dict], token_ids: list, greedy: list, slots: tuple[str, ...], steps: int = 300
):
    """An EAGLE-3 draft (rca's runner, speculators' layout) trained on `slots` with a 128-token
    vocabulary (d2t) and the target's frozen embedding; returns it and its weights as saved."""
    from rca.evidence.draft_runner import build_draft

    kept = (
        torch.bincount(torch.cat(greedy), minlength=VOCAB).argsort(descending=True)[:128].sort().values
    )  # the draft vocabulary
    to_draft = torch.full((VOCAB,), -100)
    to_draft[kept] = torch.arange(128)
    torch.manual_seed(0)
    draft = build_draft(config, len(slots) * 64, 128)
    draft.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight.data)
    draft.embed_tokens.weight.requires_grad = False
    draft.d2t.copy_(kept - torch.arange(128))
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    for step in range(steps):
        sample = step % len(taps)
        logits = draft(torch.cat([taps[sample][tap] for tap in slots], dim=-1)[:-1], token_ids[sample][1:])
        loss = torch.nn.functional.cross_entropy(logits, to_draft[greedy[sample][1:]], ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    draft.eval()
    return draft, {
        name: tensor.contiguous()
        for name, tensor in draft.state_dict().items()
        if not name.startswith(("embed_tokens", "rotary"))
    }


def test_the_users_draft_checkpoint_is_measured_as_its_trainer_runs_it(tmp_path: Path) -> None:
    """An EAGLE-3 draft in speculators' layout (reduced vocabulary with d2t, no embed_tokens), trained
    on [h3, h5, h7] for a few hundred CPU steps, loaded back from safetensors (also under EAGLE's
    `midlayer.` names): it predicts exactly as before saving, and accepts best under its wiring."""
    from safetensors.torch import save_file

    from rca.evidence.draft_runner import load_draft
    from rca.evidence.reference import ReferenceModel

    model = tiny_model("llama", LAYERS, initializer_range=0.05)
    directory = save_model(model, tmp_path / "target")
    reference = ReferenceModel.load(directory, "cpu")
    generator = torch.Generator().manual_seed(0)
    token_ids = [torch.randint(0, VOCAB, (128,), generator=generator) for _ in range(24)]
    taps = [reference.taps(ids) for ids in token_ids]
    greedy = [reference.greedy(t["h8+norm"]) for t in taps]
    write_dumps(
        tmp_path / "dumps",
        "speculators-safetensors",
        token_ids,
        [[t["h3"], t["h5"], t["h7"]] for t in taps],
        [t["h8"] for t in taps],
    )
    config = {
        "speculators_model_type": "eagle3",
        "draft_vocab_size": 128,
        "norm_before_residual": False,
        "transformer_layer_config": DRAFT_LAYERS,
    }
    draft, state = train_draft(model, config, taps, token_ids, greedy, ("h3", "h5", "h7"))
    for layout, rename in (
        ("speculators", lambda name: name),
        ("eagle", lambda name: "model." + name.replace("layers.0.", "midlayer.")),
    ):
        saved = tmp_path / layout
        saved.mkdir()
        save_file({rename(name): tensor for name, tensor in state.items()}, saved / "model.safetensors")
        (saved / "config.json").write_text(json.dumps(config))
        loaded = load_draft(saved, model.get_input_embeddings().weight)
        features = torch.cat([taps[0][tap] for tap in ("h3", "h5", "h7")], dim=-1)[:-1]
        with torch.inference_mode():
            assert torch.equal(
                loaded.target_tokens(loaded(features, token_ids[0][1:])),
                draft.target_tokens(draft(features, token_ids[0][1:])),
            ), layout
    result = runner.invoke(
        app,
        [
            "probe",
            "acceptance",
            "--draft",
            str(tmp_path / "speculators"),
            "--dumps",
            str(tmp_path / "dumps"),
            "--target",
            str(directory),
            "--wiring",
            "h0,h3,h5",
            "--device",
            "cpu",
            "--format",
            "json",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["draft"].endswith("speculators") and report["steps"] == 0
    # The checkpoint has no embed_tokens (speculators keeps the target's): filled, and said so.
    assert [item.split(":")[0] for item in report["filled"]] == ["embed_tokens"]
    assert "the checkpoint lacked embed_tokens" in report["summary"]
    (tmp_path / "no-map").mkdir()
    save_file({k: v for k, v in state.items() if k != "d2t"}, tmp_path / "no-map" / "model.safetensors")
    (tmp_path / "no-map" / "config.json").write_text(json.dumps(config))
    unmapped = load_draft(tmp_path / "no-map", model.get_input_embeddings().weight)
    assert [item.split(":")[0] for item in unmapped.filled] == ["embed_tokens", "d2t"]
    assert "draft token i is read as target token i" in unmapped.filled[1]
    rates = {",".join(item["wiring"]): item["acceptance"] for item in report["results"]}
    assert rates["h3,h5,h7"] > 0.3 and rates["h0,h3,h5"] < rates["h3,h5,h7"]
    (tmp_path / "broken").mkdir()
    save_file({"fc.weight": state["fc.weight"]}, tmp_path / "broken" / "model.safetensors")
    (tmp_path / "broken" / "config.json").write_text(json.dumps(config))
    refused = runner.invoke(
        app,
        [
            "probe",
            "acceptance",
            "--draft",
            str(tmp_path / "broken"),
            "--dumps",
            str(tmp_path / "dumps"),
            "--target",
            str(directory),
            "--device",
            "cpu",
            "--quiet",
        ],
    )
    assert refused.exit_code == 2 and "the draft checkpoint lacks norm.weight" in refused.stderr


def test_the_agent_measures_what_the_mismatch_costs_with_the_users_draft(
    founding_analogue, targets, tmp_path: Path
) -> None:
    """With the draft's weights beside its SGLang-style config, a diagnosed mismatch comes with the
    draft's own acceptance as served and as trained."""
    from safetensors.torch import save_file

    from rca.evidence.reference import ReferenceModel
    from rca.inputs.dumps import open_dumps

    model, _ = targets["deepseek_v3"]
    reference = ReferenceModel.load(founding_analogue["target"], "cpu")
    dumps = dumps_from_taps(
        model, tmp_path / "more-dumps", "speculators-pt", ["h3", "h5", "h7"], "h8", samples=24, length=128
    )  # enough that the draft must use its inputs
    token_ids = [sample.token_ids for sample in open_dumps(dumps).samples()]
    taps = [reference.taps(ids) for ids in token_ids]
    greedy = [reference.greedy(t["h8+norm"]) for t in taps]
    config = {**json.loads(founding_analogue["draft"].read_text()), **DRAFT_LAYERS, "draft_vocab_size": 128}
    _, state = train_draft(model, config, taps, token_ids, greedy, ("h3", "h5", "h7"), steps=200)
    draft = tmp_path / "draft-with-weights"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(config))
    save_file(state, draft / "model.safetensors")
    result = diagnose_cli(
        {**founding_analogue, "draft": draft, "dumps": dumps}, "--probe", "--device", "cpu", "--format", "json"
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["verdict"]["root_cause"] == "embed-slot-added"
    impact = report["agent"]["impact"]
    assert (
        impact["measured"]
        and impact["served"]["wiring"] == ["h0", "h3", "h5"]
        and impact["trained"]["wiring"] == ["h3", "h5", "h7"]
    )
    assert impact["served"]["acceptance"] < impact["trained"]["acceptance"], impact
    text = diagnose_cli({**founding_analogue, "draft": draft, "dumps": dumps}, "--probe", "--device", "cpu").stdout
    assert "What the mismatch costs" in text and "as served ([h0, h3, h5])" in text
    without_weights = json.loads(
        diagnose_cli(founding_analogue, "--probe", "--device", "cpu", "--format", "json").stdout
    )["agent"]["impact"]
    assert not without_weights["measured"] and "no safetensors weights" in without_weights["reason"]
    assert without_weights["command"].startswith("rca probe acceptance --draft DRAFT_DIR")


@pytest.mark.parametrize(("last", "ratio"), [("h32", 3.0), ("h32+norm", 0.1)])
def test_the_fingerprinted_last_state_bears_on_a_teacher_without_the_final_norm(last: str, ratio: float) -> None:
    observation = Observation(
        "fingerprint", ("h3", "h17", "h30"), "", {"verifier_last": {"tap": last, "cosine": 0.9991}}
    )
    found = Fingerprint().bearing(observation, Wiring("serving", (), None))
    assert found["teacher-unnormed"].likelihood_ratio == ratio
    assert last in found["teacher-unnormed"].summary
    assert "teacher-unnormed" not in Fingerprint().bearing(
        Observation("fingerprint", ("h3",), "", {"verifier_last": None}), Wiring("serving", (), None)
    )
