"""Which layers a data-generation pipeline asks its inference workers to capture."""

from __future__ import annotations

from typing import Iterator

from rca.static.context import SideContext
from rca.static.evaluate.values import MutList, ObjRef, Opaque, Val, describe
from rca.static.facts import CaptureSet, Fact, Finding
from rca.static.analyzer import Analyzer, Example
from rca.analyzers._support import call_step, calls_named, dump_ids, ints, store_location

_GENERATOR = '''
from transformers import AutoConfig


class HiddenStatesGenerator:
    def __init__(self, model_path, layer_ids=None):
        config = AutoConfig.from_pretrained(model_path)
        num_layers = config.num_hidden_layers
        if layer_ids is None:
            self.layer_ids = [2, num_layers // 2, num_layers - 3, num_layers - 1]
        else:
            self.layer_ids = layer_ids
        self.executor = Executor()
        self._setup_capture()

    def _setup_capture(self):
        self.executor.collective_rpc("_setup_capture_worker", args=(self.layer_ids,))
'''

_WORKER = '''
import types


def _patched_forward(self, input_ids, positions):
    hidden_states = self.embed_input_ids(input_ids)
    residual = None
    aux_hidden_states = []
    target_layers = self._extension._layer_ids
    for idx, layer in enumerate(self.layers):
        hidden_states, residual = layer(hidden_states=hidden_states, positions=positions, residual=residual)
        if idx in target_layers:
            aux_hidden_states.append((hidden_states + residual).clone())
    return aux_hidden_states


class WorkerExtension:
    def _setup_capture_worker(self, layer_ids):
        self._layer_ids = frozenset(layer_ids)
        model = self.model_runner.model
        model._extension = self
        model.forward = types.MethodType(_patched_forward, model)
'''

_FILES = {"gen/generator.py": _GENERATOR, "gen/worker.py": _WORKER}
_TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}


class WorkerCaptureLayers(Analyzer):
    """Reads the layer ids a data generator sends to its workers (by RPC), or the ids its dumps record.

    ## What it reads
    A `collective_rpc("method", args=(ids,))` whose worker method stores the ids as a capture
    set; the ids' origin (the generator's defaults, e.g. `[2, L//2, L-3, L-1]` in speculators
    0.3–0.4) and, when a dump directory is given, the ids its `data_config.json` records.

    ## Why it matters
    The dumps were captured with whatever ids the generator used: defaults that capture after
    each layer are one layer later than the engines' defaults.
    """

    code = "RCA-T101"
    name = "worker-capture-layers"
    sides = frozenset({"training"})
    anchors = ("collective_rpc",)
    provides = (CaptureSet,)

    VALID = (
        Example(files=_FILES, target=_TARGET, captured=("h3", "h17", "h30", "h32"), why="defaults captured after each layer"),
        Example(
            files=_FILES,
            target=_TARGET,
            dumps={"data_config.json": {"hidden_states": {"layer_ids": [1, 15, 28, 31]}}},
            captured=("h2", "h16", "h29", "h32"),
            why="the dump's recorded ids override the defaults",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        ev = ctx.evaluator
        recorded = dump_ids(ctx)
        for function, call in calls_named(ctx, "collective_rpc"):
            if not call.args or not any(arg.keyword is not None and arg.keyword.value == "args" for arg in call.args):
                continue
            method = call.args[0].value
            if not hasattr(method, "evaluated_value") or not ev.find_methods(method.evaluated_value):
                continue
            receiver = Val(ObjRef(function.owner)) if function.owner is not None else None
            result = ev.run_to(function, call, receiver)
            if not result.reached or result.args is None:
                continue
            args, kwargs = result.args
            payload = kwargs.get("args")
            if payload is None or not isinstance(payload.v, MutList):
                continue
            items = list(payload.v.items)
            position = next((i for i, item in enumerate(items) if ints(item) is not None), None)
            if position is None:
                continue
            origin = "config" if ctx.graph.derives_from(items[position].src, "config") else "default"
            if recorded is not None:
                items[position] = recorded
                origin = "dump metadata"
            delivery, delivery_key = call_step(ctx, function.module, function, call, "sends the layer ids to the workers", items[position])
            items[position] = Val(items[position].v, frozenset({delivery_key}))
            kwargs = {**kwargs, "args": Val(MutList(items, tuple_like=True), items[position].src)}
            with ev.trace() as trace:
                ev.call(Val(Opaque("collective_rpc", "collective_rpc")), args, kwargs, call, None)
            for owner, attribute, value in trace.stores:
                if ints(value):
                    location = store_location(ctx, value, attribute) or delivery.location
                    yield CaptureSet(
                        "training", self.name, location, f"{owner.cls.name}.{attribute} = {describe(value)}",
                        ids=items[position], ids_origin=origin, owner=Val(owner), attribute=attribute, value=value, delivery=delivery,
                    )
                    return
