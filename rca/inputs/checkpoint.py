"""Reading a safetensors checkpoint's headers, its small tensors and single rows, without loading it.

A target can be a trillion-parameter model whose shards do not fit in memory; the embedding probe
needs only the rows of `embed_tokens` for the tokens in a dump, and the static checks of a draft
only its tensor names and its vocab map. safetensors lays a file out as an 8-byte header length, a
JSON header (dtype, shape and byte offsets per tensor) and the raw data. The headers and the small
tensors are read here by hand: the static path runs without torch or numpy, and the safetensors
library hands out tensors only through one of them. Rows for the probes (where torch is present)
are read with the library's lazy slices. Every byte read is counted, to report against the
checkpoint's size.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rca.errors import InputError, brief
from rca.inputs.configs import display_path
from rca.inputs.files import MIB, model_file, opened, read_text, within_model

if TYPE_CHECKING:
    import torch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
# struct codes of the dtypes a static check decodes (little-endian, as safetensors stores them).
_STRUCT = {
    "I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B", "BOOL": "?",
    "F64": "d", "F32": "f", "F16": "e", "BF16": "H",
}  # fmt: skip
SMALL_TENSOR = 4 * MIB  # a vocab map of a 256k-token vocabulary is 2 MB; weights are never read whole
_MAX_HEADER = 100 * 1024 * 1024
_MAX_INDEX = 64 * MIB  # an index names every tensor of a model: a few MB for a trillion parameters
MAX_SHARDS = 10_000  # shard files an index may name: the largest checkpoints have a few hundred
_REDOWNLOAD = "re-download the shard"


def has_weights(directory: Path) -> bool:
    """Whether a model directory names its safetensors tensors (an index, or a single file)."""
    return (directory / INDEX).is_file() or (directory / SINGLE).is_file()


class CheckpointError(InputError):
    """A target directory whose weights cannot be read as safetensors."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset of the data in the file
    end: int


@dataclass
class Checkpoint:
    """The safetensors shards of a model directory, read lazily (headers first, rows on demand)."""

    directory: Path
    base: Path | None = None
    weight_map: dict[str, str] = field(default_factory=dict)  # tensor name -> shard file name
    bytes_read: int = 0
    _headers: dict[str, dict[str, TensorEntry]] = field(default_factory=dict)

    @classmethod
    def open(cls, directory: Path, base: Path | None = None, flag: str = "--target") -> Checkpoint:
        """The checkpoint in `directory`, the model directory given as `flag`."""
        shown = display_path(directory, base)
        if not directory.is_dir():
            raise CheckpointError(
                f"{flag} is not a model directory",
                where=shown,
                fix=f"pass {flag} DIR holding config.json and the *.safetensors weights",
            )
        checkpoint = cls(directory, base)
        index = directory / INDEX
        if index.exists():
            fix = "restore the index written with the weights"
            text = read_text(
                model_file(index, "the safetensors index"), "the safetensors index", limit=_MAX_INDEX, fix=fix
            )
            try:
                weight_map = json.loads(text)["weight_map"]
            except (ValueError, KeyError, TypeError, RecursionError):
                weight_map = None
            if not isinstance(weight_map, dict) or not all(isinstance(file, str) for file in weight_map.values()):
                raise CheckpointError(
                    "malformed safetensors index (weight_map is not a mapping of tensor names to shard files)",
                    where=display_path(index, base),
                    fix=fix,
                )
            shards = set(weight_map.values())
            if len(shards) > MAX_SHARDS:
                raise CheckpointError(
                    f"the index names {len(shards):,} shard files; a checkpoint has at most {MAX_SHARDS:,}",
                    where=display_path(index, base),
                    fix=fix,
                )
            inside = {file: checkpoint._inside(file, index) for file in shards}  # each shard checked once
            checkpoint.bytes_read += len(text.encode("utf-8"))
            checkpoint.weight_map = {str(name): inside[file] for name, file in weight_map.items()}
        elif (directory / SINGLE).is_file():
            checkpoint.weight_map = dict.fromkeys(checkpoint._header(SINGLE), SINGLE)
        else:
            raise CheckpointError(
                f"no {INDEX} or {SINGLE} in the {flag} directory",
                where=shown,
                fix="pass the directory the model's safetensors weights were downloaded to",
            )
        return checkpoint

    def _inside(self, file: str, index: Path) -> str:
        """A shard name the index gives, when it names a file inside the checkpoint directory (a
        link may lead to where a Hugging Face hub download keeps its files)."""
        root = self.directory.resolve()
        try:
            (root / file).resolve()
        except (OSError, RuntimeError, ValueError):  # a NUL byte, a symlink loop
            raise CheckpointError(
                f"the index names a shard that is not a usable file name: {file!r}",
                where=display_path(index, self.base),
                fix="restore the index written with the weights",
            ) from None
        named = Path(os.path.normpath(root / file))
        if Path(file).is_absolute() or not named.is_relative_to(root) or not within_model(root / file, root):
            raise CheckpointError(
                f"the index names a shard outside the checkpoint directory: {file!r}",
                where=display_path(index, self.base),
                fix="use an index whose shard files are inside its directory",
            )
        return file

    @property
    def total_bytes(self) -> int:
        """The size of the shards the index names (of the single file, which may hold no tensor)."""
        files = set(self.weight_map.values()) or {SINGLE}
        return sum((self.directory / name).stat().st_size for name in files if (self.directory / name).is_file())

    def find(self, suffixes: Iterable[str]) -> str | None:
        """The first tensor whose name ends with one of `suffixes`, preferring the shortest name
        (`model.embed_tokens.weight` over `model.mtp.embed_tokens.weight`)."""
        for suffix in suffixes:
            names = sorted((name for name in self.weight_map if name == suffix or name.endswith("." + suffix)), key=len)
            if names:
                return names[0]
        return None

    def entry(self, name: str) -> TensorEntry:
        file = self.weight_map.get(name)
        if file is None:
            raise CheckpointError(
                f"no tensor {name!r} in the checkpoint",
                where=display_path(self.directory, self.base),
                fix="pass the target model's own weights",
            )
        header = self._header(file)
        if name not in header:
            raise CheckpointError(
                f"the index places {name!r} in {file}, whose header lacks it",
                where=display_path(self.directory / file, self.base),
                fix=_REDOWNLOAD,
            )
        return header[name]

    def rows(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """Rows `rows` ([S] integer ids) of the 2-D tensor `name`, as float32 [S, width]; each
        distinct row is read once."""
        import torch

        entry = self.entry(name)
        if len(entry.shape) != 2:
            raise CheckpointError(
                f"{name} has shape {list(entry.shape)}, not [rows, width]",
                where=display_path(entry.file, self.base),
                fix="pass the target model's own weights",
            )
        if entry.dtype not in _DTYPES:
            raise CheckpointError(
                f"{name} is stored as {entry.dtype}, not as floating point",
                where=display_path(entry.file, self.base),
                fix="pass a checkpoint with unquantized embeddings",
            )
        count, width = entry.shape
        dtype = getattr(torch, _DTYPES[entry.dtype])
        row_bytes = width * torch.empty((), dtype=dtype).element_size()
        if count < 0 or width < 0 or count * row_bytes != entry.end - entry.start:
            raise CheckpointError(
                f"{name} has shape {list(entry.shape)} of {entry.dtype}, but {entry.end - entry.start} bytes of data",
                where=display_path(entry.file, self.base),
                fix=_REDOWNLOAD,
            )
        unique, inverse = torch.unique(rows, return_inverse=True)
        if len(unique) and (int(unique[0]) < 0 or int(unique[-1]) >= count):
            raise CheckpointError(
                f"token id {int(unique[-1]) if int(unique[-1]) >= count else int(unique[0])} is outside {name} "
                f"({count} rows)",
                where=display_path(entry.file, self.base),
                fix="pass the target the dumps were generated with",
            )
        from safetensors import safe_open

        try:
            with safe_open(str(entry.file), "pt") as handle:
                tensor = handle.get_slice(name)
                chunks = [tensor[row : row + 1] for row in unique.tolist()]  # each row read on its own
        except Exception as error:  # the library's own checks of the file
            raise CheckpointError(
                f"unreadable safetensors shard ({brief(error, 120)})",
                where=display_path(entry.file, self.base),
                fix=_REDOWNLOAD,
            ) from None
        self.bytes_read += len(unique) * row_bytes
        table = torch.cat(chunks) if chunks else torch.empty((0, width), dtype=dtype)
        return table.float()[inverse]

    def row_bytes(self, name: str, row: int) -> bytes:
        """The raw bytes of row `row` of the 2-D tensor `name` (to tell an exact copy of another
        checkpoint's rows without decoding them or importing torch)."""
        entry = self.entry(name)
        shown = display_path(entry.file, self.base)
        size = entry.end - entry.start
        if len(entry.shape) != 2 or entry.shape[0] <= 0 or size % entry.shape[0] or not 0 <= row < entry.shape[0]:
            raise CheckpointError(
                f"{name} has shape {list(entry.shape)}: no row {row} of it can be read",
                where=shown,
                fix="pass the model's own weights",
            )
        width = size // entry.shape[0]
        with opened(entry.file, "a safetensors shard", _REDOWNLOAD) as handle:
            handle.seek(entry.start + row * width)
            data = handle.read(width)
        if len(data) != width:
            raise CheckpointError("truncated safetensors shard", where=shown, fix=_REDOWNLOAD)
        self.bytes_read += width
        return data

    def values(self, name: str, limit: int = SMALL_TENSOR) -> list:
        """The elements of a small tensor (a vocab map, a norm's weight), flattened, decoded without
        torch; a tensor larger than `limit` bytes is refused, not read."""
        entry = self.entry(name)
        shown = display_path(entry.file, self.base)
        size = entry.end - entry.start
        readable(name, entry.dtype, entry.shape, size, shown, limit)
        with opened(entry.file, "a safetensors shard", _REDOWNLOAD) as handle:
            handle.seek(entry.start)
            data = handle.read(size)
        if len(data) != size:
            raise CheckpointError("truncated safetensors shard", where=shown, fix=_REDOWNLOAD)
        self.bytes_read += size
        return _decoded(entry.dtype, data, math.prod(entry.shape))

    def row_values(self, name: str, row: int) -> list[float]:
        """Row `row` of the 2-D floating-point tensor `name`, decoded without torch (a few rows of an
        embedding, to compare with another checkpoint's by direction and size)."""
        entry = self.entry(name)
        if entry.dtype not in _STRUCT or not entry.dtype.startswith(("F", "BF")):
            raise CheckpointError(
                f"{name} is stored as {entry.dtype}, not as floating point",
                where=display_path(entry.file, self.base),
                fix="pass a checkpoint with unquantized embeddings",
            )
        return _decoded(entry.dtype, self.row_bytes(name, row), entry.shape[1])

    def _header(self, file: str) -> dict[str, TensorEntry]:
        if file in self._headers:
            return self._headers[file]
        path = self.directory / file
        shown = display_path(path, self.base)
        if not path.exists():
            raise CheckpointError(
                "a shard the index names is missing", where=shown, fix="download every shard of the checkpoint"
            )
        with opened(model_file(path, "a safetensors shard"), "a safetensors shard", _REDOWNLOAD) as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
            if not 0 < length <= min(_MAX_HEADER, size - 8):
                raise CheckpointError("not a safetensors file (bad header length)", where=shown, fix=_REDOWNLOAD)
            raw = handle.read(length)
        self.bytes_read += 8 + length
        try:
            header = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            header = None
        if not isinstance(header, dict):
            raise CheckpointError("corrupt safetensors header", where=shown, fix=_REDOWNLOAD)
        entries = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = info["data_offsets"]
                entry = TensorEntry(
                    name,
                    path,
                    str(info["dtype"]),
                    tuple(int(n) for n in info["shape"]),
                    8 + length + int(begin),
                    8 + length + int(end),
                )
            except (KeyError, TypeError, ValueError, OverflowError):
                raise CheckpointError(
                    f"corrupt safetensors header entry {name!r}", where=shown, fix=_REDOWNLOAD
                ) from None
            if not 8 + length <= entry.start <= entry.end:
                raise CheckpointError(
                    f"corrupt safetensors header entry {name!r} (data_offsets {[begin, end]})",
                    where=shown,
                    fix=_REDOWNLOAD,
                )
            if entry.end > size:
                raise CheckpointError(
                    f"truncated safetensors shard ({name} ends at byte {entry.end}, the file has {size})",
                    where=shown,
                    fix=_REDOWNLOAD,
                )
            entries[name] = entry
        self._headers[file] = entries
        return entries


def readable(name: str, dtype: str, shape: tuple[int, ...], size: int, shown: str, limit: int = SMALL_TENSOR) -> None:
    """Refuse a small tensor a static check cannot read: a dtype it does not decode, a shape that
    does not fit its bytes, or more than `limit` bytes."""
    code = _STRUCT.get(dtype)
    if code is None:
        raise CheckpointError(
            f"{name} is stored as {dtype}, which a static check does not read",
            where=shown,
            fix="store it as an integer or floating-point tensor",
        )
    if min(shape, default=0) < 0 or math.prod(shape) * struct.calcsize(code) != size:
        raise CheckpointError(
            f"{name} has shape {list(shape)} of {dtype}, but {size} bytes of data", where=shown, fix=_REDOWNLOAD
        )
    if size > limit:
        raise CheckpointError(
            f"{name} is {size:,} bytes; a static check reads at most {limit:,}", where=shown, fix="re-export it"
        )


def decoded(name: str, dtype: str, shape: tuple[int, ...], data: bytes, shown: str) -> list:
    """A small tensor's elements from its bytes, checked as `readable` checks them."""
    readable(name, dtype, shape, len(data), shown)
    return _decoded(dtype, data, math.prod(shape))


def _decoded(dtype: str, data: bytes, count: int) -> list:
    """`count` elements of `dtype` from their little-endian bytes."""
    if dtype == "BF16":  # the upper half of a float32
        return [struct.unpack("<f", struct.pack("<I", half << 16))[0] for half in struct.unpack(f"<{count}H", data)]
    return list(struct.unpack(f"<{count}{_STRUCT[dtype]}", data))
