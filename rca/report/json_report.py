"""The `rca.diagnosis/1` JSON object (its fields are documented in the README)."""

from __future__ import annotations

import json

from rca.model import Diagnosis


def render(diagnosis: Diagnosis) -> str:
    return json.dumps(diagnosis.to_json(), indent=2) + "\n"
