"""The draft's checkpoint as the static checks know it: tensor names, dtypes and shapes, and the
vocab map's values, never the weights themselves (read by `rca.inputs.draft`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DraftTensor:
    """One tensor of the draft's checkpoint, and the file (relative to the draft directory) holding it."""

    name: str
    dtype: str  # safetensors spelling: I64, F16, BF16, ...
    shape: tuple[int, ...]
    file: str


@dataclass(frozen=True)
class DraftWeights:
    """What the static checks know of a draft's checkpoint. `values` holds the vocab maps read
    (flattened), `unreadable` the ones that could not be (name -> why)."""

    directory: str  # as shown to the user
    tensors: Mapping[str, DraftTensor]
    values: Mapping[str, tuple] = field(default_factory=dict)
    unreadable: Mapping[str, str] = field(default_factory=dict)
    bytes_read: int = 0
    total_bytes: int = 0

    def find(self, suffix: str) -> DraftTensor | None:
        """The tensor named `suffix` or ending in `.suffix`, the shortest such name first."""
        names = sorted((name for name in self.tensors if name == suffix or name.endswith("." + suffix)), key=len)
        return self.tensors[names[0]] if names else None

    def shown(self, tensor: DraftTensor) -> str:
        return f"{self.directory.rstrip('/')}/{tensor.file}"
