"""Probe: whether the lm_head rows where a fine-tune changed the vocab map still score the parent's tokens."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rca.sdk import Confidence, Evidence, Location, Observation, Probe, ProbeInputs, Step, StepKind, Tap, Wiring
from rca.sdk.evidence import mean_cosine, require_torch
from rca.sdk.inputs import Checkpoint, weights_directory

SAMPLE = 256  # changed draft ids compared at the most
MARGIN = 0.2  # how far one reading of the rows must beat the other
CARRIED = 0.9  # without the target's weights: rows this close to the parent's are the parent's


class VocabMapCarried(Probe):
    """Whether a fine-tuned draft's lm_head rows, where its vocab map differs from its parent's, score the old tokens.

    ## Why it matters
    Trainers start a reduced-vocabulary draft's `lm_head` from the target's rows of the tokens it
    keeps, so a row keeps pointing where the target's row for its token does. Where a fine-tune
    regenerated the map, draft row i is served as the new map's target token: if it still lines up
    with the target's row for the parent's token, the head was never retrained for the new map.
    With the target's weights, rows are compared with the target rows both maps name; without
    them, with the parent's own rows. Only those rows of each checkpoint are read.
    """

    name = "vocab-map-carried"
    cost = 0.5
    command = "rca probe vocab-lineage"
    arguments = "--draft DRAFT_DIR --parent-draft PARENT_DIR --target MODEL_DIR"
    settles = ("vocab-map-regenerated",)

    def applies(self, inputs: ProbeInputs) -> bool:
        return inputs.parent_draft is not None

    def unavailable(self, inputs: ProbeInputs) -> str | None:
        for flag, path in (("--draft", inputs.draft), ("--parent-draft", inputs.parent_draft)):
            if path is None or not any(weights_directory(path).glob("*.safetensors")):
                return f"{flag} has no safetensors weights"
        return None

    def predict(self, slots: tuple[Tap, ...]) -> Hashable:
        return None  # says nothing about which states training fed

    def bearing(self, observation: Observation, serving: Wiring) -> dict[str, Evidence]:
        said, cited = observation.summary, observation.citations
        strength = 20.0 if observation.data.get("against") == "target" else 3.0
        if observation.value == "carried":
            return {"vocab-map-regenerated": Evidence(said, Confidence.OBSERVED, strength, cited)}
        if observation.value == "retrained":
            return {"vocab-map-regenerated": Evidence(said, Confidence.OBSERVED, 0.1, cited)}
        return {}

    def run(self, inputs: ProbeInputs, progress: Any = None) -> Observation:
        torch = require_torch()
        assert inputs.draft is not None and inputs.parent_draft is not None
        child = Checkpoint.open(weights_directory(inputs.draft), inputs.base, flag="--draft")
        parent = Checkpoint.open(weights_directory(inputs.parent_draft), inputs.base, flag="--parent-draft")
        maps = []
        for checkpoint in (child, parent):
            name = checkpoint.find(["d2t"])
            if name is None:
                return Observation(self.name, None, f"{checkpoint.directory.name} has no d2t", reliability=0.5)
            maps.append([i + int(value) for i, value in enumerate(checkpoint.values(name))])  # or refused, by file
        new, old = maps
        if len(new) != len(old):
            said = (
                f"the draft's d2t has {len(new):,} entries and its parent's {len(old):,}: maps of different lengths "
                "are not one map, and no row of the heads can be matched with the parent's by its index"
            )
            return Observation(self.name, None, said, reliability=0.5)
        changed = [i for i in range(len(new)) if new[i] != old[i]]
        if not changed:
            return Observation(self.name, "same-map", "the draft's d2t is its parent's", reliability=0.5)
        head = child.find(["lm_head.weight"])
        if head is None or parent.find(["lm_head.weight"]) is None:
            return Observation(self.name, None, "a draft without its own lm_head", reliability=0.5)
        picked = changed[:: max(1, len(changed) // SAMPLE)][:SAMPLE]
        ids = torch.tensor(picked)
        own = child.rows(head, ids)
        model = inputs.model_directory
        if model is not None:
            target = Checkpoint.open(model, inputs.base)
            theirs = target.find(["lm_head.weight", "embed_tokens.weight"])
            if theirs is None:
                return Observation(self.name, None, "the target has no lm_head or embedding", reliability=0.5)
            at_old = mean_cosine(torch, own, target.rows(theirs, torch.tensor([old[i] for i in picked])))
            at_new = mean_cosine(torch, own, target.rows(theirs, torch.tensor([new[i] for i in picked])))
            against, read = "target", child.bytes_read + target.bytes_read
            if at_old >= at_new + MARGIN:
                value = "carried"
            elif at_new >= at_old + MARGIN:
                value = "retrained"
            else:
                value = "unclear"
            said = (
                f"where the maps differ ({len(changed)} draft ids, {len(picked)} compared), the draft's lm_head rows "
                f"match the target's rows of the parent's tokens at {at_old:.2f} and of the new map's at {at_new:.2f}"
            )
            data = {"cosine_parent_tokens": round(at_old, 4), "cosine_new_tokens": round(at_new, 4)}
        else:
            close = mean_cosine(torch, own, parent.rows(head, ids))
            against, read = "parent", child.bytes_read + parent.bytes_read
            value = "carried" if close >= CARRIED else "unclear"
            said = (
                f"where the maps differ ({len(changed)} draft ids, {len(picked)} compared), the draft's lm_head rows "
                f"are the parent's at cosine {close:.2f}"
            )
            data = {"cosine_parent_rows": round(close, 4)}
        if progress:
            progress(f"{self.name}: {len(picked)} rows of each lm_head compared")
        citation = Step(
            Location("draft", f"{child.directory.name}/{child.weight_map[head]}", 1, 1), said, kind=StepKind.TENSOR
        )
        return Observation(
            self.name,
            value,
            said,
            {"value": value, "changed": len(changed), "rows_compared": len(picked), "against": against, **data}
            | {"bytes_read": read},
            (citation,),
        )
