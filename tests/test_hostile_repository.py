"""A repository someone else prepared: its configuration and attributes name commands for every
hook git offers (filters, textconv, external diff, fsmonitor, hooks). `rca diff` and `rca history`
read it, and none of those commands may run."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import git
from typer.testing import CliRunner

from rca.cli import app
from tests.conftest import edit
from tests.test_changes import founding_repo  # noqa: F401 - the fixture
from tests.test_cli import EMBED_EDITS, MODEL

runner = CliRunner()


def _arm(root: Path, markers: Path) -> list[str]:
    """Configure every command git could run on this repository to leave a marker file."""
    markers.mkdir()

    def command(name: str) -> str:
        return f"sh -c 'touch {markers / name}; cat'"

    repo = git.Repo(root)
    with repo.config_writer() as config:
        config.set_value('filter "evil"', "clean", command("clean"))
        config.set_value('filter "evil"', "smudge", command("smudge"))
        config.set_value('filter "evil"', "process", f"sh -c 'touch {markers / 'process'}'")
        config.set_value('filter "evil"', "required", "true")
        config.set_value('diff "evil"', "textconv", command("textconv"))
        config.set_value('diff "evil"', "command", command("diff-command"))
        config.set_value("diff", "external", command("external-diff"))
        config.set_value("core", "fsmonitor", command("fsmonitor"))
        config.set_value("core", "pager", command("pager"))
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n")
    hooks = Path(repo.git_dir) / "hooks"
    hooks.mkdir(exist_ok=True)
    for hook in ("post-index-change", "pre-commit", "post-checkout", "reference-transaction"):
        script = hooks / hook
        script.write_text(f"#!/bin/sh\ntouch {markers / hook}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return ["clean", "smudge", "process", "textconv", "diff-command", "external-diff", "fsmonitor", "pager"]


def test_nothing_the_repository_configures_runs(founding_repo, speculators_like: Path, tmp_path: Path) -> None:  # noqa: F811
    root, shas = founding_repo
    markers = tmp_path / "markers"
    _arm(root, markers)
    model = root / MODEL
    model.write_text(edit(model.read_text(), *EMBED_EDITS))  # a dirty working tree, compared with HEAD
    status_before = {path: path.stat().st_mtime_ns for path in (root / ".git").rglob("index")}
    common = [
        "--quiet",
        "--repo",
        str(root),
        "--training",
        str(speculators_like),
        "--draft",
        "draft",
        "--target",
        "target",
    ]
    runs = {
        "diff of the working tree": runner.invoke(app, ["diff", *common]),
        "diff of a range": runner.invoke(app, ["diff", f"{shas['import']}..{shas['patch']}", *common]),
        "history": runner.invoke(app, ["history", *common]),
    }
    for name, result in runs.items():
        assert result.exit_code in (0, 1), (name, result.output)
    assert sorted(os.listdir(markers)) == [], "commands configured by the repository ran"
    assert {path: path.stat().st_mtime_ns for path in (root / ".git").rglob("index")} == status_before


def test_the_armed_repository_does_run_them_under_plain_git(founding_repo, tmp_path: Path) -> None:  # noqa: F811
    """The test above can fail: plain git on the same repository runs what it configures."""
    root, _ = founding_repo
    markers = tmp_path / "markers"
    _arm(root, markers)
    model = root / MODEL
    model.write_text(model.read_text() + "\n# changed\n")
    try:
        git.Repo(root).git.diff("HEAD")
    except git.GitCommandError:  # the armed process filter does not speak the protocol: it ran, then git gave up
        pass
    assert os.listdir(markers), "plain git ran nothing: the armed configuration is not what git uses"
