"""How a trainer turns the dumped hidden states into the draft's input and the verifier's last state."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from rca.sdk import Analyzer, CapturedTaps, DraftInput, Example, Fact, Finding, SideContext
from rca.sdk.code import FunctionInfo, walk
from rca.sdk.examples import DATA_GENERATOR_FILES, DUMP_READER, LLAMA_8B_TARGET
from rca.sdk.values import MutDict, MutList, Opaque, TensorVal, Val

KEY = "hidden_states"


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
    precedence = 40

    VALID = (
        Example(
            files={**DATA_GENERATOR_FILES, "train/data.py": DUMP_READER},
            target=LLAMA_8B_TARGET,
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            why="the last capture is the verifier's last state, the others are the draft slots",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        captured = ctx.fact(CapturedTaps)
        assert captured is not None
        ev = ctx.evaluator
        tensors = [Val(tensor, frozenset(captured.sinks)) for tensor in captured.tensors]
        dumped = (
            Val(TensorVal("stack", items=captured.tensors, dim=1), frozenset(captured.sinks))
            if captured.stacked
            else Val(MutList(tensors), frozenset(captured.sinks))
        )
        for function, record_name, returned in self._readers(ctx, captured.stacked):
            record = {
                key: Val(Opaque(key, "", "a field of the dump record"))
                for key in _subscript_keys(function, record_name)
            }
            record[KEY] = dumped
            receiver = ev.new_object(function.owner) if function.owner is not None else None
            result = MutDict(
                {
                    element.key.evaluated_value: ev.evaluate(
                        function, element.value, {record_name: Val(MutDict(record))}, receiver
                    )
                    for element in returned.elements
                    if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
                }
            )
            slots_key, slots = _concat_entry(result)
            if slots is None:
                continue
            last_key, last = _single_entry(result)
            steps = tuple(
                function.module.step(element, function.node, note)
                for element, note in _entries(function, slots_key, last_key)
            )
            sinks = tuple(key for key in result.items[slots_key].src) or captured.sinks
            yield DraftInput(
                "training",
                self.name,
                function.module.location(function.node, function.node),
                f"{function.qualname}: {slots_key!r} feeds fc"
                + (f", {last_key!r} is the verifier's last state" if last_key else ""),
                slots=tuple(tap for tap in (item.as_tap() for item in slots.items) if tap is not None),
                verifier_last=last.as_tap() if last is not None else None,
                sinks=sinks,
                steps=steps,
            )
            return
        ctx.note("no reader that turns the dumped hidden states into the draft input was found")

    def _readers(self, ctx: SideContext, stacked: bool) -> list[tuple[FunctionInfo, str, cst.Dict]]:
        """Functions returning a dict literal built from `<record>["hidden_states"]`: those that
        index the dump the way it is laid out first (`[:, :-1]` for a stacked tensor, `[:-1]` for
        a list), then readers other code names as a default (`standardize_fn=...`)."""
        assert ctx.index is not None
        candidates: list[tuple[FunctionInfo, str, cst.Dict]] = []
        functions: list[FunctionInfo] = []
        for relpath in ctx.anchor_files(self.anchors[0]):
            module = ctx.index.load(relpath)
            if module is None:
                continue
            functions.extend(module.all_functions)
            for function in module.all_functions:
                if KEY not in function.text:
                    continue
                returned = _returned_dict(function)
                record_name = _record_name(returned) if returned is not None else None
                if returned is not None and record_name is not None:
                    candidates.append((function, record_name, returned))
        names = {candidate[0].name for candidate in candidates}
        defaults = {
            name
            for function in functions
            if any(name in function.text for name in names)
            for name in _parameter_defaults(function)
        }
        return sorted(
            candidates, key=lambda entry: (_indexes_stack(entry[2], entry[1]) != stacked, entry[0].name not in defaults)
        )


def _parameter_defaults(function: FunctionInfo) -> set[str]:
    names = set()
    for param in [*function.node.params.params, *function.node.params.kwonly_params]:
        if isinstance(param.default, cst.Name):
            names.add(param.default.value)
    return names


def _returned_dict(function: FunctionInfo) -> cst.Dict | None:
    """The dict literal the function returns with a "hidden_states" entry."""
    for node in walk(function.node.body):
        if isinstance(node, cst.Return) and isinstance(node.value, cst.Dict):
            keys = {
                element.key.evaluated_value
                for element in node.value.elements
                if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
            }
            if KEY in keys:
                return node.value
    return None


def _record_subscripts(node: cst.CSTNode) -> Iterator[cst.Subscript]:
    """`<name>["hidden_states"]` subscripts under `node`."""
    for current in walk(node):
        if isinstance(current, cst.Subscript) and isinstance(current.value, cst.Name) and len(current.slice) == 1:
            index = current.slice[0].slice
            if (
                isinstance(index, cst.Index)
                and isinstance(index.value, cst.SimpleString)
                and index.value.evaluated_value == KEY
            ):
                yield current


def _record_name(returned: cst.Dict) -> str | None:
    """The name of the dump record the returned dict reads its hidden states from."""
    for subscript in _record_subscripts(returned):
        return subscript.value.value  # type: ignore[attr-defined]
    return None


def _indexes_stack(returned: cst.Dict, record_name: str) -> bool:
    """Whether the record's hidden states are indexed as a [tokens, layers, hidden] tensor
    (`[:, :-1]`, two indices) rather than as a list of per-layer tensors."""
    for current in walk(returned):
        if isinstance(current, cst.Subscript) and any(
            current.value is subscript for subscript in _record_subscripts(returned)
        ):
            return len(current.slice) == 2
    return False


def _subscript_keys(function: FunctionInfo, record_name: str) -> set[str]:
    """String keys the function subscripts the record with (`data["input_ids"]`)."""
    keys: set[str] = set()
    for node in walk(function.node.body):
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value == record_name:
            element = node.slice[0].slice
            if isinstance(element, cst.Index) and isinstance(element.value, cst.SimpleString):
                key = element.value.evaluated_value
                if isinstance(key, str):  # not a bytes literal
                    keys.add(key)
    return keys


def _concat_entry(result: MutDict) -> tuple[str | None, TensorVal | None]:
    for key, value in result.items.items():
        if isinstance(value.v, TensorVal) and value.v.kind in ("concat", "stack"):
            return str(key), value.v
    return None, None


def _single_entry(result: MutDict) -> tuple[str | None, TensorVal | None]:
    singles = [
        (str(key), value.v)
        for key, value in result.items.items()
        if isinstance(value.v, TensorVal) and value.v.as_tap() is not None
    ]
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
