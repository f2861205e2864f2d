"""How the serving engine turns the captured hidden states into the draft's input: the concatenation."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from rca.sdk import Analyzer, CapturedTaps, CaptureSet, DraftInput, Example, Fact, Finding, Reports, SideContext, Tap
from rca.sdk.code import FunctionInfo, ModuleInfo, call_name, call_step, dotted_name, iter_calls
from rca.sdk.examples import CAPTURE_BEFORE, DRAFT_IDS_0_3_5, LOOP_MODEL, SGLANG_RUNNER, SMALL_TARGET

_LOGITS = """
import torch


class LogitsProcessor(nn.Module):
    def forward(self, input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states=None):
        if aux_hidden_states is not None:
            aux_hidden_states = torch.cat({order}, dim=-1)
            hidden_states_to_store = aux_hidden_states
        return hidden_states_to_store
"""
_FILES = {
    "runner.py": SGLANG_RUNNER,
    "model.py": LOOP_MODEL.format(capture_before=CAPTURE_BEFORE, capture_after="pass"),
}
_RUNNER_CONCAT = """

    def propose_draft(self, aux_hidden_states, n):
        return self.drafter.propose(torch.cat([h[:n] for h in aux_hidden_states], dim=-1))
"""
_OTHER_MODEL = """
class OtherModel(nn.Module):
    def forward(self, hidden_states, aux_hidden_states):
        packed = torch.cat([hidden_states, *aux_hidden_states], dim=-1)
        return torch.cat(list(reversed(aux_hidden_states)), dim=-1)
"""
ORDER_CHANGING = frozenset({"sorted", "reversed"})


class AuxConcat(Analyzer):
    """Finds where the captured aux hidden states are concatenated into the draft's fc input.

    ## What it reads
    `torch.cat(aux_hidden_states, dim=-1)` (SGLang's logits processor) or a concatenation of a
    comprehension over the list (`torch.cat([h[:n] for h in aux_hidden_states], dim=-1)`, vLLM's
    model runner): the slots follow the capture order (ascending layers, since the capture happens
    inside the layer loop), unless the list is sorted or reversed on the way. A concatenation that
    mixes other tensors in (`torch.cat([hidden_states, *aux_hidden_states])`, packing for a
    collective) is not the draft's input. Among several, the one in the file that hands the ids
    to the model comes first, then those outside model definitions.

    ## Finding
    `slot-order-changed`: the concatenation reorders the captured states, so the draft's slots
    are not in capture order. Evidence for `slot-order`.
    """

    code = "RCA-S103"
    name = "aux-concat"
    sides = frozenset({"serving"})
    anchors = ("aux_hidden_states",)
    requires = (CapturedTaps,)
    provides = (DraftInput,)
    precedence = 10
    reports = (Reports("slot-order-changed", hypothesis="slot-order"),)

    VALID = (
        Example(
            files={**_FILES, "logits_processor.py": _LOGITS.format(order="aux_hidden_states")},
            target=SMALL_TARGET,
            draft=DRAFT_IDS_0_3_5,
            slots=("h1", "h4", "h6"),
        ),
        Example(
            files={**_FILES, "runner.py": SGLANG_RUNNER + _RUNNER_CONCAT, "models/other.py": _OTHER_MODEL},
            target=SMALL_TARGET,
            draft=DRAFT_IDS_0_3_5,
            slots=("h1", "h4", "h6"),
            why="the runner that hands over the ids concatenates them; another model's concatenations are not this "
            "draft's input",
        ),
    )
    INVALID = (
        Example(
            files={**_FILES, "logits_processor.py": _LOGITS.format(order="list(reversed(aux_hidden_states))")},
            target=SMALL_TARGET,
            draft=DRAFT_IDS_0_3_5,
            slots=("h6", "h4", "h1"),
            finding="slot-order-changed",
            message=(
                "the captured states are passed through reversed before the concatenation, so slot order differs "
                "from capture order"
            ),
            path="logits_processor.py",
            line=8,
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        captured = ctx.fact(CapturedTaps)
        assert captured is not None and ctx.index is not None
        for module, function, call in aux_concatenations(ctx):
            wrappers = _wrappers(call.args[0].value)
            slots = list(captured.taps)
            for wrapper in reversed(wrappers):  # innermost first
                slots = list(reversed(slots)) if wrapper == "reversed" else sorted(slots, key=_layer)
            if any(slot is None for slot in slots):
                ctx.note(
                    f"a captured tensor could not be named as a tap "
                    f"({', '.join(t.describe() for t in captured.tensors)})"
                )
            step, key = call_step(
                ctx, module, function, call, "concatenates the captured states into the draft's fc input"
            )
            ctx.graph.flow(captured.sinks, key)
            ctx.graph.observe(key, ", ".join(str(slot) for slot in slots))
            if wrappers:
                yield self.finding(
                    ctx,
                    "slot-order-changed",
                    f"the captured states are passed through {' and '.join(wrappers)} before the concatenation, so "
                    f"slot order differs from capture order",
                    step.location,
                    likelihood_ratio=10.0,
                    steps=(step,),
                )
            yield DraftInput(
                "serving",
                self.name,
                step.location,
                "fc input = concatenation of the captured states",
                slots=tuple(slot for slot in slots if slot is not None),
                verifier_last=None,
                sinks=(key,),
                steps=(step,),
            )
            return
        ctx.note("no concatenation of the captured aux hidden states was found; slots are taken in capture order")
        yield DraftInput(
            "serving",
            self.name,
            captured.location,
            "slots in capture order (no concatenation found)",
            slots=tuple(tap for tap in captured.taps if tap is not None),
            verifier_last=None,
            sinks=captured.sinks,
        )


_COMBINED = re.compile(r"combine_hidden_states\(\s*torch\.cat\(")
_TESTS_EAGLE3 = re.compile(r"""==\s*["']eagle3["']""")


def aux_concatenations(ctx: SideContext) -> Iterator[tuple[ModuleInfo, FunctionInfo, cst.Call]]:
    """Concatenations of the aux list alone, best candidate first: files are visited in order
    of preference and parsed only until one is found."""
    assert ctx.index is not None
    capture = ctx.fact(CaptureSet)
    handoff = capture.delivery.location.path if capture is not None and capture.delivery is not None else None
    captured = ctx.fact(CapturedTaps)
    capturing = captured.location.path if captured is not None else None  # a forward that concatenates its own
    files = ctx.tree.grep_in("torch.cat(", ctx.anchor_files("aux_hidden_states"))

    def preference(relpath: str) -> tuple:
        # a concatenation handed straight to a draft's fc (`combine_hidden_states(torch.cat(...))`), in
        # code that tests for the EAGLE-3 method (not another method's speculator)
        text = ctx.tree.read(relpath) or ""
        combined = _COMBINED.search(text) is not None
        eagle3 = _TESTS_EAGLE3.search(text) is not None
        return (
            relpath != handoff,
            relpath != capturing,
            not combined,
            not eagle3,
            "/models/" in f"/{relpath}",
            relpath,
        )

    for relpath in sorted(files, key=preference):
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if "torch.cat" not in function.text:
                continue
            for call in iter_calls(function.node.body):
                if (
                    dotted_name(call.func) in ("torch.cat", "torch.concat", "torch.concatenate")
                    and call.args
                    and _only_aux(call.args[0].value)
                ):
                    yield module, function, call


def _is_aux_name(node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute)) and "aux" in (
        node.attr.value if isinstance(node, cst.Attribute) else node.value
    )


def _only_aux(node: cst.CSTNode) -> bool:
    """The argument is the aux list itself, possibly reordered, sliced per element by a
    comprehension, or unpacked alone into a list."""
    while isinstance(node, cst.Call) and node.args:
        node = node.args[0].value
    if _is_aux_name(node):
        return True
    if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
        return _is_aux_name(node.for_in.iter) and node.for_in.inner_for_in is None
    if isinstance(node, (cst.List, cst.Tuple)) and node.elements:
        return all(isinstance(element, cst.StarredElement) and _is_aux_name(element.value) for element in node.elements)
    return False


def _layer(tap: Tap | None) -> int:
    return tap.layer if tap is not None and tap.layer is not None else -1


def _wrappers(node: cst.CSTNode) -> list[str]:
    """Order-changing calls around the list (`sorted(...)`, `reversed(...)`), outermost first."""
    found: list[str] = []
    while isinstance(node, cst.Call):
        name = call_name(node)
        if name in ORDER_CHANGING:
            found.append(name)
        if not node.args:
            break
        node = node.args[0].value
    return found
