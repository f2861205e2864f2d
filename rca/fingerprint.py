"""Where rca keeps what it keeps, and this rca by content: what its caches and its server are keyed
by, so that a changed rca never reads what an older one wrote, nor is served by an older one still
running. Light on purpose: every command reads these before it imports anything else."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

_CODE: str | None = None


def cache_dir() -> Path:
    """`$RCA_CACHE_DIR`, else `$XDG_CACHE_HOME/rca`, else `~/.cache/rca`: where releases, remembered
    diagnoses, the analysis cache and the server's socket are kept."""
    explicit = os.environ.get("RCA_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rca"


def code_digest() -> str:
    """rca's Python code and its knowledge files, by content (about 5 ms)."""
    global _CODE
    if _CODE is None:
        digest = hashlib.sha256()
        roots = [Path(__file__).resolve().parent]  # the rca package
        for package in ("rca.analyzers", "rca.knowledge"):
            spec = importlib.util.find_spec(package)
            if spec is not None and spec.submodule_search_locations:
                roots.extend(Path(location) for location in spec.submodule_search_locations)
        for root in roots:
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts:
                    digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
        _CODE = digest.hexdigest()
    return _CODE
