"""The bundled cases and refactored variants, on the real SGLang 0.5.12 and speculators 0.4.0.

The wheels are downloaded once with `pip download --no-deps` into the rca cache.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cases.casefile import load_case
from rca.cli import app
from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from rca.model import ConfigEdit
from tests.conftest import CASES, eagle_configs, edit, make_patch

pytestmark = pytest.mark.release

DEEPSEEK = "sglang/srt/models/deepseek_v2.py"
TRANSFORM = "            self.model.layers_to_capture = [val + 1 for val in layer_ids]"


@pytest.mark.parametrize("name", sorted(path.name for path in CASES.iterdir() if (path / "case.toml").is_file()))
def test_bundled_case_reaches_its_expected_verdict(name: str) -> None:
    case = load_case(CASES / name)
    run = diagnose(case.inputs)
    assert case.expected is not None
    assert case.expected.misses(run.diagnosis) == []


def test_case_check_prints_a_table_and_exits_one_on_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rca case check`: a row per case (the verdicts themselves are checked per case above), and a
    case whose expected verdict is not reached is a miss, with exit status 1."""
    monkeypatch.chdir(CASES.parent)
    missed = Path(shutil.copytree(CASES / "kimi-k25-consistent", tmp_path / "expects-a-mismatch"))
    toml = missed / "case.toml"
    toml.write_text(toml.read_text().replace('status = "consistent"', 'status = "mismatch"'))
    cases = [str(CASES / "kimi-k25-embed-slot"), str(missed)]
    result = CliRunner().invoke(app, ["case", "check", *cases, "--quiet", "--format", "markdown"])
    assert result.exit_code == 1, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and not line.startswith("| case")]
    assert [row.split(" | ")[0][2:] for row in rows] == ["kimi-k25-embed-slot", "expects-a-mismatch"]
    assert rows[0].endswith("| ok |") and rows[0].split(" | ")[3] == "1"
    assert rows[1].endswith("| MISS |")
    assert "1 of 2 cases reach their expected verdict" in result.stdout


def test_the_founding_cases_committed_report_is_current() -> None:
    """cases/kimi-k25-embed-slot/report.md is what readers open first: it must be what rca writes now."""
    from rca.report.markdown import render as render_markdown

    case = CASES / "kimi-k25-embed-slot"
    diagnosis = diagnose(load_case(case).inputs).diagnosis
    fresh = {
        "report.md": render_markdown(diagnosis),
        "diagnosis.json": json.dumps(diagnosis.to_json(), indent=2) + "\n",
    }
    for name, text in fresh.items():
        assert (case / name).read_text() == text, (
            f"cases/kimi-k25-embed-slot/{name} is stale: regenerate it with rca case run cases/kimi-k25-embed-slot"
        )


def test_founding_case_cites_the_config_the_patch_and_the_training_capture() -> None:
    run = diagnose(load_case(CASES / "kimi-k25-embed-slot").inputs)
    top = run.diagnosis.hypotheses[0]
    cited = {(step.location.path, step.location.line): step for step in top.citations}
    assert ("draft/config.json", 10) in cited  # "eagle_aux_hidden_state_layer_ids": [-1, 2, 30]
    assert ("sglang/srt/model_executor/model_runner.py", 904) in cited  # hands the ids to the target model
    derivation = {(step.location.path, step.location.line) for step in run.diagnosis.wirings["serving"].steps}
    assert (
        "sglang/srt/model_executor/model_runner.py",
        436,
    ) in derivation  # eagle_config["eagle_aux_hidden_state_layer_ids"]
    assert cited[(DEEPSEEK, 2545)].patched  # [0 if val == -1 else val + 1 for val in layer_ids]
    assert cited[(DEEPSEEK, 2278)].patched and "h0" in cited[(DEEPSEEK, 2278)].note  # the embedding append
    assert ("speculators/data_generation/custom_worker.py", 60) in cited  # capture after each layer
    assert not [path for path, _ in cited if path.startswith("target/")]  # a flag the target config lacks is no reason
    assert "set eagle_config.eagle_aux_hidden_state_layer_ids to [2, 30, 58]" in top.fix
    ranks = {hypothesis.id: hypothesis for hypothesis in run.diagnosis.hypotheses}
    assert ranks["layer-missing"].params == {"tap": "h59"} and ranks["layer-missing"].rank == 2
    assert "unexplained" in ranks["layer-missing"].reason
    assert ranks["wiring-consistent"].score < 0.01 and "embedding" in ranks["wiring-consistent"].reason


def test_a_runner_that_never_reads_the_draft_ids_is_config_ignored_with_its_hand_off_cited() -> None:
    run = diagnose(load_case(CASES / "draft-ids-never-read-on-vllm-0.9").inputs)
    top = run.diagnosis.hypotheses[0]
    assert top.id == "config-ignored" and "never reads the draft config's ids" in top.reason
    cited = {(step.location.path, step.location.line) for step in top.citations}
    assert ("vllm/v1/worker/gpu_model_runner.py", 1797) in cited  # set_aux_hidden_state_layers(get_eagle3_...())
    assert "serve the draft on an engine release whose runner reads" in top.fix and "2, 16, 29" in top.fix
    ranks = {hypothesis.id: hypothesis.rank for hypothesis in run.diagnosis.hypotheses}
    assert ranks["layer-offset"] > 1  # the shift is what the defaults look like, not a convention to convert


def test_a_checkpoint_fc_wider_than_the_engine_builds_is_fc_width_mismatch_with_a_checked_edit() -> None:
    run = diagnose(load_case(CASES / "five-layer-draft-fc-sized-for-three-on-vllm").inputs)
    top = run.diagnosis.hypotheses[0]
    assert top.id == "fc-width-mismatch" and "fc.weight [1, 20480]: it was trained on 5 states" in top.reason
    cited = {(step.location.path, step.location.line) for step in top.citations}
    assert {("draft/model.safetensors", 1), ("vllm/model_executor/models/llama_eagle3.py", 242)} <= cited
    assert top.fix_edit == ConfigEdit(("eagle_config", "eagle_aux_hidden_state_layer_ids"), [1, 8, 15, 22, 28])
    assert "then builds its fc for 5 x 4096 = 20480 inputs" in top.fix


@pytest.mark.parametrize(
    ("case", "relpath"),
    [
        ("draft-built-for-2k-on-vllm-0.33", "vllm/config/speculative.py"),
        ("draft-built-for-2k-on-sglang", "sglang/srt/configs/model_config.py"),
    ],
)
def test_context_too_short_cites_where_the_engine_raises_the_drafts_positions(case: str, relpath: str) -> None:
    inputs = load_case(CASES / case).inputs
    lines = (fetch_release(*inputs.serving.split("==")) / relpath).read_text().splitlines()
    raised = [n for n, line in enumerate(lines, 1) if re.match(r"\s+\w+(\.\w+)*\.max_position_embeddings = ", line)]
    top = diagnose(inputs).diagnosis.hypotheses[0]
    assert top.id == "context-too-short" and "raises the draft's max_position_embeddings" in top.reason
    cited = {(step.location.path, step.location.line) for step in top.citations}
    assert any((relpath, line) in cited for line in raised), (raised, cited)


def test_cli_json_and_exit_codes() -> None:
    runner = CliRunner()
    mismatch = runner.invoke(
        app, ["diagnose", "--quiet", "--case", str(CASES / "kimi-k25-embed-slot"), "--format", "json"]
    )
    assert mismatch.exit_code == 1, mismatch.output
    report = json.loads(mismatch.stdout)
    assert report["schema"] == "rca.diagnosis/1"
    assert report["wiring"]["training"] == {
        **report["wiring"]["training"],
        "slots": ["h3", "h31", "h59"],
        "verifier_last": "h61",
    }
    assert (
        report["wiring"]["serving"]["slots"] == ["h0", "h3", "h31"]
        and report["wiring"]["serving"]["verifier_last"] is None
    )
    assert report["verdict"]["status"] == "mismatch" and report["verdict"]["root_cause"] == "embed-slot-added"
    first = report["hypotheses"][0]
    assert {"id", "rank", "score", "title", "params", "citations", "evidence", "fix"} <= set(first)
    assert all({"path", "line", "end_line", "note"} <= set(citation) for citation in first["citations"])
    consistent = runner.invoke(app, ["diagnose", "--quiet", "--case", str(CASES / "kimi-k25-consistent")])
    assert consistent.exit_code == 0, consistent.output


def _serving_with(tmp_path: Path, sglang: Path, speculators: Path, ids: list[int], *edits: tuple[str, str]):
    original = (sglang / DEEPSEEK).read_text()
    patch = tmp_path / "variant.patch"
    patch.write_text(make_patch(DEEPSEEK, original, edit(original, *edits)))
    draft, target = eagle_configs(tmp_path, ids, use_aux_hidden_state=True)
    return diagnose(
        Inputs(
            serving=str(sglang),
            serving_patch=str(patch),
            training=str(speculators),
            draft=str(draft),
            target=str(target),
        )
    )


HELPER = (
    (TRANSFORM, "            self.model.layers_to_capture = _capture_indices(layer_ids)"),
    (
        "class DeepseekV2ForCausalLM(",
        "def _capture_indices(ids):\n    shifted = []\n    for layer_id in ids:\n        shifted.append(layer_id + "
        "1)\n    return shifted\n\n\nclass DeepseekV2ForCausalLM(",
    ),
)
RENAMES = (
    (
        "    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):\n        if not "
        "self.pp_group.is_last_rank:\n            return\n\n        if layer_ids is None:",
        "    def set_eagle3_layers_to_capture(self, ids: Optional[List[int]] = None):\n        if not "
        "self.pp_group.is_last_rank:\n            return\n\n        if ids is None:",
    ),
    (TRANSFORM, "            wanted = [k + 1 for k in ids]\n            self.model.layers_to_capture = wanted"),
)
BEFORE_LAYER = """                if i in self.layers_to_capture:
                    if self.enable_a2a_moe and i > self.first_k_dense_replace:
                        aux_hidden_state = get_attention_tp_group().all_gather(
                            hidden_states + residual, dim=0
                        )
                        aux_hidden_states.append(aux_hidden_state)
                    else:
                        aux_hidden_states.append(hidden_states + residual)
"""
LAYER_CALL_END = (
    "                    llama_4_scaling,\n                    prev_topk_indices=topk_indices,\n                )\n"
)


def after_layer(index: str) -> tuple[tuple[str, str], ...]:
    """Move the capture after the layer call, testing `index` against the capture set."""
    moved = (
        f"                if {index} in self.layers_to_capture:\n                    "
        f"aux_hidden_states.append(hidden_states + residual)\n"
    )
    return ((BEFORE_LAYER, ""), (LAYER_CALL_END, LAYER_CALL_END + moved))


@pytest.mark.parametrize(
    ("edits", "slots"),
    [
        pytest.param(RENAMES, ["h3", "h31", "h59"], id="renamed-variables"),
        pytest.param(HELPER, ["h3", "h31", "h59"], id="plus-one-in-a-helper"),
        pytest.param(after_layer("i + 1"), ["h3", "h31", "h59"], id="after-the-layer-same-taps"),
        pytest.param(after_layer("i"), ["h4", "h32", "h60"], id="after-the-layer-one-later"),
        pytest.param(
            ((TRANSFORM, "            self.model.layers_to_capture = [val + 2 for val in layer_ids]"),),
            ["h4", "h32", "h60"],
            id="offset-two",
        ),
    ],
)
def test_refactors_keep_the_taps_and_semantic_changes_move_them(
    tmp_path: Path, sglang_0_5_12: Path, speculators_0_4_0: Path, edits, slots
) -> None:
    run = _serving_with(tmp_path, sglang_0_5_12, speculators_0_4_0, [2, 30, 58], *edits)
    assert [str(tap) for tap in run.diagnosis.wirings["serving"].slots] == slots
    expected = "consistent" if slots == ["h3", "h31", "h59"] else "mismatch"
    assert run.diagnosis.verdict.status.value == expected
    if expected == "mismatch":
        assert run.diagnosis.verdict.root_cause == "layer-offset"


FUSION_ON = "--tp 8 --enable-flashinfer-allreduce-fusion"
FUSE_TEST = (
    "        should_allreduce_fusion = (\n            "
    "self.layer_communicator.should_fuse_mlp_allreduce_with_next_layer(\n                forward_batch\n    "
    "        )\n        )\n"
)
MARKER = "            hidden_states._sglang_needs_allreduce_fusion = True"


@pytest.mark.parametrize(
    ("edits", "exposed"),
    [
        pytest.param((), True, id="as-released"),
        pytest.param(((MARKER, "            hidden_states._deferred_allreduce = True"),), True, id="renamed-marker"),
        pytest.param(after_layer("i + 1"), True, id="capture-after-the-layer-call"),
        pytest.param(((FUSE_TEST, "        should_allreduce_fusion = False\n"),), False, id="fusion-never-on"),
    ],
)
def test_capture_before_a_deferred_allreduce(
    tmp_path: Path, sglang_0_5_12: Path, speculators_0_4_0: Path, edits, exposed: bool
) -> None:
    """DeepSeek-V2 in 0.5.12 captures `hidden_states + residual` between layers while its layer can
    leave the MLP output unreduced for the next one: with the fusion on, ranks capture partial sums."""
    original = (sglang_0_5_12 / DEEPSEEK).read_text()
    patch = tmp_path / "variant.patch"
    patch.write_text(make_patch(DEEPSEEK, original, edit(original, *edits)) if edits else "")
    draft, target = eagle_configs(tmp_path, [2, 30, 58], use_aux_hidden_state=True)
    run = diagnose(
        Inputs(
            serving=str(sglang_0_5_12),
            serving_patch=str(patch) if edits else None,
            serving_args=FUSION_ON,
            training=str(speculators_0_4_0),
            draft=str(draft),
            target=str(target),
        )
    )
    assert [str(tap) for tap in run.diagnosis.wirings["serving"].slots] == ["h3", "h31", "h59"]
    top = run.diagnosis.hypotheses[0]
    if not exposed:
        assert top.id == "wiring-consistent"
        assert not [f for f in run.sides["serving"].findings if f.name == "capture-before-allreduce"]
        return
    assert top.id == "capture-before-allreduce" and top.params["partial_taps"] == [
        "h3~partial",
        "h31~partial",
        "h59~partial",
    ]
    cited = {(step.location.path, step.location.line) for step in top.citations}
    assert ("--serving-args", 1) in cited  # the setting that turns the fusion on
    if not edits:
        assert (DEEPSEEK, 1981) in cited  # if not self.nsa_enable_prefill_cp and should_allreduce_fusion:


def test_llama_target_captures_at_the_entry_of_layer_k_plus_one(
    tmp_path: Path, sglang_0_5_12: Path, speculators_0_4_0: Path
) -> None:
    draft, _ = eagle_configs(tmp_path, [1, 15, 28], use_aux_hidden_state=True)
    target = tmp_path / "llama" / "config.json"
    target.parent.mkdir()
    target.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}))
    run = diagnose(
        Inputs(serving=str(sglang_0_5_12), training=str(speculators_0_4_0), draft=str(draft), target=str(target))
    )
    serving, training = run.diagnosis.wirings["serving"], run.diagnosis.wirings["training"]
    assert [str(tap) for tap in serving.slots] == ["h2", "h16", "h29"]
    assert any(step.location.path == "sglang/srt/models/llama.py" and step.kind == "append" for step in serving.steps)
    # speculators 0.3-0.4 defaults [2, L//2, L-3, L-1] are captured after each layer: one layer later
    assert [str(tap) for tap in training.slots] == ["h3", "h17", "h30"] and str(training.verifier_last) == "h32"
    assert run.diagnosis.verdict.root_cause == "layer-offset"
    assert "[2, 16, 29]" in run.diagnosis.hypotheses[0].fix


def test_dump_metadata_overrides_the_generator_defaults(
    tmp_path: Path, sglang_0_5_12: Path, speculators_0_4_0: Path
) -> None:
    draft, target = eagle_configs(tmp_path, [2, 30, 58], use_aux_hidden_state=True)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "data_config.json").write_text(json.dumps({"hidden_states": {"layer_ids": [1, 29, 57, 60]}}, indent=2))
    run = diagnose(
        Inputs(
            serving=str(sglang_0_5_12),
            training=str(speculators_0_4_0),
            dumps=str(dumps),
            draft=str(draft),
            target=str(target),
        )
    )
    training = run.diagnosis.wirings["training"]
    assert [str(tap) for tap in training.slots] == ["h2", "h30", "h58"] and str(training.verifier_last) == "h61"
    assert training.steps[0].location.path.endswith("data_config.json") and training.steps[0].kind == "dump"
    assert run.diagnosis.verdict.root_cause == "layer-offset"


# -- vLLM 0.33.0: the capture lives in a mixin helper that Llama's forward calls after each layer --

VLLM_LLAMA = "vllm/model_executor/models/llama.py"
VLLM_MIXIN = "vllm/model_executor/models/interfaces.py"
AFTER_LAYER_CALL = (
    "            self._maybe_add_hidden_state(\n                aux_hidden_states, idx + 1, "
    "hidden_states, residual\n            )\n"
)
LAYER_CALL = (
    "            hidden_states, residual = layer(\n                positions, hidden_states, residual, "
    "**extra_layer_kwargs\n            )\n"
)
HELPER_TEST = (
    "        if layer_idx in self.aux_hidden_state_layers:\n            value = hidden_states + residual "
    "if residual is not None else hidden_states\n"
)

VLLM_VARIANTS = [
    pytest.param(
        VLLM_LLAMA,
        ((AFTER_LAYER_CALL, AFTER_LAYER_CALL.replace("idx + 1", "1 + idx")),),
        ["h2", "h16", "h29"],
        id="index-written-differently",
    ),
    pytest.param(
        VLLM_LLAMA,
        (
            (
                LAYER_CALL + AFTER_LAYER_CALL,
                "            if idx in self.aux_hidden_state_layers:\n                "
                "aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)\n"
                + LAYER_CALL,
            ),
        ),
        ["h2", "h16", "h29"],
        id="helper-inlined-before-the-layer",
    ),
    pytest.param(
        VLLM_MIXIN,
        (
            (
                HELPER_TEST,
                HELPER_TEST.replace("        if layer_idx in", "        wanted = layer_idx\n        if wanted in"),
            ),
        ),
        ["h2", "h16", "h29"],
        id="renamed-local-in-the-helper",
    ),
    pytest.param(
        VLLM_LLAMA,
        ((AFTER_LAYER_CALL, AFTER_LAYER_CALL.replace("idx + 1", "idx")),),
        ["h3", "h17", "h30"],
        id="after-the-layer-without-the-shift",
    ),
    pytest.param(
        VLLM_MIXIN,
        (
            (
                HELPER_TEST,
                HELPER_TEST.replace(
                    "hidden_states + residual if residual is not None else hidden_states", "hidden_states"
                ),
            ),
        ),
        ["h2-residual", "h16-residual", "h29-residual"],
        id="residual-dropped",
    ),
]


@pytest.mark.parametrize(("relpath", "edits", "slots"), VLLM_VARIANTS)
def test_vllm_refactors_keep_the_taps_and_semantic_changes_move_them(
    tmp_path: Path, relpath: str, edits, slots
) -> None:
    from rca.inputs.sources import fetch_release
    from tests.releases import VLLM_REFACTORED

    vllm = fetch_release(*VLLM_REFACTORED)
    original = (vllm / relpath).read_text()
    patch = tmp_path / "variant.patch"
    patch.write_text(make_patch(relpath, original, edit(original, *edits)))
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}))
    draft = tmp_path / "draft.json"
    draft.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 4096,
                "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
            },
            indent=2,
        )
    )
    serving = diagnose(
        Inputs(serving=str(vllm), serving_patch=str(patch), draft=str(draft), target=str(target))
    ).diagnosis.wirings["serving"]
    assert [str(tap) for tap in serving.slots] == slots, serving.notes
    assert any(step.patched and step.location.path == relpath for step in serving.steps), "the patched lines are cited"


def test_diff_on_a_fork_of_the_real_release(tmp_path: Path, sglang_0_5_12: Path, speculators_0_4_0: Path) -> None:
    """The founding case as commits on a copy of the real SGLang 0.5.12 tree: the import with the
    trained ids, then the -1 patch with the draft's ids changed."""
    import git

    root = tmp_path / "sglang-fork"
    shutil.copytree(sglang_0_5_12, root)
    shutil.copytree(CASES / "kimi-k25-consistent" / "draft", root / "draft")
    shutil.copytree(CASES / "kimi-k25-consistent" / "target", root / "target")
    repo = git.Repo.init(root)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test").set_value("user", "email", "test@example.com")
    repo.git.add(A=True)
    repo.git.commit("-q", "--no-verify", "-m", "Import SGLang 0.5.12")
    repo.git.apply(str(CASES / "kimi-k25-embed-slot" / "serving.patch"))
    shutil.copy(CASES / "kimi-k25-embed-slot" / "draft" / "config.json", root / "draft" / "config.json")
    repo.git.add(A=True)
    repo.git.commit("-q", "--no-verify", "-m", "Capture the embedding for id -1")
    patch_commit = repo.head.commit.hexsha
    result = CliRunner().invoke(
        app,
        [
            "diff",
            "HEAD",
            "--quiet",
            "--repo",
            str(root),
            "--training",
            str(speculators_0_4_0),
            "--draft",
            "draft",
            "--target",
            "target",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["effect"] == "introduces" and report["after"]["root_cause"] == "embed-slot-added"
    assert report["slots"]["serving"] == {"before": ["h3", "h31", "h59"], "after": ["h0", "h3", "h31"]}
    responsible = {(item["path"], item["line"]): item["commit"] for item in report["responsible"]}
    assert {(DEEPSEEK, 2545), (DEEPSEEK, 2278)} <= set(responsible)  # the -1 mapping and the embedding append
    assert any(path == "draft/config.json" for path, _ in responsible)
    assert set(responsible.values()) == {patch_commit}
