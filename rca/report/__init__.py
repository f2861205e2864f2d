"""Renderers of a diagnosis, one module per format, registered by name.

A renderer's module is imported when its format is asked for: a run prints one format, and each
imports what it alone needs (SARIF the hypothesis catalog, Markdown the diagrams).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping

from rca.model import Diagnosis

_MODULES = {"text": "text", "json": "json_report", "markdown": "markdown", "sarif": "sarif"}


class _Renderers(Mapping[str, Callable[[Diagnosis], str]]):
    """format name -> render(diagnosis), importing the format's module on first use."""

    def __getitem__(self, name: str) -> Callable[[Diagnosis], str]:
        module = _MODULES[name]
        return importlib.import_module(f"rca.report.{module}").render  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        return iter(_MODULES)

    def __len__(self) -> int:
        return len(_MODULES)


RENDERERS: Mapping[str, Callable[[Diagnosis], str]] = _Renderers()
