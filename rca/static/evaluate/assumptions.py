"""Deployment assumptions used when analyzed code asks about runtime state it cannot see.

The analysis follows one path through the code: the one rank 0 of a single pipeline stage
takes with optional runtime features off. When a condition depends on such state, the value
below is used, and the evaluator records the assumption (with its location) so that every
result can be read together with what was assumed. Anything not listed here that is unknown
is taken as false ("feature off") and recorded the same way.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Assumption:
    value: object  # a constant, or "num_layers" for the target's decoder-layer count
    why: str


# Keyed by the attribute or function name the unknown value was reached through.
BY_NAME: dict[str, Assumption] = {
    "is_first_rank": Assumption(True, "a single pipeline-parallel stage (first and last rank)"),
    "is_last_rank": Assumption(True, "a single pipeline-parallel stage (first and last rank)"),
    "rank_in_group": Assumption(0, "the view of tensor-parallel rank 0"),
    "tp_rank": Assumption(0, "the view of tensor-parallel rank 0"),
    "local_rank": Assumption(0, "the view of tensor-parallel rank 0"),
    "start_layer": Assumption(0, "a single pipeline stage holds every decoder layer"),
    "end_layer": Assumption("num_layers", "a single pipeline stage holds every decoder layer"),
    "is_eagle3": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    "speculative_config": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    "draft_model_config": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    "use_aux_hidden_state_outputs": Assumption(True, "the deployment serves an EAGLE-3 draft"),
    # A training run's own override of the capture layers (SpecForge's model.aux_hidden_state_layer_ids):
    # run settings are not an input, so the trainer's documented fallbacks decide.
    "aux_hidden_state_layer_ids": Assumption(None, "no run setting overrides the capture layers"),
}

# Names whose unknown value is a stack of the target's decoder layers.
LAYER_STACKS = frozenset({"layers", "h", "blocks", "decoder_layers"})
