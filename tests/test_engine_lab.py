"""Ground truth from a real engine: rca's verdicts against the acceptance vLLM itself measures.

The lab (`tests/enginelab.py`) serves its tiny target and EAGLE-3 draft on vLLM's own source built
for the CPU, as trained and with failures induced; `rca probe served` reads vLLM's counters. This
is the slice CI runs (a control at tensor parallel 2, a wiring failure with its fix, a contract failure with its fix,
captures of a right and a wrong wiring, a DFlash draft's ids in EAGLE-3's numbering with its fix,
the calibration of the offline estimate); the whole table, with the DFlash draft against a target
whose vocabulary is padded further, is `scripts/engine_lab.py`. Each engine start takes 25-70 s on two cores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from safetensors import safe_open

from tests import enginelab
from tests.enginelab import DRAFT, DUMPS, FAILURES, TARGET, TRAINED, failing_draft, rca

pytestmark = pytest.mark.engine
PROMPTS = 16  # the dumps' samples: their first 16 tokens are the prompt, the next 48 the target's own continuation
NEW_TOKENS = 48


def served_with_capture(
    draft: Path, out: Path, overlay: Path | None = None, tensor_parallel: int = 1
) -> tuple[dict, Path]:
    """`rca probe served` on an engine launched under `rca capture`: one start gives both the measured
    acceptance and what the draft received."""
    capture = out / "capture"
    result = rca(
        "probe",
        "served",
        "--dumps",
        str(DUMPS),
        "--prompt-length",
        str(PROMPTS),
        "--requests",
        str(PROMPTS),
        "--max-new-tokens",
        str(NEW_TOKENS),
        "--format",
        "json",
        "--",
        sys.executable,
        "-m",
        "rca",
        "capture",
        "--output",
        str(capture),
        "--",
        *enginelab.serve_command(draft, enginelab.free_port(), overlay, tensor_parallel=tensor_parallel),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), capture


def compared(capture: Path) -> dict:
    result = rca("probe", "compare", "--capture", str(capture), "--target", str(TARGET), "--device", "cpu", "-q",
                 "--format", "json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def diagnosed_mismatch_served(failure: enginelab.Failure, draft: Path, command: list[str]) -> dict:
    """`rca diagnose --serve-with -- LAUNCH` on a failure of the lab: a mismatch (exit 1), as JSON."""
    result = rca(
        "diagnose", *enginelab.diagnose_arguments(failure, draft), "--format", "json", "-q", "--serve-with",
        "--serve-requests", str(PROMPTS), "--serve-max-new-tokens", str(NEW_TOKENS), "--", *command,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def engine() -> Path:
    return enginelab.engine_venv()


@pytest.fixture(scope="module")
def control(engine, tmp_path_factory) -> tuple[dict, Path]:
    """The draft as trained, served at tensor parallel 2 (one core per rank): the same acceptance as
    one process, and each rank's capture besides (one engine start serves both checks)."""
    return served_with_capture(DRAFT, tmp_path_factory.mktemp("control"), tensor_parallel=2)


def test_the_draft_as_trained_is_accepted_and_each_rank_s_capture_names_its_taps(control) -> None:
    """The target split over two processes: each rank writes its own capture, the ranks hold the
    same (all-reduced) states, the draft's taps, and the engine accepts the draft."""
    served, capture = control
    assert served["engine"] == "vllm" and served["acceptance"] >= 0.9, served["summary"]
    files = sorted(capture.glob("capture_r0_*.safetensors"))
    assert files and not (capture / "hook-errors.log").exists()
    with safe_open(str(files[-1]), "pt") as handle:
        assert handle.metadata()["draft"] == "Eagle3LlamaForCausalLM"
        assert handle.metadata()["cut"] == "per request, from position 0"
    assert sorted(path.name.split("_")[1] for path in capture.glob("capture_r*_0.safetensors")) == ["r0", "r1"]
    report = compared(capture)
    assert report["serving"] == list(TRAINED), report["summary"]
    assert all(match["cosine"] >= 0.99 for match in report["matches"]), report["matches"]
    assert report["ranks"]["agree"] and report["ranks"]["captures"] >= 2, report["ranks"]


def test_a_shifted_wiring_costs_acceptance_its_capture_shows_it_and_rca_names_it(control, tmp_path: Path) -> None:
    failure = FAILURES["layer-offset"]
    draft = failing_draft(failure, tmp_path / "draft")
    served, capture = served_with_capture(draft, tmp_path)
    assert served["acceptance"] <= control[0]["acceptance"] / 2, served["summary"]
    assert compared(capture)["serving"] == ["h2", "h3", "h4"]
    result = rca("diagnose", *enginelab.diagnose_arguments(failure, draft), "--format", "json", "-q")
    assert result.returncode == 1, result.stderr
    diagnosis = json.loads(result.stdout)
    top = diagnosis["hypotheses"][0]
    assert top["id"] == "layer-offset" and diagnosis["wiring"]["training"]["slots"] == list(TRAINED)
    assert top["fix_edit"] == {
        "file": "draft config",
        "key": "eagle_config.eagle_aux_hidden_state_layer_ids",
        "value": [1, 2, 3],
    }


def test_an_embedding_slot_patch_is_diagnosed_and_its_fix_verified_in_the_engine(control, tmp_path: Path) -> None:
    """A case records the launch command; its report carries what the engine measured, as served
    (the patched engine) and with the fix rca proposes (a copy of the draft with the ids it checked)."""
    failure = FAILURES["embed-slot-added"]
    draft = failing_draft(failure, tmp_path / "draft")
    overlay = enginelab.patched_overlay(failure.serving_patch, tmp_path / "overlay")
    command = enginelab.serve_command(draft, enginelab.free_port(), overlay)
    case = tmp_path / "case"
    result = rca(
        "case", "new", str(case), *enginelab.diagnose_arguments(failure, draft), "--serve-with",
        "--serve-requests", str(PROMPTS), "--serve-max-new-tokens", str(NEW_TOKENS), "--", *command,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    diagnosis = json.loads((case / "diagnosis.json").read_text())
    assert diagnosis["hypotheses"][0]["id"] == "embed-slot-added"
    assert diagnosis["wiring"]["serving"]["slots"] == ["h0", "h1", "h2"]
    engine = diagnosis["engine"]
    assert engine["as_served"]["acceptance"] <= control[0]["acceptance"] / 2
    assert abs(engine["with_fix"]["acceptance"] - control[0]["acceptance"]) <= 0.05, engine["summary"]
    assert engine["verified"] and engine["summary"].startswith("fix verified in the engine: acceptance 0.")
    assert "## In the engine" in (case / "report.md").read_text() and "[serve]" in (case / "case.toml").read_text()


def test_a_dropped_norm_is_diagnosed_and_its_fix_verified_in_the_engine(control, tmp_path: Path) -> None:
    failure = FAILURES["norm-before-fc-dropped"]
    draft = failing_draft(failure, tmp_path / "draft")
    command = enginelab.serve_command(draft, enginelab.free_port())
    diagnosis = diagnosed_mismatch_served(failure, draft, command)
    assert diagnosis["hypotheses"][0]["id"] == "norm-flag-dropped"
    engine = diagnosis["engine"]
    assert engine["as_served"]["acceptance"] <= control[0]["acceptance"] / 2
    assert abs(engine["with_fix"]["acceptance"] - control[0]["acceptance"]) <= 0.05 and engine["verified"]


def test_the_offline_estimate_agrees_with_the_engine(control) -> None:
    """`rca probe acceptance` runs the draft on the dumps' prompts itself; the engine's first-position
    acceptance on the same prompts is what it estimates."""
    result = rca(
        "probe", "acceptance", "--dumps", str(DUMPS), "--target", str(TARGET), "--draft", str(DRAFT),
        "--wiring", ",".join(TRAINED), "--device", "cpu", "--format", "json", "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    offline = json.loads(result.stdout)["results"][0]["acceptance"]
    assert abs(offline - control[0]["by_position"][0]) < 0.05, (offline, control[0]["by_position"])


def test_a_dflash_draft_given_ids_in_eagle3s_convention_is_diagnosed_and_its_fix_verified(tmp_path: Path) -> None:
    """DFlash ids name "the output of layer k" and vLLM adds one as it reads them: a DFlash config
    written with EAGLE-3's ids feeds every tap one layer late. rca reads that from the engine's
    code, names the key and the ids that feed the draft what it was trained on, and the engine
    started with them accepts the draft again."""
    failure = FAILURES["dflash-layer-offset"]
    draft = failing_draft(failure, tmp_path / "draft")
    command = enginelab.serve_command(draft, enginelab.free_port(), method="dflash")
    diagnosis = diagnosed_mismatch_served(failure, draft, command)
    top = diagnosis["hypotheses"][0]
    assert top["id"] == "layer-offset" and diagnosis["wiring"]["serving"]["slots"] == ["h2", "h3", "h4"]
    assert top["fix_edit"] == {"file": "draft config", "key": "dflash_config.target_layer_ids", "value": [0, 1, 2]}
    engine = diagnosis["engine"]
    assert engine["with_fix"]["acceptance"] >= 0.9 and engine["verified"], engine["summary"]
    assert engine["as_served"]["acceptance"] <= engine["with_fix"]["acceptance"] / 2, engine["summary"]


def test_partial_sums_captured_at_tensor_parallel_2_cost_acceptance_and_rca_names_the_deferral(tmp_path: Path) -> None:
    """A serving patch leaves each layer's MLP output unreduced for the next layer to reduce, so
    each of the two ranks captures its own partial sum: the engine measures what that costs, and
    rca, reading the tensor parallel size from the launch it serves, names the deferred all-reduce."""
    failure = FAILURES["tp2-partial-sum"]
    draft = failing_draft(failure, tmp_path / "draft")
    overlay = enginelab.patched_overlay(failure.serving_patch, tmp_path / "overlay")
    command = enginelab.serve_command(draft, enginelab.free_port(), overlay, tensor_parallel=2)
    diagnosis = diagnosed_mismatch_served(failure, draft, command)
    top = diagnosis["hypotheses"][0]
    assert top["id"] == "capture-before-allreduce" and top["severity"] == "cause", top
    assert top["params"]["partial_taps"] == ["h1~partial", "h2~partial", "h3~partial"]
    assert "tensor_parallel_size = 2" in " ".join(item["summary"] for item in top["evidence"])
    assert diagnosis["engine"]["as_served"]["acceptance"] <= 0.5, diagnosis["engine"]["summary"]
