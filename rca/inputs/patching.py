"""Apply a unified diff to files of a source tree, in memory, never touching the tree itself."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rca.errors import PatchError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_MAX_OFFSET = 200  # how far a hunk may have moved from its stated line
_MAX_DIGITS = 18  # of a line number or count in a hunk header: beyond any file's length


@dataclass
class Hunk:
    header_line: int  # line of the @@ header in the patch file, for errors
    old_start: int
    new_start: int
    lines: list[str] = field(default_factory=list)  # with their ' ', '-', '+' prefixes

    @property
    def old_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[:1] in (" ", "-")]

    @property
    def new_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[:1] in (" ", "+")]


@dataclass
class FilePatch:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    hunks: list[Hunk] = field(default_factory=list)


def _strip_prefix(name: str) -> str | None:
    name = name.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name


def parse_patch(text: str, patch_name: str) -> list[FilePatch]:
    """Parse a unified diff (git or plain) into per-file hunks."""
    files: list[FilePatch] = []
    current: FilePatch | None = None
    hunk: Hunk | None = None
    remaining_old = remaining_new = 0
    lines = [line.rstrip("\n").removesuffix("\r") for line in _split(text)]
    index = 0
    while index < len(lines):
        line = lines[index]
        if hunk is not None and (remaining_old > 0 or remaining_new > 0):
            tag = line[:1] if line else " "
            if tag == "\\":  # "\ No newline at end of file"
                index += 1
                continue
            if tag not in (" ", "-", "+"):
                raise PatchError(
                    f"hunk ends early: expected {remaining_old} more old and {remaining_new} more new lines",
                    where=f"{patch_name}:{index + 1}",
                    fix="regenerate the patch with `git diff` or `diff -u`",
                )
            hunk.lines.append(line if line else " ")
            if tag in (" ", "-"):
                remaining_old -= 1
            if tag in (" ", "+"):
                remaining_new -= 1
            index += 1
            continue
        if line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            current = FilePatch(_strip_prefix(line[4:]), _strip_prefix(lines[index + 1][4:]))
            files.append(current)
            hunk = None
            index += 2
            continue
        match = _HUNK.match(line)
        if match:
            if current is None:
                raise PatchError(
                    "hunk before any file header", where=f"{patch_name}:{index + 1}", fix="include the ---/+++ lines"
                )
            if any(len(number) > _MAX_DIGITS for number in match.groups(default="")):
                raise PatchError(
                    "hunk header with line numbers longer than any file",
                    where=f"{patch_name}:{index + 1}",
                    fix="regenerate the patch with `git diff` or `diff -u`",
                )
            remaining_old = int(match[2]) if match[2] is not None else 1
            remaining_new = int(match[4]) if match[4] is not None else 1
            hunk = Hunk(index + 1, int(match[1]), int(match[3]))
            current.hunks.append(hunk)
        index += 1
    if hunk is not None and (remaining_old > 0 or remaining_new > 0):
        raise PatchError("patch ends inside a hunk", where=f"{patch_name}:{len(lines)}", fix="regenerate the patch")
    if not files or not any(file.hunks for file in files):
        raise PatchError(
            "no file changes found" if not files else "the patch has file headers but no hunks: it changes nothing",
            where=patch_name,
            fix="pass a unified diff (`git diff` or `diff -u` output)",
        )
    for file in files:
        for name in (file.old_path, file.new_path):
            if name is not None and (name.startswith("/") or ".." in Path(name).parts):
                raise PatchError(
                    f"the patch names {name}, outside the source tree it is applied to",
                    where=patch_name,
                    fix="use paths relative to the tree (a/sglang/srt/...), as git diff writes them",
                )
    return files


def _split(text: str) -> list[str]:
    """Lines as diff and git split them: at newlines only, not at the form feeds and other separators
    that str.splitlines also breaks at. Each keeps its newline."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def candidate_paths(name: str) -> list[str]:
    """`a/x/y.py` -> [`a/x/y.py`, `x/y.py`, `y.py`]: the -pN strip levels `patch` would try."""
    parts = Path(name).as_posix().split("/")
    return ["/".join(parts[level:]) for level in range(len(parts))]


def apply_hunks(original: str, patch: FilePatch, patch_name: str, target: str) -> str:
    """Apply the hunks of one file patch to its text; each hunk may have drifted a little."""
    lines = _split(original)
    keep_newline = original.endswith("\n") or not original
    stripped = [line.rstrip("\r\n") for line in lines]
    result: list[str] = []
    cursor = 0  # index in `lines` up to which the original was copied
    for hunk in patch.hunks:
        old = hunk.old_lines
        expected = hunk.old_start if not old else hunk.old_start - 1  # an empty range is after its line
        start = _find(stripped, old, max(expected, 0), cursor)
        if start is None:
            raise PatchError(
                f"hunk at patch line {hunk.header_line} does not apply to {target} (expected its lines near "
                f"line {hunk.old_start})",
                where=patch_name,
                fix="regenerate the patch against this version of the file",
            )
        result.extend(lines[cursor:start])
        result.extend(line + "\n" for line in hunk.new_lines)
        cursor = start + len(old)
    result.extend(lines[cursor:])
    text = "".join(result)
    if not keep_newline and text.endswith("\n"):
        text = text[:-1]
    return text


def _find(lines: list[str], block: list[str], expected: int, floor: int) -> int | None:
    def matches(at: int) -> bool:
        return at >= floor and lines[at : at + len(block)] == block

    if not block:
        return max(expected, floor)
    for offset in range(_MAX_OFFSET + 1):
        for at in (expected - offset, expected + offset):
            if 0 <= at <= len(lines) - len(block) and matches(at):
                return at
    return None


def apply_patch(
    text: str, patch_name: str, exists: Callable[[str], bool], read: Callable[[str], str]
) -> dict[str, str | None]:
    """Apply a patch against a tree; returns relative path -> new text (None for a deletion)."""
    changes: dict[str, str | None] = {}
    for file_patch in parse_patch(text, patch_name):
        name = file_patch.old_path or file_patch.new_path
        assert name is not None
        if file_patch.old_path is None:  # a new file: drop git's b/ prefix
            target = name[2:] if name.startswith(("a/", "b/")) else name
            changes[target] = apply_hunks("", file_patch, patch_name, target)
            continue
        found = next((path for path in candidate_paths(name) if exists(path)), None)
        if found is None:
            raise PatchError(
                f"patched file {name} is not in the source tree",
                where=patch_name,
                fix="check that the patch was made against this source (paths like a/sglang/srt/...)",
            )
        target = found
        original = changes.get(target)
        base = read(target) if original is None else original
        changes[target] = None if file_patch.new_path is None else apply_hunks(base, file_patch, patch_name, target)
    return changes
