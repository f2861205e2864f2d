"""Reading single tensor rows from a safetensors checkpoint, without loading it.

A target can be a trillion-parameter model whose shards do not fit in memory; the embedding probe
needs only the rows of `embed_tokens` for the tokens in a dump. safetensors lays a file out as an
8-byte header length, a JSON header (dtype, shape and byte offsets per tensor) and the raw data,
so a row is one seek and one read. Every byte read is counted, to report against the
checkpoint's size.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rca.errors import InputError
from rca.inputs.configs import display_path
from rca.inputs.files import MIB, read_text, regular_file

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
_MAX_HEADER = 100 * 1024 * 1024
_MAX_INDEX = 64 * MIB  # an index names every tensor of a model: a few MB for a trillion parameters


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
    def open(cls, directory: Path, base: Path | None = None) -> Checkpoint:
        shown = display_path(directory, base)
        if not directory.is_dir():
            raise CheckpointError(
                "the target is not a model directory",
                where=shown,
                fix="pass --target DIR holding config.json and the *.safetensors weights",
            )
        checkpoint = cls(directory, base)
        index = directory / INDEX
        if index.exists():
            fix = "restore the index written with the weights"
            text = read_text(index, "the safetensors index", limit=_MAX_INDEX, fix=fix)
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
            checkpoint.bytes_read += len(text.encode("utf-8"))
            checkpoint.weight_map = {str(name): checkpoint._inside(file, index) for name, file in weight_map.items()}
        elif (directory / SINGLE).is_file():
            checkpoint.weight_map = dict.fromkeys(checkpoint._header(SINGLE), SINGLE)
        else:
            raise CheckpointError(
                f"no {INDEX} or {SINGLE} in the target directory",
                where=shown,
                fix="pass the directory the model's safetensors weights were downloaded to",
            )
        return checkpoint

    def _inside(self, file: str, index: Path) -> str:
        """A shard name the index gives, when it names a file inside the checkpoint directory."""
        root = self.directory.resolve()
        try:
            resolved = (root / file).resolve()
        except (OSError, RuntimeError, ValueError):  # a NUL byte, a symlink loop
            raise CheckpointError(
                f"the index names a shard that is not a usable file name: {file!r}",
                where=display_path(index, self.base),
                fix="restore the index written with the weights",
            ) from None
        if Path(file).is_absolute() or not resolved.is_relative_to(root):
            raise CheckpointError(
                f"the index names a shard outside the checkpoint directory: {file!r}",
                where=display_path(index, self.base),
                fix="use an index whose shard files are inside its directory",
            )
        return file

    @property
    def total_bytes(self) -> int:
        """The size of the shards the index names."""
        return sum(
            (self.directory / name).stat().st_size
            for name in set(self.weight_map.values())
            if (self.directory / name).is_file()
        )

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
                fix="re-download the shard",
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
                fix="re-download the shard",
            )
        unique, inverse = torch.unique(rows, return_inverse=True)
        if len(unique) and (int(unique[0]) < 0 or int(unique[-1]) >= count):
            raise CheckpointError(
                f"token id {int(unique[-1]) if int(unique[-1]) >= count else int(unique[0])} is outside {name} "
                f"({count} rows)",
                where=display_path(entry.file, self.base),
                fix="pass the target the dumps were generated with",
            )
        buffer = bytearray(len(unique) * row_bytes)
        with entry.file.open("rb") as handle:
            for position, row in enumerate(unique.tolist()):
                handle.seek(entry.start + row * row_bytes)
                chunk = handle.read(row_bytes)
                if len(chunk) != row_bytes:
                    raise CheckpointError(
                        "truncated safetensors shard",
                        where=display_path(entry.file, self.base),
                        fix="re-download the shard",
                    )
                buffer[position * row_bytes : (position + 1) * row_bytes] = chunk
        self.bytes_read += len(buffer)
        table = (
            torch.frombuffer(buffer, dtype=dtype).reshape(len(unique), width)
            if buffer
            else torch.empty((len(unique), width), dtype=dtype)  # no rows asked for, or rows 0 wide
        )
        return table.float()[inverse]

    def _header(self, file: str) -> dict[str, TensorEntry]:
        if file in self._headers:
            return self._headers[file]
        path = self.directory / file
        shown = display_path(path, self.base)
        if not path.exists():
            raise CheckpointError(
                "a shard the index names is missing", where=shown, fix="download every shard of the checkpoint"
            )
        size = regular_file(path, "a safetensors shard", "re-download the shard").st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
            if not 0 < length <= min(_MAX_HEADER, size - 8):
                raise CheckpointError(
                    "not a safetensors file (bad header length)", where=shown, fix="re-download the shard"
                )
            raw = handle.read(length)
        self.bytes_read += 8 + length
        try:
            header = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            header = None
        if not isinstance(header, dict):
            raise CheckpointError("corrupt safetensors header", where=shown, fix="re-download the shard")
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
                    f"corrupt safetensors header entry {name!r}", where=shown, fix="re-download the shard"
                ) from None
            if not 8 + length <= entry.start <= entry.end:
                raise CheckpointError(
                    f"corrupt safetensors header entry {name!r} (data_offsets {[begin, end]})",
                    where=shown,
                    fix="re-download the shard",
                )
            if entry.end > size:
                raise CheckpointError(
                    f"truncated safetensors shard ({name} ends at byte {entry.end}, the file has {size})",
                    where=shown,
                    fix="re-download the shard",
                )
            entries[name] = entry
        self._headers[file] = entries
        return entries
