"""Hugging Face Hub ids (`org/name`, the form of every model card and launch line) resolved to local
model directories, the way `huggingface_hub` lays out its cache.

A cached repository is `models--ORG--NAME/` with `refs/REVISION` (a branch or tag naming a commit)
and `snapshots/COMMIT/` (each file a link into `blobs/`). The user's cache (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `~/.cache/huggingface/hub`) is read and never written. What is not there is
fetched, when the Hub may be asked (`HF_HUB_OFFLINE` unset and no `--offline`), into rca's own
cache in the same layout, and only the small files a diagnosis reads: configs, tokenizer config,
chat template and the safetensors index, never weights. The Hub is asked over its HTTP API
(`HF_ENDPOINT`, the token of `HF_TOKEN` or `hf auth login`), so no Hub library is needed
(https://huggingface.co/docs/huggingface_hub/guides/manage-cache).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from rca.errors import InputError
from rca.inputs.hubfetch import COMMIT

# An id as the Hub spells it: one owner and one name (a third part or `..` is a path, not an id).
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class HubModel:
    """A Hub repository found at one revision: the snapshot directory holding its files."""

    repo_id: str
    revision: str  # as asked: a branch, a tag or a commit
    commit: str  # the commit the revision names
    path: Path


def is_hub_id(value: str, base: Path | None = None) -> bool:
    """Whether `value` names a Hub repository rather than a path: `org/name`, and no such path here."""
    if not _REPO_ID.fullmatch(value) or ".." in value.split("/"):
        return False
    return not (Path(value).exists() or (base is not None and (base / value).exists()))


def user_hub_cache() -> Path:
    """The user's hub cache, as huggingface_hub finds it."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def own_hub_cache() -> Path:
    """Where rca keeps the small files it fetched from the Hub (the user's cache is never written)."""
    from rca.fingerprint import cache_dir

    return cache_dir() / "hub"


def offline(asked: bool = False) -> bool:
    """Whether the Hub must not be asked: `--offline`, or HF_HUB_OFFLINE as huggingface_hub reads it."""
    return asked or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def repository_snapshot(root: Path, revision: str | None = None) -> HubModel | None:
    """The snapshot of a cached repository root (`models--ORG--NAME`) at `revision` (a ref or a
    commit; by default `main`, else its only snapshot); None when `root` is no such root or holds no
    snapshot for it."""
    if not root.name.startswith("models--") or not (root / "snapshots").is_dir():
        return None
    repo_id = _repo_id(root.name)
    wanted = revision or "main"
    commit = _read_ref(root, wanted) or (wanted if COMMIT.fullmatch(wanted) else None)
    if commit is None and revision is None:
        snapshots = [path.name for path in (root / "snapshots").iterdir() if path.is_dir()]
        commit = snapshots[0] if len(snapshots) == 1 else None
    if commit is None or not (root / "snapshots" / commit).is_dir():
        return None
    return HubModel(repo_id, wanted, commit, root / "snapshots" / commit)


def _read_ref(root: Path, revision: str) -> str | None:
    ref = root / "refs" / revision
    if ".." in Path(revision).parts or not ref.is_file() or ref.stat().st_size > 256:
        return None
    text = ref.read_text(encoding="ascii", errors="replace").strip()
    return text if COMMIT.fullmatch(text) else None


def cached(repo_id: str, revision: str | None = None) -> HubModel | None:
    """The repository in the user's cache or rca's own, with a config at `revision`."""
    for cache in (user_hub_cache(), own_hub_cache()):
        found = repository_snapshot(cache / f"models--{repo_id.replace('/', '--')}", revision)
        if found is not None and (found.path / "config.json").is_file():
            return found
    return None


def resolve(
    repo_id: str, revision: str | None, flag: str, *, no_network: bool = False, values: tuple[str, ...] | None = None
) -> HubModel:
    """The local snapshot of `repo_id`: cached, else its small files fetched when the Hub may be
    asked (with `values`, a draft's: its safetensors headers and those small tensors too). Each
    way it can fail is one line with its fix."""
    found = cached(repo_id, revision)
    if found is not None:
        return found
    at = f" at {revision}" if revision else ""
    if offline(no_network):
        raise InputError(
            f"{repo_id}{at} is not in the Hugging Face cache ({user_hub_cache()}) and the Hub may not be asked "
            f"({'--offline' if no_network else 'HF_HUB_OFFLINE is set'})",
            where=flag,
            fix=f"download its config first (hf download {repo_id} config.json), point HF_HUB_CACHE at the cache "
            "that holds it, or pass its directory",
        )
    from rca.inputs.hubfetch import fetch

    commit, snapshot = fetch(repo_id, revision, flag, own_hub_cache(), values)
    return HubModel(repo_id, revision or "main", commit, snapshot)


def display(path: Path) -> str | None:
    """A file inside a cached snapshot as users know it, `org/name@commit/file` (its links lead to
    blob hashes, which name nothing); None for any other path."""
    parts = path.parts
    for index in range(len(parts) - 2):
        if parts[index].startswith("models--") and parts[index + 1] == "snapshots":
            repo_id = _repo_id(parts[index])
            inside = "/".join(parts[index + 3 :])
            return f"{repo_id}@{parts[index + 2][:7]}" + (f"/{inside}" if inside else "")
    return None


def _repo_id(directory: str) -> str:
    """The repository id a cache directory is named for: `models--org--name` -> `org/name`."""
    return directory.removeprefix("models--").replace("--", "/", 1)
