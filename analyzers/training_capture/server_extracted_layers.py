"""Which layers an inference server extracted into the dumps a trainer reads."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from rca.sdk import Analyzer, CapturedTaps, CaptureSet, Example, Fact, Finding, IdsOrigin, SideContext, StepKind, Tap
from rca.sdk.code import FunctionInfo, ModuleInfo, NodeKey, walk
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.sides import capture_by_engine, dump_ids
from rca.sdk.values import MutList, Opaque, Val, ints, tap_tensor

KEY = "hidden_states_path"

_CLIENT = """
async def generate_hidden_states(client, model, token_ids):
    completion = await client.completions.create(model=model, prompt=token_ids, max_tokens=1)
    return completion.kv_transfer_params.get("hidden_states_path")
"""

_STACKED_READER = """
from safetensors.torch import load_file


class ArrowDataset:
    def __getitem__(self, index):
        loaded_hs = load_file(self.paths[index])
        return {
            "hidden_states": loaded_hs["hidden_states"][:, :-1].flatten(1),
            "input_ids": loaded_hs["token_ids"],
            "verifier_last_hidden_states": loaded_hs["hidden_states"][:, -1],
        }
"""

_FILES = {"data_generation/vllm_client.py": _CLIENT, "train/data.py": _STACKED_READER}
_CONVENTION = "id k is the residual stream entering layer k (h_k), id L the last layer's output before the final norm"


class ServerExtractedLayers(Analyzer):
    """Reads which layers a server extracted for the trainer: vLLM's `extract_hidden_states`.

    ## What it reads
    A data-generation client that asks an inference server for hidden states and reads back the
    path of the dump it wrote (`kv_transfer_params["hidden_states_path"]`, speculators 0.5 and
    later). The server is not part of the training source, so the extracted ids come from the
    dump's own metadata when given, else from the draft config, where the trainer records the
    ids it trained with (top level, `eagle_aux_hidden_state_layer_ids`), plus the last layer the
    launcher appends for the verifier's state. Ids are read in the extracting server's convention
    (vLLM: id k is h_k) and the dump is one stacked `[tokens, layers, hidden]` tensor.

    ## Why it matters
    These dumps use the engines' own numbering, one layer earlier than speculators 0.3–0.4's
    after-layer capture; a draft trained on them and served with ids written for the older
    pipeline is off by one.
    """

    code = "RCA-T105"
    name = "server-extracted-layers"
    sides = frozenset({"training"})
    anchors = (KEY,)
    provides = (CaptureSet, CapturedTaps)
    precedence = 20

    VALID = (
        Example(
            files=_FILES,
            target=LLAMA_8B_TARGET,
            draft={"eagle_aux_hidden_state_layer_ids": [2, 16, 29]},
            slots=("h2", "h16", "h29"),
            verifier_last="h32",
            why="the recorded ids in the server's numbering, the appended last layer as the verifier's state",
        ),
        Example(
            files=_FILES,
            target=LLAMA_8B_TARGET,
            draft={"eagle_aux_hidden_state_layer_ids": [2, 16, 29]},
            dumps={"data_config.json": {"layer_ids": [1, 15, 28, 31]}},
            slots=("h1", "h15", "h28"),
            verifier_last="h31",
            why="the dump's own record of what was extracted wins over the draft config",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        site = self._client_site(ctx)
        if site is None:
            return
        module, function, node = site
        layers = ctx.target.num_layers
        found = self._ids(ctx)
        if found is None:
            ctx.note(
                f"the dumps were extracted by an inference server ({module.relpath}), but neither the dump metadata "
                "nor the draft config records the extracted layer ids"
            )
            return
        ids, origin, sources = found
        step = module.step(
            node, function.node, "the dumps are extracted by an inference server; this client reads back their path"
        )
        server = ctx.graph.node(StepKind.CALL, step.location, step.note, step.code)
        ctx.graph.flow(sources, server)
        ctx.graph.observe(server, str(ids))
        engine = capture_by_engine(ctx, list(ids))
        if engine is None:
            ctx.note(
                f"the extracting server is not in {ctx.tree.label}; its numbering is assumed: {_CONVENTION} (pass "
                f"--training-engine to read it)"
            )
        if origin is IdsOrigin.CONFIG:
            ctx.note(
                f"the dumps are assumed to hold the recorded ids plus the last layer ({layers}), which the launcher "
                f"appends for the verifier's state"
            )
        ids_value = Val(MutList([Val(i, frozenset(sources)) for i in ids]), frozenset(sources))
        stored = Val(ids_value.v, frozenset({server}))
        yield CaptureSet(
            "training",
            self.name,
            step.location,
            f"the server extracts layers {list(ids)}",
            ids=ids_value,
            ids_origin=origin,
            owner=Val(Opaque("server", "", "the inference server that wrote the dumps")),
            attribute="",
            value=stored,
            delivery=step,
        )
        if engine is not None:
            taps = list(engine.taps)
        else:
            taps = [Tap(i) for i in ids if 0 <= i <= layers]
            if len(taps) < len(ids):
                ctx.note(
                    f"ids {[i for i in ids if not 0 <= i <= layers]} are outside 0..{layers} and cannot have been "
                    f"extracted"
                )
        yield CapturedTaps(
            "training",
            self.name,
            step.location,
            f"the dumps stack {', '.join(map(str, taps))}",
            tensors=tuple(tap_tensor(tap) for tap in taps),
            sinks=(server,),
            stacked=True,
            steps=engine.steps if engine else (),
        )

    def _client_site(self, ctx: SideContext) -> tuple[ModuleInfo, FunctionInfo, cst.SimpleString] | None:
        """Where a client reads the dump path out of the server's reply."""
        assert ctx.index is not None
        for relpath in ctx.anchor_files(KEY):
            module = ctx.index.load(relpath)
            if module is None:
                continue
            for function in module.all_functions:
                if KEY not in function.text:
                    continue
                for node in walk(function.node.body):
                    if isinstance(node, cst.SimpleString) and node.evaluated_value == KEY:
                        return module, function, node  # type: ignore[return-value]
        return None

    def _ids(self, ctx: SideContext) -> tuple[tuple[int, ...], IdsOrigin, list[NodeKey]] | None:
        """The extracted ids, how they are known, and the graph nodes they come from."""
        recorded = dump_ids(ctx)
        if recorded is not None:
            return tuple(ints(recorded) or ()), IdsOrigin.DUMP_METADATA, list(recorded.src)
        if ctx.draft is None:
            return None
        for path, value in sorted(ctx.draft.declared_ids(), key=lambda entry: len(entry[0])):  # the top level first
            if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
                config = ctx.draft.config
                key = ctx.graph.from_step(
                    StepKind.CONFIG, config.step(path, f"{'.'.join(path)} = {value} (recorded by the trainer)"), path
                )
                ctx.graph.observe(key, str(value))
                layers_path = ctx.target.num_layers_path
                last = ctx.graph.from_step(
                    StepKind.CONFIG,
                    ctx.target.config.step(
                        layers_path,
                        f"{'.'.join(layers_path)} = {ctx.target.num_layers}: the last layer, appended for the "
                        f"verifier's state",
                    ),
                    layers_path,
                )
                return (*value, ctx.target.num_layers), IdsOrigin.CONFIG, [key, last]
        return None
