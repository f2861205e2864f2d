"""Reading a draft's checkpoint for the static checks: names and shapes from headers, only the vocab
map's bytes, every layout a trainer exports, and the map's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rca.analyzers.draft_contract.vocab_map import _problems

from rca.inputs.draft import load_draft, read_draft_weights
from rca.inputs.draftweights import DraftTensor, DraftWeights
from tests.conftest import write_json, write_safetensors

DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 4, "vocab_size": 16}


def _sparse_checkpoint(path: Path, d2t: list[int]) -> None:
    """A safetensors file with a real header for a 2 GB lm_head (its data a hole in a sparse file) and a d2t."""
    head_bytes = 32_000 * 32_768 * 2
    d2t_bytes = 8 * len(d2t)
    header = {
        "d2t": {"dtype": "I64", "shape": [len(d2t)], "data_offsets": [0, d2t_bytes]},
        "lm_head.weight": {
            "dtype": "F16",
            "shape": [32_000, 32_768],
            "data_offsets": [d2t_bytes, d2t_bytes + head_bytes],
        },
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as handle:
        handle.write(len(raw).to_bytes(8, "little") + raw)
        handle.write(b"".join(value.to_bytes(8, "little", signed=True) for value in d2t))
        handle.truncate(8 + len(raw) + d2t_bytes + head_bytes)


def test_a_multi_gigabyte_checkpoint_is_read_in_under_a_megabyte(tmp_path: Path) -> None:
    write_json(tmp_path / "config.json", DRAFT)
    _sparse_checkpoint(tmp_path / "model.safetensors", [1, 2, 3, 4])
    weights = read_draft_weights(tmp_path)
    assert weights is not None
    assert weights.tensors["lm_head.weight"].shape == (32_000, 32_768)
    assert weights.values["d2t"] == (1, 2, 3, 4)
    assert weights.total_bytes > 2_000_000_000 and weights.bytes_read < 1024**2


def test_sharded_checkpoint_is_read_through_its_index(tmp_path: Path) -> None:
    write_json(tmp_path / "config.json", DRAFT)
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"lm_head.weight": ("F16", (4, 2), None)})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"d2t": ("I64", (4,), (0, 1, 2, 3))})
    write_json(
        tmp_path / "model.safetensors.index.json",
        {
            "weight_map": {
                "lm_head.weight": "model-00001-of-00002.safetensors",
                "d2t": "model-00002-of-00002.safetensors",
            }
        },
    )
    weights = load_draft(tmp_path).weights
    assert weights is not None
    assert weights.tensors["d2t"].file == "model-00002-of-00002.safetensors"
    assert weights.values["d2t"] == (0, 1, 2, 3)


def test_pytorch_model_bin_is_loaded_as_plain_tensors(tmp_path: Path) -> None:
    write_json(tmp_path / "config.json", DRAFT)
    torch.save({"d2t": torch.tensor([2, 2, 2, 2]), "lm_head.weight": torch.zeros(4, 2)}, tmp_path / "pytorch_model.bin")
    weights = read_draft_weights(tmp_path / "config.json")
    assert weights is not None
    assert weights.values["d2t"] == (2, 2, 2, 2)
    assert weights.tensors["lm_head.weight"] == DraftTensor("lm_head.weight", "F32", (4, 2), "pytorch_model.bin")


def test_a_config_only_draft_has_no_weights(tmp_path: Path) -> None:
    write_json(tmp_path / "config.json", DRAFT)
    assert load_draft(tmp_path).weights is None


def _weights(d2t: tuple, dtype: str = "I64", t2d: tuple | None = None) -> DraftWeights:
    tensors = {"d2t": DraftTensor("d2t", dtype, (len(d2t),), "model.safetensors")}
    values = {"d2t": d2t}
    if t2d is not None:
        tensors["t2d"] = DraftTensor("t2d", "BOOL", (len(t2d),), "model.safetensors")
        values["t2d"] = t2d
    return DraftWeights("draft", tensors, values)


KEEP_1_5_9_13 = tuple(i in (1, 5, 9, 13) for i in range(16))


@pytest.mark.parametrize(
    ("weights", "says"),
    [
        (_weights((1, 4, 7, 10), t2d=KEEP_1_5_9_13), None),
        (_weights((0, 0, 0, 0)), "all 4 entries are 0"),
        (_weights((1, 4, 7, 20)), "1 draft ids map outside the target's 16 tokens (draft id 3 -> 23)"),
        (_weights((5, 4, 3, 2)), "1 target ids are mapped more than once (target id 5)"),
        (_weights((1, 4, 7)), "it has 3 entries for a draft vocabulary of 4"),
        (_weights((1.0, 4.0, 7.0, 10.0), dtype="F32"), "it is stored as F32, not as integer offsets"),
        (_weights((1, 4, 7, 10), t2d=tuple(i in (1, 5, 9, 12) for i in range(16))), "t2d disagrees with d2t (1 "),
        (_weights((1, 4, 7, 10), t2d=KEEP_1_5_9_13[:8]), "t2d has 8 entries"),
    ],
)
def test_a_vocab_map_that_cannot_be_right_says_why(weights: DraftWeights, says: str | None) -> None:
    problems = _problems(weights, weights.tensors["d2t"], 4, 16)
    assert (problems == []) if says is None else any(says in problem for problem in problems), problems
