"""The token each trainer's training-time-test loop feeds the draft after the first step, on every
pinned release. speculators up to 0.6.0 feed the draft's own argmax unless `use_off_policy_tokens`
is set (its scripts' `--use-off-policy-tokens`); from 0.7.0 the loop always feeds the data's next
token (its PR 818). SpecForge, NeMo Automodel and ModelOpt's looped TTT feed the data's tokens.
The expectation is read from each release's code; the analysis reads the same code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rca.analyzers.training_capture.ttt_token_source import TttTokenSource

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from rca.model import Severity
from tests.conftest import write_json
from tests.releases import MODELOPT, NEMO_AUTOMODEL, SPECFORGE, SPECULATORS

pytestmark = pytest.mark.release

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096}
DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 4096,
    "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
}
TRAINER = "speculators/models/eagle3/core.py"
LAUNCH = "python scripts/train.py --verifier-name-or-path meta-llama/Llama-3.1-8B-Instruct --ttt-steps 3"
HYPOTHESIS = "ttt-own-argmax"
# a training-time-test loop, and the files an EAGLE trainer keeps it in (ModelOpt's HF path: plugins/transformers.py)
_TTT_LOOP = re.compile(r"for \w+ in range\([\w.]*(ttt\w*|length)\):")
_EAGLE_FILE = re.compile(r"eagle|speculative/plugins/transformers\.py", re.IGNORECASE)


def _diagnose(tmp_path: Path, root: Path, training_args: str | None):
    return diagnose(
        Inputs(
            training=str(root),
            draft=str(write_json(tmp_path / "draft" / "config.json", DRAFT)),
            target=str(write_json(tmp_path / "target.json", LLAMA)),
            training_args=training_args,
        ),
        parallel=False,
    )


def _found(run) -> list:
    return [f for f in run.sides["training"].findings if f.hypothesis == HYPOTHESIS]


def _loops(run) -> list:
    return list(TttTokenSource.loops(run.sides["training"].ctx))


@pytest.mark.parametrize("version", SPECULATORS)
def test_speculators_feeds_its_own_argmax_by_default_until_0_7(tmp_path: Path, version: str) -> None:
    root = fetch_release("speculators", version)
    code = (root / TRAINER).read_text()
    gated = re.search(r"^\s*if use_off_policy_tokens:", code, re.MULTILINE) is not None
    argmax = next(n for n, text in enumerate(code.splitlines(), 1) if "input_ids = torch.argmax(logits" in text)

    default = _diagnose(tmp_path, root, LAUNCH)
    loops = _loops(default)
    assert [(module.relpath, function.qualname) for module, function, _ in loops] == [
        (TRAINER, "Eagle3DraftModel.forward")
    ]
    found = _found(default)
    assert bool(found) is gated, (version, [f.message for f in found])
    if gated:
        assert (found[0].location.path, found[0].location.line) == (TRAINER, argmax)
        assert "use_off_policy_tokens, which this run leaves at its default False" in found[0].message
        assert "--use-off-policy-tokens" in found[0].fix
        ranked = [h.id for h in default.diagnosis.hypotheses]
        others = [
            f for f in default.sides["training"].findings if f.hypothesis != HYPOTHESIS and f.severity is Severity.CAUSE
        ]
        # first where it is the only break (0.3.0's unnormed teacher, a stronger one, comes first there)
        assert ranked.index(HYPOTHESIS) == (1 if others else 0), ranked
    else:  # the data's next token at every step
        assert not loops[0][2].reading.fed.sites

    forced = _diagnose(tmp_path, root, f"{LAUNCH} --use-off-policy-tokens")
    assert not _found(forced)
    assert not [w for w in forced.diagnosis.warnings if "--use-off-policy-tokens" in w and gated]

    unknown = _diagnose(tmp_path, root, None)
    assert not _found(unknown)
    notes = [note.text for note in unknown.sides["training"].ctx.notes if "training-time-test" in note.text]
    assert bool(notes) is gated, notes


@pytest.mark.parametrize(
    ("name", "version"),
    [("specforge", v) for v in SPECFORGE]
    + [("nemo-automodel", v) for v in NEMO_AUTOMODEL if v != "0.4.0"]
    + [("nvidia-modelopt", v) for v in MODELOPT],
)
def test_other_trainers_feed_the_data_tokens(tmp_path: Path, name: str, version: str) -> None:
    root = fetch_release(name, version)
    run = _diagnose(tmp_path, root, None)
    assert not _found(run)
    loops = _loops(run)
    looped = any(
        _TTT_LOOP.search(path.read_text(errors="replace"))
        for path in root.rglob("*.py")
        if _EAGLE_FILE.search(str(path.relative_to(root))) and not re.search(r"peagle|dflash", str(path))
    )
    assert bool(loops) is looped, (name, version, [(m.relpath, f.qualname) for m, f, _ in loops])
    unrolled = [note.text for note in run.sides["training"].ctx.notes if "unrolls its training-time-test" in note.text]
    plugin = root / "modelopt/torch/speculative/plugins/transformers.py"
    steps = re.findall(r"embed_tokens\(eagle_input_ids_\d", plugin.read_text()) if plugin.exists() else []
    assert bool(unrolled) is (not looped and len(steps) >= 2), unrolled  # written out step by step: a note
    for module, function, walker in loops:
        assert walker.reading is not None and not walker.reading.fed.sites, (module.relpath, function.qualname)
        assert not walker.reading.fed.unsure
