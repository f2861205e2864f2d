"""Acceptance as the engine itself measures it: prompts sent to a running server, and the
speculative-decoding counters it keeps, read before and after.

What is read, from each engine's own code:

* vLLM (v1 engine, 0.8 and later): the Prometheus counters at `/metrics` that
  `vllm/v1/spec_decode/metrics.py` (`SpecDecodingProm`) defines, `vllm:spec_decode_num_drafts`,
  `vllm:spec_decode_num_draft_tokens`, `vllm:spec_decode_num_accepted_tokens` and
  `vllm:spec_decode_num_accepted_tokens_per_pos` (label `position`), each exported with the
  `_total` suffix and one series per engine. Prompts go to `/v1/completions` as token ids.
* SGLang: per request, the `meta_info` of its native `/generate` answer
  (`managers/tokenizer_manager.py`): `spec_verify_ct` (verify steps), `completion_tokens`, and from
  0.5.12 `spec_num_correct_drafts`, `spec_num_proposed_drafts` and
  `spec_correct_drafts_histogram` (how many verify steps accepted n drafts). Its Prometheus gauge
  `sglang:spec_accept_length` and the "accept len" of its log lines average only the last 40 decode
  steps, so rca sums the requests' own counts instead.

Mean acceptance length counts the token each verify step adds itself, as both engines do:
1 + accepted / drafts.

A server is untrusted input. Each request has a deadline for the whole of it and a bound on its
answer's size; redirects are not followed; a count must be a whole, finite, non-negative number
that did not go down while rca measured, with no more tokens accepted than drafted and draft
positions in range. Anything else is one line naming the counter or the URL (exit 2), never a
figure.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rca.errors import InputError, brief
from rca.evidence.engine.process import Ended, Launched, stopped_on_signals

Progress = Callable[[str], None]
VLLM_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
    "per_position": "vllm:spec_decode_num_accepted_tokens_per_pos",
}
SGLANG_FIELDS = (
    "spec_verify_ct",
    "completion_tokens",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
)
_SGLANG_NAMES = {
    "drafts": "meta_info.spec_verify_ct",
    "accepted": "meta_info.spec_num_correct_drafts",
    "per_position": "meta_info.spec_correct_drafts_histogram",
}
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}
MAX_POSITIONS = 1024  # draft positions a counter may name: engines speculate a handful of tokens
PROMPT_SECONDS = 600.0  # one prompt, answered whole
METRICS_SECONDS = INFO_SECONDS = 30.0
METRICS_BYTES = 32 << 20  # vLLM's /metrics is some hundred KiB
ANSWER_BYTES = 8 << 20
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Counts:
    """Speculative-decoding counts over the prompts sent: drafts (verify steps with a draft),
    draft tokens proposed, draft tokens accepted, and accepted tokens by draft position."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...] = ()

    def minus(self, before: Counts, where: str) -> Counts:
        """The counts since `before`; a counter that went down is no count of these prompts."""
        width = max(len(self.per_position), len(before.per_position))
        mine = (*self.per_position, *[0] * (width - len(self.per_position)))
        theirs = (*before.per_position, *[0] * (width - len(before.per_position)))
        pairs = {
            VLLM_COUNTERS["drafts"]: (self.drafts, before.drafts),
            VLLM_COUNTERS["draft_tokens"]: (self.draft_tokens, before.draft_tokens),
            VLLM_COUNTERS["accepted"]: (self.accepted, before.accepted),
            **{
                f"{VLLM_COUNTERS['per_position']} position {j}": pair
                for j, pair in enumerate(zip(mine, theirs, strict=True))
            },
        }
        for counter, (after, earlier) in pairs.items():
            if after < earlier:
                raise CounterError(counter, f"went down from {earlier:,} to {after:,} while rca measured", where)
        return Counts(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(a - b for a, b in zip(mine, theirs, strict=True)),
        )

    def checked(self, where: str, names: dict[str, str]) -> Counts:
        """These counts, when they can be true of speculative decoding: no more tokens accepted
        than drafted, no position accepted in more drafts than there were."""
        if self.accepted > self.draft_tokens:
            raise CounterError(
                names["accepted"], f"says {self.accepted:,} accepted of {self.draft_tokens:,} draft tokens", where
            )
        if self.draft_tokens and self.drafts > self.draft_tokens:
            raise CounterError(names["drafts"], f"says {self.drafts:,} drafts of {self.draft_tokens:,} tokens", where)
        for position, count in enumerate(self.per_position):
            if count > self.drafts:
                raise CounterError(
                    names["per_position"],
                    f"says {count:,} drafts accepted at position {position} of {self.drafts:,} drafts",
                    where,
                )
        return self


@dataclass(frozen=True)
class ServedAcceptance:
    """What the engine measured while it served the prompts."""

    engine: str
    url: str
    prompts: int
    generated_tokens: int
    counts: Counts
    read: tuple[str, ...]  # the counters or fields the figures come from
    seconds: float  # serving the prompts
    startup_seconds: float | None = None  # from the launch until the server answered
    launch: tuple[str, ...] = field(default=())

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens per draft token proposed."""
        return self.counts.accepted / self.counts.draft_tokens if self.counts.draft_tokens else 0.0

    @property
    def by_position(self) -> tuple[float, ...]:
        """Per draft position j, the share of drafts whose first j+1 tokens were all accepted."""
        drafts = self.counts.drafts
        return tuple(count / drafts for count in self.counts.per_position) if drafts else ()

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.counts.accepted / self.counts.drafts if self.counts.drafts else 1.0

    @property
    def summary(self) -> str:
        positions = ", ".join(f"{rate:.3f}" for rate in self.by_position)
        started = f"; the engine answered {self.startup_seconds:.0f} s after its launch" if self.startup_seconds else ""
        return (
            f"{self.engine} accepted {self.counts.accepted:,} of {self.counts.draft_tokens:,} draft tokens "
            f"({self.acceptance:.3f}) over {self.counts.drafts:,} drafts for {self.prompts} prompts "
            f"({self.generated_tokens:,} tokens generated in {self.seconds:.1f} s); mean acceptance length "
            f"{self.mean_acceptance_length:.2f}" + (f"; by position {positions}" if positions else "") + started
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "rca.served-acceptance/1",
            "engine": self.engine,
            "url": self.url,
            "prompts": self.prompts,
            "generated_tokens": self.generated_tokens,
            "drafts": self.counts.drafts,
            "draft_tokens": self.counts.draft_tokens,
            "accepted_tokens": self.counts.accepted,
            "acceptance": round(self.acceptance, 4),
            "by_position": [round(rate, 4) for rate in self.by_position],
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "read": list(self.read),
            "seconds": round(self.seconds, 2),
            "startup_seconds": None if self.startup_seconds is None else round(self.startup_seconds, 1),
            "launch": list(self.launch),
            "summary": self.summary,
        }


@dataclass(frozen=True)
class Prompts:
    """What to send: token ids or text, and how many tokens each may generate."""

    items: tuple[list[int] | str, ...]
    max_tokens: int = 64
    source: str = ""


# -- prompts -----------------------------------------------------------------------------------------


def read_prompts(path: Path, count: int, max_tokens: int, base: Path | None = None) -> Prompts:
    """Prompts from a file: JSON (a list of token-id lists or strings, or {"prompts": [...]}), JSON
    lines with a "prompt" or "input_ids" field, or plain text with one prompt a line."""
    from rca.inputs.configs import display_path

    shown = display_path(path, base)
    fix = 'pass --prompts a JSON list of token-id lists or strings, {"prompts": [...]}, or a text file of lines'
    if not path.is_file():
        raise InputError("--prompts is not a file", where=shown, fix=fix)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"--prompts cannot be read ({error})", where=shown, fix=fix) from None
    items: list[Any]
    try:
        loaded = json.loads(text)
        items = loaded.get("prompts") if isinstance(loaded, dict) else loaded  # type: ignore[assignment]  # checked below
    except RecursionError:
        raise InputError("--prompts is nested too deeply to be prompts", where=shown, fix=fix) from None
    except ValueError:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            records = [json.loads(line) for line in lines]
            items = [record.get("input_ids", record.get("prompt")) for record in records if isinstance(record, dict)]
        except ValueError:
            items = lines
    if not isinstance(items, list) or not items:
        raise InputError("--prompts holds no prompts", where=shown, fix=fix)
    prompts: list[list[int] | str] = []
    for item in items[:count]:
        if isinstance(item, str) and item.strip():
            prompts.append(item)
        elif (
            isinstance(item, list)
            and item
            and all(isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in item)
        ):
            prompts.append(item)
        else:
            raise InputError(f"prompt {len(prompts) + 1} is neither text nor a list of token ids", where=shown, fix=fix)
    return Prompts(tuple(prompts), max_tokens, shown)


def prompts_from_dumps(dumps: Path, count: int, length: int, max_tokens: int, base: Path | None = None) -> Prompts:
    """The first `length` token ids of the dumps' samples: prompts the draft was trained on."""
    from rca.inputs.dumps import open_dumps

    dump_set = open_dumps(dumps, base)
    items: list[list[int] | str] = []
    for sample in dump_set.samples(None):
        ids = [int(token) for token in sample.token_ids[:length]]
        if ids:
            items.append(ids)
        if len(items) >= count:
            break
    if not items:
        raise InputError("the dumps hold no token ids", where=str(dumps), fix="pass --prompts FILE instead")
    return Prompts(tuple(items), max_tokens, f"the first {length} tokens of {len(items)} dump samples")


# -- talking to the server ---------------------------------------------------------------------------


class ServerFault(InputError):
    """A server that did not answer as an engine does: nothing there, an HTTP error, a redirect,
    too slow, too large, cut short."""

    def __init__(self, what: str, url: str, status: int | None = None, unreached: str = "") -> None:
        super().__init__(what, where=url, fix="pass --url of a vLLM or SGLang server that serves the draft")
        self.status = status
        self.unreached = unreached  # why nothing answered at all (refused, timed out), if nothing did


def _request(
    url: str, payload: dict | None = None, seconds: float = PROMPT_SECONDS, limit: int = ANSWER_BYTES
) -> bytes:
    """The body of one request, under a deadline for the whole of it (connecting, sending, every
    byte of the answer: a server that trickles a byte a second is cut off) and a size bound. A
    redirect is not followed: the server measured is the one asked."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerFault("is not an http(s) URL", url)
    deadline = time.monotonic() + seconds

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    body = json.dumps(payload).encode() if payload is not None else None
    try:
        connection = kind(parts.hostname, parts.port, timeout=seconds)
    except ValueError as error:  # a port out of range
        raise ServerFault(f"is not a URL rca can reach ({error})", url, unreached=str(error)) from None
    answered = False
    try:
        connection.connect()
        sock = connection.sock
        connection.request(
            "POST" if body is not None else "GET",
            urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")),
            body=body,
            headers={"Content-Type": "application/json"} if body is not None else {},
        )
        sock.settimeout(left())
        answer = connection.getresponse()
        answered = True
        if answer.status >= 300:
            detail = answer.read(400).decode("utf-8", "replace").strip()
            moved = f" to {answer.getheader('Location') or '?'}, not followed" if answer.status < 400 else ""
            raise ServerFault(
                f"answered HTTP {answer.status}{moved}" + (f": {detail}" if detail else ""), url, answer.status
            )
        declared = answer.getheader("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ServerFault(f"answered {int(declared):,} bytes, more than the {limit:,} rca reads", url)
        chunks: list[bytes] = []
        size = 0
        while True:
            sock.settimeout(left())
            chunk = answer.read1(1 << 16)
            if not chunk:
                if answer.length:  # fewer bytes than its Content-Length said
                    raise http.client.IncompleteRead(b"".join(chunks), answer.length)
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise ServerFault(f"answered more than the {limit:,} bytes rca reads", url)
            chunks.append(chunk)
    except ServerFault:
        raise
    except http.client.IncompleteRead:
        raise ServerFault("cut its answer short", url) from None
    except TimeoutError:
        raise ServerFault(
            f"gave no whole answer within {seconds:g} s", url, unreached="" if answered else "timed out"
        ) from None
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise ServerFault(f"did not answer ({brief(error)})", url, unreached=brief(error)) from None
    finally:
        connection.close()


def _get_json(url: str, seconds: float = INFO_SECONDS) -> Any:
    return _json(_request(url, seconds=seconds), url)


def _json(data: bytes, url: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ServerFault("answered something other than JSON", url) from None


def reachable(url: str) -> str:
    """`url` when a server answers there (if not with 200); one line saying so when nothing does."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InputError("--url is not an http(s) URL", where=url, fix="pass --url http://HOST:PORT")
    try:
        _request(f"{url}/health", seconds=10)
    except ServerFault as fault:
        if fault.unreached:
            raise InputError(
                f"nothing answers at --url ({fault.unreached})",
                where=url,
                fix="start the server first, or pass its launch command after -- for rca to start it",
            ) from None
    return url


def detect_engine(url: str) -> str:
    """Which engine answers at `url`: vLLM exports `vllm:` metrics, SGLang has `/server_info` (or,
    before 0.5.12, `/get_server_info`)."""
    try:
        metrics = _request(f"{url}/metrics", seconds=METRICS_SECONDS, limit=METRICS_BYTES).decode("utf-8", "replace")
    except ServerFault:
        metrics = ""
    if "vllm:" in metrics:
        return "vllm"
    for route in ("/server_info", "/get_server_info"):
        try:
            _get_json(f"{url}{route}")
            return "sglang"
        except ServerFault:
            continue
    raise InputError(
        "the server answers, but as neither vLLM (no vllm: metrics at /metrics) nor SGLang (no /server_info)",
        where=url,
        fix="pass --url of a vLLM or SGLang server that serves the draft",
    )


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value)."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        samples.append((match["name"], dict(_LABEL.findall(match["labels"] or "")), value))
    return samples


class CounterError(InputError):
    """A speculative-decoding counter no engine could report: rca will not make a figure of it."""

    def __init__(self, counter: str, what: str, where: str) -> None:
        super().__init__(
            f"{counter} {what}",
            where=where,
            fix="measure a server that serves the draft alone at that URL, and that is not restarted while rca "
            "measures it",
        )


def _count(value: Any, counter: str, where: str) -> int:
    """A count as the engine reported it: a whole, finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CounterError(counter, f"is {repr(value)[:40]}, not a count", where)
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise CounterError(counter, f"is {value!r}, not a count", where)
    return int(value)


def vllm_counts(text: str, where: str = "/metrics") -> Counts | None:
    """vLLM's speculative-decoding counters summed over engines (None when it exports none)."""
    totals: dict[str, int] = {}
    positions: dict[int, int] = {}
    found = False
    for name, labels, value in parse_metrics(text):
        base = name.removesuffix("_total")
        if base == VLLM_COUNTERS["per_position"]:
            found = True
            label = labels.get("position", "0")
            if not label.isdigit() or int(label) >= MAX_POSITIONS:
                raise CounterError(name, f'has position="{label[:20]}", not a draft position', where)
            positions[int(label)] = positions.get(int(label), 0) + _count(value, name, where)
        elif base in VLLM_COUNTERS.values():
            found = True
            totals[base] = totals.get(base, 0) + _count(value, name, where)
    if not found:
        return None
    return Counts(
        totals.get(VLLM_COUNTERS["drafts"], 0),
        totals.get(VLLM_COUNTERS["draft_tokens"], 0),
        totals.get(VLLM_COUNTERS["accepted"], 0),
        tuple(positions.get(j, 0) for j in range(max(positions, default=-1) + 1)),
    )


def _vllm_model(url: str) -> str:
    try:
        return str(_get_json(f"{url}/v1/models")["data"][0]["id"])
    except (ServerFault, KeyError, IndexError, TypeError):
        raise InputError(
            "the vLLM server lists no model at /v1/models", where=url, fix="pass --url of the server that serves it"
        ) from None


def _send_vllm(url: str, model: str, prompt: list[int] | str, max_tokens: int) -> tuple[int, dict]:
    where = f"{url}/v1/completions"
    answer = _json(
        _request(
            where, {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
        ),
        where,
    )
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        raise ServerFault("answered a prompt without usage counts", where)
    return _count(usage.get("completion_tokens", 0), "usage.completion_tokens", where), {}


def _send_sglang(url: str, prompt: list[int] | str, max_tokens: int) -> tuple[int, dict]:
    where = f"{url}/generate"
    key = "input_ids" if isinstance(prompt, list) else "text"
    sampling = {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    answer = _json(_request(where, {key: prompt, "sampling_params": sampling}), where)
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    if not isinstance(meta, dict):
        raise ServerFault("answered a prompt without meta_info", where)
    return _count(meta.get("completion_tokens", 0), "meta_info.completion_tokens", where), {
        name: meta[name] for name in SGLANG_FIELDS if name in meta
    }


def sglang_counts(metas: Sequence[dict], draft_tokens_per_step: int | None, where: str = "/generate") -> Counts | None:
    """The requests' own speculative counts summed (None when the server reported none)."""
    if not any("spec_verify_ct" in meta for meta in metas):
        return None

    def total(name: str) -> int:
        return sum(_count(meta.get(name, 0), f"meta_info.{name}", where) for meta in metas)

    drafts = total("spec_verify_ct")
    if all("spec_num_correct_drafts" in meta for meta in metas):
        accepted, proposed = total("spec_num_correct_drafts"), total("spec_num_proposed_drafts")
    else:  # before 0.5.12: each verify step adds its accepted drafts and one token; the first comes from prefill
        accepted = sum(
            max(
                0,
                _count(meta.get("completion_tokens", 0), "meta_info.completion_tokens", where)
                - 1
                - int(meta["spec_verify_ct"]),
            )
            for meta in metas
        )
        proposed = drafts * (draft_tokens_per_step or 0)
    histogram: list[int] = []
    for meta in metas:
        buckets = meta.get("spec_correct_drafts_histogram") or []
        if not isinstance(buckets, list) or len(buckets) > MAX_POSITIONS + 1:
            raise CounterError(
                "meta_info.spec_correct_drafts_histogram",
                f"is not a list of at most {MAX_POSITIONS + 1} counts (one per number of correct drafts)",
                where,
            )
        histogram.extend([0] * (len(buckets) - len(histogram)))
        for correct, steps in enumerate(buckets):
            histogram[correct] += _count(steps, "meta_info.spec_correct_drafts_histogram", where)
    at_least, per_position = 0, []  # per position j: verify steps with more than j correct drafts
    for steps in reversed(histogram[1:]):
        at_least += steps
        per_position.append(at_least)
    return Counts(drafts, proposed, accepted, tuple(reversed(per_position)))


def _sglang_draft_tokens(url: str) -> int | None:
    for route in ("/server_info", "/get_server_info"):
        try:
            info = _get_json(f"{url}{route}")
        except ServerFault:
            continue
        steps = info.get("speculative_num_steps") if isinstance(info, dict) else None
        return steps if isinstance(steps, int) and not isinstance(steps, bool) and 0 < steps <= MAX_POSITIONS else None
    return None


def _vllm_counts_at(url: str) -> Counts:
    where = f"{url}/metrics"
    text = _request(where, seconds=METRICS_SECONDS, limit=METRICS_BYTES).decode("utf-8", "replace")
    counts = vllm_counts(text, where)
    if counts is None:
        raise InputError(
            "the server exports no speculative-decoding counters (vllm:spec_decode_*): it serves without a draft",
            where=where,
            fix='launch it with the draft, e.g. --speculative-config \'{"method": "eagle3", "model": DRAFT, '
            '"num_speculative_tokens": 3}\'',
        )
    return counts


def measure(
    url: str,
    prompts: Prompts,
    progress: Progress | None = None,
    concurrency: int = 32,
    engine: str | None = None,
) -> ServedAcceptance:
    """Send the prompts to the server at `url` (several at a time, as traffic comes) and read what
    its speculative decoding did with them."""
    url = url.rstrip("/")
    engine = engine or detect_engine(url)
    if engine == "vllm":
        model = _vllm_model(url)
        before = _vllm_counts_at(url)

        def send(prompt):
            return _send_vllm(url, model, prompt, prompts.max_tokens)
    else:

        def send(prompt):
            return _send_sglang(url, prompt, prompts.max_tokens)

    if progress:
        progress(f"sending {len(prompts.items)} prompts to {engine} at {url} ({prompts.max_tokens} tokens each)")
    started = time.monotonic()
    answers: list[tuple[int, dict]] = []
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(prompts.items)))) as pool:
            for answer in pool.map(send, prompts.items):
                answers.append(answer)
                if progress and (len(answers) % 8 == 0 or len(answers) == len(prompts.items)):
                    progress(f"served {len(answers)}/{len(prompts.items)} prompts")
    except ServerFault as fault:
        if fault.status is not None and 400 <= fault.status < 500:
            raise InputError(
                f"the server refused a prompt ({fault.what})",
                where=fault.where,
                fix="pass prompts the served model takes (token ids within its vocabulary, within its context)",
            ) from None
        raise
    seconds = time.monotonic() - started
    generated = sum(tokens for tokens, _ in answers)
    if engine == "vllm":
        counts = _vllm_counts_at(url).minus(before, f"{url}/metrics").checked(f"{url}/metrics", VLLM_COUNTERS)
        read = tuple(f"{name}_total" for name in VLLM_COUNTERS.values())
    else:
        counted = sglang_counts([meta for _, meta in answers], _sglang_draft_tokens(url), f"{url}/generate")
        if counted is None:
            raise InputError(
                "the server's answers carry no speculative-decoding counts (meta_info.spec_verify_ct): it serves "
                "without a draft",
                where=url,
                fix="launch it with --speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT",
            )
        counts = counted.checked(f"{url}/generate", _SGLANG_NAMES)
        read = tuple(f"meta_info.{name}" for name in SGLANG_FIELDS)
    if counts.drafts <= 0 or counts.draft_tokens <= 0:
        raise InputError(
            f"the speculative-decoding counters did not move while {len(answers)} prompts were served "
            f"({generated:,} tokens generated)",
            where=url,
            fix="check that the server speculates for these requests (and, for vLLM, that it is not launched with "
            "--disable-log-stats, which stops its counters)",
        )
    return ServedAcceptance(engine, url, len(answers), generated, counts, read, seconds)


# -- a server rca starts itself ---------------------------------------------------------------------


def launch_url(command: Sequence[str]) -> str:
    """Where a launched server will answer: its --host and --port, else the engine's default port."""

    def value(flag: str) -> str | None:
        for index, argument in enumerate(command):
            if argument == flag and index + 1 < len(command):
                return command[index + 1]
            if argument.startswith(flag + "="):
                return argument.split("=", 1)[1]
        return None

    host = value("--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    engine = "sglang" if any("sglang" in argument for argument in command) else "vllm"
    port = value("--port") or str(DEFAULT_PORTS[engine])
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(
            f"the launch's --port {port[:20]} is not a TCP port", fix="launch the engine on a port 1-65535"
        )
    return f"http://{host}:{port}"


def wait_until_ready(url: str, launched: Launched, timeout: float, progress: Progress | None) -> float:
    """Seconds until the server at `url` answers /health; the engine's own error when it exits first."""
    started = time.monotonic()
    said = 0.0
    while True:
        elapsed = time.monotonic() - started
        if not launched.running():
            ended = launched.wait()
            raise EngineExited(ended, url)
        try:
            _request(f"{url}/health", seconds=5)
            return elapsed
        except ServerFault:
            pass
        if elapsed > timeout:
            raise InputError(
                f"the launched server did not answer at {url} within {timeout:.0f} s",
                where=" ".join(launched.command[:3]),
                fix="pass --url where it listens (or its --port), or a longer --startup-timeout",
            )
        if progress and elapsed - said >= 15:
            said = elapsed
            progress(f"waiting for the engine to answer at {url} ({elapsed:.0f} s)")
        time.sleep(1.0)


class EngineExited(InputError):
    """A launched engine that ended before it served, with its last lines."""

    def __init__(self, ended: Ended, url: str) -> None:
        last = ended.last_error()
        super().__init__(
            f"the launched engine {ended.describe()} before it answered" + (f" ({last})" if last else ""),
            where=url,
            fix="run the launch command by itself to see it start, then pass it again",
        )
        self.ended = ended


def measure_launched(
    command: Sequence[str],
    prompts: Prompts,
    url: str | None = None,
    environment: dict[str, str] | None = None,
    startup_timeout: float = 900.0,
    progress: Progress | None = None,
) -> ServedAcceptance:
    """Start the server `command` launches, measure it on `prompts`, and stop it (and every process
    it started), whatever happens."""
    url = (url or launch_url(command)).rstrip("/")
    parts = urllib.parse.urlsplit(url)
    try:
        address = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    except ValueError:  # a port out of range
        raise InputError("--url has no TCP port rca can reach", where=url, fix="pass --url http://HOST:PORT") from None
    with socket.socket() as probe:  # something already answering there would be measured instead
        if probe.connect_ex(address) == 0:
            raise InputError(
                f"something already listens at {url}",
                where=" ".join(command[:3]),
                fix="stop it, or launch the engine on a free --port",
            )
    if progress:
        progress(f"launching the engine: {' '.join(command[:6])}{' ...' if len(command) > 6 else ''}")
    with stopped_on_signals():  # a SIGTERM or SIGHUP of rca stops the engine too
        launched = Launched(command, environment or dict(os.environ), echo=False, own_group=True)
        try:
            startup = wait_until_ready(url, launched, startup_timeout, progress)
            if progress:
                progress(f"the engine answered at {url} after {startup:.0f} s")
            result = measure(url, prompts, progress)
        finally:
            launched.stop()
    return replace(result, startup_seconds=startup, launch=tuple(command))
