"""Inputs: what a diagnosis reads, as the user named it, and the readers of each kind.

`Inputs` (here) names them; it is kept apart from the analysis so that a remembered result can be
found without loading the analyzers. The submodules read them: source trees and releases
(`sources`), patches (`patching`), configs with their line positions (`configs`, `jsonpos`), the
serving launch command (`launch`), dump directories (`dumps`) and safetensors checkpoints
(`checkpoint`), and the draft with its weights (`draft`, `draftweights`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class Inputs:
    """What a diagnosis reads. Relative paths are taken from `base` (a case directory) if given."""

    serving: str | None = None
    serving_patch: str | None = None
    training: str | None = None
    training_patch: str | None = None
    serving_args: str | None = None  # the serving engine's launch command: a file holding it, or its flags
    training_args: str | None = None  # how training data was rendered: the trainer's command, flags or run config
    training_engine: str | None = None  # the engine that captured the training hidden states (vllm==X, sglang==Y)
    dumps: str | None = None
    draft: str | None = None
    target: str | None = None
    parent_draft: str | None = None  # the draft this one was fine-tuned from (its directory with the checkpoint)
    # the draft config as training recorded it, where the one served was edited since (rca diff: the
    # config before the change): what the draft learned is read from it, what is served from `draft`
    trained_draft: str | None = None
    base: Path | None = None

    def path(self, value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() or self.base is None else self.base / path

    def with_values(self, values: Mapping[str, str]) -> Inputs:
        """These inputs with the named ones set (from the command line, a launch, a repository)."""
        named = {f.name for f in fields(self) if f.name != "base"}
        unknown = set(values) - named
        if unknown:
            raise TypeError(f"no such input: {', '.join(sorted(unknown))}")
        return replace(self, **values)  # type: ignore[arg-type]  # each a str field, checked above

    def as_dict(self) -> dict[str, str]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "base" and getattr(self, f.name) is not None
        }
