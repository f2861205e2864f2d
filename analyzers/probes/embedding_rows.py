"""Probe: which dump slots are the embedding (`h0`), from the embedding rows alone."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rca.sdk import Confidence, Evidence, Observation, Probe, ProbeExample, ProbeInputs, Tap, Wiring
from rca.sdk.evidence import cosine_table, dump_citation, needs_dumps_and_weights, require_torch
from rca.sdk.inputs import Checkpoint

EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")
MATCH = 0.99  # mean cosine of a slot that is the embedding (bf16 rounding stays above 0.999)


class EmbeddingRows(Probe):
    """Which dump slots equal `embed_tokens[token_ids]`, reading only those rows of the checkpoint.

    ## Why it matters
    "Training used the embedding" is the premise behind adding an `h0` slot at serving time (the
    founding case). A slot that is the embedding equals the embedding rows of its tokens; reading
    just those rows answers it in seconds, even for a model too large to load.
    """

    name = "embedding-rows"
    cost = 1.0
    command = "rca probe embedding"

    EXAMPLES = (
        ProbeExample(("h3", "h5", "h7"), frozenset(), "h8", why="decoder-layer outputs only: no slot is the embedding"),
        ProbeExample(("h0", "h3", "h5"), frozenset({0}), why="slot 0 is the embedding output"),
    )

    def unavailable(self, inputs: ProbeInputs) -> str | None:
        return needs_dumps_and_weights(inputs)

    def predict(self, slots: tuple[Tap, ...]) -> Hashable:
        return frozenset(index for index, tap in enumerate(slots) if tap.is_embedding)

    def bearing(self, observation: Observation, serving: Wiring) -> dict[str, Evidence]:
        served = [index for index, tap in enumerate(serving.slots) if tap.is_embedding]
        if not served or observation.value is None:
            return {}
        if not observation.value:
            said = f"no dump slot equals the embedding rows of its tokens, yet serving feeds h0 in slot {served[0]}"
            return {
                "embed-slot-added": Evidence(said, Confidence.OBSERVED, 10.0, observation.citations[:1]),
                "wiring-consistent": Evidence(said, Confidence.OBSERVED, 0.05, observation.citations[:1]),
            }
        if set(served) <= set(observation.value):  # type: ignore[arg-type, call-overload]  # slot numbers
            said = f"dump slot {served[0]} equals the embedding rows of its tokens, as serving's h0 slot does"
            return {"embed-slot-added": Evidence(said, Confidence.OBSERVED, 0.05, observation.citations[:1])}
        return {}

    def run(self, inputs: ProbeInputs, progress: Any = None) -> Observation:
        require_torch()
        assert inputs.dumps is not None and inputs.model_directory is not None
        dumps = inputs.open_dumps()
        checkpoint = Checkpoint.open(inputs.model_directory, inputs.base)
        name = checkpoint.find(EMBEDDING_NAMES)
        if name is None:
            return Observation(
                self.name,
                None,
                f"no embedding tensor ({', '.join(EMBEDDING_NAMES)}) in the checkpoint",
                reliability=0.5,
            )
        sums: list[float] = []
        tokens, files = 0, []
        for sample in dumps.samples(inputs.max_tokens):
            rows = checkpoint.rows(name, sample.token_ids)
            weight = len(sample.token_ids)
            cosines = [cosine_table(slot, {"embedding": rows})["embedding"] for slot in sample.slots]
            sums = (
                [total + cosine * weight for total, cosine in zip(sums, cosines, strict=False)]
                if sums
                else [cosine * weight for cosine in cosines]
            )
            tokens += weight
            files.append(sample.path)
            if progress:
                progress(f"embedding rows: {tokens} tokens compared")
        cosines = [round(total / max(tokens, 1), 4) for total in sums]
        equal = frozenset(index for index, cosine in enumerate(cosines) if cosine >= MATCH)
        total = checkpoint.total_bytes
        fraction = checkpoint.bytes_read / total if total else 0.0
        said = ", ".join(f"slot {index}" for index in sorted(equal)) or "no slot"
        return Observation(
            self.name,
            equal,
            f"{said} equals the embedding rows of its tokens (cosines {cosines}; {checkpoint.bytes_read:,} "
            f"of {total:,} checkpoint bytes read, {fraction:.4%})",
            {
                "tensor": name,
                "cosines": cosines,
                "embedding_slots": sorted(equal),
                "tokens": tokens,
                "bytes_read": checkpoint.bytes_read,
                "checkpoint_bytes": total,
            },
            tuple(dump_citation(path, "compared with the embedding rows of its tokens") for path in files[:3]),
        )
