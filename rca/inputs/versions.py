"""Release versions as the package index's tools order them (`packaging`), not as an index lists them."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Nearest:
    """The releases of a package nearest an asked version, by version order (not the index's)."""

    nearest: tuple[str, ...]  # up to `around` below it and as many above, ascending
    closest: str | None  # the newest below it, else the oldest above it
    latest: str | None


def nearest_releases(version: str, releases: Iterable[str], around: int = 4) -> Nearest:
    """Order `releases` as versions (those that do not parse as one are left out) and pick the
    ones nearest `version` on each side, so an unknown release is answered with its neighbours."""
    from packaging.version import InvalidVersion, Version

    parsed = []
    for release in releases:
        with contextlib.suppress(InvalidVersion):
            parsed.append((Version(release), release))
    parsed.sort()
    if not parsed:
        return Nearest((), None, None)
    try:
        asked = Version(version)
    except InvalidVersion:
        below, above = [release for _, release in parsed], []
    else:
        below = [release for key, release in parsed if key < asked]
        above = [release for key, release in parsed if key > asked]
    nearest = (*below[-around:], *above[:around])
    return Nearest(nearest, below[-1] if below else above[0], parsed[-1][1])
