"""Tensor helpers for probes: the target's reference forward pass, cosine tables, citations of the
dumps, and the comparison of a serving capture with training."""

from rca.evidence.compare import UNRELATED, compare
from rca.evidence.probes import cosine_table, dump_citation, mean_cosine, needs_dumps_and_weights
from rca.evidence.reference import ReferenceModel, require_torch

__all__ = [
    "UNRELATED",
    "ReferenceModel",
    "compare",
    "cosine_table",
    "dump_citation",
    "mean_cosine",
    "needs_dumps_and_weights",
    "require_torch",
]
