"""Hidden-state dumps: what a dump directory records about itself, and its tensors.

speculators' data generation writes `data_config.json` beside the dumps, recording the layer ids it
captured (`hidden_states.layer_ids`): the ids training really used, whatever the defaults in the code
say. `read_dump_metadata` reads only that record, for the static analysis.

The tensors are read one sample per file, split into slots as the format's trainer does.

Four layouts exist in the wild, told apart by file name:

- speculators 0.3-0.4, `data_<i>.pt`: `hidden_states` is a list of [S, H] tensors; the trainer
  feeds all but the last to the draft and uses the last as the verifier's last state;
- speculators >= 0.5, `hs_<i>.safetensors`: `hidden_states` is [S, n, H], split the same way;
- SpecForge, `*.ckpt` or `*.ckpt.gz` (possibly in `rows_<a>-<b>/` subdirectories):
  `aux_hidden_state` [1, S, k*H] is the k slots concatenated, `hidden_state` [1, S, H] the
  verifier's last state;
- anything else `*.safetensors` (what rca's own capture writes): `hidden_states` [S, n, H] holds
  every slot, `verifier_last` [S, H] is optional.

Pickles are loaded with `weights_only=True` only: a dump is untrusted input and must never run code.
torch and safetensors are imported when a file is read, so the static analysis runs without them.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rca.errors import InputError, brief
from rca.inputs.configs import display_path
from rca.inputs.files import MIB, read_text, readable
from rca.inputs.jsonpos import JsonSyntaxError, loads
from rca.model import Location, Step

if TYPE_CHECKING:
    import torch

# speculators' and SpecForge's data_config.json; NeMo Automodel's cache manifest.json.
METADATA_FILES = ("data_config.json", "manifest.json")
IDS_PATHS = (("hidden_states", "layer_ids"), ("layer_ids",), ("target_layer_ids",), ("aux_layer_ids",))


@dataclass(frozen=True)
class DumpMetadata:
    ids: tuple[int, ...]
    step: Step


def read_dump_metadata(dumps: Path, base: Path | None = None) -> DumpMetadata | None:
    """The captured layer ids a dump directory records, or None when it records none."""
    if not dumps.exists():
        raise InputError(
            "--dumps path does not exist", where=str(dumps), fix="pass the directory holding the hidden-state dumps"
        )
    if not dumps.is_dir():
        raise InputError(
            "--dumps is not a directory", where=str(dumps), fix="pass the directory holding the hidden-state dumps"
        )
    for name in METADATA_FILES:
        path = dumps / name
        if not path.exists() and not path.is_symlink():
            continue
        fix = f"restore the {name} written by data generation"
        try:
            doc = loads(read_text(path, "dump metadata", limit=16 * MIB, fix=fix))
        except JsonSyntaxError as error:
            raise InputError(
                f"malformed JSON: {error.message}",
                where=f"{path}:{error.line}:{error.column}",
                fix=fix,
            ) from None
        for key_path in IDS_PATHS:
            node = doc.data
            for key in key_path:
                node = node.get(key) if isinstance(node, dict) else None
            if node is None:
                continue
            if not isinstance(node, list) or not all(
                isinstance(item, int) and not isinstance(item, bool) for item in node
            ):
                first, _ = doc.line_range(key_path) or (1, 1)
                raise InputError(
                    f"{'.'.join(key_path)} is {json.dumps(node)[:80]}, not a list of layer ids",
                    where=f"{path}:{first}",
                    fix=fix,
                )
            first, last = doc.line_range(key_path) or (1, 1)
            location = Location("dumps", display_path(path, base), first, last)
            return DumpMetadata(
                tuple(node), Step(location, f"the dump records the captured layer ids {node}", doc.source_line(first))
            )
    return None


# Format key -> the names its files are written under (any *.pt and *.ckpt[.gz] is read as such).
FORMATS = {
    "speculators-pt": "data_<i>.pt",
    "speculators-safetensors": "hs_<i>.safetensors",
    "specforge-ckpt": "*.ckpt[.gz]",
    "safetensors": "*.safetensors",
}
_PATTERNS = ", ".join(FORMATS.values())
_WRITERS = {
    "speculators-pt": "speculators' data generation",
    "speculators-safetensors": "speculators' data generation",
    "specforge-ckpt": "SpecForge's prepare_hidden_states.py",
    "safetensors": "the capture that wrote it",
}
_REGENERATE = "regenerate the file, or move it out of the dump directory"


class DumpError(InputError):
    """A dump file that cannot be read as hidden states."""


@dataclass(frozen=True)
class DumpSample:
    path: str  # the file, as display_path shows it
    format: str  # a FORMATS key
    token_ids: torch.Tensor  # [S] int64
    slots: tuple[torch.Tensor, ...]  # each [S, H] in the file's dtype: the draft-input slots in order
    verifier_last: torch.Tensor | None  # [S, H], or None when the file has none


@dataclass(frozen=True)
class DumpSet:
    directory: Path
    format: str
    files: tuple[Path, ...]  # sorted naturally (data_2 before data_10)
    base: Path | None = None
    hidden_size: int | None = None  # the target's, to split SpecForge files that lack hidden_state
    vocabulary: int | None = None  # the target's token count, which every token id must be below

    @property
    def bytes(self) -> int:
        return sum(file.stat().st_size for file in self.files)

    def samples(self, max_tokens: int | None = None) -> Iterator[DumpSample]:
        """Streams one file at a time (never the whole directory in memory); stops once max_tokens
        tokens were yielded (the last sample is truncated to fit)."""
        left = max_tokens
        width: tuple[int, str] | None = None  # the first sample's, which every other must share
        for file in self.files:
            if left is not None and left <= 0:
                return
            sample = _read(file, self.format, display_path(file, self.base), self.hidden_size)
            _check_ids(int(sample.token_ids.min()), int(sample.token_ids.max()), self.vocabulary, sample.path)
            if self.hidden_size is not None and int(sample.slots[0].shape[1]) != self.hidden_size:
                raise DumpError(
                    f"its hidden states are {int(sample.slots[0].shape[1])} wide, but the target's hidden size is "
                    f"{self.hidden_size}",
                    where=sample.path,
                    fix="pass the target the dumps were generated with",
                )
            if width is None:
                width = (int(sample.slots[0].shape[1]), sample.path)
            elif int(sample.slots[0].shape[1]) != width[0]:
                raise DumpError(
                    f"its hidden states are {int(sample.slots[0].shape[1])} wide, "
                    f"but those of {width[1]} are {width[0]}",
                    where=sample.path,
                    fix="keep the dumps of one target per directory",
                )
            if left is not None:
                sample = _head(sample, left)
                left -= len(sample.token_ids)
            yield sample


@dataclass(frozen=True)
class TokenRecord:
    """One dump file's token ids and loss mask (None when the file keeps none), and nothing else."""

    path: str
    ids: list[int]
    loss_mask: list[int] | None


def token_records(dumps: DumpSet, limit: int | None = None) -> Iterator[TokenRecord]:
    """The token ids and loss masks of up to `limit` files, reading no hidden state: torch.save
    files are memory-mapped (a tensor's bytes are read only when used), safetensors files read
    two tensors by name."""
    for file in dumps.files[:limit]:
        shown = display_path(readable(file, "a dump file", _REGENERATE), dumps.base)
        if dumps.format in ("speculators-pt", "specforge-ckpt"):
            data = _load_pickle(file, shown, mapped=True)
            ids = _entry(data, "input_ids", shown, dumps.format)
            mask = data.get("loss_mask") if isinstance(data, dict) else None
        else:
            ids, mask = _safetensors_tokens(file, dumps.format, shown)
        ids = _batchless(_tensor(ids, "input_ids", shown), 1).to(_torch().int64)
        mask = _batchless(_tensor(mask, "loss_mask", shown), 1) if mask is not None else None
        if ids.numel():
            _check_ids(int(ids.min()), int(ids.max()), dumps.vocabulary, shown)
        if ids.dim() != 1 or (mask is not None and mask.shape != ids.shape):
            raise DumpError(
                f"input_ids {list(ids.shape)} and loss_mask {None if mask is None else list(mask.shape)} are not "
                "one [S] sequence each",
                where=shown,
                fix=_REGENERATE,
            )
        yield TokenRecord(shown, ids.tolist(), None if mask is None else mask.tolist())


def _safetensors_tokens(file: Path, format: str, shown: str) -> tuple[Any, Any]:
    from safetensors import safe_open

    try:
        with safe_open(file, "pt") as handle:
            keys = set(handle.keys())
            name = next((key for key in ("input_ids", "token_ids") if key in keys), None)
            if name is None:
                raise _missing("input_ids or token_ids", sorted(keys), shown, format)
            return handle.get_tensor(name), handle.get_tensor("loss_mask") if "loss_mask" in keys else None
    except DumpError:
        raise
    except Exception as error:
        raise DumpError(
            f"truncated or corrupt safetensors file ({brief(error, 120)})", where=shown, fix=_REGENERATE
        ) from None


def open_dumps(
    path: Path,
    base: Path | None = None,
    hidden_size: int | None = None,
    check: bool = True,
    vocabulary: int | None = None,
) -> DumpSet:
    """Detect the format of a dump directory (or a single dump file) and check it can be read.

    With `check`, the first file is read in full, so a directory of the wrong shape fails here,
    naming the file (a reader of token ids only passes False: no hidden state is read). Where the
    target's `vocabulary` is known, a token id past it is refused naming its file.
    """
    _torch()
    shown = display_path(path, base)
    if not path.exists():
        raise DumpError(
            "--dumps path does not exist", where=shown, fix="pass the directory holding the hidden-state dumps"
        )
    if path.is_file():
        kind = _format_of(path.name)
        if kind is None:
            raise DumpError(
                "is not a hidden-state dump file",
                where=shown,
                fix=f"pass a dump directory, or one file named {_PATTERNS}",
            )
        dumps = DumpSet(path.parent, kind, (path,), base, hidden_size, vocabulary)
    else:
        found: dict[str, list[Path]] = {}
        for file in sorted(_walk(path), key=lambda file: _natural(file.relative_to(path).as_posix())):
            kind = _format_of(file.name)
            if kind is not None:
                found.setdefault(kind, []).append(file)
        if not found:
            raise DumpError(
                "holds no hidden-state dump files",
                where=shown,
                fix=f"pass the directory data generation wrote ({_PATTERNS})",
            )
        if len(found) > 1:
            kinds = "; ".join(
                f"{len(files)} {kind} (e.g. {files[0].relative_to(path).as_posix()})"
                for kind, files in sorted(found.items())
            )
            raise DumpError(
                f"mixes dump formats: {kinds}",
                where=shown,
                fix="keep one format per directory: move the other files out",
            )
        ((kind, files),) = found.items()
        dumps = DumpSet(path, kind, tuple(files), base, hidden_size, vocabulary)
    if check:
        _read(dumps.files[0], dumps.format, display_path(dumps.files[0], base), hidden_size)
    return dumps


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise DumpError("reading dumps needs torch", fix="pip install 'rca[probes]'") from None
    return torch


def _format_of(name: str) -> str | None:
    if name.endswith((".ckpt", ".ckpt.gz")):
        return "specforge-ckpt"
    if name.endswith(".pt"):
        return "speculators-pt"
    if re.fullmatch(r"hs_\d+\.safetensors", name):
        return "speculators-safetensors"
    if name.endswith(".safetensors"):
        return "safetensors"
    return None


def _walk(directory: Path) -> Iterator[Path]:
    """Every file below `directory` (SpecForge nests its dumps in `rows_<a>-<b>/`), hidden ones aside;
    a link that leads nowhere (broken, or a loop) is refused by name."""
    for root, subdirs, names in os.walk(directory):
        subdirs[:] = [name for name in subdirs if not name.startswith(".")]
        for name in names:
            path = Path(root, name)
            if name.startswith("."):
                continue
            if path.is_symlink() and not path.exists():
                raise DumpError(
                    "is a link that leads nowhere (broken, or a loop)",
                    where=str(path),
                    fix="remove the link or point it at the dump file",
                )
            yield path


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key that puts data_2 before data_10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _head(sample: DumpSample, tokens: int) -> DumpSample:
    return replace(
        sample,
        token_ids=sample.token_ids[:tokens],
        slots=tuple(slot[:tokens] for slot in sample.slots),
        verifier_last=None if sample.verifier_last is None else sample.verifier_last[:tokens],
    )


# -- reading one file ------------------------------------------------------------------------------

Named = tuple[str, Any]  # (where the tensor sits in the file, the tensor)


def _read(file: Path, format: str, shown: str, hidden_size: int | None) -> DumpSample:
    readable(file, "a dump file", _REGENERATE)
    last: Named | None
    if format == "speculators-pt":
        ids, slots, last = _speculators_pt(_load_pickle(file, shown), shown)
    elif format == "specforge-ckpt":
        ids, slots, last = _specforge(_load_pickle(file, shown), shown, hidden_size)
    else:
        ids, slots, last = _safetensors(file, format, shown)
    return _checked(shown, format, ids, slots, last)


# Hidden states compress poorly (a SpecForge .ckpt.gz is about half its size); a file that expands
# far more than that is not a dump, and reading it all would exhaust memory (a gzip bomb).
_MAX_EXPANSION = 20
_MAX_DUMP_BYTES = 16 * 1024 * MIB


def _gunzip(file: Path, shown: str) -> bytes:
    limit = min(max(64 * MIB, _MAX_EXPANSION * file.stat().st_size), _MAX_DUMP_BYTES)
    try:
        with gzip.open(file, "rb") as stream:
            data = stream.read(limit + 1)
    except (OSError, EOFError, zlib.error) as error:
        raise DumpError(f"truncated or corrupt gzip file ({brief(error, 120)})", where=shown, fix=_REGENERATE) from None
    if len(data) > limit:
        raise DumpError(
            f"expands to more than {limit:,} bytes, far beyond a dump of its size (a gzip bomb?)",
            where=shown,
            fix=_REGENERATE,
        )
    return data


def _load_pickle(file: Path, shown: str, mapped: bool = False) -> Any:
    """A torch.save file, unpickling tensors and plain containers only (never code); `mapped`
    memory-maps a file of the zip format, so that tensors not used are never read."""
    torch = _torch()
    source: Any = file
    if file.name.endswith(".gz"):
        source, mapped = io.BytesIO(_gunzip(file, shown)), False
    try:
        if mapped:
            try:
                return torch.load(source, weights_only=True, map_location="cpu", mmap=True)
            except RuntimeError as error:  # the legacy format cannot be mapped: read it whole
                if "mmap" not in str(error):
                    raise
        return torch.load(source, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        text = str(error)
        if "Weights only load failed" not in text:
            raise DumpError(
                f"truncated or corrupt torch.save file ({brief(error, 120)})", where=shown, fix=_REGENERATE
            ) from None
        blocked = re.search(r"GLOBAL ([\w.]+)", text)
        if blocked is None:  # not a pickle of anything: garbage, or a truncated file
            raise DumpError("not a torch.save file (nor a truncated one)", where=shown, fix=_REGENERATE) from None
        what = blocked[1]
        raise DumpError(
            f"refuses to unpickle code: the file pickles {what}",
            where=shown,
            fix="regenerate the dump, or convert it to safetensors where you trust its source",
        ) from None
    except Exception as error:
        raise DumpError(
            f"truncated or corrupt torch.save file ({brief(error, 120)})", where=shown, fix=_REGENERATE
        ) from None


def _entry(data: Any, key: str, shown: str, format: str) -> Any:
    if not isinstance(data, dict):
        raise DumpError(
            f"holds a {type(data).__name__}, not a dict of tensors",
            where=shown,
            fix=f"pass dumps written by {_WRITERS[format]}",
        )
    if key not in data:
        raise _missing(key, map(str, data), shown, format)
    return data[key]


def _missing(key: str, keys: Iterable[str], shown: str, format: str) -> DumpError:
    return DumpError(
        f"has no {key} (it has: {', '.join(keys) or 'nothing'})",
        where=shown,
        fix=f"pass dumps written by {_WRITERS[format]}",
    )


def _tensor(value: Any, name: str, shown: str) -> Any:
    if not isinstance(value, _torch().Tensor):
        raise DumpError(f"{name} is a {type(value).__name__}, not a tensor", where=shown, fix=_REGENERATE)
    return value


def _batchless(tensor: Any, dims: int) -> Any:
    """Drop the leading batch dimension of 1 that SpecForge's generation adds."""
    return tensor[0] if tensor.dim() == dims + 1 and tensor.shape[0] == 1 else tensor


def _speculators_pt(data: Any, shown: str) -> tuple[Any, list[Named], Named]:
    ids = _tensor(_entry(data, "input_ids", shown, "speculators-pt"), "input_ids", shown)
    layers = _entry(data, "hidden_states", shown, "speculators-pt")
    if not isinstance(layers, (list, tuple)):
        raise DumpError(
            f"hidden_states is a {type(layers).__name__}, not a list of [S, H] tensors", where=shown, fix=_REGENERATE
        )
    if len(layers) < 2:
        raise DumpError(
            f"hidden_states holds {len(layers)} layer(s): no slot is left after the verifier's last state",
            where=shown,
            fix="regenerate the dumps capturing the draft's layers and the last layer",
        )
    named = [
        (f"hidden_states[{index}]", _tensor(layer, f"hidden_states[{index}]", shown))
        for index, layer in enumerate(layers)
    ]
    return ids, named[:-1], named[-1]


def _specforge(data: Any, shown: str, hidden_size: int | None) -> tuple[Any, list[Named], Named | None]:
    ids = _tensor(_entry(data, "input_ids", shown, "specforge-ckpt"), "input_ids", shown)
    aux = _batchless(_tensor(_entry(data, "aux_hidden_state", shown, "specforge-ckpt"), "aux_hidden_state", shown), 2)
    last = _batchless(_tensor(data["hidden_state"], "hidden_state", shown), 2) if "hidden_state" in data else None
    for name, tensor in (("aux_hidden_state", aux), ("hidden_state", last)):
        if tensor is not None and tensor.dim() != 2:
            raise DumpError(f"{name} has shape {list(tensor.shape)}, not [1, S, width]", where=shown, fix=_REGENERATE)
    width = int(last.shape[1]) if last is not None else hidden_size
    if width is None:
        raise DumpError(
            "has no hidden_state to give the hidden size that splits aux_hidden_state into slots",
            where=shown,
            fix="pass --target so the hidden size is known",
        )
    if width <= 0 or aux.shape[1] % width:
        source = "hidden_state's" if last is not None else "the target's hidden_size"
        raise DumpError(
            f"aux_hidden_state is {aux.shape[1]} wide, not a multiple of {source} width {width}",
            where=shown,
            fix=_REGENERATE if last is not None else "pass the --target the dumps were captured from",
        )
    slots = [
        (f"aux_hidden_state[..., {index * width}:{(index + 1) * width}]", chunk)
        for index, chunk in enumerate(aux.split(width, dim=-1))
    ]
    return ids, slots, None if last is None else ("hidden_state", last)


def _safetensors(file: Path, format: str, shown: str) -> tuple[Any, list[Named], Named | None]:
    _torch()  # safe_open(..., "pt") fails without it, and the file would be called corrupt
    try:
        from safetensors import safe_open
    except ImportError:
        raise DumpError("reading safetensors dumps needs safetensors", fix="pip install 'rca[probes]'") from None
    wanted = ("hidden_states", "token_ids", "input_ids", "verifier_last")
    try:
        with safe_open(file, "pt") as handle:
            keys = sorted(handle.keys())
            tensors = {key: handle.get_tensor(key) for key in wanted if key in keys}
    except Exception as error:
        raise DumpError(
            f"truncated or corrupt safetensors file ({brief(error, 120)})", where=shown, fix=_REGENERATE
        ) from None
    if "hidden_states" not in tensors:
        raise _missing("hidden_states", keys, shown, format)
    ids_keys = ("token_ids",) if format == "speculators-safetensors" else ("input_ids", "token_ids")
    ids = next((tensors[key] for key in ids_keys if key in tensors), None)
    if ids is None:
        raise _missing(" or ".join(ids_keys), keys, shown, format)
    hidden = tensors["hidden_states"]
    if hidden.dim() != 3:
        raise DumpError(f"hidden_states has shape {list(hidden.shape)}, not [S, n, H]", where=shown, fix=_REGENERATE)
    slots = [(f"hidden_states[:, {index}]", layer) for index, layer in enumerate(hidden.unbind(1))]
    if format == "speculators-safetensors":
        if len(slots) < 2:
            raise DumpError(
                f"hidden_states holds {len(slots)} layer(s): no slot is left after the verifier's last state",
                where=shown,
                fix="regenerate the dumps capturing the draft's layers and the last layer",
            )
        return ids, slots[:-1], slots[-1]
    if not slots:
        raise DumpError("hidden_states holds no slot (shape [S, 0, H])", where=shown, fix=_REGENERATE)
    return ids, slots, ("verifier_last", tensors["verifier_last"]) if "verifier_last" in tensors else None


def _check_ids(low: int, high: int, vocabulary: int | None, shown: str) -> None:
    """Refuse token ids (`low` the least, `high` the largest) no target has: a negative one, one past
    the target's `vocabulary` where it is known."""
    if low < 0:
        raise DumpError(f"token id {low} is negative", where=shown, fix=_REGENERATE)
    if vocabulary is not None and high >= vocabulary:
        raise DumpError(
            f"token id {high:,} is outside the target's vocabulary ({vocabulary:,} tokens)",
            where=shown,
            fix="pass the target the dumps were generated with",
        )


def _checked(shown: str, format: str, ids: Any, slots: list[Named], last: Named | None) -> DumpSample:
    """The checks every format shares: dtypes, one token count, one width, finite values."""
    torch = _torch()
    ids = _batchless(ids, 1)
    if ids.dim() != 1:
        raise DumpError(f"token ids have shape {list(ids.shape)}, not [S]", where=shown, fix=_REGENERATE)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise DumpError(f"token ids are {ids.dtype}, not integers", where=shown, fix=_REGENERATE)
    if len(ids) == 0:
        raise DumpError("the dump holds no tokens", where=shown, fix=_REGENERATE)
    ids = ids.to(torch.int64)  # min() has no kernel for the wider unsigned types
    _check_ids(int(ids.min()), int(ids.max()), None, shown)
    named = [(f"slot {index} ({source})", tensor) for index, (source, tensor) in enumerate(slots)]
    if last is not None:
        named.append((f"the verifier's last state ({last[0]})", last[1]))
    for name, tensor in named:
        if not tensor.dtype.is_floating_point:
            raise DumpError(f"{name} is {tensor.dtype}, not floating point", where=shown, fix=_REGENERATE)
        if tensor.dim() != 2:
            raise DumpError(f"{name} has shape {list(tensor.shape)}, not [S, H]", where=shown, fix=_REGENERATE)
        if tensor.shape[0] != len(ids):
            raise DumpError(
                f"{name} has {tensor.shape[0]} rows but the file has {len(ids)} token ids", where=shown, fix=_REGENERATE
            )
    widths = [int(tensor.shape[1]) for _, tensor in named]
    if len(set(widths)) > 1:
        raise DumpError(
            f"hidden-state widths "
            f"differ: {', '.join(f'{name} is {width}' for (name, _), width in zip(named, widths, strict=True))}",
            where=shown,
            fix=_REGENERATE,
        )
    for name, tensor in named:
        values = tensor.float() if tensor.element_size() == 1 else tensor  # isfinite has no 8-bit float kernel
        bad = tensor.numel() - int(torch.isfinite(values).sum())
        if bad:
            raise DumpError(
                f"{name} has {bad} NaN or Inf value(s)",
                where=shown,
                fix="regenerate the dump; non-finite states usually mean the target overflowed in fp16",
            )
    return DumpSample(shown, format, ids, tuple(tensor for _, tensor in slots), None if last is None else last[1])
