"""Which token ids a model's tokenizer emits, read from its files (no tokenizer library): the rows
of an embedding or a head past them are padding, which no token is embedded or scored through.

Checkpoints pad their vocabulary to a round size, and two models of one tokenizer may pad it
differently (a target of 152,576 rows, its draft of 152,064: both cover the 151,669 ids the
tokenizer emits). A draft of fewer rows than its target is then not a reduced vocabulary: its
token i is the target's token i, it needs no map, and the target's head scores it right."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rca.errors import InputError
from rca.inputs.configs import display_path
from rca.inputs.files import MIB, model_file, read_text
from rca.model import Location, Step, StepKind

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
_MAX_BYTES = 64 * MIB  # the largest tokenizer.json published (Gemma's) is about 33 MB


@dataclass(frozen=True)
class TokenIds:
    """How many ids a tokenizer emits (ids 0 .. count-1), or, where only its added tokens are
    known, at least how many (`exact` False: the base vocabulary's size is not in that file)."""

    count: int
    exact: bool
    step: Step

    @property
    def said(self) -> str:
        return f"{'' if self.exact else 'at least '}{self.count:,} ids ({self.step.location.path})"


def tokenizer_ids(model: Path, base: Path | None = None) -> TokenIds | None:
    """The ids the tokenizer beside a model's config emits: from `tokenizer.json` (its model's
    vocabulary and its added tokens), else a lower bound from `tokenizer_config.json`'s added
    tokens; None where neither is there or neither can be read."""
    directory = model if model.is_dir() else model.parent
    for name, read in ((TOKENIZER_FILE, _tokenizer_file), (TOKENIZER_CONFIG, _tokenizer_config)):
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(read_text(model_file(path, name), name, limit=_MAX_BYTES, fix=f"pass the model's {name}"))
        except (InputError, ValueError, RecursionError):
            continue  # a tokenizer file that cannot be read settles nothing; the other may
        found = read(data) if isinstance(data, dict) else None
        if found is not None:
            count, exact = found
            shown = display_path(path, base)
            how = "the ids its vocabulary and added tokens use" if exact else "the highest id of its added tokens"
            step = Step(Location("target", shown, 1, 1), f"the target's tokenizer: {how}", kind=StepKind.CONFIG)
            return TokenIds(count, exact, step)
    return None


def _tokenizer_file(data: dict[str, Any]) -> tuple[int, bool] | None:
    """One past the highest id of a `tokenizer.json`: its model's vocabulary (a token -> id map, or
    a list of pieces for Unigram) and its added tokens."""
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids = [value for value in vocab.values() if _is_id(value)] if isinstance(vocab, dict) else []
    highest = max(ids, default=-1) if isinstance(vocab, dict) else len(vocab) - 1 if isinstance(vocab, list) else -1
    added = data.get("added_tokens")
    if isinstance(added, list):
        highest = max([highest, *(item["id"] for item in added if isinstance(item, dict) and _is_id(item.get("id")))])
    return (highest + 1, True) if highest >= 0 else None


def _tokenizer_config(data: dict[str, Any]) -> tuple[int, bool] | None:
    """One past the highest id `tokenizer_config.json`'s added tokens take: a lower bound only, as
    the base vocabulary below them is not in this file."""
    decoder = data.get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return None
    ids = [int(key) for key in decoder if isinstance(key, str) and key.isdigit()]
    return (max(ids) + 1, False) if ids else None


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
