"""Whether the served target declares a rotation or quantization that changes the hidden states the draft reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Reports, Severity, SideContext, Step
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.inputs import KeyPath

QUANTIZATION = "quantization_config"
_ROTATION_WORDS = ("rotation", "rotate", "quarot", "spinquant")  # keys or methods that name a rotation
_RESIDUAL_WRITERS = ("embed_tokens", "o_proj", "down_proj")  # the layers whose output is the residual stream
_VERIFIER = ("speculators_config", "verifier", "name_or_path")  # where a draft records its target

_SPINQUANT = {
    "quant_method": "compressed-tensors",
    "transform_config": {
        "config_groups": {
            "R1": {
                "type": "hadamard",
                "apply": [
                    {"targets": ["re:.*embed_tokens$", "re:.*o_proj$", "re:.*down_proj$"], "location": "weight_output"},
                    {"targets": ["re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$"], "location": "weight_input"},
                ],
            }
        }
    },
}
_QUIP = {
    "quant_method": "compressed-tensors",
    "transform_config": {
        "config_groups": {"v": {"type": "hadamard", "apply": [{"targets": ["Linear"], "location": "input"}]}}
    },
}
_VERIFIED_DRAFT = {
    "architectures": ["Eagle3Speculator"],
    "speculators_config": {"verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}},
}


class TargetTransform(Analyzer):
    """Reads whether the served target's config declares a rotation of its residual stream, or a quantization.

    ## What it reads
    The target config's `quantization_config`: a compressed-tensors `transform_config` whose
    transforms apply at the output of the layers that write the residual stream (`embed_tokens`,
    `o_proj`, `down_proj`: SpinQuant's R1, QuaRot), or any key or method naming a rotation. And
    the target the draft records it was trained against (speculators'
    `speculators_config.verifier.name_or_path`), compared with the served target's own
    `_name_or_path`: a draft trained on this very checkpoint saw its states.

    ## Why it matters
    A rotated target computes `X Q` where the unrotated one computes `X`: every hidden state the
    draft is fed is rotated, and a draft trained on the unrotated model sees states it never saw
    (acceptance length about 1, until `Q` is folded into its `fc`). A quantization alone changes
    the states a little: a suspicion, a candidate that only a serving capture raises to a cause.
    Transforms applied inside a layer only (QuIP's input Hadamards) leave the residual stream as
    it was. `rca probe compare` on a serving capture that matches no tap of the unrotated target
    is the evidence that settles it.
    """

    code = "RCA-D110"
    name = "target-transform"
    formerly = ("RCA-T111",)
    sides = frozenset({"serving"})
    compares = Compares(
        training="the target the draft config records it was trained against",
        serving="the target served: its quantization or rotation of the residual stream",
    )
    reports = (
        Reports("target-rotated", hypothesis="target-transformed"),
        Reports("target-quantized", hypothesis="target-transformed", severity=Severity.WARNING),
    )
    VALID = (
        Example(files={}, target=LLAMA_8B_TARGET, why="a plain target: nothing transforms its states"),
        Example(
            files={},
            target={**LLAMA_8B_TARGET, QUANTIZATION: _QUIP},
            why="Hadamards applied at each linear layer's input only: the residual stream is unrotated",
        ),
    )
    INVALID = (
        Example(
            files={},
            target={**LLAMA_8B_TARGET, QUANTIZATION: _SPINQUANT},
            finding="target-rotated",
            path="target.json",
            key=("quantization_config", "transform_config", "config_groups", "R1", "apply", 0),
            message=(
                "the served target's quantization_config rotates its residual stream (transform R1, hadamard, at the "
                "output of embed_tokens, o_proj, down_proj): every hidden state the draft is fed is rotated; whether "
                "the draft was trained on this rotated target is not recorded"
            ),
            why="SpinQuant's R1 rotation fused into the target's weights",
        ),
        Example(
            files={},
            target={
                **LLAMA_8B_TARGET,
                QUANTIZATION: {"quant_method": "gptq", "bits": 4, "algorithms": [{"name": "quarot", "rotate": True}]},
            },
            finding="target-rotated",
            path="target.json",
            key=("quantization_config", "algorithms", 0, "name"),
            message=(
                "the served target's quantization_config rotates its residual stream (name = 'quarot'): every hidden "
                "state the draft is fed is rotated; whether the draft was trained on this rotated target is not "
                "recorded"
            ),
            why="a QuaRot export that names its rotation in a list of the quantization's algorithms",
        ),
        Example(
            files={},
            target={**LLAMA_8B_TARGET, "_name_or_path": "org/Llama-3.1-8B-FP8", QUANTIZATION: {"quant_method": "fp8"}},
            draft=_VERIFIED_DRAFT,
            finding="target-quantized",
            path="target.json",
            key=("quantization_config",),
            message=(
                "the served target 'org/Llama-3.1-8B-FP8' is quantized (fp8) and the draft records it was trained "
                "against 'meta-llama/Llama-3.1-8B-Instruct': its hidden states differ from those the draft learned on "
                "by what the quantization changes, which only a serving capture measures (expect a small loss of "
                "acceptance, not a collapse)"
            ),
            why="a quantized checkpoint of the model the draft records: a suspicion, never a cause by itself",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return isinstance(ctx.target.config.data.get(QUANTIZATION), dict)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        config = ctx.target.config
        quantization = config.data[QUANTIZATION]
        trained, trained_step = _trained_against(ctx)
        served = config.data.get("_name_or_path")
        if trained is not None and isinstance(served, str) and _same_model(trained, served):
            return  # the draft records this very checkpoint: it was trained on these states
        recorded = (
            f"the draft records it was trained against {trained!r}"
            if trained is not None
            else "whether the draft was trained on this rotated target is not recorded"
        )
        steps: tuple[Step, ...] = (config.step((QUANTIZATION,), "the served target's quantization_config"),)
        steps += (trained_step,) if trained_step is not None else ()
        rotation = _rotation(quantization)
        if rotation is not None:
            path, said = rotation
            yield self.finding(
                ctx,
                "target-rotated",
                f"the served target's quantization_config rotates its residual stream ({said}): every hidden state "
                f"the draft is fed is rotated; {recorded}",
                config.location((QUANTIZATION, *path)),
                likelihood_ratio=12.0 if trained is not None else 6.0,
                steps=(*steps, config.step((QUANTIZATION, *path), said)),
                fix="fold the rotation into the draft's fc (and its embedding) at load, or retrain the draft on the "
                "rotated target's hidden states",
            )
        elif trained is not None and isinstance(served, str):
            method = quantization.get("quant_method", "unnamed")
            yield self.finding(
                ctx,
                "target-quantized",
                f"the served target {served!r} is quantized ({method}) and the draft records it was trained against "
                f"{trained!r}: its hidden states differ from those the draft learned on by what the quantization "
                "changes, which only a serving capture measures (expect a small loss of acceptance, not a collapse)",
                config.location((QUANTIZATION,)),
                likelihood_ratio=1.0,
                steps=steps,
                fix="capture what serving feeds (rca capture) and diagnose with it (rca diagnose --capture DIR "
                "--target MODEL_DIR of the unquantized model), or train the draft on the quantized target's states",
            )


def _trained_against(ctx: SideContext) -> tuple[str | None, Step | None]:
    """The target the draft config records it was trained against, and where."""
    if ctx.draft is None:
        return None, None
    draft = ctx.declared_draft.config
    found, value = draft.lookup(_VERIFIER)
    if found and isinstance(value, str) and value:
        return value, draft.step(_VERIFIER, f"the draft was trained against {value!r}")
    return None, None


def _same_model(trained: str, served: str) -> bool:
    """Two names of one checkpoint: a hub id and a local copy's path agree on their last part."""
    return trained.rstrip("/").rsplit("/", 1)[-1].lower() == served.rstrip("/").rsplit("/", 1)[-1].lower()


def _rotation(quantization: dict[str, Any]) -> tuple[KeyPath, str] | None:
    """Where the config declares a rotation of the residual stream, and what it says."""
    groups = (quantization.get("transform_config") or {}).get("config_groups") or {}
    for name, group in groups.items() if isinstance(groups, dict) else ():
        for index, apply in enumerate(group.get("apply") or [] if isinstance(group, dict) else []):
            targets = [str(target) for target in apply.get("targets", [])] if isinstance(apply, dict) else []
            writers = [layer for layer in _RESIDUAL_WRITERS if any(layer in target for target in targets)]
            if writers and apply.get("location") in ("weight_output", "output"):
                kind = group.get("type", "transform")
                return (
                    ("transform_config", "config_groups", name, "apply", index),
                    f"transform {name}, {kind}, at the output of {', '.join(writers)}",
                )
    for path, key, value in _walk(quantization, ()):
        words = f"{key} {value if isinstance(value, str) else ''}".lower()
        if any(word in words for word in _ROTATION_WORDS) and value not in (False, None, "", 0):
            return path, f"{key} = {value!r}"
    return None


def _walk(node: Any, path: KeyPath) -> Iterator[tuple[KeyPath, str, Any]]:
    """Every key of a config (and entry of its lists) with its path, depth first."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield (*path, key), str(key), value
        yield from _walk(value, (*path, key))
