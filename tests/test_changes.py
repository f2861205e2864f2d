"""`rca diff` and `rca history` on a repository that replays the founding case as commits.

The repository holds the SGLang-shaped tree and the draft and target configs: first as SGLang
0.5.12 serves the trained ids, then the wrong fix (the -1 patch to the model and the draft's
ids changed to [-1, 2, 30]), then a revert; unrelated commits in between.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import git
import jsonschema
import pytest
from typer.testing import CliRunner

from rca.cli import app
from tests.conftest import edit, make_patch, sglang_like_configs, write_json
from tests.test_cli import EMBED_EDITS, MODEL

runner = CliRunner()
SARIF_SCHEMA = Path(__file__).parent / "fixtures" / "sarif-2.1.0-subset.schema.json"


def _commit(repo: git.Repo, message: str) -> str:
    repo.git.add(A=True)
    repo.git.commit("-q", "--no-verify", "-m", message)
    return repo.head.commit.hexsha


@pytest.fixture
def founding_repo(tmp_path: Path, sglang_like: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "deploy"
    shutil.copytree(sglang_like, root)
    repo = git.Repo.init(root)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test").set_value("user", "email", "test@example.com")
    sglang_like_configs(root, [2, 30, 58])
    (root / "README.md").write_text("deployment\n")
    shas = {"import": _commit(repo, "Import the serving tree and the draft")}
    (root / "README.md").write_text("deployment notes\n")
    shas["docs"] = _commit(repo, "Document the deployment")
    model = root / MODEL
    original = model.read_text()
    model.write_text(edit(original, *EMBED_EDITS))
    sglang_like_configs(root, [-1, 2, 30])
    shas["patch"] = _commit(repo, "Feed the embedding to the draft (the -1 fix)")
    (root / "NOTES.txt").write_text("benchmarks\n")
    shas["notes"] = _commit(repo, "Add notes")
    model.write_text(original)
    sglang_like_configs(root, [2, 30, 58])
    shas["revert"] = _commit(repo, "Revert the -1 fix")
    return root, shas


def _diff(root: Path, speculators_like: Path, *args: str):
    return _changes("diff", root, speculators_like, *args)


def _changes(command: str, root: Path, speculators_like: Path, *args: str):
    """`rca diff` or `rca history` on the repository, with the deployment's other inputs."""
    return runner.invoke(
        app,
        [
            command,
            *args,
            "--quiet",
            "--repo",
            str(root),
            "--training",
            str(speculators_like),
            "--draft",
            "draft",
            "--target",
            "target",
        ],
    )


def test_diff_of_the_patch_commit_introduces_the_embedding_slot(founding_repo, speculators_like: Path) -> None:
    root, shas = founding_repo
    result = _diff(root, speculators_like, shas["patch"], "--format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "rca.diff/1" and report["effect"] == "introduces"
    assert report["after"] == {"status": "mismatch", "root_cause": "embed-slot-added"}
    assert report["slots"]["serving"] == {"before": ["h3", "h31", "h59"], "after": ["h0", "h3", "h31"]}
    patched = edit((root / MODEL).read_text(), *EMBED_EDITS).splitlines()
    store_line = next(i for i, line in enumerate(patched, 1) if "0 if val == -1" in line)
    append_line = next(i for i, line in enumerate(patched, 1) if "aux_hidden_states.append(hidden_states)" in line)
    ids_line = next(
        i
        for i, line in enumerate((root / "draft" / "config.json").read_text().splitlines(), 1)
        if "eagle_aux_hidden_state_layer_ids" in line
    )
    responsible = {(item["path"], item["line"]): item["commit"] for item in report["responsible"]}
    # The ids' value spans lines; the finding goes on its first changed line (the first id).
    assert {(MODEL, store_line), (MODEL, append_line), ("draft/config.json", ids_line + 1)} <= set(responsible)
    assert set(responsible.values()) == {shas["patch"]}
    assert set(report["changed_files"]) == {MODEL, "draft/config.json"}


def test_diff_of_the_revert_removes_it_and_text_names_the_lines(founding_repo, speculators_like: Path) -> None:
    root, shas = founding_repo
    result = _diff(root, speculators_like, shas["revert"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        f"rca diff {shas['notes'][:10]}..{shas['revert'][:10]}: removes the mismatch (embed-slot-added)"
    )
    assert "serving: [h0, h3, h31] -> [h3, h31, h59]" in result.stdout


def test_diff_of_an_unrelated_range_changes_nothing(founding_repo, speculators_like: Path) -> None:
    root, shas = founding_repo
    result = _diff(root, speculators_like, f"{shas['import']}..{shas['docs']}")
    assert result.exit_code == 0, result.output
    assert "leaves the wiring consistent" in result.stdout


def test_working_tree_diff_reads_without_touching_the_checkout(founding_repo, speculators_like: Path) -> None:
    root, _ = founding_repo
    (root / MODEL).write_text(edit((root / MODEL).read_text(), *EMBED_EDITS))  # the fix again, uncommitted
    sglang_like_configs(root, [-1, 2, 30])
    status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    before = {path: path.read_bytes() for path in root.rglob("*") if path.is_file() and ".git" not in path.parts}
    result = _diff(root, speculators_like, "--format", "markdown")
    assert result.exit_code == 1, result.output
    assert "introduces a mismatch (embed-slot-added)" in result.stdout and "working tree" in result.stdout
    assert subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout == status
    assert before == {
        path: path.read_bytes() for path in root.rglob("*") if path.is_file() and ".git" not in path.parts
    }


def _git_directory(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under .git, with its bytes and modification time."""
    return {
        str(path.relative_to(root)): (path.read_bytes(), path.lstat().st_mtime_ns)
        for path in (root / ".git").rglob("*")
        if path.is_file()
    }


def test_diff_and_history_never_write_the_repository(founding_repo, speculators_like: Path) -> None:
    """Files touched since the last commit (stamps changed, contents not) would make `git diff`
    refresh .git/index; only the real edits may show, and .git must stay byte for byte as it was."""
    root, _ = founding_repo
    later = time.time() + 120
    for tracked in git.Repo(root).git.ls_files("-z").split("\0"):
        if tracked:
            os.utime(root / tracked, (later, later))
    (root / MODEL).write_text(edit((root / MODEL).read_text(), *EMBED_EDITS))  # the real edits
    sglang_like_configs(root, [-1, 2, 30])
    before = _git_directory(root)
    result = _diff(root, speculators_like, "--format", "json")
    assert result.exit_code == 1, result.output
    change = json.loads(result.stdout)
    assert change["after"]["root_cause"] == "embed-slot-added"
    assert set(change["changed_files"]) == {MODEL, "draft/config.json"}
    history = _changes("history", root, speculators_like)
    assert history.exit_code == 0, history.output
    assert _git_directory(root) == before


def test_history_lists_exactly_the_patch_and_the_revert(founding_repo, speculators_like: Path) -> None:
    root, shas = founding_repo
    result = _changes("history", root, speculators_like, "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "rca.history/1" and report["commits"] == 5
    assert [change["head"] for change in report["changes"]] == [shas["patch"], shas["revert"]]
    assert [change["effect"] for change in report["changes"]] == ["introduces", "removes"]
    # The first commit and the patch: docs and notes touch nothing read, and the revert restores
    # the blobs of the first commit, whose diagnosis is remembered by them.
    assert report["analyzed"] == 2


def test_sarif_validates_and_puts_the_finding_on_the_changed_lines(founding_repo, speculators_like: Path) -> None:
    root, shas = founding_repo
    result = _diff(root, speculators_like, shas["patch"], "--format", "sarif")
    assert result.exit_code == 1, result.output
    log = json.loads(result.stdout)
    jsonschema.validate(log, json.loads(SARIF_SCHEMA.read_text()))
    (run,) = log["runs"]
    (finding,) = run["results"]
    assert finding["ruleId"] == "embed-slot-added" and finding["level"] == "error"
    assert [rule["id"] for rule in run["tool"]["driver"]["rules"]] == ["embed-slot-added"]
    uris = {location["physicalLocation"]["artifactLocation"]["uri"] for location in finding["locations"]}
    assert uris == {MODEL, "draft/config.json"}


def test_a_commit_that_adds_the_vendored_patch_compares_against_the_tree_without_it(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    """The deployment repository holds the configs; the serving tree is the installed release,
    outside it. The wrong fix adds patches/serving.patch: at its parent the patch does not exist."""
    root = tmp_path / "deploy"
    root.mkdir()
    repo = git.Repo.init(root)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test").set_value("user", "email", "test@example.com")
    sglang_like_configs(root, [2, 30, 58])
    _commit(repo, "Pin the draft")
    original = (sglang_like / MODEL).read_text()
    (root / "patches").mkdir()
    (root / "patches" / "serving.patch").write_text(make_patch(MODEL, original, edit(original, *EMBED_EDITS)))
    sglang_like_configs(root, [-1, 2, 30])
    _commit(repo, "Feed the embedding to the draft (the -1 fix)")
    arguments = ["--serving", str(sglang_like), "--serving-patch", "patches/serving.patch"]
    result = _diff(root, speculators_like, "HEAD", *arguments, "--format", "json")
    assert result.exit_code == 1, result.output
    change = json.loads(result.stdout)
    assert change["effect"] == "introduces" and change["before"]["status"] == "consistent"
    assert change["after"] == {"status": "mismatch", "root_cause": "embed-slot-added"}
    assert change["slots"]["serving"] == {"before": ["h3", "h31", "h59"], "after": ["h0", "h3", "h31"]}
    assert {item["path"] for item in change["responsible"]} == {"patches/serving.patch", "draft/config.json"}


def test_an_input_broken_at_one_revision_is_named_in_repository_terms(founding_repo, speculators_like: Path) -> None:
    root, _ = founding_repo
    repo = git.Repo(root)
    (root / "draft" / "config.json").write_text("{not json")
    _commit(repo, "Break the draft config")
    result = _diff(root, speculators_like, "HEAD")
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "draft/config.json" in line and "rca-rev-" not in line and "(at " in line


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("plain", [], "not a git repository"),
        ("empty", [], "the repository has no commits yet"),
        ("one-commit", ["no-such-rev"], "unknown revision 'no-such-rev'"),
        ("one-commit", ["HEAD"], "is the first commit: it has no parent"),
    ],
)
def test_bad_repositories_exit_2_with_one_line(tmp_path: Path, setup: str, args: list[str], message: str) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    if setup != "plain":
        repo = git.Repo.init(root)
        if setup == "one-commit":
            with repo.config_writer() as config:
                config.set_value("user", "name", "Test").set_value("user", "email", "test@example.com")
            write_json(root / "draft" / "config.json", {})
            _commit(repo, "first")
    result = runner.invoke(app, ["diff", *args, "--quiet", "--repo", str(root)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_shallow_clone_missing_the_base_says_how_to_fetch_it(tmp_path: Path, founding_repo) -> None:
    root, _ = founding_repo
    clone = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{root}", str(clone)], check=True)
    result = runner.invoke(app, ["diff", "HEAD", "--quiet", "--repo", str(clone)])
    assert result.exit_code == 2, result.output
    assert "not in this shallow clone" in result.stderr and "--deepen" in result.stderr


def test_binary_and_huge_files_in_the_change_are_left_out(founding_repo, speculators_like: Path) -> None:
    root, _ = founding_repo
    repo = git.Repo(root)
    (root / "draft" / "weights.bin").write_bytes(bytes(range(256)) * 4096)  # binary, next to the config
    (root / "draft" / "huge.json").write_text("[" + "0," * (9 * 1024 * 1024) + "0]")  # over the 16 MiB read limit
    _commit(repo, "Add draft weights")
    result = _diff(root, speculators_like, "HEAD")
    assert result.exit_code == 0, result.output
    assert "leaves the wiring consistent" in result.stdout


# -- contract breaks: a config edit and a loader patch ------------------------------------------------

DRAFT_MODULE = "sglang/srt/models/llama_eagle3.py"
ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 65536}
CONTRACT_READS = """
        self.rope_scaling = getattr(config, "rope_scaling", None)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.hot_token_id = None
"""
LOADER = """
    def load_weights(self, weights):
        for name, loaded_weight in weights:
            if "d2t" in name:
                self.hot_token_id = loaded_weight + torch.arange(loaded_weight.shape[0])
            else:
                self.load_one(name, loaded_weight)
"""


@pytest.fixture
def contract_repo(tmp_path: Path, sglang_like: Path) -> tuple[Path, dict[str, str]]:
    """The SGLang-shaped tree with a draft module that reads RoPE and loads d2t, and a draft config
    matching the target; then a config edit that drops rope_scaling, then a loader patch that drops
    the d2t branch."""
    root = tmp_path / "deploy"
    shutil.copytree(sglang_like, root)
    module = root / DRAFT_MODULE
    text = module.read_text().replace(
        "        self.config = config\n", "        self.config = config" + CONTRACT_READS, 1
    )
    text = text.replace("\n\nEntryClass", LOADER + "\n\nEntryClass")
    module.write_text(text)
    draft, target = sglang_like_configs(root, [2, 30, 58])
    target_config = json.loads(target.read_text())
    target_config["text_config"]["rope_scaling"] = ROPE
    write_json(target, target_config)
    text_config = target_config["text_config"]
    draft_config = {
        **json.loads(draft.read_text()),
        "draft_vocab_size": 32000,
        "vocab_size": text_config["vocab_size"],
        "rope_theta": text_config["rope_theta"],
        "rope_scaling": ROPE,
    }
    write_json(draft, draft_config)
    repo = git.Repo.init(root)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test").set_value("user", "email", "test@example.com")
    shas = {"import": _commit(repo, "Import the serving tree and the draft")}
    write_json(draft, {key: value for key, value in draft_config.items() if key != "rope_scaling"})
    shas["config"] = _commit(repo, "Convert the draft config")
    module.write_text(module.read_text().replace('if "d2t" in name:', 'if "vocab_map" in name:'))
    shas["loader"] = _commit(repo, "Rename the vocab map the loader reads")
    return root, shas


def test_diff_of_a_config_edit_that_drops_rope_scaling_introduces_rope_mismatch(
    contract_repo, speculators_like: Path
) -> None:
    root, shas = contract_repo
    result = _diff(root, speculators_like, shas["config"], "--format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["effect"] == "introduces"
    assert report["after"] == {"status": "mismatch", "root_cause": "rope-mismatch"}
    assert report["changed_files"] == ["draft/config.json"]


def test_history_names_the_config_edit_and_the_loader_patch(contract_repo, speculators_like: Path) -> None:
    root, shas = contract_repo
    result = _changes("history", root, speculators_like, "--format", "json", "--since", shas["import"])
    assert result.exit_code == 0, result.output
    changes = json.loads(result.stdout)["changes"]
    assert [(change["head"], change["effect"], change["contract"]["added"]) for change in changes] == [
        (shas["config"], "introduces", ["rope-mismatch"]),
        (shas["loader"], "changes", ["vocab-map-missing"]),
    ], result.stdout
    loader_lines = {(item["path"], item["commit"]) for item in changes[1]["responsible"]}
    assert (DRAFT_MODULE, shas["loader"]) in loader_lines


def test_an_edit_of_the_ids_an_exported_draft_records_is_read_against_the_record_before_it(
    tmp_path: Path, sglang_like: Path
) -> None:
    """A draft config naming no trainer, its ids edited in a commit with no change of code: what
    training fed is read from the config before the edit, so the commit introduces a shift instead
    of moving what training fed along with it."""
    root = tmp_path / "deploy"
    shutil.copytree(sglang_like, root)
    repo = git.Repo.init(root)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test").set_value("user", "email", "test@example.com")
    sglang_like_configs(root, [2, 30, 58])
    _commit(repo, "Import the serving tree and a published draft")
    sglang_like_configs(root, [3, 31, 59])
    edited = _commit(repo, "Renumber the draft's ids")
    arguments = ["diff", edited, "--quiet", "--repo", str(root), "--draft", "draft", "--target", "target"]
    result = runner.invoke(app, [*arguments, "--format", "json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["effect"] == "introduces" and report["after"]["root_cause"] == "layer-offset"
    assert report["slots"] == {"serving": {"before": ["h3", "h31", "h59"], "after": ["h4", "h32", "h60"]}}
    text = runner.invoke(app, arguments).stdout
    assert "training fed [h3, h31, h59]" in text, text
