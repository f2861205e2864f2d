"""Searching many files for many needles: each file is read once, and a needle that holds a
shorter one, or shares a long prefix with another, is looked for only where that one was found."""

from __future__ import annotations

from collections.abc import Callable, Iterable

# Needles sharing a prefix this long (`class X(` and `class X:`) are searched for it once.
_SHARED_PREFIX = 12

SearchStep = tuple[str | None, bytes, int | None]  # a needle (None: a shared prefix), its bytes, the step it needs


def search_files(
    relpaths: Iterable[str], read: Callable[[str], bytes | None], wanted: dict[str, bytes]
) -> dict[str, list[str]]:
    """Which of `relpaths` hold each needle of `wanted`, in their order (`read` gives a file's
    bytes, or None for a file left unread)."""
    hits: dict[str, list[str]] = {needle: [] for needle in wanted}
    plan = search_plan(wanted)
    for relpath in relpaths:
        data = read(relpath)
        if data is not None:
            for needle in needles_in(data, plan):
                hits[needle].append(relpath)
    return hits


def search_plan(wanted: dict[str, bytes]) -> list[SearchStep]:
    """How to test a file for every needle in fewer scans of it: a needle that holds a shorter
    one (`.lm_head(` holds `lm_head(`), or a prefix it shares with another, is looked for only in
    a file that holds the shorter one or the prefix. Steps shortest first, each naming the
    longest earlier step it holds (None: it is looked for in every file)."""
    raws = set(wanted.values())
    shared = {_common_prefix(first, second) for first in raws for second in raws if first < second}
    prefixes = {prefix for prefix in shared if len(prefix) >= _SHARED_PREFIX} - raws
    names = {raw: needle for needle, raw in wanted.items()}
    steps: list[SearchStep] = []
    for raw in sorted(raws | prefixes, key=lambda raw: (len(raw), raw)):
        held = [index for index, (_, shorter, _) in enumerate(steps) if shorter in raw]
        steps.append((names.get(raw), raw, max(held, key=lambda index: len(steps[index][1])) if held else None))
    return steps


def _common_prefix(first: bytes, second: bytes) -> bytes:
    length = 0
    for mine, theirs in zip(first, second, strict=False):
        if mine != theirs:
            break
        length += 1
    return first[:length]


def needles_in(data: bytes, plan: list[SearchStep]) -> list[str]:
    """The needles of a `search_plan` that `data` holds."""
    found = [False] * len(plan)
    held: list[str] = []
    for index, (needle, raw, needs) in enumerate(plan):
        if (needs is None or found[needs]) and raw in data:
            found[index] = True
            if needle is not None:
                held.append(needle)
    return held
