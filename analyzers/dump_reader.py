"""How a trainer turns the dumped hidden states into the draft's input and the verifier's last state."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ..codeindex import FunctionInfo, walk
from ..engine import SideContext
from ..evaluate.values import FuncRef, MutDict, MutList, Opaque, TensorVal, Val
from ..facts import CapturedTaps, DraftInput, Fact, Finding
from . import Analyzer, Example
from .worker_capture_layers import _FILES, _TARGET

KEY = "hidden_states"

_READER = '''
import torch


def standardize(data):
    return {
        "hidden_states": torch.cat(data["hidden_states"][:-1], dim=-1),
        "input_ids": data["input_ids"],
        "verifier_last_hidden_states": data["hidden_states"][-1],
    }


class SampleDataset:
    def __init__(self, files, standardize_fn=standardize):
        self.standardize_fn = standardize_fn
'''


class DumpReader(Analyzer):
    """Evaluates the trainer's dump reader on the captured list: which slots feed `fc`, which is last.

    ## What it reads
    Functions that take a dump record and return the training batch (speculators'
    `standardize_data_v1`: `cat(hidden_states[:-1])` as the draft input, `hidden_states[-1]` as the
    verifier's last state), evaluated on the tensors the capture analysis found, in capture order.
    A reader used as a parameter default (`standardize_fn=...`) is preferred over others.

    ## Why it matters
    The reader decides which captures are draft slots and which one trains the verifier head; a
    different slice (`[:, :-1]` vs `[:-1]`) or order changes what the draft learned from.
    """

    code = "RCA-T103"
    name = "dump-reader"
    sides = frozenset({"training"})
    anchors = (f'["{KEY}"]',)
    requires = (CapturedTaps,)
    provides = (DraftInput,)

    VALID = (
        Example(
            files={**_FILES, "train/data.py": _READER},
            target=_TARGET,
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            why="the last capture is the verifier's last state, the others are the draft slots",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        captured = ctx.fact(CapturedTaps)
        assert captured is not None
        ev = ctx.evaluator
        for function in self._readers(ctx):
            keys = _subscript_keys(function)
            record = {key: Val(Opaque(key, "", "a field of the dump record")) for key in keys}
            record[KEY] = Val(MutList([Val(tensor, frozenset(captured.sinks)) for tensor in captured.tensors]), frozenset(captured.sinks))
            result = ev.call(Val(FuncRef(function)), [Val(MutDict(record))], {})
            if not isinstance(result.v, MutDict):
                continue
            slots_key, slots = _concat_entry(result.v)
            if slots is None:
                continue
            last_key, last = _single_entry(result.v)
            steps = tuple(function.module.step(element, function.node, note) for element, note in _entries(function, slots_key, last_key))
            sinks = tuple(key for key in result.v.items[slots_key].src) or captured.sinks
            yield DraftInput(
                "training", self.name, function.module.location(function.node, function.node),
                f"{function.qualname}: {slots_key!r} feeds fc" + (f", {last_key!r} is the verifier's last state" if last_key else ""),
                slots=tuple(tap for tap in (item.as_tap() for item in slots.items) if tap is not None),
                verifier_last=last.as_tap() if last is not None else None,
                sinks=sinks, steps=steps,
            )
            return
        ctx.warnings.append("training: no reader that turns the dumped hidden states into the draft input was found")

    def _readers(self, ctx: SideContext) -> list[FunctionInfo]:
        assert ctx.index is not None
        candidates: list[FunctionInfo] = []
        functions: list[FunctionInfo] = []
        for relpath in ctx.anchor_files(self.anchors[0]):
            module = ctx.index.load(relpath)
            if module is None:
                continue
            functions.extend(module.all_functions)
            for function in module.all_functions:
                if function.owner is None and KEY in function.text and _returns_dict(function) and KEY in _subscript_keys(function):
                    candidates.append(function)
        names = {candidate.name for candidate in candidates}
        defaults = {name for function in functions if any(name in function.text for name in names) for name in _parameter_defaults(function)}
        return sorted(candidates, key=lambda function: function.name not in defaults)


def _parameter_defaults(function: FunctionInfo) -> set[str]:
    names = set()
    for param in [*function.node.params.params, *function.node.params.kwonly_params]:
        if isinstance(param.default, cst.Name):
            names.add(param.default.value)
    return names


def _returns_dict(function: FunctionInfo) -> bool:
    return any(isinstance(node, cst.Return) and isinstance(node.value, cst.Dict) for node in walk(function.node.body))


def _subscript_keys(function: FunctionInfo) -> set[str]:
    """String keys the function subscripts its first parameter with (`data["hidden_states"]`)."""
    params = function.node.params.params
    if not params:
        return set()
    name = params[0].name.value
    keys = set()
    for node in walk(function.node.body):
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value == name:
            element = node.slice[0].slice
            if isinstance(element, cst.Index) and isinstance(element.value, cst.SimpleString):
                keys.add(element.value.evaluated_value)
    return keys


def _concat_entry(result: MutDict) -> tuple[str | None, TensorVal | None]:
    for key, value in result.items.items():
        if isinstance(value.v, TensorVal) and value.v.kind in ("concat", "stack"):
            return str(key), value.v
    return None, None


def _single_entry(result: MutDict) -> tuple[str | None, TensorVal | None]:
    singles = [(str(key), value.v) for key, value in result.items.items() if isinstance(value.v, TensorVal) and value.v.as_tap() is not None]
    singles.sort(key=lambda entry: not any(word in entry[0] for word in ("verifier", "last", "target")))
    return singles[0] if singles else (None, None)


def _entries(function: FunctionInfo, slots_key: str | None, last_key: str | None) -> Iterator[tuple[cst.CSTNode, str]]:
    """The dict entries of the reader's return that define the draft input and the last state."""
    for node in walk(function.node.body):
        if isinstance(node, cst.DictElement) and isinstance(node.key, cst.SimpleString):
            key = node.key.evaluated_value
            if key == slots_key:
                yield node, f"{key!r} (the draft's fc input) is built here"
            elif key == last_key:
                yield node, f"{key!r} (the verifier's last hidden state) is taken here"
