"""Case directories end to end: create, show, run again with new evidence, check; reports as a
reader sees them (snapshots) and the dataflow graph export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cases.casefile import create_case
from rca.cli import app
from rca.inputs import Inputs
from tests.conftest import ROOT, sglang_like_configs, write_json
from tests.test_cli import EMBED_EDITS, MODEL, edit, embed_patch, inputs

runner = CliRunner()


def founding_inputs(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> list[str]:
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    return inputs(sglang_like, speculators_like, draft, target, embed_patch(tmp_path, sglang_like))


def test_case_new_writes_a_case_that_travels(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> None:
    case = tmp_path / "cases" / "founding"
    result = runner.invoke(
        app,
        [
            "case",
            "new",
            str(case),
            *founding_inputs(tmp_path, sglang_like, speculators_like),
            "--title",
            "the founding case",
            "--quiet",
        ],
    )
    assert result.exit_code == 1, result.output
    assert sorted(path.name for path in case.iterdir()) == [
        "case.toml",
        "diagnosis.json",
        "draft",
        "embed.patch",
        "report.md",
        "target",
        "transcript.md",
    ]
    toml = (case / "case.toml").read_text()
    assert (
        'title = "the founding case"' in toml and 'serving_patch = "embed.patch"' in toml and 'draft = "draft"' in toml
    )
    assert f'serving = "{sglang_like.resolve()}"' in toml  # a source tree is referred to, not copied
    assert json.loads((case / "diagnosis.json").read_text())["verdict"]["root_cause"] == "embed-slot-added"
    report = (case / "report.md").read_text()
    assert report.startswith("# rca: mismatch: embed-slot-added")
    assert "```mermaid\nflowchart LR" in report and "```diff\n--- a/draft/config.json" in report
    assert '+    "eagle_aux_hidden_state_layer_ids": [2, 30, 58]' in report
    assert "Verdict: mismatch, embed-slot-added" in (case / "transcript.md").read_text()
    again = runner.invoke(
        app, ["case", "new", str(case), *founding_inputs(tmp_path, sglang_like, speculators_like), "--quiet"]
    )
    assert again.exit_code == 2 and "is not empty" in again.stderr
    broken = tmp_path / "cases" / "broken"
    failed = runner.invoke(
        app,
        [
            "case",
            "new",
            str(broken),
            *founding_inputs(tmp_path, sglang_like, speculators_like),
            "--serving-patch",
            str(tmp_path / "missing.patch"),
            "--quiet",
        ],
    )
    assert failed.exit_code == 2 and "missing.patch" in failed.stderr
    assert not broken.exists()  # no half-made case to trip over when the input is fixed


def test_case_show_renders_the_saved_diagnosis_without_running(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    case = tmp_path / "case"
    runner.invoke(app, ["case", "new", str(case), *founding_inputs(tmp_path, sglang_like, speculators_like), "--quiet"])
    (case / "case.toml").write_text(
        (case / "case.toml").read_text().replace(str(sglang_like.resolve()), str(tmp_path / "gone"))
    )  # nothing is read again
    shown = runner.invoke(app, ["case", "show", str(case)])
    assert shown.exit_code == 1 and shown.stdout.startswith("rca: mismatch: embed-slot-added")
    as_json = runner.invoke(app, ["case", "show", str(case), "--format", "json"])
    assert json.loads(as_json.stdout) == json.loads((case / "diagnosis.json").read_text())
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "case.toml").write_text('[inputs]\nserving = "x"\n')
    missing = runner.invoke(app, ["case", "show", str(empty)])
    assert missing.exit_code == 2 and "has not been run" in missing.stderr


def test_case_run_with_a_fixed_patch_changes_the_ranking_and_the_transcript_says_so(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    case = tmp_path / "case"
    runner.invoke(app, ["case", "new", str(case), *founding_inputs(tmp_path, sglang_like, speculators_like), "--quiet"])
    fixed = tmp_path / "fixed" / "config.json"
    fixed.parent.mkdir()
    draft = json.loads((case / "draft" / "config.json").read_text())
    draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 30, 58]  # the fix the first run proposed
    fixed.write_text(json.dumps(draft, indent=2))
    result = runner.invoke(
        app, ["case", "run", str(case), "--draft", str(fixed), "--serving-patch", str(tmp_path / "no.patch"), "--quiet"]
    )
    assert result.exit_code == 2 and "no.patch" in result.stderr  # a bad input leaves the case as it was
    assert "no.patch" not in (case / "case.toml").read_text() and "## Run 2" not in (case / "transcript.md").read_text()
    result = runner.invoke(app, ["case", "run", str(case), "--draft", str(fixed), "--quiet"])
    assert result.exit_code == 0, (
        result.output
    )  # the patch maps only -1: with the ids fixed, serving feeds what training fed
    transcript = (case / "transcript.md").read_text()
    run2 = transcript[transcript.index("## Run 2") :]
    assert f"`draft` = `{fixed}`" in run2
    assert "Verdict: consistent (was: mismatch, embed-slot-added (0.95))." in run2
    assert "The serving wiring changed: [h0, h3, h31] -> [h3, h31, h59]" in run2
    assert "The ranking changed: embed-slot-added 0.95" in run2 and "-> wiring-consistent 1.00" in run2
    assert result.stdout.startswith("## Run 2")
    assert f'draft = "{fixed}"' in (case / "case.toml").read_text()


def test_graph_export(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> None:
    inputs = founding_inputs(tmp_path, sglang_like, speculators_like)
    mermaid = runner.invoke(app, ["graph", *inputs, "--quiet"])
    assert mermaid.exit_code == 0 and mermaid.stdout.startswith("flowchart TD\n")
    graph = json.loads(runner.invoke(app, ["graph", *inputs, "--format", "json", "--quiet"]).stdout)
    assert graph["schema"] == "rca.graph/1" and graph["side"] == "serving"
    patched = edit((sglang_like / MODEL).read_text(), *EMBED_EDITS).splitlines()
    append_line = next(i for i, line in enumerate(patched, 1) if "aux_hidden_states.append(hidden_states)" in line)
    appended = [node for node in graph["nodes"] if node["path"] == MODEL and node["line"] == append_line]
    assert appended and "h0" in appended[0]["note"]
    ids = {node["id"] for node in graph["nodes"]}
    assert all(edge["from"] in ids and edge["to"] in ids for edge in graph["edges"]) and graph["edges"]
    dot = runner.invoke(app, ["graph", *inputs, "--side", "training", "--format", "dot", "--quiet"]).stdout
    assert dot.startswith("digraph dataflow {") and dot.count(" -> ") > 0
    # GraphML through networkx: the same nodes and edges, the append that captures h0 among them.
    import networkx as nx

    graphml = runner.invoke(app, ["graph", *inputs, "--format", "graphml", "--quiet"]).stdout
    loaded = nx.parse_graphml(graphml)
    assert (loaded.number_of_nodes(), loaded.number_of_edges()) == (len(graph["nodes"]), len(graph["edges"]))
    appends = [data for _, data in loaded.nodes(data=True) if data["location"] == f"{MODEL}:{append_line}"]
    assert appends and "h0" in appends[0]["note"] and appends[0]["kind"] == "append"
    assert runner.invoke(app, ["graph", *inputs, "--side", "draft"]).exit_code == 2


def test_reports_match_their_snapshots(
    tmp_path: Path, sglang_like: Path, speculators_like: Path, snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # configs are shown relative to the working directory, as a user sees them
    inputs = founding_inputs(tmp_path, sglang_like, speculators_like)
    for format, name in (("text", "founding-like.txt"), ("markdown", "founding-like.md")):
        result = runner.invoke(app, ["diagnose", *inputs, "--format", format, "--quiet", "--no-cache"])
        assert result.exit_code == 1, result.output
        snapshot(name, result.stdout.replace(str(tmp_path.resolve()), "<tmp>").replace(str(ROOT), "<repo>"))


@pytest.mark.parametrize("bad", ["missing", "no-inputs", "bad-toml"])
def test_bad_case_directories_are_one_line_errors(tmp_path: Path, bad: str) -> None:
    case = tmp_path / "case"
    if bad != "missing":
        case.mkdir()
        (case / "case.toml").write_text("title = 'x'\n" if bad == "no-inputs" else "[inputs\n")
    result = runner.invoke(app, ["case", "run", str(case)])
    assert (
        result.exit_code == 2
        and len(result.stderr.strip().splitlines()) == 1
        and result.stderr.startswith("rca: error: ")
    )


def test_a_new_case_brings_the_targets_chat_template_and_the_template_file_its_launch_names(tmp_path: Path) -> None:
    source = tmp_path / "deployment"
    write_json(source / "model" / "config.json", {"num_hidden_layers": 4})
    write_json(source / "model" / "tokenizer_config.json", {"chat_template": "{{ messages }}"})
    (source / "plain.jinja").write_text("{{ messages }}")
    (source / "serve.sh").write_text("serve --chat-template plain.jinja --tp 2\n")
    inputs = Inputs(serving_args="serve.sh", target="model/config.json", base=source)
    case = create_case(tmp_path / "case", inputs, "templates travel")
    assert sorted(path.name for path in (case / "target").iterdir()) == ["config.json", "tokenizer_config.json"]
    assert (case / "serve.sh").is_file() and (case / "plain.jinja").read_text() == "{{ messages }}"


def test_a_new_case_copies_the_template_a_launch_names_but_not_its_key(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    """A launch script names a chat template, the server's TLS key and a JSON of API keys, all beside
    it: the case travels with the template the diagnosis reads, never with a secret, whatever its
    suffix, and says what it left out."""
    deployment = tmp_path / "deployment"
    deployment.mkdir()
    (deployment / "plain.jinja").write_text("{{ messages }}")
    (deployment / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n")
    (deployment / "keys.json").write_text('{"api_key": "PRIVATE KEY"}')
    launch = deployment / "serve.sh"
    launch.write_text(
        "python -m sglang.launch_server --chat-template=plain.jinja --ssl-keyfile key.pem --api-keys keys.json --tp 2\n"
    )
    case = tmp_path / "case"
    arguments = [*founding_inputs(tmp_path, sglang_like, speculators_like), "--serving-args", str(launch)]
    result = runner.invoke(app, ["case", "new", str(case), *arguments, "--quiet"])
    assert result.exit_code == 1, result.output
    assert (case / "serve.sh").is_file() and (case / "plain.jinja").read_text() == "{{ messages }}"
    assert not (case / "key.pem").exists()
    assert not [path for path in case.rglob("*") if "PRIVATE KEY" in (path.read_text() if path.is_file() else "")]
    assert f"rca: left {deployment / 'key.pem'} out of the case" in result.stderr
    assert not (case / "keys.json").exists() and str(deployment / "keys.json") in result.stderr
