"""Renderers of a diagnosis, one module per format, registered by name."""

from __future__ import annotations

from collections.abc import Callable

from rca.model import Diagnosis
from rca.report import json_report, markdown, sarif, text

RENDERERS: dict[str, Callable[[Diagnosis], str]] = {
    "text": text.render,
    "json": json_report.render,
    "markdown": markdown.render,
    "sarif": sarif.render,
}
