"""What each release's draft module does with its final norm under every `norm_output` a draft
config can carry, and the diagnosis where a trainer and an engine read it apart. Every
expectation is read from the release's own lines; the analysis reads the same code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.draft import load_draft
from rca.inputs.sources import SourceTree, fetch_release
from rca.model import StepKind
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.wiring import resolve_wiring
from tests.conftest import write_json
from tests.releases import SGLANG, SPECFORGE, SPECULATORS, VLLM

pytestmark = pytest.mark.release

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096}
FLAGS = [None, False, True]
_ENGINE_DEFAULT = re.compile(r'getattr\(\s*(?:self\.)?config,\s*"norm_output",\s*(True|False)\s*\)')
_FIELD_DEFAULT = re.compile(r"norm_output: bool = Field\(\s*default=(True|False)")
ENGINE_FILES = {"sglang": "sglang/srt/models/llama_eagle3.py", "vllm": "vllm/model_executor/models/llama_eagle3.py"}
SPECFORGE_DRAFT = "specforge/modeling/draft/llama3_eagle.py"


def _draft(tmp_path: Path, flag: bool | None, **extra) -> Path:
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 4096,
        "vocab_size": 128256,
        "draft_vocab_size": 32000,
        "rms_norm_eps": 1e-5,
        **extra,
    }
    if flag is not None:
        config["norm_output"] = flag
    return write_json(tmp_path / "draft" / "config.json", config)


def _norm_use(tmp_path: Path, side: str, package: str, version: str, flag: bool | None):
    root = fetch_release(package, version)
    target = TargetConfig(load_config("target", write_json(tmp_path / "target.json", LLAMA)))
    ctx = SideContext(side, SourceTree(side, f"{package} {version}", root), target, load_draft(_draft(tmp_path, flag)))
    run_side(ctx, only={"final-norm-use"})
    return root, resolve_wiring(ctx).aspect("draft_norm")


def _flag(code: str, pattern: re.Pattern[str], flag: bool | None) -> bool | None:
    """What a draft config with `flag` gets where the release reads the flag (None: it does not)."""
    found = pattern.search(code)
    if found is None:
        return None
    return flag if flag is not None else found.group(1) == "True"


@pytest.mark.parametrize("flag", FLAGS, ids=str)
@pytest.mark.parametrize(
    ("package", "version"),
    [("sglang", v) for v in SGLANG] + [("vllm", v) for v in VLLM if v != "0.9.2"],  # 0.9 names the draft otherwise
)
def test_an_engine_always_norms_before_lm_head_and_passes_the_state_the_flag_asks_for(
    tmp_path: Path, package: str, version: str, flag: bool | None
) -> None:
    root, use = _norm_use(tmp_path, "serving", package, version, flag)
    assert use is not None
    code = (root / ENGINE_FILES[package]).read_text()
    assert use.head_normed
    assert use.passed_on_normed is bool(_flag(code, _ENGINE_DEFAULT, flag)), (version, use)
    assert {step.location.path for step in use.steps if step.kind != StepKind.CONFIG} == {ENGINE_FILES[package]}


@pytest.mark.parametrize("flag", FLAGS, ids=str)
@pytest.mark.parametrize("version", SPECFORGE)
def test_specforge_reads_the_flag_as_the_norm_before_lm_head_from_0_2(
    tmp_path: Path, version: str, flag: bool | None
) -> None:
    root, use = _norm_use(tmp_path, "training", "specforge", version, flag)
    assert use is not None
    read = _flag((root / SPECFORGE_DRAFT).read_text(), _ENGINE_DEFAULT, flag)
    assert use.head_normed is (True if read is None else read), (version, use)
    assert not use.passed_on_normed  # the TTT loop passes the backbone's output on
    assert use.holder == "LlamaForCausalLMEagle3.compute_logits"


@pytest.mark.parametrize("flag", FLAGS, ids=str)
@pytest.mark.parametrize("version", SPECULATORS)
def test_speculators_reads_the_flag_as_the_state_passed_on_from_0_7(
    tmp_path: Path, version: str, flag: bool | None
) -> None:
    root, use = _norm_use(tmp_path, "training", "speculators", version, flag)
    assert use is not None
    package = root / "speculators/models/eagle3"
    reads = "self.config.norm_output" in (package / "core.py").read_text()
    read = _flag((package / "config.py").read_text(), _FIELD_DEFAULT, flag) if reads else None
    assert use.head_normed
    assert use.passed_on_normed is bool(read), (version, use)


def _line(root: Path, relpath: str, text: str) -> int:
    return next(n for n, line in enumerate((root / relpath).read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize(
    ("training", "serving", "flag", "finding"),
    [
        ("specforge==0.2.0", "sglang==0.5.23", False, "norm-before-head-differs"),
        ("specforge==0.2.0", "vllm==0.33.0", False, "norm-before-head-differs"),
        ("specforge==0.2.0", "sglang==0.5.23", True, "passed-on-norm-differs"),
        ("specforge==0.1.0", "vllm==0.22.0", True, "passed-on-norm-differs"),
        ("speculators==0.9.0", "sglang==0.5.10", True, "passed-on-norm-differs"),
        ("speculators==0.9.0", "sglang==0.5.12", True, None),
        ("specforge==0.2.0", "sglang==0.5.23", None, None),
        ("specforge==0.1.0", "vllm==0.33.0", False, None),
    ],
)
def test_the_diagnosis_where_trainer_and_engine_read_norm_output_apart(
    tmp_path: Path, training: str, serving: str, flag: bool | None, finding: str | None
) -> None:
    draft = _draft(tmp_path, flag, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15, 28]})
    target = write_json(tmp_path / "target.json", LLAMA)
    run = diagnose(Inputs(serving=serving, training=training, draft=str(draft), target=str(target)), parallel=False)
    found = [f for f in run.diagnosis.hypotheses if f.id == "norm-semantics-differ"]
    findings = [f for f in run.sides["training"].findings if f.hypothesis == "norm-semantics-differ"]
    assert not findings  # a comparison of both sides: reported once both are analyzed
    if finding is None:
        assert not found, found[0].reason
        return
    assert found and found[0].params["findings"] == [finding], run.diagnosis.hypotheses
    package, version = training.split("==")
    root = fetch_release(package, version)
    relpath = SPECFORGE_DRAFT if package == "specforge" else "speculators/models/eagle3/core.py"
    citation = next(step for step in found[0].citations if step.location.input == "training")
    head = (
        "return self.lm_head(norm_hidden_states)" if package == "specforge" else "logits = self.lm_head(hidden_states)"
    )
    assert (citation.location.path, citation.location.line) == (relpath, _line(root, relpath, head))
