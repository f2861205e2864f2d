"""Whether the serving engine reads the mask embedding a DFlash draft ships beside its checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import libcst as cst

from rca.sdk import (
    Analyzer,
    Compares,
    Example,
    Fact,
    Finding,
    Location,
    Reports,
    Severity,
    SideContext,
    Step,
    StepKind,
)
from rca.sdk.code import guarded_statements, names_in
from rca.sdk.engines import spec_method
from rca.sdk.examples import SMALL_TARGET

# The file DFlash trainers that learn the mask token's embedding apart from the vocabulary save it
# in, and engines read by that name: a pickled tensor, which rca never loads (only its presence counts).
SIDECAR = "mask_embedding.pt"
_ID_KEY = "mask_token_id"
_READS_SIDECAR = f"""
import os
import torch


class DFlashWorker:
    def merge_trained_mask_embedding(self, draft_model_path, embed):
        path = os.path.join(draft_model_path, "{SIDECAR}")
        if os.path.exists(path):
            saved = torch.load(path, weights_only=True)
            embed.weight[saved["mask_token_id"]] = saved["embedding"]
"""
_TAKES_ID = """
class Proposer:
    def __init__(self, hf_config):
        dflash_config = getattr(hf_config, "dflash_config", None) or {}
        self.parallel_drafting_token_id = dflash_config["mask_token_id"]  # finding: mask-embedding-unread
"""
_DRAFT = {"architectures": ["DFlashDraftModel"], "dflash_config": {"target_layer_ids": [1, 3, 5], "mask_token_id": 7}}
_SIDECAR_BYTES = {SIDECAR: b"PK\x03\x04 a torch.save archive: {'embedding': ..., 'mask_token_id': 7}"}


class MaskEmbeddingSidecar(Analyzer):
    """Whether the serving engine reads the mask embedding a DFlash draft ships beside its checkpoint.

    ## What it reads
    For a draft served as DFlash (the launch's method, else its config's layout) whose directory
    holds `mask_embedding.pt`: the statements of the serving source that name that file (where the
    engine opens it), and, where none does, the statement that takes the draft's mask token id
    instead. The file itself is a pickle and is never loaded.

    ## Why it matters
    A DFlash draft fills the slots of its block with the embedding of its mask token. Some trainers
    learn that embedding apart from the vocabulary (the token's own row is an untrained, added one,
    near zero) and ship it as `mask_embedding.pt`. An engine that does not read the file embeds the
    slots from the vocabulary row: the draft sees an input it was never trained on in every slot
    after the first, and little beyond one token is accepted (MiMo's DFlash draft on SGLang:
    accept length 1.42 against 6.30).
    """

    code = "RCA-D113"
    name = "mask-embedding-sidecar"
    sides = frozenset({"serving"})
    anchors = (SIDECAR, f'"{_ID_KEY}"')
    compares = Compares(
        training=f"the mask token's embedding the draft was trained with: saved beside it ({SIDECAR}) in place of "
        "its vocabulary row",
        serving="whether the engine's DFlash code opens that file, or embeds the mask slots from the vocabulary row",
    )
    reports = (Reports("mask-embedding-unread", hypothesis="mask-embedding-unread", severity=Severity.CAUSE),)
    VALID = (
        Example(
            files={"speculative/dflash_worker.py": _READS_SIDECAR, "spec_decode/proposer.py": _TAKES_ID},
            target=SMALL_TARGET,
            draft=_DRAFT,
            draft_files=_SIDECAR_BYTES,
            why=f"the engine opens {SIDECAR} and writes its vector into the mask token's row",
        ),
        Example(
            files={"spec_decode/proposer.py": _TAKES_ID},
            target=SMALL_TARGET,
            draft=_DRAFT,
            why="no sidecar: the mask token's vocabulary row is the one the draft was trained with",
        ),
    )
    INVALID = (
        Example(
            files={"spec_decode/proposer.py": _TAKES_ID},
            target=SMALL_TARGET,
            draft=_DRAFT,
            draft_files=_SIDECAR_BYTES,
            finding="mask-embedding-unread",
            path="mask_embedding.pt",
            line=1,
            message=(
                f"the draft ships its mask token's trained embedding in {SIDECAR}, which no code of the serving "
                "source reads: the mask slots of every block are embedded from the token's row of the "
                "vocabulary (id 7), not the vector the draft was trained with"
            ),
            why="a draft whose trainer learned the mask embedding apart, served by a release that predates the sidecar",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and spec_method(ctx) == "dflash" and _sidecar(ctx) is not None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        sidecar = _sidecar(ctx)
        assert sidecar is not None
        reader = next(_statements_naming(ctx, SIDECAR, "opens the sidecar"), None)
        if reader is not None:
            ctx.note(f"the draft's {SIDECAR} is read at {reader.location}, in place of the mask token's vocabulary row")
            return
        token = _mask_token_id(ctx)
        shown = f" (id {token})" if token is not None else ""
        location = Location("draft", _display(ctx, sidecar), 1, 1)
        steps = [
            Step(location, f"{SIDECAR}: the mask embedding the draft was trained with", kind=StepKind.TENSOR),
            *_first(_statements_naming(ctx, _ID_KEY, "takes the mask token's id: the slots get its row", assigns=True)),
        ]
        yield self.finding(
            ctx,
            "mask-embedding-unread",
            f"the draft ships its mask token's trained embedding in {SIDECAR}, which no code of the serving source "
            f"reads: the mask slots of every block are embedded from the token's row of the vocabulary{shown}, not "
            "the vector the draft was trained with",
            location,
            likelihood_ratio=30.0,
            steps=tuple(steps),
            fix=f"serve with a release whose DFlash code opens {SIDECAR}, or write its vector into the mask token's "
            "row of the embedding the engine serves the draft with",
        )


def _sidecar(ctx: SideContext) -> Path | None:
    assert ctx.draft is not None
    path = ctx.draft.config.file.parent / SIDECAR
    return path if path.is_file() else None


def _display(ctx: SideContext, sidecar: Path) -> str:
    """The sidecar as the draft's config is shown: beside it."""
    assert ctx.draft is not None
    folder = ctx.draft.config.display.rpartition("/")[0]
    return f"{folder}/{sidecar.name}" if folder else sidecar.name


def _mask_token_id(ctx: SideContext) -> object:
    assert ctx.draft is not None
    data = ctx.draft.config.data
    nested = data.get("dflash_config")
    return nested.get(_ID_KEY) if isinstance(nested, dict) and _ID_KEY in nested else data.get(_ID_KEY)


def _nearest_to_drafting(relpath: str) -> tuple[bool, bool, str]:
    """DFlash's own files first, then the engine's speculative decoding, then the rest (config converters)."""
    return "dflash" not in relpath, not any(part in relpath for part in ("spec_decode", "speculative")), relpath


def _first(steps: Iterator[Step]) -> list[Step]:
    return [step for step in [next(steps, None)] if step is not None]


def _statements_naming(ctx: SideContext, literal: str, note: str, assigns: bool = False) -> Iterator[Step]:
    """The statements of the serving source's functions that name `literal` as a string (not in a
    docstring or a message), cited with `note`; with `assigns`, only assignments."""
    assert ctx.index is not None
    relpaths = ctx.anchor_files(SIDECAR if literal == SIDECAR else f'"{literal}"')
    for relpath in sorted(relpaths, key=_nearest_to_drafting):
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if literal not in function.text:
                continue
            for statement, _, _ in guarded_statements(function):
                if assigns and not any(isinstance(small, cst.Assign) for small in statement.body):
                    continue
                if literal in names_in(statement):
                    step = module.step(statement, function.node, note)
                    yield Step(step.location, note, step.code, StepKind.ASSIGN, ctx.tree.is_patched(step.location.path))
