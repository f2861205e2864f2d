"""Diagnoses remembered by what they read, so that asking again about unchanged inputs is instant.

The key digests everything a diagnosis depends on: this version of `rca` (its code and catalog),
the Python that parses the sources, each source tree (a release by its immutable name and
version, a local tree by the path, size and modification time of every Python file in it), the
patches and configs by content, and the dumps directory by its listing. Nothing from the analysis
itself is needed to compute it, so a hit costs a directory walk and a JSON read. Entries are plain
JSON, signed like the analysis cache's (`rca.signed`): one that cannot be read, or does not prove
rca wrote it for its key (an edited verdict), is ignored and the diagnosis computed again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from rca import model, signed
from rca.errors import InputError
from rca.fingerprint import code_digest
from rca.inputs import Inputs
from rca.inputs.draft import checkpoint_files, weights_directory
from rca.inputs.files import resolved
from rca.inputs.launch import named_files
from rca.inputs.sources import SourceSpec, cache_dir, materialize
from rca.inputs.templates import TEMPLATE_FILES
from rca.model import Diagnosis
from rca.signed import SignedStore, read_bounded

SCHEMA = "rca.cache/1"
_MAGIC = b"RCAR1\n"
_MAX_ENTRIES = 256
_MAX_ENTRY_BYTES = 64 << 20
_LEGACY = re.compile(r"[0-9a-f]{64}\.json|tmp\w+\.tmp")  # an older rca's unsigned entries
_LEGACY_HEAD = b'{"schema": "rca.cache/1"'
_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in vars(model).values()
    if isinstance(cls, type)
    and cls.__module__ == model.__name__
    and (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum))
}


def result_key(inputs: Inputs) -> str | None:
    """The digest of everything the diagnosis of `inputs` reads; None when an input cannot be
    fingerprinted (it is then left to the diagnosis to report)."""
    digest = hashlib.sha256()
    digest.update(f"{SCHEMA}\0{sys.version_info[:2]}\0{code_digest()}\0".encode())
    try:
        for side in ("serving", "training"):
            spec_text = getattr(inputs, side)
            digest.update(f"\0{side}\0".encode())
            if spec_text is not None:
                spec = SourceSpec.parse(spec_text, f"--{side}", inputs.base)
                _update_tree(digest, spec)
            _update_file(digest, inputs.path(getattr(inputs, f"{side}_patch")))
        for name in ("serving_args", "training_args"):  # a launch file, and the files its command names
            digest.update(f"\0{name}\0".encode())
            launch = inputs.path(getattr(inputs, name))
            if launch is not None and launch.is_file():
                _update_file(digest, launch)
            for named in named_files(getattr(inputs, name), launch, inputs.base):
                _update_file(digest, named)
        digest.update(b"\0training_engine\0")
        if inputs.training_engine is not None:
            _update_tree(digest, SourceSpec.parse(inputs.training_engine, "--training-engine", inputs.base))
        for name in ("draft", "target", "parent_draft"):
            digest.update(f"\0{name}\0".encode())
            path = inputs.path(getattr(inputs, name))
            _update_file(digest, path / "config.json" if path is not None and path.is_dir() else path)
            if name == "target" and path is not None:  # the chat template beside the config is read too
                for beside in TEMPLATE_FILES:
                    _update_file(digest, (path if path.is_dir() else path.parent) / beside)
            if path is not None and path.exists():  # the checkpoint beside each config is read too
                weights = checkpoint_files(path)  # sizes and times: a checkpoint is too large to hash
                _update_listing(digest, weights_directory(path), weights)
        digest.update(b"\0dumps\0")
        dumps = inputs.path(inputs.dumps)
        if dumps is not None:
            _update_listing(digest, dumps, dumps.rglob("*") if dumps.is_dir() else [dumps])
        digest.update(json.dumps(inputs.as_dict(), sort_keys=True).encode())
    except (InputError, OSError):
        return None
    return digest.hexdigest()


def load(key: str) -> Diagnosis | None:
    """The diagnosis remembered for `key`, when an entry proves rca wrote it for that key."""
    payload = _store().read(key)
    if payload is None:
        return None
    try:
        data = json.loads(payload.decode("utf-8"))
        if data.get("schema") != SCHEMA:
            return None
        diagnosis = _decode(data["diagnosis"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return diagnosis if isinstance(diagnosis, Diagnosis) else None


def store(key: str, diagnosis: Diagnosis) -> None:
    """Remember a diagnosis (best effort: a read-only or full cache only costs the speed-up); the
    oldest beyond the last `_MAX_ENTRIES` are forgotten."""
    kept = _store()
    payload = json.dumps({"schema": SCHEMA, "diagnosis": _encode(diagnosis)})  # json.dump: pure Python
    if kept.write(key, payload.encode("utf-8")):
        kept.delete([name for _, _, name in sorted(kept.listing())[:-_MAX_ENTRIES]])


def summary() -> dict[str, Any]:
    """Where the remembered diagnoses are, how many and their size."""
    entries = _store().listing()
    return {"location": str(_store().root), "entries": len(entries), "bytes": sum(size for _, size, _ in entries)}


def clear() -> int:
    """Forget every remembered diagnosis (an older rca's unsigned ones too); the count forgotten."""
    count = _store().clear()
    root = _store().root
    for name in os.listdir(root) if root.is_dir() and not root.is_symlink() else []:
        if _LEGACY.fullmatch(name) and (read_bounded(root / name, _MAX_ENTRY_BYTES) or b"").startswith(_LEGACY_HEAD):
            with contextlib.suppress(OSError):
                os.unlink(root / name)
                count += 1
    return count


def _store() -> SignedStore:
    return signed.opened(
        cache_dir() / "results",
        "the remembered diagnoses",
        "RCA_CACHE_DIR",
        _MAGIC,
        _MAX_ENTRY_BYTES,
        lambda name: bool(_LEGACY.fullmatch(name)),
    )


# -- fingerprints --------------------------------------------------------------------------------


def _update_tree(digest: Any, spec: SourceSpec) -> None:
    if spec.kind == "release":
        digest.update(f"release\0{spec.name}=={spec.version}".encode())  # published files never change
        return
    assert spec.path is not None
    digest.update(f"{spec.kind}\0{resolved(spec.path)}".encode())
    tree = materialize(spec, "")  # the files a diagnosis reads: links out of the tree and pipes left out
    _update_listing(digest, tree.root, [tree.root / relpath for relpath in tree.files()])


def _update_listing(digest: Any, root: Path, paths: Any) -> None:
    for path in paths:
        status = path.stat()
        digest.update(
            f"{path.relative_to(root) if path != root else '.'}\0{status.st_size}\0{status.st_mtime_ns}\n".encode()
        )


def _update_file(digest: Any, path: Path | None) -> None:
    if path is None:
        digest.update(b"-")
    elif path.is_file():
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    else:
        digest.update(b"missing")


# -- a diagnosis as JSON ---------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    """Model objects as tagged JSON; tuples and lists stay distinct, so reports render the same."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            "$": type(value).__name__,
            **{f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)},
        }
    if isinstance(value, enum.Enum):
        return {"$enum": type(value).__name__, "value": value.value}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(item) for item in value]}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, dict):
        return {"$dict": [[key, _encode(item)] for key, item in value.items()]}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot cache a {type(value).__name__}")


def _decode(data: Any) -> Any:
    if isinstance(data, list):
        return [_decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if "$tuple" in data:
        return tuple(_decode(item) for item in data["$tuple"])
    if "$dict" in data:
        return {key: _decode(item) for key, item in data["$dict"]}
    if "$enum" in data:
        return _TYPES[data["$enum"]](data["value"])
    cls = _TYPES[data["$"]]
    return cls(**{key: _decode(item) for key, item in data.items() if key != "$"})
