"""Fetching a Hub repository's small files over the Hub's HTTP API (`HF_ENDPOINT`, else
huggingface.co; the token of HF_TOKEN or `hf auth login`) into rca's own cache, in the layout
huggingface_hub reads (https://huggingface.co/docs/hub/api): the revision's commit and file list
first, then each small file it has, by commit. Never weights; every answer bounded in time and size."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from urllib.error import HTTPError

from rca.errors import InputError

_TIMEOUT_S = 20.0
COMMIT = re.compile(r"[0-9a-f]{40}")  # a commit as the Hub names it (and the cache's snapshot directories)
# The files of a model repository that a diagnosis reads: never its weights.
SMALL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
    "mask_embedding.pt",  # a DFlash draft's trained mask embedding: one vector, whose presence is read
)


def fetch(
    repo_id: str, revision: str | None, flag: str, cache: Path, values: tuple[str, ...] | None = None
) -> tuple[str, Path]:
    """The commit `revision` names and its snapshot in `cache` holding the repository's small
    files, fetched from the Hub's HTTP API (`HF_ENDPOINT`, else huggingface.co) in the layout
    huggingface_hub reads: the revision's commit and file list first, then each small file it has,
    by commit. With `values` (tensor names, as the last part of a name: `d2t`), also its
    safetensors headers and those small tensors, by range requests (HEADERS, beside the files)."""
    wanted = revision or "main"
    info = _get_json(f"/api/models/{repo_id}/revision/{quote(wanted, safe='')}", repo_id, wanted, flag)
    commit = info.get("sha") if isinstance(info, dict) else None
    siblings = info.get("siblings") if isinstance(info, dict) else None
    if not isinstance(commit, str) or not COMMIT.fullmatch(commit) or not isinstance(siblings, list):
        raise InputError(
            f"the Hub's answer for {repo_id} is not a model's revision", where=flag, fix="check HF_ENDPOINT"
        )
    names = {entry.get("rfilename") for entry in siblings if isinstance(entry, dict)}
    if "config.json" not in names:
        raise InputError(
            f"{repo_id} has no config.json at {wanted}",
            where=flag,
            fix="name the repository of a model, or its directory",
        )
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    for name in SMALL_FILES:
        if name in names:
            data = _get(f"/{repo_id}/resolve/{commit}/{name}", repo_id, wanted, flag, limit=_MAX_FILE)
            _store(root, snapshot, name, data)
    if values is not None:
        shards = _shards(snapshot, names)
        if shards:
            where = (repo_id, commit, wanted, flag)
            recorded = {"files": {shard: _shard_header(where, shard, values) for shard in shards}}
            (snapshot / HEADERS).write_text(json.dumps(recorded), encoding="utf-8")
    (root / "refs").mkdir(parents=True, exist_ok=True)
    if not COMMIT.fullmatch(wanted) and "/" not in wanted and wanted not in (".", ".."):
        (root / "refs" / wanted).write_text(commit, encoding="ascii")
    return commit, snapshot


_MAX_FILE = 16 * 1024 * 1024  # a config, template or index; a larger answer is not one
# What rca kept of a fetched repository's safetensors shards: each shard's header, and the small
# tensors asked for (base64 of their bytes). Read only from rca's own hub cache.
HEADERS = ".rca-safetensors-headers.json"
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own bound
_MAX_VALUES = 4 * 1024 * 1024  # bytes of one small tensor (a vocab map of a 256k-token vocabulary is 2 MB)
_MAX_SHARDS = 1024


def _shards(snapshot: Path, names: set) -> list[str]:
    """The safetensors files of the repository: those its index names, else its single file."""
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (ValueError, AttributeError, RecursionError):
            weight_map = None
        shards = (
            sorted({file for file in weight_map.values() if isinstance(file, str)})
            if isinstance(weight_map, dict)
            else []
        )
        return [shard for shard in shards if shard in names][:_MAX_SHARDS]
    return ["model.safetensors"] if "model.safetensors" in names else []


def _shard_header(where: tuple[str, str, str, str], shard: str, values: tuple[str, ...]) -> dict:
    """One shard's header and the small tensors named in `values`, by range requests."""
    repo_id, commit, wanted, flag = where
    path = f"/{repo_id}/resolve/{commit}/{quote(shard)}"
    prefix = _get(path, repo_id, wanted, flag, limit=8, byte_range=(0, 7))
    length = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
    if not 0 < length <= _MAX_HEADER:
        raise InputError(f"{repo_id}: {shard} is not a safetensors file", where=flag, fix="check the repository")
    raw = _get(path, repo_id, wanted, flag, limit=length, byte_range=(8, 8 + length - 1))
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise InputError(f"{repo_id}: {shard} has a corrupt header", where=flag, fix="check the repository")
    kept = {}
    for name, info in header.items():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if name.rsplit(".", 1)[-1] not in values or not isinstance(offsets, list) or len(offsets) != 2:
            continue
        if not all(isinstance(offset, int) and not isinstance(offset, bool) for offset in offsets):
            continue
        begin, end = offsets
        if 0 <= begin < end and end - begin <= _MAX_VALUES:
            data = _get(
                path, repo_id, wanted, flag, limit=end - begin, byte_range=(8 + length + begin, 8 + length + end - 1)
            )
            kept[name] = base64.b64encode(data).decode("ascii")
    return {"header": header, "values": kept}


def _store(root: Path, snapshot: Path, name: str, data: bytes) -> None:
    """One file as huggingface_hub keeps it: its bytes in blobs/, a link to them in the snapshot."""
    blob = root / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        partial = blob.with_suffix(".incomplete")
        partial.write_bytes(data)
        partial.replace(blob)
    link = snapshot / name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(blob, snapshot))


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _token() -> str | None:
    """The user's Hub token, where huggingface_hub keeps it (HF_TOKEN, else HF_HOME/token)."""
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"].strip()
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    path = Path(os.environ.get("HF_TOKEN_PATH") or home / "token")
    try:
        if not path.is_file() or path.stat().st_size > 4096:
            return None
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _get_json(path: str, repo_id: str, revision: str, flag: str) -> object:
    data = _get(path, repo_id, revision, flag, limit=_MAX_FILE)
    try:
        return json.loads(data)
    except ValueError:
        raise InputError(f"the Hub's answer for {repo_id} is not JSON", where=flag, fix="check HF_ENDPOINT") from None


def _get(
    path: str, repo_id: str, revision: str, flag: str, *, limit: int, byte_range: tuple[int, int] | None = None
) -> bytes:
    """One GET against the Hub, bounded in time and size; each failure one line with its fix."""
    import urllib.error
    import urllib.parse
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        """The API's redirects are a renamed repository, said to the user; file downloads follow theirs."""

        def redirect_request(self, req, fp, code, msg, headers, newurl):
            if "/api/" in req.full_url:
                return None
            followed = super().redirect_request(req, fp, code, msg, headers, newurl)
            if (
                followed is not None
                and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc
            ):
                followed.remove_header("Authorization")  # the token is the Hub's, not a CDN's
            return followed

    request = urllib.request.Request(_endpoint() + path, headers={"User-Agent": "rca"})
    token = _token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if byte_range is not None:
        request.add_header("Range", f"bytes={byte_range[0]}-{byte_range[1]}")
    opener = urllib.request.build_opener(NoRedirect())
    try:
        with opener.open(request, timeout=_TIMEOUT_S) as response:
            if byte_range is not None and response.status != 206:
                raise InputError(
                    f"the Hub answered a range request for {repo_id} with the whole file",
                    where=flag,
                    fix="check HF_ENDPOINT (a mirror must answer range requests), or download the draft and pass it",
                )
            data = response.read(limit + 1)
    except urllib.error.HTTPError as error:
        raise _http_error(error, repo_id, revision, flag) from None
    except TimeoutError:
        raise _timed_out(repo_id, flag) from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, TimeoutError):
            raise _timed_out(repo_id, flag) from None
        raise InputError(
            f"cannot reach the Hub ({_endpoint()}) for {repo_id}: {reason}",
            where=flag,
            fix="check the connection and HF_ENDPOINT, or download its config and pass --offline",
        ) from None
    if len(data) > limit:
        raise InputError(
            f"the Hub's answer for {repo_id} is larger than any config", where=flag, fix="check HF_ENDPOINT"
        )
    return data


def _timed_out(repo_id: str, flag: str) -> InputError:
    return InputError(
        f"the Hub did not answer for {repo_id} within {_TIMEOUT_S:g} s",
        where=flag,
        fix="try again, check HF_ENDPOINT, or download its config and pass --offline",
    )


def _http_error(error: HTTPError, repo_id: str, revision: str, flag: str) -> InputError:
    code = error.headers.get("X-Error-Code", "") if error.headers else ""
    if 300 <= error.code < 400:
        moved = (error.headers.get("Location") or "") if error.headers else ""
        match = re.search(r"/api/models/([^/]+/[^/]+)", moved)
        new = match[1] if match else "its new name"
        return InputError(f"{repo_id} has moved to {new}", where=flag, fix=f"name it as {new}")
    if code == "GatedRepo" or (error.code == 403 and "gated" in str(error.reason).lower()):
        return InputError(
            f"{repo_id} is gated: its files need an accepted licence and a token",
            where=flag,
            fix=f"accept its terms on https://huggingface.co/{repo_id} and log in (hf auth login, or HF_TOKEN)",
        )
    if code == "RevisionNotFound":
        return InputError(
            f"{repo_id} has no revision {revision!r}", where=flag, fix="name a branch, tag or commit it has"
        )
    if error.code in (401, 404) or code == "RepoNotFound":
        return InputError(
            f"no Hugging Face repository {repo_id} (or it is private and no token was given)",
            where=flag,
            fix="check the id on https://huggingface.co, or log in (hf auth login) for a private one",
        )
    return InputError(
        f"the Hub answered {error.code} for {repo_id}", where=flag, fix="try again later, or pass its directory"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__
