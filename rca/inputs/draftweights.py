"""The draft's checkpoint as the static checks know it: tensor names, dtypes and shapes, and the
vocab map's values, never the weights themselves (read by `rca.inputs.draft`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rca.model import Location, Step, StepKind


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

    def step(self, name: str) -> Step:
        """A citation of one tensor: its file, name, dtype and shape."""
        tensor = self.tensors[name]
        shape = "[" + ", ".join(str(n) for n in tensor.shape) + "]"
        return Step(
            Location("draft", self.shown(tensor), 1, 1), f"tensor {name}: {tensor.dtype} {shape}", kind=StepKind.TENSOR
        )

    def listing(self, missing: str) -> Step:
        """A citation of the checkpoint as a whole, for a tensor it lacks (`missing` says which)."""
        files = sorted({tensor.file for tensor in self.tensors.values()})
        location = Location("draft", f"{self.directory.rstrip('/')}/{files[0] if files else ''}", 1, 1)
        return Step(location, f"{len(self.tensors)} tensors, {missing}", kind=StepKind.TENSOR)
