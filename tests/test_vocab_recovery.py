"""A lost vocab map recovered from the draft's own head rows, on the engine lab's draft (a 512-token
vocabulary over a 1,024-token target, its head started from the target's rows and trained), and the
fixed copy that serves it without touching the user's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from rca.cli import app  # noqa: E402
from rca.errors import RcaError  # noqa: E402
from rca.evidence.engine.verify import FIX_FILE, fixed_copy  # noqa: E402
from rca.evidence.vocab_recovery import recover_map  # noqa: E402
from rca.model import CheckpointEdit, edit_from_json  # noqa: E402
from tests.enginelab import DRAFT, DUMPS, FAILURES, TARGET, failing_draft  # noqa: E402

runner = CliRunner()
TRUE = load_file(str(DRAFT / "model.safetensors"))["d2t"]


def _words() -> set[int]:
    """The tokens the target produces (after each dump's first): the draft's head rows its training moved."""
    return {int(token) for file in DUMPS.glob("*.safetensors") for token in load_file(str(file))["input_ids"][1:]}


def test_the_map_is_recovered_where_training_moved_the_rows(tmp_path: Path) -> None:
    draft = failing_draft(FAILURES["vocab-map-missing"], tmp_path / "draft")
    recovered = recover_map(draft, TARGET, device="cpu")
    got = torch.arange(len(TRUE)) + torch.tensor(recovered.d2t)
    true = torch.arange(len(TRUE)) + TRUE
    used = torch.tensor([int(token) in _words() for token in true.tolist()])
    assert used.sum() > 16 and bool((got == true)[used].all())  # every token the draft proposes maps back
    assert len(set(got.tolist())) == len(TRUE)  # each target token once
    assert recovered.aligned == 1.0 and recovered.mean_cosine > 0.85
    assert "rows are about as close to another target row" in recovered.summary  # the never-trained ones, said


def test_a_head_not_started_from_the_target_gives_no_map(tmp_path: Path) -> None:
    draft = failing_draft(FAILURES["vocab-map-missing"], tmp_path / "draft")
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["lm_head.weight"] = torch.randn(tensors["lm_head.weight"].shape, generator=torch.Generator().manual_seed(1))
    save_file(tensors, str(draft / "model.safetensors"))
    with pytest.raises(RcaError, match="resemble a target row"):
        recover_map(draft, TARGET, device="cpu")


def test_write_map_writes_what_the_engines_load(tmp_path: Path) -> None:
    draft = failing_draft(FAILURES["vocab-map-missing"], tmp_path / "draft")
    out = tmp_path / "vocab-map.safetensors"
    result = runner.invoke(
        app,
        [
            "probe",
            "vocab-map",
            "--draft",
            str(draft),
            "--target",
            str(TARGET),
            "--write-map",
            str(out),
            "-q",
            "--device",
            "cpu",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["d2t_entries"] == 512
    written = load_file(str(out))
    assert (
        written["d2t"].dtype == torch.int64 and written["t2d"].dtype == torch.bool and int(written["t2d"].sum()) == 512
    )
    refused = runner.invoke(app, ["probe", "vocab-map", "--draft", str(draft), "--write-map", str(out), "-q"])
    assert refused.exit_code == 2 and "pass --target MODEL_DIR" in refused.stderr


@pytest.mark.parametrize("indexed", [False, True], ids=["single-file", "sharded"])
def test_the_fixed_copy_replaces_the_map_and_leaves_the_users_checkpoint(tmp_path: Path, indexed: bool) -> None:
    draft = failing_draft(FAILURES["vocab-map-zeroed"], tmp_path / "draft")
    if indexed:
        tensors = load_file(str(draft / "model.safetensors"))
        (draft / "model.safetensors").unlink()
        save_file({name: tensors.pop(name) for name in ("d2t", "t2d")}, str(draft / "model-00002.safetensors"))
        save_file(tensors, str(draft / "model-00001.safetensors"))
        weight_map = dict.fromkeys(tensors, "model-00001.safetensors") | dict.fromkeys(
            ("d2t", "t2d"), "model-00002.safetensors"
        )
        (draft / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    edit = edit_from_json(CheckpointEdit({"d2t": tuple(TRUE.tolist())}, 1024).to_json())
    before = {path.name: path.read_bytes() for path in draft.iterdir()}
    with fixed_copy(draft / "config.json", edit) as copy:
        loaded: dict[str, torch.Tensor] = {}
        shards = sorted(copy.glob("*.safetensors"))
        if indexed:
            index = json.loads((copy / "model.safetensors.index.json").read_text())["weight_map"]
            assert index["d2t"] == index["t2d"] == FIX_FILE and index["fc.weight"] == "model-00001.safetensors"
        for shard in shards:
            names = set(load_file(str(shard)))
            assert not (names & set(loaded)), names & set(loaded)  # each tensor in one file only
            loaded |= load_file(str(shard))
        assert torch.equal(loaded["d2t"], TRUE) and int(loaded["t2d"].sum()) == 512
        assert not (copy / "config.json").is_symlink() and (copy / "config.json").read_bytes() == before["config.json"]
    assert {path.name: path.read_bytes() for path in draft.iterdir()} == before and not copy.exists()


@pytest.mark.release
def test_diagnose_with_probes_proposes_the_recovered_map_as_a_fix(tmp_path: Path) -> None:
    """On vLLM 0.33.0 (whose llama_eagle3.py is the lab engine's), the agent's probes give the broken
    map's hypothesis a fix it can serve: the map the head rows give."""
    draft = failing_draft(FAILURES["vocab-map-missing"], tmp_path / "draft")
    result = runner.invoke(
        app,
        [
            "diagnose",
            "--serving",
            "vllm==0.33.0",
            "--draft",
            str(draft),
            "--target",
            str(TARGET),
            "--dumps",
            str(DUMPS),
            "--probe",
            "--device",
            "cpu",
            "--format",
            "json",
            "-q",
        ],
    )
    assert result.exit_code == 1, result.output
    top = json.loads(result.stdout)["hypotheses"][0]
    assert top["id"] == "vocab-map-missing" and top["fix_edit"]["file"] == "draft checkpoint"
    assert top["fix_edit"]["tensors"]["d2t"] == list(recover_map(draft, TARGET, device="cpu").d2t)
    assert "--write-map FILE" in top["fix"] and "recovered from the 512 rows" in top["fix"]
