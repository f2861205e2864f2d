"""Reading the draft: its config, and its checkpoint as far as the static checks need it.

A draft is shipped as `model.safetensors`, sharded safetensors with their index, or
`pytorch_model.bin`. Safetensors headers are read without loading anything; a `.bin` is a pickle,
opened only with torch's `weights_only=True` (which refuses anything that needs code) and memory
mapped, and skipped with a note where torch is not installed. A directory with only `config.json`
is a config-only draft: the checks that need weights say they were not made.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import zipfile
from pathlib import Path
from typing import BinaryIO

from rca.errors import brief
from rca.inputs import hub
from rca.inputs.checkpoint import INDEX, SINGLE, SMALL_TENSOR, Checkpoint, CheckpointError, decoded
from rca.inputs.configs import DraftConfig, display_path, load_config
from rca.inputs.draftweights import DraftTensor, DraftWeights
from rca.inputs.files import MIB, model_file, opened, read_text, resolved
from rca.inputs.hubfetch import HEADERS

BIN = "pytorch_model.bin"
VOCAB_MAPS = ("d2t", "t2d")  # draft id -> target id offsets, and the target ids the draft keeps
_TORCH_DTYPES = {
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
}  # fmt: skip
# What reading a .bin may hold in memory: its pickle (a state dict's names and shapes, kilobytes) and
# any compressed record; the stored tensors are memory mapped, and only the vocab maps' pages read.
MAX_UNPACKED = 64 * MIB
_RESAVE = "re-save the draft's state_dict as safetensors, or re-download it (rca loads a .bin as plain tensors only)"


def weights_directory(draft: Path) -> Path:
    """Where a draft's weights are: the directory given, or the one holding the config file given."""
    return draft if draft.is_dir() else draft.parent


def read_draft_weights(draft: Path, base: Path | None = None, flag: str = "--draft") -> DraftWeights | None:
    """The checkpoint next to the draft's config; None for a config-only draft. A checkpoint that
    is present but unreadable is bad input (CheckpointError), said with the file and the fix."""
    directory = weights_directory(draft)
    if (directory / HEADERS).is_file() and resolved(directory).is_relative_to(resolved(hub.own_hub_cache())):
        return _from_fetched_headers(directory, base)  # a draft rca fetched from the Hub: no weights here
    if (directory / INDEX).exists() or (directory / SINGLE).exists():
        return _from_safetensors(directory, base, flag)
    if (directory / BIN).exists():
        return _from_bin(directory, base)
    return None


def _from_safetensors(directory: Path, base: Path | None, flag: str) -> DraftWeights:
    checkpoint = Checkpoint.open(directory, base, flag=flag)
    tensors = {}
    for name in checkpoint.weight_map:
        entry = checkpoint.entry(name)
        tensors[name] = DraftTensor(name, entry.dtype, entry.shape, entry.file.name)
    values, unreadable = {}, {}
    for name in VOCAB_MAPS:
        found = checkpoint.find([name])
        if found is None:
            continue
        try:
            values[found] = tuple(checkpoint.values(found, SMALL_TENSOR))
        except CheckpointError as error:
            unreadable[found] = error.what
    return DraftWeights(
        display_path(directory, base), tensors, values, unreadable, checkpoint.bytes_read, checkpoint.total_bytes
    )


def _from_fetched_headers(directory: Path, base: Path | None) -> DraftWeights:
    """What rca fetched of a Hub draft's checkpoint (`hubfetch.HEADERS`): each shard's header and
    its vocab maps' bytes; its weights stay on the Hub."""
    path = directory / HEADERS
    shown = display_path(directory, base)
    fix = f"delete {directory} and run again (rca fetches it anew)"
    text = read_text(path, "rca's record of the draft's checkpoint headers", limit=64 * MIB, fix=fix)
    try:
        files = json.loads(text)["files"]
        tensors, values = {}, {}
        for file, recorded in files.items():
            for name, info in recorded["header"].items():
                if name != "__metadata__":
                    tensors[name] = DraftTensor(name, str(info["dtype"]), tuple(int(n) for n in info["shape"]), file)
            for name, data in recorded["values"].items():
                tensor = tensors[name]
                values[name] = tuple(decoded(name, tensor.dtype, tensor.shape, base64.b64decode(data), shown))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, binascii.Error):
        raise CheckpointError(
            "rca's record of the draft's checkpoint headers is corrupt", where=shown, fix=fix
        ) from None
    return DraftWeights(shown, tensors, values, bytes_read=len(text))


def _from_bin(directory: Path, base: Path | None) -> DraftWeights:
    """A pickled state dict, loaded with `weights_only=True` and memory mapped: only plain tensors
    and containers are accepted, and only the vocab maps' pages are touched."""
    path = directory / BIN
    shown = display_path(path, base)
    what = "the draft's pytorch_model.bin"
    with opened(model_file(path, what), what, _RESAVE) as handle:
        size = os.fstat(handle.fileno()).st_size
        try:
            import torch
        except ImportError:
            return DraftWeights(
                display_path(directory, base),
                {},
                unreadable={BIN: "torch is not installed; install rca[probes] to read pytorch_model.bin"},
                total_bytes=size,
            )
        _check_records(handle, shown)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # a pickle fails in many ways (an empty stack, a missing memo key): each the file's
        raise CheckpointError(
            f"pytorch_model.bin cannot be loaded as plain tensors: {_unpickling(error)}", where=shown, fix=_RESAVE
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(
            f"pytorch_model.bin holds a {type(state).__name__}, not a state dict",
            where=shown,
            fix="save the draft's state_dict() (better: as safetensors)",
        )
    tensors, values, read = {}, {}, 0
    for name, tensor in state.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            continue
        dtype = _TORCH_DTYPES.get(str(tensor.dtype).removeprefix("torch."), str(tensor.dtype))
        tensors[name] = DraftTensor(name, dtype, tuple(tensor.shape), BIN)
        if name.rsplit(".", 1)[-1] in VOCAB_MAPS and tensor.numel() * tensor.element_size() <= SMALL_TENSOR:
            values[name] = tuple(tensor.flatten().tolist())
            read += tensor.numel() * tensor.element_size()
    return DraftWeights(display_path(directory, base), tensors, values, {}, read, size)


def _check_records(handle: BinaryIO, shown: str) -> None:
    """Refuse a .bin that is not torch's zip format, or whose pickle and compressed records expand
    past MAX_UNPACKED: read from the zip's directory, before anything is unpickled."""
    try:
        records = zipfile.ZipFile(handle).infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise CheckpointError(
            "pytorch_model.bin is not in torch.save's zip format (it is torch < 1.6's legacy format, or no torch file)",
            where=shown,
            fix=_RESAVE,
        ) from None
    held = [
        record
        for record in records
        if record.filename.endswith("data.pkl") or record.compress_type != zipfile.ZIP_STORED
    ]
    unpacked = sum(record.file_size for record in held)
    if unpacked > MAX_UNPACKED:
        raise CheckpointError(
            f"pytorch_model.bin's pickle and compressed records expand to {unpacked:,} bytes; rca holds at most "
            f"{MAX_UNPACKED:,} of a .bin in memory (its stored tensors are mapped, not read)",
            where=shown,
            fix=_RESAVE,
        )


def _unpickling(error: Exception) -> str:
    """Why torch did not load a .bin: the code it pickles, or what is corrupt in it."""
    text = str(error)
    code = re.search(r"GLOBAL ([\w.]+)", text)
    if code is not None:
        return f"it pickles {code[1]}, which would run code"
    complaint = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    return f"it is corrupt ({complaint[1].strip()[:120] if complaint else brief(error, 120)})"


def checkpoint_files(draft: Path) -> list[Path]:
    """The files a model's weights are read from, beside its config (for fingerprinting a diagnosis's inputs)."""
    directory = weights_directory(draft)
    if not directory.is_dir():
        return []
    named = [directory / name for name in (INDEX, BIN) if (directory / name).is_file()]
    return named + sorted(path for path in directory.glob("*.safetensors") if path.is_file())


def load_draft(path: Path, base: Path | None = None, flag: str = "--draft") -> DraftConfig:
    """The draft's config, its declared ids and sizes checked, with what is known of its weights
    (`flag` names the option it was given by: the draft, or the parent it was fine-tuned from)."""
    config = DraftConfig(load_config(flag.removeprefix("--"), path, base))
    config.check_ids()
    config.check_sizes()
    return DraftConfig(config.config, read_draft_weights(path, base, flag))
