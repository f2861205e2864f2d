"""Which layers SGLang's target captures for the draft, read from the runner and the model file."""

from __future__ import annotations

from typing import Iterator

from ..engine import SideContext
from ..evaluate.values import ConfigObj, ObjRef, Opaque, Val, describe
from ..facts import CaptureSet, Fact, Finding
from ..model import Confidence
from . import Analyzer, Example
from ._support import call_step, calls_named, ints, store_location

METHOD = "set_eagle3_layers_to_capture"

_RUNNER = '''
class ModelRunner:
    def __init__(self, server_args):
        self.eagle_aux_hidden_state_layer_ids = None
        if self.spec_algorithm.is_eagle3():
            draft_model_config = self._build_model_config(server_args, is_draft_model=True)
            try:
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                self.eagle_aux_hidden_state_layer_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                self.eagle_aux_hidden_state_layer_ids = None

    def init_aux_hidden_state_capture(self):
        self.model.set_eagle3_layers_to_capture(self.eagle_aux_hidden_state_layer_ids)
'''

_LLAMA = '''
class LlamaModel(nn.Module):
    def __init__(self, config):
        self.layers = make_layers(config.num_hidden_layers)
        self.layers_to_capture = []

    def forward(self, input_ids, positions, input_embeds=None):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            layer = self.layers[i]
            hidden_states, residual = layer(positions, hidden_states, residual)
        return hidden_states, aux_hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix=""):
        self.config = config
        self.model = LlamaModel(config)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
'''

_LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}


class SglangCaptureLayers(Analyzer):
    """Reads where SGLang's runner takes the layer ids and what the target model makes of them.

    ## What it reads
    The call that hands the draft's layer ids to the target (`model.set_eagle3_layers_to_capture(ids)`),
    the code that produced `ids` (the draft-config read and its fallback), and the target class's
    `set_eagle3_layers_to_capture` (default list, `+1` transform, any special case a user added).

    ## Why it matters
    SGLang reads only `eagle_config.eagle_aux_hidden_state_layer_ids`, inside an `except` that
    silently falls back to the model's defaults; the `+1` (conditional in some model files) shifts
    every id by one layer relative to other engines.

    ## Finding
    `layer-ids-not-read`: the draft config's ids are not where the runner reads them, so the
    target captures its default layers. Evidence for `config-ignored`.
    """

    code = "RCA-S101"
    name = "sglang-capture-layers"
    sides = frozenset({"serving"})
    anchors = (METHOD, "eagle_aux_hidden_state_layer_ids")  # the hand-off, and the readers of the key
    provides = (CaptureSet,)

    VALID = (
        Example(
            files={"sglang/srt/model_executor/model_runner.py": _RUNNER, "sglang/srt/models/llama.py": _LLAMA},
            target=_LLAMA_CONFIG,
            draft={"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}},
            captured=("h2", "h16", "h29"),
            why="config ids k are captured at the entry of layer k+1: h(k+1)",
        ),
        Example(
            files={
                "sglang/srt/model_executor/model_runner.py": _RUNNER,
                "sglang/srt/models/llama.py": _LLAMA.replace(
                    "self.model.layers_to_capture = [val + 1 for val in layer_ids]",
                    "self.model.layers_to_capture = shift(layer_ids)",
                )
                + "\n\ndef shift(ids):\n    out = []\n    for i in ids:\n        out.append(i + 1)\n    return out\n",
            },
            target=_LLAMA_CONFIG,
            draft={"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}},
            captured=("h2", "h16", "h29"),
            why="the +1 moved into a helper function reads the same",
        ),
    )
    INVALID = (
        Example(
            files={"sglang/srt/model_executor/model_runner.py": _RUNNER, "sglang/srt/models/llama.py": _LLAMA},
            target=_LLAMA_CONFIG,
            draft={"architectures": ["LlamaForCausalLMEagle3"], "eagle_aux_hidden_state_layer_ids": [2, 16, 29]},
            captured=("h2", "h16", "h29"),
            finding="layer-ids-not-read",
            path="sglang/srt/model_executor/model_runner.py",
            line=10,
            why="ids at the top level are not read; the bare except falls back to the defaults",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        ev = ctx.evaluator
        target_class = _target_class(ctx)
        if target_class is None:
            ctx.warnings.append(
                f"serving: no class for the target architecture {', '.join(ctx.target.architectures) or '(none declared)'} in {ctx.tree.label}"
            )
            return
        for function, call in calls_named(ctx, METHOD, outside_definitions=True):
            if function.owner is not None and METHOD in function.owner.methods:
                continue  # a model delegating to its language model, not the runner
            if not call.args:
                continue
            handled_before = len(ev.handled)
            result = ev.run_to_call(function, call, Val(ObjRef(function.owner)) if function.owner else None)
            if not result.reached or result.args is None or not result.args[0]:
                ctx.warnings.append(f"serving: the call at {function.module.location(call, function.node)} was not reached: {result.reason}")
                continue
            ids = result.args[0][0]
            delivery, delivery_key = call_step(ctx, function.module, function, call, "hands the layer ids to the target model", ids)
            ids = Val(ids.v, frozenset({delivery_key}))
            handled = ev.handled[handled_before:]
            yield from self._fallbacks(ctx, handled)
            keys = ctx.graph.keypaths(ids.src) + [path for event in handled for path in ctx.graph.keypaths(event.sources)]
            target = ev.new_object(target_class, [], {"config": Val(ConfigObj(ctx.target.config))})
            method = ev.field(target, METHOD)
            if isinstance(method.v, Opaque):
                ctx.warnings.append(f"serving: {target_class.name} has no {METHOD}: this SGLang cannot capture hidden states for an EAGLE-3 draft on this target")
                return
            stores_before = len(ev.stores)
            ev.call(method, [ids], {}, call, None)
            capture = _capture_store(ev.stores[stores_before:])
            if capture is None:
                ctx.warnings.append(f"serving: {target_class.name}.{METHOD} stored no list of layer indices")
                return
            owner, attribute, value = capture
            origin = "default" if ids.v is None else ("config" if _from_config(ctx, ids) else "code")
            location = store_location(ctx, value, attribute) or delivery.location
            yield CaptureSet(
                "serving", self.name, location, f"{owner.cls.name}.{attribute} = {describe(value)}",
                ids=ids, ids_origin=origin, owner=Val(owner), attribute=attribute, value=value, delivery=delivery,
                config_keys=tuple(sorted(dict.fromkeys(keys), key=len, reverse=True)),
            )
            return

    def _fallbacks(self, ctx: SideContext, handled: list) -> Iterator[Finding]:
        for event in handled:
            if event.kind not in ("KeyError", "AttributeError", "TypeError") or event.handled_at is None:
                continue
            declared = [".".join(path) for path, _ in (ctx.draft.declared_ids() if ctx.draft else [])]
            where = f"; the draft config declares them at {', '.join(declared)}" if declared else ""
            yield Finding(
                self.code, "layer-ids-not-read", "serving",
                f"the runner's read of the layer ids failed ({event.kind}: {event.message}) and the except at "
                f"{event.handled_at} swallowed it, so the target captures its default layers{where}",
                event.handled_at, Confidence.INFERRED, hypothesis="config-ignored", likelihood_ratio=20.0,
            )


def _target_class(ctx: SideContext):
    for name in (*ctx.target.architectures, *ctx.target.text_architectures()):
        cls = ctx.find_class(name)
        if cls is not None:
            return cls
    return None


def _capture_store(stores: list) -> tuple | None:
    """The field store that holds layer indices (a list, tuple or set of ints)."""
    for owner, attribute, value in stores:
        if ints(value) is not None and ints(value):
            return owner, attribute, value
    return None


def _from_config(ctx: SideContext, value: Val) -> bool:
    return ctx.graph.derives_from(value.src, "config")
