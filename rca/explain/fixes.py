"""Fixes checked against the serving code: the draft-config edit that makes serving feed the wanted
slots, found by running the serving analysis again with candidate ids (never by a table of id
conventions), and the slots the model captures with its default layers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rca.inputs.configs import DraftConfig, TargetConfig
from rca.model import ConfigEdit, Hypothesis, Step, Tap
from rca.static.analyzer import registry
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.facts import CapturedTaps, CaptureSet, DraftInput, IdsOrigin
from rca.static.wiring import resolve_wiring

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Fix:
    ids: tuple[int, ...]
    key: str  # the config key to set, dotted
    location: Step | None  # where that key is (or would be)
    diff: str = ""  # the edit as a unified diff of the config file

    engine_offset: int | None = None  # an edit of the serving code, whose id k captures h(k + offset)

    @property
    def edit(self) -> ConfigEdit | None:
        """The fix as an edit of the draft config (None for an edit of the serving code)."""
        return ConfigEdit(tuple(self.key.split(".")), list(self.ids)) if self.engine_offset is None else None

    def text(self) -> str:
        if self.engine_offset is not None and self.location is not None:
            return (
                f"the serving engine sets the layers it captures itself and never reads the draft's ids: make "
                f"{self.location.location} set {self.key} to {list(self.ids)} (there, id k captures "
                f"h(k{self.engine_offset:+d}))"
            ).replace("h(k+0)", "hk")
        where = f" ({self.location.location})" if self.location else ""
        return f"set {self.key} to {list(self.ids)} in the draft config{where}"


def proposer(
    serving: SideContext | None, draft: DraftConfig | None, target: TargetConfig, progress: Progress | None
) -> tuple[Callable[[tuple[Tap, ...]], Fix | None], Callable[[], tuple[Tap, ...] | None]]:
    """Trials of the serving analysis with other ids in the draft config: the fix for a wanted set
    of slots, and the slots of the model's defaults (the ids read as None)."""
    capture = serving.fact(CaptureSet) if serving is not None else None
    if serving is not None and capture is not None and capture.ids_origin is IdsOrigin.ENGINE:
        return _engine_edit(serving, capture), (lambda: None)
    if serving is None or capture is None or draft is None or not capture.config_keys:
        return (lambda slots: None), (lambda: None)
    cache: dict[tuple[Tap, ...], Fix | None] = {}
    defaulted: list[tuple[Tap, ...] | None] = []  # what the model captures with its defaults, once resolved
    wiring_facts = {CaptureSet, CapturedTaps, DraftInput}  # a trial needs the taps, not the fc's width
    needed = {analyzer.name for analyzer in registry().for_side("serving") if wiring_facts & set(analyzer.provides)}

    def trial(keypath: tuple, value: object) -> SideContext:
        ctx = serving.trial(keypath, value, draft)
        run_side(ctx, only=needed)
        return ctx

    def reader_keypath() -> tuple:
        """Where the serving reader takes the ids from. When a parent key is missing, the reader
        stopped there; give it an empty mapping and see which key it asks for next."""
        keypath = capture.config_keys[0]
        for _ in range(3):
            found, value = draft.config.lookup(keypath)
            if found and value is not None and not isinstance(value, dict):  # a null parent: look inside it
                break
            retry = trial(keypath, {}).fact(CaptureSet)
            longer = [
                key
                for key in (retry.config_keys if retry else ())
                if key[: len(keypath)] == keypath and len(key) > len(keypath)
            ]
            if not longer:
                break
            keypath = longer[0]
        return keypath

    def propose(slots: tuple[Tap, ...]) -> Fix | None:
        if slots in cache:
            return cache[slots]
        cache[slots] = None
        if not slots or any(tap.layer is None or tap.norm for tap in slots):
            return None
        if progress:
            progress("checking candidate fixes against the serving code")
        keypath = reader_keypath()
        for delta in (-1, 0, 1):  # the id conventions in use: k -> h(k+1), k -> hk, k -> h(k-1)
            ids = tuple(tap.layer + delta for tap in slots)  # type: ignore[operator]
            if any(i < -1 for i in ids):
                continue
            wiring = resolve_wiring(trial(keypath, list(ids)))
            if wiring.slots == slots:
                location = draft.config.step(keypath, "set the ids here")
                cache[slots] = Fix(
                    ids,
                    ".".join(map(str, keypath)),
                    replace(location, note="the key to change"),
                    draft.config.edit_diff(keypath, list(ids)),
                )
                break
        return cache[slots]

    def defaults() -> tuple[Tap, ...] | None:
        if not defaulted:
            if progress:
                progress("resolving what the model captures with its default layers")
            defaulted.append(resolve_wiring(trial(reader_keypath(), None)).slots or None)
        return defaulted[0]

    return propose, defaults


def _engine_edit(serving: SideContext, capture: CaptureSet) -> Callable[[tuple[Tap, ...]], Fix | None]:
    """An engine that chooses the captured layers itself: the edit of the line that sets them,
    in the numbering its own capture shows (the ids it sets against the taps it captures)."""
    captured = serving.fact(CapturedTaps)
    ids = sorted(item.v for item in getattr(capture.ids.v, "items", ()) if isinstance(item.v, int))
    layers = sorted(tap.layer for tap in captured.taps if tap is not None and tap.layer is not None) if captured else []
    offsets = {layer - i for layer, i in zip(layers, ids, strict=False)}
    if capture.delivery is None or len(offsets) != 1 or len(layers) != len(ids):
        return lambda slots: None
    offset = offsets.pop()

    def propose(slots: tuple[Tap, ...]) -> Fix | None:
        if not slots or any(tap.layer is None or tap.norm for tap in slots):
            return None
        wanted = tuple(tap.layer - offset for tap in slots)  # type: ignore[operator]
        return Fix(wanted, capture.attribute, capture.delivery, engine_offset=offset)

    return propose


VOCAB_MAP_BREAKS = ("vocab-map-missing", "vocab-map-invalid")


def with_recovered_map(
    hypotheses: tuple[Hypothesis, ...],
    draft: Path | None,
    target: Path | None,
    base: Path | None,
    device: str,
    progress: Progress | None = None,
) -> tuple[tuple[Hypothesis, ...], str]:
    """A broken vocab map ranked first gets the map the draft's own head rows give as its fix (an
    edit of the checkpoint, which --serve-with can serve); otherwise the hypotheses are as they
    were. Returns them with a note on why no map was recovered ("" when one was, or none was sought)."""
    if not hypotheses or hypotheses[0].id not in VOCAB_MAP_BREAKS or draft is None or target is None:
        return hypotheses, ""
    from rca.errors import RcaError
    from rca.evidence.vocab_recovery import recover_map

    try:
        recovered = recover_map(draft, target, base, device, progress)
    except RcaError as error:
        return hypotheses, error.what
    held = "; remove the d2t and t2d the checkpoint holds" if hypotheses[0].id == "vocab-map-invalid" else ""
    fix = (
        f"give the draft's checkpoint the d2t (and t2d) its lm_head rows give, {recovered.summary}: rca probe "
        f"vocab-map --draft DRAFT --target MODEL_DIR --write-map FILE writes them to a safetensors file to put "
        f"beside the draft's weights{held}"
    )
    return (dataclasses.replace(hypotheses[0], fix=fix, fix_edit=recovered.edit), *hypotheses[1:]), ""
