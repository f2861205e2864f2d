"""Which layers a data-generation pipeline asks its inference workers to capture."""

from __future__ import annotations

from collections.abc import Iterator

from rca.sdk import Analyzer, CaptureSet, Example, Fact, Finding, IdsOrigin, SideContext, StepKind
from rca.sdk.code import call_step, calls_named, store_location
from rca.sdk.examples import DATA_GENERATOR_FILES, LLAMA_8B_TARGET
from rca.sdk.sides import dump_ids
from rca.sdk.values import MutList, ObjRef, Opaque, Val, describe, ints


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
    precedence = 10

    VALID = (
        Example(
            files=DATA_GENERATOR_FILES,
            target=LLAMA_8B_TARGET,
            captured=("h3", "h17", "h30", "h32"),
            why="defaults captured after each layer",
        ),
        Example(
            files=DATA_GENERATOR_FILES,
            target=LLAMA_8B_TARGET,
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
            origin = (
                IdsOrigin.CONFIG if ctx.graph.derives_from(items[position].src, StepKind.CONFIG) else IdsOrigin.DEFAULT
            )
            if recorded is not None:
                items[position] = recorded
                origin = IdsOrigin.DUMP_METADATA
            delivery, delivery_key = call_step(
                ctx, function.module, function, call, "sends the layer ids to the workers", items[position]
            )
            items[position] = Val(items[position].v, frozenset({delivery_key}))
            kwargs = {**kwargs, "args": Val(MutList(items, tuple_like=True), items[position].src)}
            with ev.trace() as trace:
                ev.call(Val(Opaque("collective_rpc", "collective_rpc")), args, kwargs, call, None)
            for owner, attribute, value in trace.stores:
                if ints(value):
                    location = store_location(ctx, value, attribute) or delivery.location
                    yield CaptureSet(
                        "training",
                        self.name,
                        location,
                        f"{owner.cls.name}.{attribute} = {describe(value)}",
                        ids=items[position],
                        ids_origin=origin,
                        owner=Val(owner),
                        attribute=attribute,
                        value=value,
                        delivery=delivery,
                    )
                    return
