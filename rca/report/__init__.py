"""Renderers of a diagnosis, one module per format, registered by name."""

from __future__ import annotations

from typing import Callable

from ..model import Diagnosis
from . import json_report, markdown, sarif, text

RENDERERS: dict[str, Callable[[Diagnosis], str]] = {
    "text": text.render,
    "json": json_report.render,
    "markdown": markdown.render,
    "sarif": sarif.render,
}
