"""The rca command line, end to end on small trees in the shape of SGLang and speculators."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from rca.knowledge import catalog
from typer.testing import CliRunner

from rca.cli import app
from rca.model import diagnosis_from_json
from rca.report.markdown import render as render_markdown
from tests.conftest import edit, make_patch, sglang_like_configs, write_tree

runner = CliRunner()
MODEL = "sglang/srt/models/deepseek_like.py"
SARIF_SCHEMA = Path(__file__).parent / "fixtures" / "sarif-2.1.0-subset.schema.json"

# The founding case's patch, written against the SGLang-shaped tree.
EMBED_EDITS = (
    (
        "                if self.enable_a2a_moe and i > self.first_k_dense_replace:",
        "                if residual is None:\n"
        "                    aux_hidden_states.append(hidden_states)\n"
        "                elif self.enable_a2a_moe and i > self.first_k_dense_replace:",
    ),
    (
        "self.model.layers_to_capture = [val + 1 for val in layer_ids]",
        "self.model.layers_to_capture = [0 if val == -1 else val + 1 for val in layer_ids]",
    ),
)


def invoke(*args: str):
    return runner.invoke(app, ["diagnose", "--quiet", *args])


def inputs(serving: Path, training: Path, draft: Path, target: Path, patch: Path | None = None) -> list[str]:
    """The command-line inputs of a deployment: its sources (a patch on the serving one) and configs."""
    patched = ["--serving-patch", str(patch)] if patch is not None else []
    return [
        "--serving",
        str(serving),
        *patched,
        "--training",
        str(training),
        "--draft",
        str(draft),
        "--target",
        str(target),
    ]


def embed_patch(tmp_path: Path, tree: Path) -> Path:
    original = (tree / MODEL).read_text()
    patch = tmp_path / "embed.patch"
    patch.write_text(make_patch(MODEL, original, edit(original, *EMBED_EDITS)))
    return patch


def test_founding_case_shape_json(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> None:
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    result = invoke(
        *inputs(sglang_like, speculators_like, draft, target, embed_patch(tmp_path, sglang_like)),
        "--format",
        "json",
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "rca.diagnosis/1"
    assert report["wiring"]["serving"]["slots"] == ["h0", "h3", "h31"]
    assert report["wiring"]["training"]["slots"] == ["h3", "h31", "h59"]
    assert report["wiring"]["training"]["verifier_last"] == "h61"
    assert report["verdict"] == {
        "status": "mismatch",
        "root_cause": "embed-slot-added",
        "summary": report["verdict"]["summary"],
        "causes": ["embed-slot-added"],  # layer-missing is its rival for the same difference, not a second cause
        "warnings": [],
        "assumptions": [report["verdict"]["assumptions"][0]],
    }
    assert report["verdict"]["assumptions"][0].startswith("no launch was given")
    assert {h["id"]: h["severity"] for h in report["hypotheses"]}["embed-slot-added"] == "cause"
    hypotheses = {h["id"]: h for h in report["hypotheses"]}
    assert [h["rank"] for h in report["hypotheses"]] == list(range(1, len(report["hypotheses"]) + 1))
    assert hypotheses["embed-slot-added"]["rank"] == 1 and hypotheses["layer-missing"]["rank"] > 1
    assert "[2, 30, 58]" in hypotheses["embed-slot-added"]["fix"]
    cited = {(c["path"], c["line"]) for c in hypotheses["embed-slot-added"]["citations"]}
    source = (sglang_like / MODEL).read_text()
    patched = edit(source, *EMBED_EDITS).splitlines()
    store_line = next(i for i, line in enumerate(patched, 1) if "0 if val == -1" in line)
    append_line = next(i for i, line in enumerate(patched, 1) if "aux_hidden_states.append(hidden_states)" in line)
    assert {(MODEL, store_line), (MODEL, append_line)} <= cited
    ids_line = next(
        i for i, line in enumerate(draft.read_text().splitlines(), 1) if "eagle_aux_hidden_state_layer_ids" in line
    )
    assert any(path.endswith("draft/config.json") and line == ids_line for path, line in cited)
    worker = speculators_like / "speculators/data_generation/custom_worker.py"
    capture_line = next(
        i for i, line in enumerate(worker.read_text().splitlines(), 1) if "aux_hidden_states.append(" in line
    )
    assert ("speculators/data_generation/custom_worker.py", capture_line) in cited
    patched_citations = [c for c in hypotheses["embed-slot-added"]["citations"] if c.get("patched")]
    assert {c["line"] for c in patched_citations} >= {store_line, append_line}


def test_reports_put_warnings_first_and_weigh_each_hypothesis_openly(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    """The model file that decides the wiring has a latin-1 comment: it is read (not dropped), the
    warning comes first and is counted in the verdict line; a hypothesis scored 0.00 is not
    described as fact; each evidence item shows its own likelihood ratio and direction, and the
    posterior is stated apart from them."""
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    deployment = inputs(sglang_like, speculators_like, draft, target, embed_patch(tmp_path, sglang_like))
    model = sglang_like / MODEL
    model.write_bytes(model.read_bytes() + b"# Tokenizer notes by Andr\xe9\n")
    text = invoke(*deployment).stdout.splitlines()
    assert text[0] == "rca: mismatch: embed-slot-added (0.95), 1 warning"
    assert text.index("Warnings") < text.index("Hypotheses")
    warning = text[text.index("Warnings") + 1].strip()
    assert warning.startswith(f"{MODEL}: not utf-8 text (byte ") and warning.endswith("; read as latin-1")
    assert "  ruled out (under 0.01): wiring-consistent" in text
    assert not any("would mean training fed the embedding" in line for line in text)  # its 0.00 reason

    report = json.loads(invoke(*deployment, "--format", "json").stdout)
    top, runner_up = report["hypotheses"][:2]
    assert (top["prior"], runner_up["prior"]) == (catalog()["embed-slot-added"].prior, catalog()["layer-missing"].prior)
    explains, *observed = top["evidence"]
    assert (
        explains["direction"] == "for" and explains["likelihood_ratio"] > runner_up["evidence"][0]["likelihood_ratio"]
    )
    assert {item["direction"] for item in observed} <= {"for", "neutral"}
    weights = {
        h["id"]: h["prior"] * math.prod(item["likelihood_ratio"] for item in h["evidence"])
        for h in report["hypotheses"]
    }
    assert top["score"] == pytest.approx(weights[top["id"]] / sum(weights.values()), abs=1e-3)  # the posterior

    diagnosis = diagnosis_from_json(report)
    unlikely = dataclasses.replace(diagnosis.hypotheses[1], score=0.001)
    markdown = render_markdown(dataclasses.replace(diagnosis, hypotheses=(diagnosis.hypotheses[0], unlikely)))
    assert "| evidence | likelihood ratio | bears | from |" in markdown
    assert f"posterior {top['score']:.2f}" in markdown
    assert f"**{unlikely.title}.** Unlikely (0.00); were it the cause: {unlikely.reason}" in markdown


def test_sarif_puts_the_root_cause_on_the_cited_lines(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    result = invoke(
        *inputs(sglang_like, speculators_like, draft, target, embed_patch(tmp_path, sglang_like)),
        "--format",
        "sarif",
    )
    assert result.exit_code == 1, result.output
    log = json.loads(result.stdout)
    jsonschema.validate(log, json.loads(SARIF_SCHEMA.read_text()))
    (run,) = log["runs"]
    (finding,) = run["results"]
    assert finding["ruleId"] == "embed-slot-added" and finding["level"] == "error"
    assert "[2, 30, 58]" in finding["properties"]["fix"]
    append_line = next(
        i
        for i, line in enumerate(edit((sglang_like / MODEL).read_text(), *EMBED_EDITS).splitlines(), 1)
        if "aux_hidden_states.append(hidden_states)" in line
    )
    located = {
        (
            loc["physicalLocation"]["artifactLocation"]["uriBaseId"],
            loc["physicalLocation"]["artifactLocation"]["uri"],
            loc["physicalLocation"]["region"]["startLine"],
        )
        for loc in finding["locations"]
    }
    assert ("serving", MODEL, append_line) in located
    assert run["originalUriBaseIds"]["serving"]["uri"] == sglang_like.resolve().as_uri() + "/"
    consistent = invoke(
        "--serving",
        str(sglang_like),
        "--training",
        str(speculators_like),
        "--draft",
        str(sglang_like_configs(tmp_path, [2, 30, 58])[0]),
        "--target",
        str(target),
        "--format",
        "sarif",
    )
    assert consistent.exit_code == 0 and json.loads(consistent.stdout)["runs"][0]["results"] == []


def test_consistent_exits_zero(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> None:
    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    result = invoke(
        *inputs(sglang_like, speculators_like, draft, target),
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("rca: consistent")
    assert "wiring-consistent" in result.stdout


def test_top_level_ids_are_ignored_by_sglang(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> None:
    draft, target = sglang_like_configs(tmp_path, [3, 31, 59], where="top")
    result = invoke(
        *inputs(sglang_like, speculators_like, draft, target),
        "--format",
        "json",
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["wiring"]["serving"]["slots"] == ["h2", "h30", "h58"]  # the model's defaults
    assert report["verdict"]["root_cause"] == "config-ignored"
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in report["hypotheses"][0]["fix"]
    assert "[2, 30, 58]" in report["hypotheses"][0]["fix"]


def test_markdown_to_a_file(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> None:
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    out = tmp_path / "out" / "report.md"
    result = invoke(
        *inputs(sglang_like, speculators_like, draft, target, embed_patch(tmp_path, sglang_like)),
        "--format",
        "markdown",
        "--output",
        str(out),
    )
    assert result.exit_code == 1 and result.stdout == ""
    text = out.read_text()
    assert text.startswith("# rca: mismatch: embed-slot-added")
    assert "| slot 0 | `h3` | `h0` | DIFFERS |" in text and "[patched]" in text


def test_hf_training_script(tmp_path: Path, sglang_like: Path) -> None:
    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom transformers import AutoModelForCausalLM\n\n"
        "target = AutoModelForCausalLM.from_pretrained('moonshotai/Kimi-K2.5')\n"
        "out = target(input_ids=ids, output_hidden_states=True)\n"
        "features = torch.cat([out.hidden_states[i] for i in (2, 30, 58)], dim=-1)\n"
    )
    result = invoke(
        *inputs(sglang_like, script, draft, target),
        "--format",
        "json",
    )
    report = json.loads(result.stdout)
    assert report["wiring"]["training"]["slots"] == ["h2", "h30", "h58"]
    assert report["verdict"]["root_cause"] == "layer-offset"
    assert "[1, 29, 57]" in report["hypotheses"][0]["fix"]


def test_syntax_error_names_the_file_and_line(tmp_path: Path, sglang_like: Path, speculators_like: Path) -> None:
    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    model = sglang_like / MODEL
    lines = model.read_text().splitlines()
    number = next(
        i for i, line in enumerate(lines, 1) if "def set_eagle3_layers_to_capture(self, layer_ids: Optional" in line
    )
    lines[number - 1] = "    def set_eagle3_layers_to_capture(self, layer_ids:"
    model.write_text("\n".join(lines) + "\n")
    result = invoke(
        *inputs(sglang_like, speculators_like, draft, target),
    )
    assert f"{MODEL}:{number}:" in result.stderr


def test_inconclusive_when_a_side_has_no_capture(tmp_path: Path, sglang_like: Path) -> None:
    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    empty = write_tree(tmp_path / "training", {"train.py": "print('hello')\n"})
    result = invoke(
        *inputs(sglang_like, empty, draft, target),
        "--format",
        "json",
    )
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout)
    assert report["verdict"]["status"] == "inconclusive" and report["hypotheses"] == []
    assert report["wiring"]["serving"]["slots"] == ["h3", "h31", "h59"]


def test_unchanged_inputs_reuse_the_diagnosis_and_an_edit_does_not(
    tmp_path: Path, sglang_like: Path, speculators_like: Path, fresh_result_cache: Path
) -> None:
    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    args = [
        "diagnose",
        *inputs(sglang_like, speculators_like, draft, target),
    ]
    first = runner.invoke(app, args)
    again = runner.invoke(app, args)
    assert (first.exit_code, again.exit_code) == (0, 0), first.output
    assert "reused" not in first.stderr and "reused" in again.stderr
    assert again.stdout == first.stdout

    # The user's local edit (the founding case's embedding slot) must be analyzed, not recalled.
    model = sglang_like / MODEL
    model.write_text(edit(model.read_text(), *EMBED_EDITS))
    sglang_like_configs(tmp_path, [-1, 2, 30])
    edited = runner.invoke(app, args)
    assert edited.exit_code == 1 and "reused" not in edited.stderr
    assert "embed-slot-added" in edited.stdout.splitlines()[0]

    entries = list((fresh_result_cache / "results" / "entries").iterdir())
    assert entries
    for entry in entries:  # an edited verdict is not believed: the diagnosis is made again
        entry.write_bytes(entry.read_bytes().replace(b"embed-slot-added", b"layer-offset"))
    edited_verdict = runner.invoke(app, args)
    assert "reused" not in edited_verdict.stderr and edited_verdict.stdout == edited.stdout
    for entry in entries:
        entry.write_text("{ not json")  # a damaged entry is recomputed, not trusted or fatal
    damaged = runner.invoke(app, args)
    assert damaged.exit_code == 1 and "reused" not in damaged.stderr and damaged.stdout == edited.stdout


def test_explain() -> None:
    result = runner.invoke(app, ["explain", "embed-slot-added"])
    assert result.exit_code == 0 and result.stdout.startswith("embed-slot-added: Serving feeds an embedding slot")
    listing = runner.invoke(app, ["explain"])
    assert "layer-offset" in listing.stdout and "wiring-consistent" in listing.stdout
    unknown = runner.invoke(app, ["explain", "no-such-thing"])
    assert unknown.exit_code == 2 and "unknown hypothesis" in unknown.stderr


def test_a_null_eagle_config_gets_a_fix_that_names_the_key_and_the_value(
    tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    draft.write_text(
        json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, "eagle_config": None})
    )
    result = invoke(*inputs(sglang_like, speculators_like, draft, target), "--format", "json")
    report = json.loads(result.stdout)
    assert report["verdict"]["root_cause"] == "config-ignored"
    assert report["hypotheses"][0]["fix"].startswith("set eagle_config.eagle_aux_hidden_state_layer_ids to [2, 30, 58]")


def _help(path: list[str]) -> str:
    environment = {**os.environ, "RCA_SERVER": "off", "COLUMNS": "200"}
    command = [sys.executable, "-m", "rca", *path, "--help"]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=60).stdout


def test_help_shows_a_value_type_only_where_an_option_takes_a_value() -> None:
    """A switch (`--quiet`, `--probe`, `--help`) takes no value: its help line shows no `<bool>`;
    an option that takes one still shows its type; an optional argument is bracketed once."""
    from rca.cli import command

    def paths(node: object, prefix: list[str]) -> list[list[str]]:
        children = getattr(node, "commands", {})
        return [prefix] + [path for name, child in children.items() for path in paths(child, [*prefix, name])]

    for path in paths(command(), []):
        shown = _help(path)
        assert "--help" in shown and "<bool>" not in shown and "[[" not in shown, (path, shown)
    diagnose = _help(["diagnose"])
    assert "<path>" in diagnose and "the case's [serve] command" in " ".join(diagnose.split())
    assert "embed_tokens[token_ids]" in _help(["probe", "embedding"])  # brackets in help are text, not markup
    # the inputs first, the engine options after them, in a panel of their own
    assert diagnose.index("--serving ") < diagnose.index("Serving in the engine") < diagnose.index("│ --serve-with")
