"""Write hidden-state dump directories the way each framework's data generation lays them out."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_dumps(
    directory: Path,
    format: str,
    token_ids: list[torch.Tensor],
    captures: list[list[torch.Tensor]],
    verifier_last: list[torch.Tensor] | None = None,
    *,
    layer_ids: list[int] | None = None,
    gzipped: bool = False,
    loss_masks: list[torch.Tensor] | None = None,
) -> list[Path]:
    """One file per sample: `token_ids[i]` [S], the draft slots `captures[i]` (each [S, H]) and,
    when given, `verifier_last[i]` [S, H]; returns the files in sample order.

    speculators writes `data_config.json` beside its dumps: pass `layer_ids` to have one.
    SpecForge nests its files in `rows_<a>-<b>/`; `gzipped` writes them as `.ckpt.gz`.
    `loss_masks[i]` is sample i's mask where the format keeps one (all ones by default).
    """
    directory.mkdir(parents=True, exist_ok=True)
    lasts = verifier_last if verifier_last is not None else [None] * len(captures)
    files = []
    for index, (ids, slots, last) in enumerate(zip(token_ids, captures, lasts, strict=True)):
        mask = loss_masks[index] if loss_masks is not None else torch.ones_like(ids)
        layers = slots + ([last] if last is not None else [])
        if format == "speculators-pt":
            file = directory / f"data_{index}.pt"
            torch.save({"input_ids": ids, "hidden_states": layers, "loss_mask": mask}, file)
        elif format == "speculators-safetensors":
            file = directory / f"hs_{index}.safetensors"
            save_file({"hidden_states": torch.stack(layers, dim=1).contiguous(), "token_ids": ids}, file)
        elif format == "specforge-ckpt":
            file = (
                directory
                / f"rows_{index // 5000 * 5000}-{index // 5000 * 5000 + 5000}"
                / f"data_{index}.ckpt{'.gz' if gzipped else ''}"
            )
            file.parent.mkdir(exist_ok=True)
            data = {
                "input_ids": ids,
                "loss_mask": mask,
                "aux_hidden_state": torch.cat(slots, dim=-1)[None],
            }
            if last is not None:
                data["hidden_state"] = last[None]
            buffer = io.BytesIO()
            torch.save(data, buffer)
            file.write_bytes(gzip.compress(buffer.getvalue()) if gzipped else buffer.getvalue())
        elif format == "safetensors":
            file = directory / f"sample_{index}.safetensors"
            tensors = {"hidden_states": torch.stack(slots, dim=1).contiguous(), "input_ids": ids}
            if last is not None:
                tensors["verifier_last"] = last.contiguous()
            save_file(tensors, file)
        else:
            raise ValueError(f"unknown dump format {format!r}")
        files.append(file)
    if layer_ids is not None:
        (directory / "data_config.json").write_text(
            json.dumps({"hidden_states": {"layer_ids": layer_ids}}, indent=2) + "\n", encoding="utf-8"
        )
    return files


def random_samples(
    lengths: list[int], slots: int, hidden: int, seed: int = 0
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], list[torch.Tensor]]:
    """Distinct token ids, slots and verifier states for samples of the given lengths."""
    generator = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, 1000, (length,), generator=generator) for length in lengths]
    captures = [[torch.randn(length, hidden, generator=generator) for _ in range(slots)] for length in lengths]
    lasts = [torch.randn(length, hidden, generator=generator) for length in lengths]
    return ids, captures, lasts
