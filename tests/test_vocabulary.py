"""The ids a target's tokenizer emits, read from its files: what tells a draft's vocabulary padded
to another size from a reduced one."""

from __future__ import annotations

import json
from pathlib import Path

from rca.inputs.vocabulary import tokenizer_ids


def _write(directory: Path, name: str, data: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(data) if not isinstance(data, str) else data)
    (directory / "config.json").write_text("{}")
    return directory


def test_a_bpe_tokenizer_counts_its_vocabulary_and_its_added_tokens(tmp_path: Path) -> None:
    tokenizer = {
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2}},
        "added_tokens": [{"id": 151668, "content": "</think>"}, {"id": 151643, "content": "<|endoftext|>"}],
    }
    found = tokenizer_ids(_write(tmp_path, "tokenizer.json", tokenizer))
    assert found is not None and (found.count, found.exact) == (151669, True)
    assert found.step.location.path.endswith("tokenizer.json") and "151,669 ids" in found.said


def test_a_unigram_tokenizer_counts_its_pieces(tmp_path: Path) -> None:
    tokenizer = {"model": {"type": "Unigram", "vocab": [["<pad>", 0.0], ["a", -1.0], ["b", -2.0]]}, "added_tokens": []}
    found = tokenizer_ids(_write(tmp_path, "tokenizer.json", tokenizer))
    assert found is not None and (found.count, found.exact) == (3, True)


def test_added_tokens_alone_are_a_lower_bound(tmp_path: Path) -> None:
    """tokenizer_config.json lists the added tokens, not the base vocabulary below them."""
    config = {"added_tokens_decoder": {"151643": {"content": "<|endoftext|>"}, "151668": {"content": "</think>"}}}
    found = tokenizer_ids(_write(tmp_path, "tokenizer_config.json", config))
    assert found is not None and (found.count, found.exact) == (151669, False) and found.said.startswith("at least")


def test_tokenizer_json_is_preferred_and_an_unreadable_one_falls_back(tmp_path: Path) -> None:
    model = _write(tmp_path, "tokenizer_config.json", {"added_tokens_decoder": {"5": {"content": "<s>"}}})
    (model / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0, "b": 41}}}')
    found = tokenizer_ids(model)
    assert found is not None and (found.count, found.exact) == (42, True)
    (model / "tokenizer.json").write_text("{not json")
    found = tokenizer_ids(model / "config.json")
    assert found is not None and (found.count, found.exact) == (6, False)


def test_no_tokenizer_files_or_none_with_ids_say_nothing(tmp_path: Path) -> None:
    assert tokenizer_ids(_write(tmp_path / "bare", "other.json", {})) is None
    assert tokenizer_ids(_write(tmp_path / "empty", "tokenizer_config.json", {"model_max_length": 8})) is None
    assert tokenizer_ids(_write(tmp_path / "list", "tokenizer.json", [1, 2, 3])) is None


def test_a_tokenizer_linked_out_of_the_model_directory_is_not_read(tmp_path: Path) -> None:
    elsewhere = _write(tmp_path / "elsewhere", "tokenizer.json", {"model": {"vocab": {"a": 0}}})
    model = _write(tmp_path / "model", "other.json", {})
    (model / "tokenizer.json").symlink_to(elsewhere / "tokenizer.json")
    assert tokenizer_ids(model) is None
