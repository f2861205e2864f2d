"""Which HF `output_hidden_states` entries a plain training script feeds the draft."""

from __future__ import annotations

from typing import Iterator

from ..engine import SideContext
from ..evaluate.values import TensorVal
from ..facts import CaptureSet, DraftInput, Fact, Finding
from . import Analyzer, Example

_SCRIPT = '''
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
'''
_TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}


class HfHiddenStatesScript(Analyzer):
    """Evaluates a training script that indexes HF `output_hidden_states` to build the draft input.

    ## What it reads
    The script as `python script.py` would run it: the target loaded with transformers, the
    forward with `output_hidden_states=True`, and the indices concatenated for the draft.
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

    VALID = (
        Example(files={"train_eagle3.py": _SCRIPT.format(a=2, b=16, c=29)}, target=_TARGET, slots=("h2", "h16", "h29")),
        Example(files={"train_eagle3.py": _SCRIPT.format(a=3, b=17, c=-1)}, target=_TARGET, slots=("h3", "h17", "h32+norm"), why="the last entry is post-norm"),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.fact(CaptureSet) is None and super().applies_to(ctx)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.index is not None
        ev = ctx.evaluator
        for relpath in ctx.anchor_files(self.anchors[0]):
            module = ctx.index.load(relpath)
            if module is None or "torch.cat" not in module.text:
                continue
            before = len(ev.concats)
            ev.run_script(module)
            inputs = [value for value in ev.concats[before:] if all(item.as_tap() is not None for item in value.v.items)]
            if not inputs:
                continue
            chosen = inputs[-1]
            tensor: TensorVal = chosen.v
            location = next((key.location for key in chosen.src), module.location(module.tree, module.tree))
            yield DraftInput(
                "training", self.name, location, "draft input = concatenation of HF output_hidden_states entries",
                slots=tuple(item.as_tap() for item in tensor.items), verifier_last=None, sinks=tuple(chosen.src),
            )
            return
