"""Tiny tokenizers built in code: one token per character, plus a model family's special tokens."""

from __future__ import annotations

import json
import string
from pathlib import Path

CHATML_SPECIAL = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
QWEN3_TEMPLATE = (  # the shape of Qwen3's template: the last turn's thinking block, `enable_thinking` in the prompt
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def write_tokenizer(directory: Path, template: str | None = QWEN3_TEMPLATE, special=CHATML_SPECIAL) -> Path:
    """`tokenizer.json` (characters, then the special tokens) and `tokenizer_config.json` with `template`."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    characters = string.printable
    vocab = {character: index for index, character in enumerate(characters)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=" "))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", **({"chat_template": template} if template is not None else {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return directory


def encode(directory: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(directory / "tokenizer.json")).encode(text, add_special_tokens=False).ids
