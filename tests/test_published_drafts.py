"""A published speculators draft (its config in speculators' own format, no training code at hand)
on every pinned vLLM and SGLang release: the trainer is inferred from the config, the engine's
conversion of the format is read from its code where it has one, and a norm flag the conversion
drops is reported. Expectations come from reading each release in the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.conftest import CASES, write_json
from tests.releases import SGLANG, VLLM
from tests.test_provenance import SPECULATORS_0_9

pytestmark = pytest.mark.release

LLAMA_TARGET = CASES / "speculators-top-level-ids-on-vllm" / "target"
CONVERTERS = "vllm/transformers_utils/configs/speculators"
RELEASES = [("vllm", version) for version in VLLM] + [("sglang", version) for version in SGLANG[-1:]]


@pytest.mark.parametrize(("package", "version"), RELEASES, ids=[f"{p}-{v}" for p, v in RELEASES])
def test_a_published_speculators_draft_on_every_release(tmp_path: Path, package: str, version: str) -> None:
    root = fetch_release(package, version)
    draft = write_json(tmp_path / "draft" / "config.json", {**SPECULATORS_0_9, "fc_norm": True})
    run = diagnose(Inputs(serving=f"{package}=={version}", draft=str(draft), target=str(LLAMA_TARGET)), parallel=False)
    diagnosis = run.diagnosis
    assert diagnosis.trainer is not None and diagnosis.trainer["source"] == "speculators==0.9.0"
    assert [str(tap) for tap in diagnosis.wirings["training"].slots] == ["h2", "h16", "h29"]
    found = {finding.hypothesis for finding in run.sides["serving"].findings}
    converters = root / CONVERTERS
    if not converters.is_dir():  # the engine has no reader of speculators' format
        assert "draft-arch-unsupported" in found, found
        return
    ctx = run.sides["serving"].ctx
    assert ctx is not None and ctx.conversion is not None
    assert ctx.conversion.location.path.startswith(CONVERTERS)
    assert ctx.draft is not None and ctx.draft.architectures == ("Eagle3LlamaForCausalLM",)
    assert "draft-arch-unsupported" not in found
    assert [str(tap) for tap in diagnosis.wirings["serving"].slots] == ["h2", "h16", "h29"]
    keeps_fc_norm = '"fc_norm"' in (converters / "algos.py").read_text()
    assert ("norm-flag-dropped" in found) is not keeps_fc_norm, (version, found)
    assert diagnosis.verdict.summary.endswith("training inferred from the draft config (speculators 0.9.0)")
