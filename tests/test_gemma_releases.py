"""Gemma-3 targets on SGLang: what each release's model captures for an EAGLE-3 draft. Every
expectation is read from the release's own lines; the analysis reads the same code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose
from rca.inputs.sources import fetch_release
from tests.releases import SGLANG

pytestmark = pytest.mark.release

GEMMA3 = "sglang/srt/models/gemma3_causal.py"
LAYERS = 34
IDS = [1, LAYERS // 2 - 1, LAYERS - 4]


def _layer_returns(root: Path) -> str | None:
    """What Gemma3DecoderLayer.forward returns: `(hidden_states,)` (the stream, its residual added
    in the layer) or `(hidden_states, residual)` (the pair, added in the next layer's norm)."""
    text = (root / GEMMA3).read_text()
    layer = text[text.index("class Gemma3DecoderLayer") :]
    found = re.search(r"outputs = \((hidden_states,(?: residual)?)\)", layer)
    return found.group(1) if found else None


@pytest.mark.parametrize("version", SGLANG)
def test_gemma3_captures_the_stream_where_its_layer_adds_the_residual(tmp_path: Path, version: str) -> None:
    root = fetch_release("sglang", version)
    target = tmp_path / "target.json"
    target.write_text(
        json.dumps({"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": LAYERS, "hidden_size": 2560})
    )
    draft = tmp_path / "draft.json"
    draft.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 2560,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": IDS},
            }
        )
    )
    serving = diagnose(Inputs(serving=str(root), draft=str(draft), target=str(target))).diagnosis.wirings["serving"]
    if "set_eagle3_layers_to_capture" not in (root / GEMMA3).read_text():
        assert not serving.slots  # no EAGLE-3 capture in this release's Gemma-3 model
        return
    returned = _layer_returns(root)
    # id k is the entry of layer k+1: the stream h(k+1) where the layer returns it whole, its last
    # branch alone (the residual missing) where the layer returns the pair
    suffix = "" if returned == "hidden_states," else "-residual"
    assert returned in ("hidden_states,", "hidden_states, residual"), returned
    assert [str(tap) for tap in serving.slots] == [f"h{k + 1}{suffix}" for k in IDS], serving.notes
