"""What analyzers know of how engines build a draft's config and hand it the target's layers: the
config builders they model, the draft architectures an engine serves, and the hand-off methods
through which a runner passes the layer ids to the target model."""

from rca.knowledge import engines
from rca.static.builders import (
    build_config,
    declaration_for,
    holder_of,
    served_architectures,
    spec_method,
    stored_step,
)
from rca.static.wiring import EAGLE3_NAMES

# The calls through which a serving runner hands the layer ids to the target model, and the launch
# settings that split the target into pipeline stages: every engine's (knowledge/engines/*.toml).
HANDOFFS = tuple(name for engine in engines().values() for name in engine.layer_handoffs)
PIPELINE_SETTINGS = tuple(name for engine in engines().values() for name in engine.pipeline_settings)

__all__ = [
    "EAGLE3_NAMES",
    "HANDOFFS",
    "PIPELINE_SETTINGS",
    "build_config",
    "declaration_for",
    "holder_of",
    "served_architectures",
    "spec_method",
    "stored_step",
]
