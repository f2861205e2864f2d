"""What a hidden-state dump directory says about itself (metadata only, no tensors).

speculators' data generation writes `data_config.json` beside the dumps, recording the layer
ids it captured (`hidden_states.layer_ids`). Those are the ids training really used, whatever
the defaults in the code say.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .configs import display_path
from .errors import InputError
from .jsonpos import JsonSyntaxError, loads
from .model import Location, Step

METADATA_FILES = ("data_config.json",)
IDS_PATHS = (("hidden_states", "layer_ids"), ("layer_ids",), ("target_layer_ids",))


@dataclass(frozen=True)
class DumpMetadata:
    ids: tuple[int, ...]
    step: Step


def read_dump_metadata(dumps: Path, base: Path | None = None) -> DumpMetadata | None:
    """The captured layer ids a dump directory records, or None when it records none."""
    if not dumps.exists():
        raise InputError("--dumps path does not exist", where=str(dumps), fix="pass the directory holding the hidden-state dumps")
    if not dumps.is_dir():
        raise InputError("--dumps is not a directory", where=str(dumps), fix="pass the directory holding the hidden-state dumps")
    for name in METADATA_FILES:
        path = dumps / name
        if not path.is_file():
            continue
        try:
            doc = loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise InputError("dump metadata is not UTF-8", where=str(path), fix="restore the data_config.json written by data generation") from None
        except JsonSyntaxError as error:
            raise InputError(f"malformed JSON: {error.message}", where=f"{path}:{error.line}:{error.column}", fix="restore the data_config.json written by data generation") from None
        for key_path in IDS_PATHS:
            node = doc.data
            for key in key_path:
                node = node.get(key) if isinstance(node, dict) else None
            if node is None:
                continue
            if not isinstance(node, list) or not all(isinstance(item, int) and not isinstance(item, bool) for item in node):
                first, _ = doc.line_range(key_path) or (1, 1)
                raise InputError(f"{'.'.join(key_path)} is {node!r}, not a list of layer ids", where=f"{path}:{first}", fix="restore the data_config.json written by data generation")
            first, last = doc.line_range(key_path) or (1, 1)
            location = Location("dumps", display_path(path, base), first, last)
            return DumpMetadata(tuple(node), Step(location, f"the dump records the captured layer ids {node}", doc.source_line(first)))
    return None
