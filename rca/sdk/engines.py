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
# ... and those of every speculative method that has its own (SGLang's DFlash).
ALL_HANDOFFS = tuple(
    dict.fromkeys(
        [*HANDOFFS, *(name for e in engines().values() for names in e.method_handoffs.values() for name in names)]
    )
)


def handoffs(method: str) -> tuple[str, ...]:
    """The hand-off methods through which engines' runners pass the ids for speculative `method`
    (`spec_method`): the method's own where an engine declares them, else EAGLE-3's."""
    return tuple(dict.fromkeys(name for engine in engines().values() for name in engine.handoffs(method)))


PIPELINE_SETTINGS = tuple(name for engine in engines().values() for name in engine.pipeline_settings)

__all__ = [
    "ALL_HANDOFFS",
    "EAGLE3_NAMES",
    "HANDOFFS",
    "PIPELINE_SETTINGS",
    "build_config",
    "declaration_for",
    "handoffs",
    "holder_of",
    "served_architectures",
    "spec_method",
    "stored_step",
]
