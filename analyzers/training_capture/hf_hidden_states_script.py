"""Which HF `output_hidden_states` entries a plain training script feeds the draft."""

from __future__ import annotations

from collections.abc import Iterator

from rca.sdk import Analyzer, CaptureSet, DraftInput, Example, Fact, Finding, SideContext
from rca.sdk.code import call_step, dotted_name, iter_calls
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.values import MutList, TensorVal

CONCATENATIONS = ("torch.cat", "torch.concat", "torch.concatenate")

_SCRIPT = """
import torch
from transformers import AutoModelForCausalLM


def main():
    target = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
    for batch in loader:
        outputs = target(input_ids=batch["input_ids"], output_hidden_states=True)
        hs = outputs.hidden_states
        features = torch.cat([hs[{a}], hs[{b}], hs[{c}]], dim=-1)
        loss = draft(features, batch["input_ids"])


if __name__ == "__main__":
    main()
"""
_TRAINER = """
import torch


class OnlineEagle3Model:
    def __init__(self, target_model, draft_model):
        self.target_model = target_model
        self.draft_model = draft_model

    def _prepare_data(self, input_ids, attention_mask):
        outputs = self.target_model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        num_layers = len(outputs.hidden_states) - 1
        low, mid, high = 1 + 1, num_layers // 2 - 1 + 1, num_layers - 4 + 1
        return torch.cat((outputs.hidden_states[low], outputs.hidden_states[mid], outputs.hidden_states[high]), dim=-1)
"""


class HfHiddenStatesScript(Analyzer):
    """Evaluates a training script that indexes HF `output_hidden_states` to build the draft input.

    ## What it reads
    The script as `python script.py` would run it: the target loaded with transformers, the
    forward with `output_hidden_states=True`, and the indices concatenated for the draft. Without
    such a script, a trainer's method that calls the target it holds with `output_hidden_states`
    and concatenates entries (online training, SpecForge 0.1), run up to the concatenation.
    HF's tuple is (h0, h1, ..., hN-1, hN+norm): index 0 is the embedding output and the last
    entry is taken after the final norm.

    ## Why it matters
    `hidden_states[k]` is the output of layer k-1, so a script written with 0-based layer
    numbers is one layer early, and `hidden_states[-1]` is post-norm where engines capture pre-norm.
    """

    code = "RCA-T104"
    name = "hf-hidden-states-script"
    sides = frozenset({"training"})
    anchors = ("output_hidden_states",)
    provides = (DraftInput,)
    precedence = 10

    VALID = (
        Example(
            files={"train_eagle3.py": _SCRIPT.format(a=2, b=16, c=29)},
            target=LLAMA_8B_TARGET,
            slots=("h2", "h16", "h29"),
        ),
        Example(
            files={"train_eagle3.py": _SCRIPT.format(a=3, b=17, c=-1)},
            target=LLAMA_8B_TARGET,
            slots=("h3", "h17", "h32+norm"),
            why="the last entry is post-norm",
        ),
        Example(
            files={"core/eagle3.py": _TRAINER},
            target=LLAMA_8B_TARGET,
            slots=("h2", "h16", "h29"),
            why="online training: a trainer method runs the target it was handed",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.fact(CaptureSet) is None and super().applies_to(ctx)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.index is not None
        ev = ctx.evaluator
        files = [
            module
            for relpath in ctx.anchor_files(self.anchors[0])
            if (module := ctx.index.load(relpath)) is not None and "torch.cat" in module.text
        ]
        for module in files:
            with ev.trace() as trace:
                ev.run_script(module)
            inputs = [value for value in trace.concats if all(item.as_tap() is not None for item in value.v.items)]
            if not inputs:
                continue
            chosen = inputs[-1]
            tensor: TensorVal = chosen.v
            location = next((key.location for key in chosen.src), module.location(module.tree, module.tree))
            yield DraftInput(
                "training",
                self.name,
                location,
                "draft input = concatenation of HF output_hidden_states entries",
                slots=tuple(tap for item in tensor.items if (tap := item.as_tap()) is not None),  # all are
                verifier_last=None,
                sinks=tuple(chosen.src),
            )
            return
        for module in files:  # a trainer's method that runs the target itself (online training)
            for function in module.all_functions:
                if "output_hidden_states" not in function.text or "torch.cat" not in function.text:
                    continue
                for call in iter_calls(function.node.body):
                    if dotted_name(call.func) not in CONCATENATIONS or not call.args:
                        continue
                    receiver = ev.new_object(function.owner) if function.owner is not None else None
                    result = ev.run_to(function, call, receiver)
                    if not result.reached or not result.args or not result.args[0]:
                        continue
                    value = result.args[0][0]
                    items = [item.v for item in value.v.items] if isinstance(value.v, MutList) else []
                    if not items or not all(
                        isinstance(item, TensorVal) and item.as_tap() is not None for item in items
                    ):
                        continue
                    step, key = call_step(
                        ctx,
                        module,
                        function,
                        call,
                        "concatenates the target's hidden states into the draft's input",
                        value,
                    )
                    ctx.graph.observe(key, ", ".join(item.describe() for item in items))
                    yield DraftInput(
                        "training",
                        self.name,
                        step.location,
                        f"{function.qualname}: draft input = concatenation of HF output_hidden_states entries",
                        slots=tuple(item.as_tap() for item in items),
                        verifier_last=None,
                        sinks=(key,),
                    )
                    return
