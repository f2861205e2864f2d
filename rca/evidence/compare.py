"""`rca probe compare`: what serving fed the draft (a capture) against what training fed it.

Two ways to line the sides up:

* with the target's weights, each side's slots are named by the fingerprint (h0..hN), so any
  prompt will do;
* without them, a capture of a prompt that also appears in the training dumps (a replayed training
  sample) is compared slot by slot over the tokens they share.

A capture taken on several tensor-parallel ranks is also compared across ranks: after the
all-reduce every rank holds the same states, so ranks that disagree captured partial sums.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rca.errors import InputError
from rca.evidence.probes import ProbeInputs, cosine_table, needs_dumps_and_weights, registered_probes
from rca.inputs.dumps import DumpSample, DumpSet, open_dumps

MIN_SHARED = 8  # tokens a capture and a training sample must share to be compared without weights
MATCH = 0.99  # mean cosine of two slots holding the same tap
UNRELATED = 0.5  # a best cosine below this: the serving states are in another basis (a transformed target)
RANKS_AGREE = 1e-2  # relative difference between ranks' captures of fully reduced states
_RANK = re.compile(r"capture_r(\d+)_(\d+)\.safetensors$")


@dataclass(frozen=True)
class Comparison:
    serving: list[str]  # per serving slot: its tap, or the training slot it equals ("t1"), or "?"
    training: list[str]  # per training slot: its tap or "t<j>"
    matches: list[dict[str, Any]]  # per serving slot: what it equals in training, with cosines
    summary: str
    ranks: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "rca.compare/1",
            "serving": self.serving,
            "training": self.training,
            "matches": self.matches,
            "ranks": self.ranks,
            "summary": self.summary,
        }


def compare(
    capture: Path,
    dumps: Path | None,
    target: Path | None,
    device: str = "auto",
    max_tokens: int = 1024,
    base: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    if dumps is None and target is None:
        raise InputError(
            "nothing to compare the capture with",
            fix="pass --dumps (a replayed training prompt) or --target MODEL_DIR (any prompt), or both",
        )
    if not capture.exists():
        raise InputError(
            "--capture path does not exist", where=str(capture), fix="pass the directory rca capture --output wrote"
        )
    ranks = _compare_ranks(capture, base)
    if target is not None:
        from rca.evidence.reference import ReferenceModel

        reason = needs_dumps_and_weights(ProbeInputs(capture, target, device, max_tokens, base))
        if reason is not None:
            raise InputError(
                f"cannot fingerprint the capture: {reason}",
                fix="pass --target MODEL_DIR with the weights, or compare with --dumps only",
            )
        model_directory = ProbeInputs(capture, target).model_directory
        served_states = _lowest_rank(capture, base)
        _same_width(served_states, model_directory, base)  # type: ignore[arg-type]
        reference = ReferenceModel.load(model_directory, device, base)  # type: ignore[arg-type]
        probe = registered_probes()["fingerprint"]()  # a plugin: reached by discovery, never imported
        seen = probe.observe(reference, served_states, max_tokens, progress)  # type: ignore[attr-defined]  # its own
        best = [slot["cosine"] for slot in seen.data["slots"]]
        served = [tap if cosine >= UNRELATED else "?" for tap, cosine in zip(seen.value, best, strict=True)]  # type: ignore[arg-type]
        trained = (
            list(
                probe.observe(  # type: ignore[attr-defined]  # the fingerprint probe's own
                    reference, ProbeInputs(dumps, target, base=base).open_dumps(), max_tokens, progress
                ).value
            )
            if dumps is not None
            else []
        )  # type: ignore[arg-type]
        matches = [
            {
                "slot": index,
                "tap": tap,
                "cosine": round(best[index], 6),
                **({"training_slot": trained.index(tap)} if tap in trained else {}),
            }
            for index, tap in enumerate(served)
        ]
        summary = _describe(served, trained) + _transformed(best, "tap of the target given")
        return Comparison(served, trained, matches, summary, ranks)
    assert dumps is not None
    return _compare_tokens(capture, dumps, max_tokens, base, ranks)


def _compare_tokens(
    capture: Path, dumps: Path, max_tokens: int, base: Path | None, ranks: dict[str, Any]
) -> Comparison:
    """Slot by slot over the tokens a capture shares with a training sample."""
    served_sample = next(_lowest_rank(capture, base).samples(max_tokens))
    best: tuple[int, DumpSample] | None = None
    for sample in open_dumps(dumps, base, len(served_sample.slots[0][0]) if served_sample.slots else None).samples(
        None
    ):
        shared = _shared_prefix(served_sample.token_ids, sample.token_ids)
        if best is None or shared > best[0]:
            best = (shared, sample)
    if best is None or best[0] < MIN_SHARED:
        raise InputError(
            f"no training sample shares {MIN_SHARED} leading tokens with the capture "
            f"(at most {best[0] if best else 0})",
            where=served_sample.path,
            fix="capture a prompt replayed from the training data, or pass --target MODEL_DIR to compare through "
            "the target's taps",
        )
    shared, trained_sample = best
    training = {f"t{index}": slot[:shared] for index, slot in enumerate(trained_sample.slots)}
    matches: list[dict[str, Any]] = []
    served: list[str] = []
    for index, slot in enumerate(served_sample.slots):
        cosines = sorted(cosine_table(slot[:shared], training).items(), key=lambda item: -item[1])
        name, cosine = cosines[0]
        equal = cosine >= MATCH
        served.append(name if equal else "?")
        matches.append(
            {
                "slot": index,
                **({"training_slot": int(name[1:])} if equal else {}),
                "cosine": round(cosine, 6),
                "closest": name,
                "tokens": shared,
            }
        )
    summary = (
        _describe(served, list(training))
        + f" (over {shared} tokens shared with {trained_sample.path})"
        + _transformed([match["cosine"] for match in matches], "training slot")
    )
    return Comparison(served, list(training), matches, summary, ranks)


def _transformed(best: list[float], what: str) -> str:
    """What it means that no serving slot resembles anything it was compared with."""
    if not best or max(best) >= UNRELATED:
        return ""
    return (
        f"; no serving slot resembles any {what} (best cosine {max(best):.2f}): the served target's states are "
        "in another basis than these, as a rotated or quantized target's are (target-transformed)"
    )


def _describe(served: list[str], trained: list[str]) -> str:
    """Which serving slots hold what training fed, which are new, which training slots are lost."""
    if served == trained:
        return f"serving feeds what training fed: [{', '.join(served)}]"
    parts = [f"serving feeds [{', '.join(served)}], training fed [{', '.join(trained)}]"]
    added = [f"slot {index} ({tap})" for index, tap in enumerate(served) if tap not in trained]
    lost = [tap for tap in trained if tap not in served]
    if added:
        several = len(added) > 1
        parts.append(
            f"serving {'slots' if several else 'slot'} {', '.join(added)} {'are' if several else 'is'} not in training"
        )
    if lost:
        parts.append(f"training's {', '.join(lost)} {'are' if len(lost) > 1 else 'is'} not fed")
    positions = [(index, trained.index(tap)) for index, tap in enumerate(served) if tap in trained]
    shifts = {s - t for s, t in positions}
    if positions and len(shifts) == 1 and shifts != {0}:
        parts.append(
            f"the shared slots sit {abs(next(iter(shifts)))} "
            f"position(s) {'later' if next(iter(shifts)) > 0 else 'earlier'}"
        )
    elif positions and len(shifts) > 1 and not added and not lost:
        parts.append("the same slots in another order")
    return "; ".join(parts)


def _compare_ranks(capture: Path, base: Path | None) -> dict[str, Any]:
    """Captures of the same request on several ranks: the largest relative difference."""
    files = [capture] if capture.is_file() else sorted(capture.glob("capture_r*_*.safetensors"))
    groups: dict[str, dict[int, Path]] = {}
    for file in files:
        match = _RANK.search(file.name)
        if match:
            groups.setdefault(match[2], {})[int(match[1])] = file
    worst, compared = 0.0, []
    for number, by_rank in sorted(groups.items()):
        if len(by_rank) < 2:
            continue
        samples = {rank: next(open_dumps(path, base).samples(None)) for rank, path in sorted(by_rank.items())}
        first = samples[min(samples)]
        for sample in samples.values():
            for mine, theirs in zip(sample.slots, first.slots, strict=False):
                worst = max(
                    worst, float((mine.float() - theirs.float()).norm() / theirs.float().norm().clamp_min(1e-12))
                )
        compared.append(number)
    if not compared:
        return {}
    agree = worst <= RANKS_AGREE
    return {
        "captures": len(compared),
        "max_relative_difference": round(worst, 6),
        "agree": agree,
        "summary": "every rank captured the same states"
        if agree
        else f"ranks captured different states (relative difference up to {worst:.3f}): partial sums, captured "
        f"before the all-reduce",
    }


def _lowest_rank(capture: Path, base: Path | None) -> DumpSet:
    """The capture files of one rank (the lowest): ranks that captured partial sums must not be
    averaged into one fingerprint."""
    dumps = open_dumps(capture, base)
    ranked = [(int(match[1]), file) for file in dumps.files if (match := _RANK.search(file.name))]
    if not ranked:
        return dumps
    lowest = min(rank for rank, _ in ranked)
    return dataclasses.replace(dumps, files=tuple(file for rank, file in ranked if rank == lowest))


def _same_width(capture: DumpSet, target: Path, base: Path | None) -> None:
    """Refuse a capture of another model's states than the target's, before the target loads: the
    target's taps cannot be matched with states of another width."""
    from rca.inputs.configs import TargetConfig, load_config

    hidden_size = TargetConfig(load_config("target", target, base)).hidden_size
    sample = next(capture.samples(1))
    width = int(sample.slots[0].shape[1])
    if hidden_size is not None and width != hidden_size:
        raise InputError(
            f"the captured hidden states are {width} wide, but the target's hidden size is {hidden_size}",
            where=sample.path,
            fix="pass --target the model the engine served when it captured, or capture again from a server "
            "of this target",
        )


def _shared_prefix(a: Any, b: Any) -> int:
    length = min(len(a), len(b))
    differs = (a[:length] != b[:length]).nonzero()
    return int(differs[0]) if len(differs) else length
