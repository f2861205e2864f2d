"""Models as most users have them: a Hugging Face hub download, each file of a snapshot a symlink
into the repository's `blobs/`. That is the layout, not an escape; a link out of the repository still is."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app
from tests.conftest import HUB, TREES, hub_snapshot
from tests.enginelab import DRAFT, DUMPS, TARGET

runner = CliRunner()


def hub_download(cache: Path, repository: str, files: dict[str, Path]) -> Path:
    """`files` laid out as huggingface_hub's cache keeps a download: content-addressed blobs and a
    snapshot of relative symlinks to them; returns the snapshot directory."""
    root = cache / f"models--{repository.replace('/', '--')}"
    snapshot = root / "snapshots" / ("0" * 40)
    (root / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0" * 40)
    for name, source in files.items():
        blob = hashlib.sha256(source.read_bytes()).hexdigest()
        shutil.copyfile(source, root / "blobs" / blob)
        os.symlink(f"../../blobs/{blob}", snapshot / name)
    return snapshot


@pytest.fixture(scope="module")
def sharded_target(tmp_path_factory) -> Path:
    """The engine lab's target saved in shards with their index, as large models are published."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("sharded")
    model = transformers.AutoModelForCausalLM.from_pretrained(TARGET)
    model.save_pretrained(out, max_shard_size="2MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TARGET / name, out / name)
    assert (out / "model.safetensors.index.json").is_file()
    return out


def test_a_hub_download_is_read_as_the_model_directory_it_is(tmp_path: Path, sharded_target: Path) -> None:
    files = {path.name: path for path in sharded_target.iterdir() if path.is_file()}
    target = hub_download(tmp_path / "hub", "lab/target", files)
    draft = hub_download(tmp_path / "hub", "lab/draft", {path.name: path for path in DRAFT.iterdir()})
    result = runner.invoke(
        app, ["probe", "embedding", "--dumps", str(DUMPS), "--target", str(target), "--format", "json", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["embedding_slots"] == []  # the lab's dumps hold h1..h3, no embedding
    result = runner.invoke(app, ["probe", "vocab-map", "--draft", str(draft), "--target", str(target), "-q"])
    assert result.exit_code == 0, result.output
    assert "match the target's rows i + d2t[i]" in result.stdout


def test_a_link_out_of_the_download_is_still_refused(tmp_path: Path, sharded_target: Path) -> None:
    files = {path.name: path for path in sharded_target.iterdir() if path.is_file()}
    target = hub_download(tmp_path / "hub", "lab/target", files)
    index = json.loads((target / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    elsewhere = tmp_path / "elsewhere.safetensors"
    shutil.copyfile(target / shard, elsewhere)
    (target / shard).unlink()
    os.symlink(elsewhere, target / shard)
    result = runner.invoke(app, ["probe", "embedding", "--dumps", str(DUMPS), "--target", str(target), "-q"])
    assert result.exit_code == 2 and "outside the checkpoint directory" in result.stderr


def test_diagnose_reads_the_target_draft_and_parent_of_a_hub_download() -> None:
    """The bundled hub cache (made with the safetensors library): a Kimi-like target's config and a
    head; a draft fine-tuned from its parent, whose vocab map it selected again from new data. Each
    file of a snapshot is a link into its repository's blobs. Read through them, the configs give
    the test tree's consistent wiring and the two checkpoints the regenerated map."""
    snapshots = {name: hub_snapshot(HUB, name) for name in ("target", "draft", "parent")}
    assert all(file.is_symlink() for snapshot in snapshots.values() for file in snapshot.iterdir())
    result = runner.invoke(
        app,
        [
            "diagnose", "--no-cache", "--format", "json",
            "--serving", str(TREES / "sglang_like"), "--training", str(TREES / "speculators_like"),
            "--target", str(snapshots["target"]), "--draft", str(snapshots["draft"]),
            "--parent-draft", str(snapshots["parent"]),
        ],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["verdict"]["root_cause"] == "vocab-map-regenerated"
    assert report["wiring"]["serving"]["slots"] == report["wiring"]["training"]["slots"] == ["h3", "h31", "h59"]
    (top,) = [hypothesis for hypothesis in report["hypotheses"] if hypothesis["rank"] == 1]
    cited = {citation["path"] for citation in top["citations"]}  # as users know them: repository@commit/file
    assert cited == {"lab/draft@0123456/model.safetensors", "lab/parent@0123456/model.safetensors"}, cited
