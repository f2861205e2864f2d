"""The symbolic evaluator's values, as analyzers meet them: what a name or an expression evaluated
to, with the graph nodes it came from (`Val.src`), and the library of modelled framework code."""

from rca.static.evaluate.interface import BudgetExceeded
from rca.static.evaluate.library import layers
from rca.static.evaluate.library.configs import DRAFT_MODEL_CONFIGS
from rca.static.evaluate.library.tensors import HF_TARGET
from rca.static.evaluate.policy import Assumption
from rca.static.evaluate.values import (
    NONE,
    ConfigObj,
    EnumMember,
    EvalRaise,
    FuncRef,
    MutDict,
    MutList,
    ObjRef,
    Opaque,
    SetVal,
    TensorVal,
    Val,
    describe,
    tap_tensor,
)

__all__ = [
    "DRAFT_MODEL_CONFIGS",
    "HF_TARGET",
    "NONE",
    "Assumption",
    "BudgetExceeded",
    "ConfigObj",
    "EnumMember",
    "EvalRaise",
    "FuncRef",
    "MutDict",
    "MutList",
    "ObjRef",
    "Opaque",
    "SetVal",
    "TensorVal",
    "Val",
    "describe",
    "ints",
    "layers",
    "tap_tensor",
]


def ints(value: Val) -> list[int] | None:
    """The value as a list of ints, when it is a concrete list, tuple or set of ints."""
    payload = value.v
    if isinstance(payload, MutList):
        items = [item.v for item in payload.items]
    elif isinstance(payload, SetVal):
        items = sorted(payload.items, key=repr)
    else:
        return None
    if all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        return items
    return None
