"""Probe: whether the dumps' conversations open each assistant turn as the server prompts, and are learned whole."""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from rca.sdk import (
    Confidence,
    Evidence,
    Location,
    Observation,
    Probe,
    ProbeInputs,
    Step,
    StepKind,
    Tap,
    TemplateUse,
    Wiring,
)
from rca.sdk.inputs import ASSISTANT, TOKENIZER_FILE, USER, TokenRecord, load_tokenizer, open_dumps, token_records

MAX_FILES = 1000  # dump files read at the most: the tokens of a thousand conversations settle it
GAP = 0.05  # the share of assistant tokens left out of the loss mask that is a gap, not rounding
SCAFFOLDED = 0.5  # the share of turns continued by training's own prompt text that marks another rendering
_QUOTED = 60  # characters of a sample's text quoted


@dataclass
class _Tally:
    """What the files read so far show."""

    files: int = 0
    masked_files: int = 0
    served_turns: int = 0  # turns opened by the served generation prompt
    scaffolded: int = 0  # ... of them continued by the text training's prompt adds (`<think>\n\n</think>\n\n`)
    trained_turns: int = 0  # turns opened by training's prompt where the served one never occurs
    assistant_tokens: int = 0
    unlearned: int = 0  # assistant tokens with loss mask 0
    example: str = ""  # where the first gap was seen


class ChatTemplateTokens(Probe):
    """Reads the dumps' token ids and loss masks: how each assistant turn opens, and whether its tokens are learned.

    ## Why it matters
    The dumps are what training saw, whatever its settings say. Decoding their token ids with the
    target's tokenizer shows, at every assistant turn, whether it opens as the server's generation
    prompt does (its template, with its arguments), or as another rendering does (an empty
    `<think></think>` block the served prompt does not end with). Where the dumps keep a loss
    mask, every token of each assistant turn, thinking included, up to its end-of-turn marker
    must be marked: a token left at 0 is never learned. Only token ids and masks are read, never a
    hidden state.
    """

    name = "chat-template-tokens"
    cost = 1.0
    command = "rca probe template"
    arguments = "--dumps DUMPS --target MODEL_DIR [--serving-args ARGS]"
    settles = ("template-mismatch", "loss-mask-gap")

    def applies(self, inputs: ProbeInputs) -> bool:
        return inputs.served_template is not None

    def unavailable(self, inputs: ProbeInputs) -> str | None:
        if inputs.dumps is None:
            return "no --dumps given"
        if inputs.target is None:
            return "no --target given"
        directory = inputs.target if inputs.target.is_dir() else inputs.target.parent
        if not (directory / TOKENIZER_FILE).is_file():
            return f"the target has no {TOKENIZER_FILE}"
        return None

    def predict(self, slots: tuple[Tap, ...]) -> Hashable:
        return None  # says nothing about which states training fed

    def bearing(self, observation: Observation, serving: Wiring) -> dict[str, Evidence]:
        said, cited = observation.summary, observation.citations
        bearing = {}
        if observation.value in ("other", "unmatched"):
            strength = 10.0 if observation.value == "other" else 4.0
            bearing["template-mismatch"] = Evidence(said, Confidence.OBSERVED, strength, cited)
        elif observation.value == "served":
            bearing["template-mismatch"] = Evidence(said, Confidence.OBSERVED, 0.2, cited)
        mask = observation.data.get("loss_mask")
        if mask == "gap":
            bearing["loss-mask-gap"] = Evidence(said, Confidence.OBSERVED, 20.0, cited)
        elif mask == "covered":
            bearing["loss-mask-gap"] = Evidence(said, Confidence.OBSERVED, 0.1, cited)
        return bearing

    def run(self, inputs: ProbeInputs, progress: Any = None) -> Observation:
        served = inputs.served_template
        assert served is not None and inputs.target is not None
        tokenizer = load_tokenizer(inputs.target, inputs.base)
        header = _opening(served)
        trained = _opening(inputs.trained_template) if inputs.trained_template is not None else None
        close = served.exchange.split(ASSISTANT)[-1].strip() or served.exchange.split(ASSISTANT)[-1]
        pieces: dict[int, str] = {}
        tally = _Tally()
        assert inputs.dumps is not None
        dumps = open_dumps(inputs.dumps, inputs.base, check=False, vocabulary=tokenizer.get_vocab_size())
        for record in token_records(dumps, MAX_FILES):
            _read_turns(record, tokenizer, pieces, header, trained, close, tally)
            if progress and tally.files % 200 == 0:
                progress(f"{self.name}: {tally.files} dump files read")
        value = _verdict(tally, header, trained)
        mask = (
            None
            if tally.masked_files == 0 or tally.assistant_tokens == 0
            else "gap"
            if tally.unlearned > GAP * tally.assistant_tokens
            else "covered"
        )
        said = _summary(tally, value, mask, header, trained)
        citation = Step(Location("dumps", str(dumps.files[0].parent.name or "."), 1, 1), said, kind=StepKind.DUMP)
        data = {
            "value": value,
            "loss_mask": mask,
            "files": tally.files,
            "files_with_loss_mask": tally.masked_files,
            "turns_opened_as_served": tally.served_turns,
            "turns_continued_by_training_prompt": tally.scaffolded,
            "turns_opened_as_trained_only": tally.trained_turns,
            "assistant_tokens": tally.assistant_tokens,
            "assistant_tokens_unlearned": tally.unlearned,
            "served_opening": header,
            **({"trained_opening": trained} if trained is not None else {}),
        }
        return Observation(self.name, value, said, data, (citation,), reliability=0.95)


def _opening(use: TemplateUse) -> str:
    """What a template puts between the question and the first token the draft proposes: the end
    of the user's turn and the generation prompt (`<|im_end|>\\n<|im_start|>assistant\\n`)."""
    return use.prompt.split(USER)[-1]


def _read_turns(
    record: TokenRecord,
    tokenizer: Any,
    pieces: dict[int, str],
    header: str,
    trained: str | None,
    close: str,
    tally: _Tally,
) -> None:
    """Decode one file token by token (each id once per run) and tally its assistant turns."""
    tally.files += 1
    starts, parts, at = [], [], 0
    for token in record.ids:
        piece = pieces.get(token)
        if piece is None:
            piece = pieces[token] = tokenizer.decode([token], skip_special_tokens=False)
        starts.append(at)
        parts.append(piece)
        at += len(piece)
    text = "".join(parts)
    opened = _occurrences(text, header)
    extra = trained[len(header) :] if trained is not None and trained.startswith(header) else ""
    for begin in opened:
        tally.served_turns += 1
        if extra and text.startswith(extra, begin + len(header)):
            tally.scaffolded += 1
    if not opened and trained is not None and trained != header:
        tally.trained_turns += len(_occurrences(text, trained))
        opened = _occurrences(text, trained)
        header = trained
    if record.loss_mask is None:
        return
    tally.masked_files += 1
    for begin in opened:
        content = begin + len(header)
        end = text.find(close, content)
        end = len(text) if end < 0 else end + len(close)
        first, last = bisect.bisect_left(starts, content), bisect.bisect_left(starts, end)
        left_out = [index for index in range(first, last) if not record.loss_mask[index]]
        tally.assistant_tokens += last - first
        tally.unlearned += len(left_out)
        if left_out and not tally.example:
            shown = text[starts[left_out[0]] : starts[left_out[0]] + _QUOTED]
            tally.example = f"{record.path}, token {left_out[0]} ({shown!r})"


def _occurrences(text: str, needle: str) -> list[int]:
    found, at = [], text.find(needle)
    while needle and at >= 0:
        found.append(at)
        at = text.find(needle, at + len(needle))
    return found


def _verdict(tally: _Tally, header: str, trained: str | None) -> str | None:
    if tally.served_turns and tally.scaffolded > SCAFFOLDED * tally.served_turns:
        return "other"
    if tally.served_turns:
        return "served"
    if tally.trained_turns:
        return "other"
    return "unmatched" if tally.files else None


def _summary(tally: _Tally, value: str | None, mask: str | None, header: str, trained: str | None) -> str:
    turns = {
        "served": f"{tally.served_turns:,} assistant turns in {tally.files:,} dump files open as the server prompts "
        f"({header!r})",
        "other": (
            f"{tally.scaffolded:,} of {tally.served_turns:,} assistant turns continue the served prompt with the text "
            f"training's prompt adds ({trained!r} against {header!r})"
            if tally.served_turns
            else f"no assistant turn in {tally.files:,} dump files opens as the server prompts ({header!r}); "
            f"{tally.trained_turns:,} open as training's template does ({trained!r})"
        ),
        "unmatched": f"no assistant turn in {tally.files:,} dump files opens as the server prompts ({header!r})",
    }.get(value or "", "no dump file was read")
    if mask is None:
        return f"{turns}; the dumps keep no loss mask" if tally.masked_files == 0 else turns
    share = tally.unlearned / tally.assistant_tokens
    masked = (
        f"the loss mask leaves {tally.unlearned:,} of {tally.assistant_tokens:,} assistant tokens ({share:.0%}) "
        f"unlearned, first at {tally.example}"
        if mask == "gap"
        else f"the loss mask covers {tally.assistant_tokens - tally.unlearned:,} of {tally.assistant_tokens:,} "
        "assistant tokens"
    )
    return f"{turns}; {masked}"
