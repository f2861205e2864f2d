"""The teacher's state on every speculators release: 0.3.0 applies the verifier's lm_head to the
pre-norm last state it dumps, 0.4.0 and later normalize it first (its PR 313). The expectation is
read from each release's trainer; the analysis reads the same code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.conftest import write_json
from tests.releases import SPECULATORS

pytestmark = pytest.mark.release

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096}
TRAINER = "speculators/models/eagle3/core.py"


@pytest.mark.parametrize("version", SPECULATORS)
def test_the_teacher_is_normalized_from_0_4(tmp_path: Path, version: str) -> None:
    root = fetch_release("speculators", version)
    draft = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 4096,
        "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
    }
    run = diagnose(
        Inputs(
            training=str(root),
            draft=str(write_json(tmp_path / "draft" / "config.json", draft)),
            target=str(write_json(tmp_path / "target.json", LLAMA)),
        ),
        parallel=False,
    )
    training = run.diagnosis.wirings["training"]
    assert str(training.verifier_last) == "h32", training.notes
    code = (root / TRAINER).read_text()
    normalized = re.search(r"verifier_lm_head\(\s*self\.verifier_norm\(", code) is not None
    found = [f for f in run.sides["training"].findings if f.hypothesis == "teacher-unnormed"]
    assert bool(found) is not normalized, (version, found)
    if found:
        line = next(n for n, text in enumerate(code.splitlines(), 1) if "self.verifier_lm_head(verifier_last" in text)
        assert (found[0].location.path, found[0].location.line) == (TRAINER, line)
        assert run.diagnosis.hypotheses[0].id == "teacher-unnormed"
    assert not [f for f in run.sides["training"].findings if f.hypothesis == "verifier-last-offset"]
