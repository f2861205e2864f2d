"""JSON with line numbers, so that a config value can be cited as `config.json:12`.

The standard library parses the values; this module only walks the text once more to learn the
line range of every key path. Key paths are tuples of keys and list indices.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|NaN|-?Infinity")
# json's own string scanner (the C one where built): it reads a string literal as json.loads does
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _matched_end(pattern: re.Pattern[str], text: str, offset: int) -> int:
    """Where `pattern` stops matching at `offset` (the text was parsed as JSON: it matches there)."""
    found = pattern.match(text, offset)
    assert found is not None
    return found.end()


_LITERALS = {"true": True, "false": False, "null": None}

KeyPath = tuple[Any, ...]
MAX_DEPTH = 100
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")


class JsonSyntaxError(ValueError):
    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"{message} at line {line}, column {column}")
        self.message = message
        self.line = line
        self.column = column


@dataclass(frozen=True)
class JsonDocument:
    data: Any
    lines: dict[KeyPath, tuple[int, int]]  # key path -> (first line, last line), 1-based
    text: str

    def line_range(self, path: KeyPath) -> tuple[int, int] | None:
        """The lines of the value at `path`, or of its nearest existing parent."""
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def source_line(self, line: int) -> str:
        lines = self.text.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def loads(text: str) -> JsonDocument:
    """Parse JSON text, recording the line range of every value. Documents nested deeper than
    `MAX_DEPTH` are refused before parsing: configs are shallow, and the parsers recurse."""
    check_depth(text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise JsonSyntaxError(error.msg, error.lineno, error.colno) from None
    except ValueError:  # valid syntax, but an integer of more digits than Python converts
        limit = sys.get_int_max_str_digits()
        found = re.search(f"[0-9]{{{limit + 1},}}", text)
        offset = found.start() if found else 0
        line, column = text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)
        raise JsonSyntaxError(f"an integer of more than {limit} digits", line, column) from None
    lines: dict[KeyPath, tuple[int, int]] = {}
    _Walker(text, lines).value(_matched_end(_WS, text, 0), ())
    return JsonDocument(data, lines, text)


class _Walker:
    """Walks JSON text already known to be valid, recording value positions."""

    def __init__(self, text: str, lines: dict[KeyPath, tuple[int, int]]) -> None:
        self.text = text
        self.lines = lines
        self.newlines = [i for i, char in enumerate(text) if char == "\n"]

    def line_of(self, offset: int) -> int:
        low, high = 0, len(self.newlines)
        while low < high:
            mid = (low + high) // 2
            if self.newlines[mid] < offset:
                low = mid + 1
            else:
                high = mid
        return low + 1

    def skip(self, offset: int) -> int:
        return _matched_end(_WS, self.text, offset)

    def value(self, offset: int, path: KeyPath) -> int:
        text = self.text
        char = text[offset]
        if char == "{":
            end = self.obj(offset + 1, path)
        elif char == "[":
            end = self.array(offset + 1, path)
        elif char == '"':
            end = _scanstring(text, offset + 1)[1]
        else:
            for word in _LITERALS:
                if text.startswith(word, offset):
                    end = offset + len(word)
                    break
            else:
                end = _matched_end(_NUMBER, text, offset)
        self.lines[path] = (self.line_of(offset), self.line_of(max(offset, end - 1)))
        return end

    def obj(self, offset: int, path: KeyPath) -> int:
        offset = self.skip(offset)
        if self.text[offset] == "}":
            return offset + 1
        while True:
            key, offset = _scanstring(self.text, offset + 1)
            key_line = self.line_of(offset)
            offset = self.skip(self.skip(offset) + 1)  # past the colon
            inner = (*path, key)
            end = self.value(offset, inner)
            first, last = self.lines[inner]
            self.lines[inner] = (min(first, key_line), last)
            offset = self.skip(end)
            if self.text[offset] == "}":
                return offset + 1
            offset = self.skip(offset + 1)  # past the comma

    def array(self, offset: int, path: KeyPath) -> int:
        offset = self.skip(offset)
        if self.text[offset] == "]":
            return offset + 1
        index = 0
        while True:
            offset = self.skip(self.value(offset, (*path, index)))
            index += 1
            if self.text[offset] == "]":
                return offset + 1
            offset = self.skip(offset + 1)


def check_depth(text: str) -> None:
    """Refuse a document whose arrays and objects nest deeper than MAX_DEPTH (strings skipped)."""
    depth = 0
    skeleton = _STRING.sub('""', text)
    for match in _BRACKET.finditer(skeleton):
        depth += 1 if match.group() in "[{" else -1
        if depth > MAX_DEPTH:
            raise JsonSyntaxError(
                f"nested deeper than {MAX_DEPTH} levels", skeleton.count("\n", 0, match.start()) + 1, 1
            )
