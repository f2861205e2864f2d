"""What analyzers know of how engines build a draft's config and hand it the target's layers: the
config builders they model, the draft architectures an engine serves, and the hand-off methods
through which a runner passes the layer ids to the target model."""

from rca.static.builders import (
    SPEC_METHOD,
    build_config,
    declaration_for,
    holder_of,
    served_architectures,
    stored_step,
)
from rca.static.wiring import EAGLE3_NAMES

# The calls through which a serving runner hands the layer ids to the target model: SGLang's,
# and vLLM's (which the model's own default feeds when the draft config names no ids).
HANDOFFS = ("set_eagle3_layers_to_capture", "set_aux_hidden_state_layers")

__all__ = [
    "EAGLE3_NAMES",
    "HANDOFFS",
    "SPEC_METHOD",
    "build_config",
    "declaration_for",
    "holder_of",
    "served_architectures",
    "stored_step",
]
