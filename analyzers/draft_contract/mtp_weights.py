"""Whether a target served as its own MTP draft holds the weights of the layers it declares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rca.sdk import (
    Analyzer,
    Compares,
    Drafting,
    Example,
    Fact,
    Finding,
    InputError,
    Location,
    Reports,
    Severity,
    SideContext,
    Step,
    StepKind,
)
from rca.sdk.code import names_in
from rca.sdk.inputs import Checkpoint

# What names a module of the MTP layers in a checkpoint, besides a layer index past the decoder's:
# `mtp.layers.0.*` (Qwen3-Next, Qwen3.5, Nemotron-H), `model.mtp_layers.0.*` (MiMo), `nextn` (SGLang's
# and GGUF's name for DeepSeek's).
_MARKS = ("mtp", "nextn")
_LAUNCH = '--speculative-config \'{"method": "mtp", "num_speculative_tokens": 1}\''
_ARGS = """
def add_cli_args(parser):
    parser.add_argument("--speculative-config", type=json.loads)
"""
_MTP_MODEL = """
class DeepSeekMultiTokenPredictor(nn.Module):
    def __init__(self, config):
        self.mtp_start_layer_idx = config.num_hidden_layers
        self.num_mtp_layers = config.num_nextn_predict_layers
"""
_FILES = {"engine/arg_utils.py": _ARGS, "models/deepseek_mtp.py": _MTP_MODEL}
_TARGET = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 2, "num_nextn_predict_layers": 1}
_DECODER = {f"model.layers.{i}.mlp.down_proj.weight": ("BF16", (4, 4), None) for i in range(2)}
_MTP_LAYER = {
    "model.layers.2.eh_proj.weight": ("BF16", (4, 8), None),
    "model.layers.2.enorm.weight": ("BF16", (4,), None),
}


class MtpWeights(Analyzer):
    """Whether a target served as its own multi-token-prediction draft holds the weights of the MTP
    layers its config declares.

    ## What it reads
    For a launch that drafts with the target's own MTP layers (knowledge/engines, `[own_layers]`:
    vLLM's and lmdeploy's MTP methods, SGLang's NEXTN), the count the target's config declares
    (`num_nextn_predict_layers`, `mtp_num_hidden_layers`), where the engine reads it, and the tensor
    names of the checkpoint they are loaded from (the target's, or the one the launch names for them:
    vLLM's `speculative_config.model`, SGLang's `--speculative-draft-model-path`), read from its
    safetensors index or header: the MTP layers are the
    layers past the decoder's (`model.layers.61.*` after 61 decoder layers) or a module named for
    them (`mtp.layers.0.*`, `model.mtp_layers.0.*`).

    ## Why it matters
    The engine builds the MTP layers from the config, then loads what the checkpoint holds. A
    checkpoint re-exported without them (quantized or pruned copies often drop them) leaves the
    layers as allocated: uninitialized memory drafts every token, and none is accepted. Releases
    that check refuse to start instead. Nothing else reports it.
    """

    code = "RCA-D112"
    name = "mtp-weights"
    sides = frozenset({"serving"})
    # no anchors: it cites the engine's MTP model files, never evaluates them
    drafting = frozenset({Drafting.OWN_LAYERS})
    compares = Compares(
        training="the MTP layers the target's config declares (trained with the target, shipped in its checkpoint)",
        serving="the tensors the checkpoint the launch serves holds for them",
    )
    reports = (Reports("mtp-weights-missing", hypothesis="mtp-weights-missing", severity=Severity.CAUSE),)
    VALID = (
        Example(
            files=_FILES,
            target=_TARGET,
            target_weights={**_DECODER, **_MTP_LAYER},
            settings=_LAUNCH,
            why="DeepSeek-style: the MTP layer is layer 2 after two decoder layers, and the checkpoint holds it",
        ),
        Example(
            files=_FILES,
            target={**_TARGET, "num_nextn_predict_layers": None, "mtp_num_hidden_layers": 1},
            target_weights={**_DECODER, "mtp.layers.0.mlp.down_proj.weight": ("BF16", (4, 4), None)},
            settings=_LAUNCH,
            why="Qwen3.5-style: the MTP layers live under a module of their own, mtp.*",
        ),
        Example(
            files=_FILES,
            target=_TARGET,
            target_weights=_DECODER,
            settings='--speculative-config \'{"method": "mtp", "model": "mtp-weights"}\'',
            why="the launch names a checkpoint of its own for the MTP layers: the target's is not read for them",
        ),
    )
    INVALID = (
        Example(
            files=_FILES,
            target=_TARGET,
            target_weights=_DECODER,
            settings=_LAUNCH,
            finding="mtp-weights-missing",
            path="target/config.json",
            key=("num_nextn_predict_layers",),
            message=(
                "the target's config declares 1 MTP layer (num_nextn_predict_layers = 1), which the launch drafts "
                "with (mtp), but its checkpoint holds no weights for it: none of its 2 tensors is of a layer past "
                "its 2 decoder layers or of a module named for MTP"
            ),
            why="a checkpoint re-exported without its MTP layer, served with MTP drafting",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.target.mtp_layers() is not None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.settings is not None
        declared = ctx.target.mtp_layers()
        method = ctx.settings.drafts_with_mtp_layers(declared=True)
        assert declared is not None and method is not None
        source = ctx.settings.mtp_source()  # a checkpoint the launch names for the MTP layers, if any
        directory = ctx.settings.mtp_directory(ctx.target.config.file.parent)
        if directory is None:
            ctx.note(
                f"the launch loads its MTP layers from {source}, which rca did not read: whether it holds them "
                "is unknown (name a local directory holding its config.json and model.safetensors.index.json)"
            )
            return
        holder = "the target's checkpoint" if source is None else f"{source}, the checkpoint they are loaded from,"
        try:
            checkpoint = Checkpoint.open(
                directory, None, flag="--target" if source is None else "the MTP layers' source"
            )
        except InputError as error:
            ctx.note(
                f"whether {holder} holds the MTP layers was not read ({error.what}): name the directory its weights "
                "were downloaded to, or one holding its model.safetensors.index.json"
            )
            return
        names = list(checkpoint.weight_map)
        layers = ctx.target.num_layers
        held = [name for name in names if _of_mtp_layers(name, layers)]
        key, count = declared
        if held:
            ctx.note(f"{holder} holds {len(held):,} tensors of the MTP layers ({held[0]}, ...)")
            return
        plural = "s" if count > 1 else ""
        declared_step = ctx.target.config.step(tuple(key.split(".")), f"{key} = {count}: the MTP layers to draft with")
        listing = _listing(
            ctx.target.config.display if source is None else f"{source}/config.json", directory, len(names)
        )
        steps: list[Step] = [declared_step, *_engine_reads(ctx, key), listing]
        yield self.finding(
            ctx,
            "mtp-weights-missing",
            f"the target's config declares {count} MTP layer{plural} ({key} = {count}), which the launch drafts "
            f"with ({method}), but {'its checkpoint' if source is None else holder} holds no weights for "
            f"{'them' if plural else 'it'}: none of its "
            f"{len(names):,} tensors is of a layer past its {layers} decoder layers or of a module named for MTP",
            declared_step.location,
            likelihood_ratio=50.0,
            steps=tuple(steps),
            fix="serve a checkpoint that holds the MTP layers (the original release's, or a re-export that keeps "
            "them), name one that does as the MTP draft (vLLM: speculative_config.model), or launch without MTP "
            "drafting",
        )


def _of_mtp_layers(name: str, layers: int) -> bool:
    """Whether a tensor belongs to the MTP layers: a layer index past the decoder's, or a module
    named for MTP."""
    parts = name.split(".")
    for index, part in enumerate(parts[:-1]):
        if any(mark in part.lower() for mark in _MARKS):
            return True
        if index and parts[index - 1] == "layers" and part.isdigit() and int(part) >= layers:
            return True
    return False


def _engine_reads(ctx: SideContext, key: str) -> list[Step]:
    """Where the serving engine builds the MTP layers from the declared count (the first class that
    reads it, preferring the target's own model's file), cited; none where no class reads it."""
    assert ctx.index is not None
    family = str(ctx.target.config.data.get("model_type") or "").split("_")[0].lower()
    relpaths = sorted(ctx.anchor_files(key.rsplit(".", 1)[-1]), key=lambda path: (family not in path, path))
    attribute = key.rsplit(".", 1)[-1]
    for relpath in relpaths:
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if function.owner is None or function.name != "__init__" or attribute not in function.text:
                continue
            for statement in function.node.body.body:
                if attribute in names_in(statement):
                    return [
                        module.step(statement, function.node, f"{function.owner.name} builds the MTP layers from it")
                    ]
    return []


def _listing(config: str, directory: Path, count: int) -> Step:
    """The checkpoint's tensor listing, cited beside the target's config (its index, or its single file)."""
    shown = (
        "model.safetensors.index.json"
        if (directory / "model.safetensors.index.json").is_file()
        else "model.safetensors"
    )
    location = Location("target", f"{config.rpartition('/')[0] or '.'}/{shown}", 1, 1)
    return Step(location, f"{count:,} tensors, none of an MTP layer", kind=StepKind.TENSOR)
