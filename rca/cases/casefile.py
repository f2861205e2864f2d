"""Case directories: `case.toml` holds the inputs of a diagnosis, how its draft is served (`[serve]`,
for `--serve-with`) and, for bundled cases, the verdict it must reach; each run writes
`diagnosis.json` and `report.md`, keeps the probes' observations in `evidence.json` (reused when
the case is run again), and appends what changed to `transcript.md`. Paths inside a case are
relative to its directory."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rca.errors import InputError
from rca.inputs import Inputs
from rca.inputs.checkpoint import INDEX
from rca.inputs.files import MIB, read_text, resolved
from rca.inputs.launch import REDACTED, TEMPLATE_FLAG, named_files, redact_secrets
from rca.inputs.templates import TEMPLATE_FILES, TOKENIZER_FILE
from rca.model import Diagnosis, Tap, diagnosis_from_json

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CASE_FILE = "case.toml"
INPUT_KEYS = (
    "serving",
    "serving_patch",
    "serving_args",
    "training",
    "training_patch",
    "training_args",
    "training_engine",
    "dumps",
    "draft",
    "target",
    "parent_draft",
)


@dataclass(frozen=True)
class Expected:
    """The verdict a bundled case must reach."""

    status: str | None = None
    root_cause: str | None = None
    serving: tuple[str, ...] | None = None
    training: tuple[str, ...] | None = None
    verifier_last: str | None = None
    fix_ids: tuple[int, ...] | None = None
    ranked_below: tuple[str, ...] = ()  # hypotheses that must rank below the root cause
    trainer: str | None = None  # the training source inferred from the draft config (pkg==version)
    warnings: tuple[str, ...] | None = None  # the hypotheses the verdict calls warnings, exactly

    def misses(self, diagnosis: Diagnosis) -> list[str]:
        """What the diagnosis got wrong, one line each (empty when it matches)."""
        problems = []
        if self.status and diagnosis.verdict.status.value != self.status:
            problems.append(f"status {diagnosis.verdict.status.value}, expected {self.status}")
        if self.root_cause and diagnosis.verdict.root_cause != self.root_cause:
            problems.append(f"root cause {diagnosis.verdict.root_cause}, expected {self.root_cause}")
        for side in ("serving", "training"):
            wanted = getattr(self, side)
            got = [str(tap) for tap in diagnosis.wirings[side].slots]
            if wanted is not None and got != list(wanted):
                problems.append(f"{side} slots {got}, expected {list(wanted)}")
        last = diagnosis.wirings["training"].verifier_last
        if self.verifier_last and str(last) != self.verifier_last:
            problems.append(f"training verifier-last {last}, expected {self.verifier_last}")
        if (
            self.fix_ids is not None
            and diagnosis.hypotheses
            and str(list(self.fix_ids)) not in diagnosis.hypotheses[0].fix
        ):
            problems.append(f"fix {diagnosis.hypotheses[0].fix!r} does not set {list(self.fix_ids)}")
        inferred = (diagnosis.trainer or {}).get("source")
        if self.trainer and inferred != self.trainer:
            problems.append(f"trainer inferred {inferred}, expected {self.trainer}")
        if self.warnings is not None and sorted(diagnosis.verdict.warnings) != sorted(self.warnings):
            problems.append(f"warnings {list(diagnosis.verdict.warnings)}, expected {list(self.warnings)}")
        ranks = {hypothesis.id: hypothesis.rank for hypothesis in reversed(diagnosis.hypotheses)}
        for below in self.ranked_below:
            if self.root_cause in ranks and ranks.get(below, 10**6) <= ranks[self.root_cause]:
                problems.append(f"{below} ranks {ranks.get(below)}, not below {self.root_cause}")
        return problems


@dataclass(frozen=True)
class CaseServe:
    """How the case's draft is served, to measure it in the engine (`--serve-with`): the launch
    command (`{draft}` and `{target}` stand for the case's draft and target paths), its prompts."""

    command: tuple[str, ...]
    prompts: Path | None = None
    requests: int | None = None
    max_new_tokens: int | None = None
    url: str | None = None

    def launch(self, inputs: Inputs) -> list[str]:
        def directory(value: str | None, placeholder: str) -> str:
            path = inputs.path(value)
            return placeholder if path is None else str(path if path.is_dir() else path.parent)

        places = {"{draft}": directory(inputs.draft, "{draft}"), "{target}": directory(inputs.target, "{target}")}
        launched = []
        for argument in self.command:
            for placeholder, value in places.items():
                argument = argument.replace(placeholder, value)
            launched.append(argument)
        return launched

    @property
    def redacted(self) -> bool:
        """Whether the case left a secret of this launch out: it cannot be served as recorded."""
        return any(REDACTED in argument for argument in (*self.command, self.url or ""))


@dataclass(frozen=True)
class Case:
    directory: Path
    title: str
    inputs: Inputs
    expected: Expected | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    serve: CaseServe | None = None


def load_case(directory: Path) -> Case:
    path = directory / CASE_FILE
    if not directory.is_dir():
        raise InputError(
            "case directory does not exist", where=str(directory), fix="pass a directory holding a case.toml"
        )
    if not path.exists() and not path.is_symlink():
        raise InputError(
            f"no {CASE_FILE} in the case directory",
            where=str(directory),
            fix=f"create {CASE_FILE} with an [inputs] table",
        )
    text = read_text(path, "the case file", limit=MIB, fix=f"pass a case directory whose {CASE_FILE} is readable TOML")
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as error:
        raise InputError(f"malformed case file: {error}", where=str(path), fix="correct the TOML syntax") from None
    except ValueError:  # valid syntax, but an integer of more digits than Python converts
        raise InputError(
            f"case file holds an integer of more than {sys.get_int_max_str_digits()} digits",
            where=str(path),
            fix="correct the number",
        ) from None
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        raise InputError(
            "case file has no [inputs] table",
            where=str(path),
            fix="add [inputs] with serving, training, draft and target",
        )
    unknown = sorted(set(inputs) - set(INPUT_KEYS))
    if unknown:
        raise InputError(f"unknown inputs {unknown}", where=str(path), fix=f"use only {', '.join(INPUT_KEYS)}")
    for key, value in inputs.items():
        if not isinstance(value, str):
            raise InputError(
                f"input {key} is {value!r}, not a string", where=str(path), fix="quote paths and source specs"
            )
    expected = _expected(data["expected"], path) if "expected" in data else None
    serve = _serve(data["serve"], path, resolved(directory)) if "serve" in data else None
    return Case(
        directory,
        str(data.get("title", directory.name)),
        Inputs(**inputs, base=resolved(directory)),
        expected,
        data,
        serve,
    )


_SERVE_KEYS = ("command", "prompts", "requests", "max_new_tokens", "url")


def _serve(raw: Any, path: Path, directory: Path) -> CaseServe:
    """The [serve] table: a launch command as a list of strings, and what to send it."""

    def bad(key: str, must: str) -> InputError:
        return InputError(f"[serve] {key} is {raw.get(key)!r}, not {must}", where=str(path), fix=f"make {key} {must}")

    if not isinstance(raw, dict):
        raise InputError("[serve] is not a table", where=str(path), fix="write [serve] as a TOML table")
    unknown = sorted(set(raw) - set(_SERVE_KEYS))
    if unknown:
        raise InputError(f"unknown [serve] keys {unknown}", where=str(path), fix=f"use only {', '.join(_SERVE_KEYS)}")
    command = raw.get("command")
    if not (isinstance(command, list) and command and all(isinstance(item, str) for item in command)):
        raise bad("command", "a non-empty list of strings (the launch command, one argument each)")
    for key in ("prompts", "url"):
        if key in raw and not isinstance(raw[key], str):
            raise bad(key, "a string")
    for key in ("requests", "max_new_tokens"):
        if key in raw and not (isinstance(raw[key], int) and not isinstance(raw[key], bool) and raw[key] > 0):
            raise bad(key, "a positive integer")
    prompts = raw.get("prompts")
    return CaseServe(
        tuple(command),
        None if prompts is None else (Path(prompts) if Path(prompts).is_absolute() else directory / prompts),
        raw.get("requests"),
        raw.get("max_new_tokens"),
        raw.get("url"),
    )


_EXPECTED_KEYS = (
    "status",
    "root_cause",
    "serving",
    "training",
    "verifier_last",
    "fix_ids",
    "ranked_below",
    "trainer",
    "warnings",
)


def _expected(raw: Any, path: Path) -> Expected:
    """The [expected] table, each value checked for what it must be."""

    def bad(key: str, must: str) -> InputError:
        return InputError(
            f"[expected] {key} is {raw.get(key)!r}, not {must}", where=str(path), fix=f"make {key} {must}"
        )

    if not isinstance(raw, dict):
        raise InputError("[expected] is not a table", where=str(path), fix="write [expected] as a TOML table")
    unknown = sorted(set(raw) - set(_EXPECTED_KEYS))
    if unknown:
        raise InputError(
            f"unknown [expected] keys {unknown}", where=str(path), fix=f"use only {', '.join(_EXPECTED_KEYS)}"
        )
    if raw.get("status") not in (None, "consistent", "mismatch", "inconclusive"):
        raise bad("status", "consistent, mismatch or inconclusive")
    for key in ("root_cause", "verifier_last", "trainer"):
        if key in raw and not isinstance(raw[key], str):
            raise bad(key, "a string")
    for key in ("serving", "training", "ranked_below", "warnings"):
        if key in raw and not (isinstance(raw[key], list) and all(isinstance(item, str) for item in raw[key])):
            raise bad(key, "a list of strings")
    for tap in [
        *raw.get("serving", []),
        *raw.get("training", []),
        *([raw["verifier_last"]] if "verifier_last" in raw else []),
    ]:
        try:
            Tap.parse(tap)
        except ValueError:
            raise InputError(
                f"[expected] names {tap!r}, which is not a tap", where=str(path), fix="name taps as h0..hN, hN+norm"
            ) from None
    if "fix_ids" in raw and not (
        isinstance(raw["fix_ids"], list)
        and all(isinstance(item, int) and not isinstance(item, bool) for item in raw["fix_ids"])
    ):
        raise bad("fix_ids", "a list of integers")
    return Expected(
        status=raw.get("status"),
        root_cause=raw.get("root_cause"),
        serving=tuple(raw["serving"]) if "serving" in raw else None,
        training=tuple(raw["training"]) if "training" in raw else None,
        verifier_last=raw.get("verifier_last"),
        fix_ids=tuple(raw["fix_ids"]) if "fix_ids" in raw else None,
        ranked_below=tuple(raw.get("ranked_below", ())),
        trainer=raw.get("trainer"),
        warnings=tuple(raw["warnings"]) if "warnings" in raw else None,
    )


@contextmanager
def _writing(directory: Path, what: str) -> Iterator[None]:
    """Turn a failure to write into the case directory into one line naming it."""
    try:
        yield
    except OSError as error:
        raise InputError(
            f"cannot write {what} ({error.strerror})",
            where=str(directory),
            fix="pass a case directory you can write to",
        ) from None


# -- case directories as a workflow: create, run again with more evidence, check -------------------

DIAGNOSIS, REPORT, TRANSCRIPT, EVIDENCE = "diagnosis.json", "report.md", "transcript.md", "evidence.json"
_SMALL = 1024 * 1024  # configs, patches and launch files up to this size are copied into a new case
_LAUNCHES = ("serving_args", "training_args")
_COPIED = ("serving_patch", "training_patch", *_LAUNCHES)
# The files of a model directory that rca reads, so the only ones a case copies (never a JSON of API
# keys or tokens beside them): its config (rca.inputs.configs), its chat template and tokenizer
# (TEMPLATE_FILES, TOKENIZER_FILE in rca.inputs.templates) and its safetensors index (rca.inputs.checkpoint).
_MODEL_FILES = ("config.json", *TEMPLATE_FILES, TOKENIZER_FILE, INDEX)


def create_case(directory: Path, inputs: Inputs, title: str, serve: Any = None) -> Path:
    """A new case directory holding `inputs`: configs, patches and launch files are copied in (a
    case should travel), sources, dumps and model weights are referred to by absolute path. With
    `serve` (rca.evidence.engine.verify.ServeWith), the launch command that serves the draft and its
    prompts are recorded in a [serve] table. Launches are kept without their secrets (redact_secrets)."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise InputError(
            "the case directory exists and is not empty",
            where=str(directory),
            fix="pick a new directory, or re-run that case with rca case run",
        )
    with _writing(directory, "the case directory"):
        directory.mkdir(parents=True, exist_ok=True)
        recorded = {key: _bring(directory, key, value, inputs) for key, value in inputs.as_dict().items()}
        lines = [f"title = {_toml_string(title)}", "", "[inputs]"] + [
            f"{key} = {_toml_string(value)}" for key, value in recorded.items()
        ]
        if serve is not None:
            command = _redacted_command(_placeheld(serve.command, inputs, recorded))
            lines += ["", "[serve]", f"command = {json.dumps(command)}", *_served_prompts(directory, serve)]
        (directory / CASE_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def _placeheld(command: Any, inputs: Inputs, recorded: dict[str, str]) -> list[str]:
    """The launch command as the case keeps it: where it names a draft or target the case copied in,
    `{draft}` or `{target}`, so that it serves the case's own copy wherever the case goes."""
    from rca.evidence.engine.verify import naming

    launch = list(command)
    for key in ("draft", "target"):
        given, kept = getattr(inputs, key), recorded.get(key)
        path = inputs.path(given)
        if path is None or kept == str(resolved(path)) or kept == given:
            continue  # referred to where it is, not copied
        directory = path if path.is_dir() else path.parent
        pattern = naming(directory)
        placeholder = "{" + key + "}"
        launch = [pattern.sub(placeholder, argument) for argument in launch]  # no backslash: taken as is
    return launch


def _served_prompts(directory: Path, serve: Any) -> list[str]:
    """The [serve] table's prompts: written into the case (it should travel), with how many."""
    prompts = serve.prompts
    with _writing(directory, "the served prompts"):
        (directory / "prompts.json").write_text(json.dumps({"prompts": list(prompts.items)}) + "\n", encoding="utf-8")
    lines = ['prompts = "prompts.json"', f"requests = {len(prompts.items)}", f"max_new_tokens = {prompts.max_tokens}"]
    return lines + ([f"url = {_toml_string(redact_secrets(serve.url))}"] if serve.url else [])


def served_as_given(directory: Path, inputs: Inputs, serve: Any) -> list[str]:
    """The launch a new case's first run serves: its [serve] command with the secrets the case does
    not keep, as `serve` gave it, `{draft}` and `{target}` standing for the case's own copies."""
    case = load_case(directory)
    return CaseServe(tuple(_placeheld(serve.command, inputs, case.raw["inputs"]))).launch(case.inputs)


def _redacted_command(command: Sequence[str]) -> list[str]:
    """A launch command as a case keeps it: one argument per argument, secrets redacted."""
    return shlex.split(redact_secrets(shlex.join(command)))


def kept_input(key: str, value: str) -> str:
    """An input as a case keeps it: launch flags without their secrets."""
    return redact_secrets(value) if key in _LAUNCHES else value


def _bring(directory: Path, key: str, value: str, inputs: Inputs) -> str:
    path = inputs.path(value)
    if path is None or not path.exists():
        return kept_input(key, value)  # a release (pkg==version), an installed package, or launch flags
    if key in ("draft", "target"):
        if path.is_file():  # the config as config.json, and the chat template files beside it
            beside = [path.parent / name for name in TEMPLATE_FILES if (path.parent / name).is_file()]
            copies = {path: "config.json", **{file: file.name for file in beside}}
        else:
            copies = {path / name: name for name in _MODEL_FILES if (path / name).is_file()}
        if path.is_file() or (
            copies and not any(path.glob("*.safetensors")) and sum(file.stat().st_size for file in copies) <= _SMALL
        ):
            (directory / key).mkdir(exist_ok=True)
            for file, name in copies.items():
                shutil.copyfile(file, directory / key / name)
            return key
    if _copied(key, path):
        if key in _LAUNCHES:  # byte for byte but for its secrets
            text = path.read_bytes().decode("utf-8", "surrogateescape")
            (directory / path.name).write_bytes(redact_secrets(text).encode("utf-8", "surrogateescape"))
        else:
            shutil.copyfile(path, directory / path.name)
        for named in _named_beside(path, value, inputs, TEMPLATE_FLAG):  # the chat template it names travels too
            if not (directory / named.name).exists():
                shutil.copyfile(named, directory / named.name)
        return path.name
    return str(resolved(path))


def _copied(key: str, path: Path) -> bool:
    """Whether a case keeps its own copy of this input: a patch or launch file, when small."""
    return key in _COPIED and path.is_file() and path.stat().st_size <= _SMALL


def _named_beside(launch: Path, value: str, inputs: Inputs, flag: str | None = None) -> list[Path]:
    """The small files a launch file names that sit beside it (with `flag`, only as its value)."""
    return [
        named
        for named in named_files(value, launch, inputs.base, flag)
        if named.parent == launch.parent and named.stat().st_size <= _SMALL
    ]


def left_out(inputs: Inputs) -> list[Path]:
    """Files beside a copied launch file that it names but a new case does not copy: anything but
    the chat template of its `--chat-template` (a key, a token, a config), never read by a diagnosis."""
    found: list[Path] = []
    for key, value in inputs.as_dict().items():
        launch = inputs.path(value)
        if launch is not None and _copied(key, launch):
            copied = set(_named_beside(launch, value, inputs, TEMPLATE_FLAG))
            found += [named for named in _named_beside(launch, value, inputs) if named not in copied]
    return found


def update_inputs(directory: Path, changes: dict[str, str]) -> None:
    """Set inputs in a case file in place, keeping its comments and its other tables."""
    path = directory / CASE_FILE
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((index for index, line in enumerate(lines) if line.strip() == "[inputs]"), None)
    if start is None:
        raise InputError(
            "case file has no [inputs] table",
            where=str(path),
            fix="add [inputs] with serving, training, draft and target",
        )
    end = next((index for index in range(start + 1, len(lines)) if lines[index].lstrip().startswith("[")), len(lines))
    for key, value in changes.items():
        entry = f"{key} = {_toml_string(value)}"
        found = next((index for index in range(start + 1, end) if lines[index].split("=", 1)[0].strip() == key), None)
        if found is not None:
            lines[found] = entry
        else:
            last = max((index for index in range(start, end) if lines[index].strip()), default=start)
            lines.insert(last + 1, entry)
            end += 1
    with _writing(directory, CASE_FILE):
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def read_diagnosis(directory: Path) -> Diagnosis | None:
    """The case's last diagnosis, or None when it has none (or one rca cannot read any more)."""
    path = directory / DIAGNOSIS
    if not path.is_file():
        return None
    try:
        return diagnosis_from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def read_evidence(directory: Path) -> list[dict[str, Any]]:
    """Probe observations of earlier runs (evidence.json), to reuse where their inputs are the same."""
    path = directory / EVIDENCE
    if not path.is_file():
        return []
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise InputError(
            "evidence.json is not JSON", where=str(path), fix="restore it, or delete it to gather the evidence again"
        ) from None
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


@dataclass(frozen=True)
class CaseRun:
    case: Case
    diagnosis: Diagnosis
    previous: Diagnosis | None
    entry: str  # what this run added to the transcript


def record_run(
    case: Case, diagnosis: Diagnosis, previous: Diagnosis | None, changed: dict[str, str], render_markdown: Any
) -> CaseRun:
    """Write a run's diagnosis, report, evidence and transcript entry into the case directory."""
    directory = case.directory
    with _writing(directory, "the run's outputs into the case directory"):
        return _record(case, diagnosis, previous, changed, render_markdown)


def _record(
    case: Case, diagnosis: Diagnosis, previous: Diagnosis | None, changed: dict[str, str], render_markdown: Any
) -> CaseRun:
    directory = case.directory
    (directory / DIAGNOSIS).write_text(json.dumps(_kept_diagnosis(diagnosis), indent=2) + "\n", encoding="utf-8")
    (directory / REPORT).write_text(render_markdown(diagnosis), encoding="utf-8")
    if diagnosis.agent is not None:
        kept = read_evidence(directory)
        known = {json.dumps([item.get("probe"), item.get("key")]) for item in kept}
        fresh = [
            step
            for step in diagnosis.agent["steps"]
            if not step.get("remembered") and json.dumps([step["probe"], step["key"]]) not in known
        ]
        if fresh:
            (directory / EVIDENCE).write_text(json.dumps(kept + fresh, indent=2) + "\n", encoding="utf-8")
    transcript = directory / TRANSCRIPT
    earlier = transcript.read_text(encoding="utf-8") if transcript.is_file() else f"# Transcript: {case.title}\n"
    number = earlier.count("\n## Run ") + 1
    entry = transcript_entry(number, diagnosis, previous, changed)
    transcript.write_text(earlier.rstrip("\n") + "\n\n" + entry, encoding="utf-8")
    return CaseRun(case, diagnosis, previous, entry)


def _kept_diagnosis(diagnosis: Diagnosis) -> dict[str, Any]:
    """The diagnosis as a case keeps it: the launches the engine served, and where, without secrets."""
    kept = diagnosis.to_json()
    engine = kept.get("engine") or {}
    for key in ("as_served", "with_fix"):
        served = engine.get(key)
        if served:
            engine[key] = {
                **served,
                "launch": _redacted_command(served["launch"]),
                "url": redact_secrets(served["url"]),
            }
    return kept


def transcript_entry(number: int, diagnosis: Diagnosis, previous: Diagnosis | None, changed: dict[str, str]) -> str:
    """One run for the transcript: what was new, what the agent did, and how the verdict and the
    ranking moved since the last run, with the wiring changes that moved them."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## Run {number} ({when})", ""]
    if changed:
        lines.append("New inputs: " + ", ".join(f"`{key}` = `{value}`" for key, value in changed.items()) + ".")
    for step in (diagnosis.agent or {}).get("steps", []):
        how = "remembered from an earlier run" if step.get("remembered") else f"ran it because it {step['reason']}"
        lines.append(f"- {step['probe']}: {how}. Observed: {step['observed']}.")
    for item in (diagnosis.agent or {}).get("missing", []):
        lines.append(f"- {item['probe']} could not run ({item['reason']}): `{item['command']}`.")
    lines.append(
        f"Verdict: {_verdict_text(diagnosis)}"
        + (
            f" (was: {_verdict_text(previous)})."
            if previous is not None and _verdict_text(previous) != _verdict_text(diagnosis)
            else "."
        )
    )
    if previous is None:
        lines.append(f"Ranking: {_ranking_text(diagnosis)}.")
    if diagnosis.verdict.root_cause and diagnosis.hypotheses and diagnosis.hypotheses[0].fix:
        lines.append(f"Fix: {diagnosis.hypotheses[0].fix}.")
    if previous is not None:
        for side in ("training", "serving"):
            before, after = previous.wirings.get(side), diagnosis.wirings.get(side)
            if before is not None and after is not None and before.slots != after.slots:
                lines.append(
                    f"The {side} wiring changed: {_slots(before)} -> {_slots(after)}"
                    + (f" ({after.notes[0]})." if after.notes else ".")
                )
        if _ranking(previous) != _ranking(diagnosis):
            lines.append(f"The ranking changed: {_ranking_text(previous)} -> {_ranking_text(diagnosis)}.")
        else:
            lines.append("The ranking is unchanged.")
    return "\n".join(lines) + "\n"


def _verdict_text(diagnosis: Diagnosis) -> str:
    top = diagnosis.hypotheses[0] if diagnosis.hypotheses else None
    return diagnosis.verdict.status.value + (
        f", {diagnosis.verdict.root_cause} ({top.score:.2f})" if diagnosis.verdict.root_cause and top else ""
    )


def _slots(wiring: Any) -> str:
    return "[" + ", ".join(str(tap) for tap in wiring.slots) + "]" if wiring.slots else "(unresolved)"


def _ranking(diagnosis: Diagnosis) -> list[str]:
    return [hypothesis.id for hypothesis in diagnosis.hypotheses[:3]]


def _ranking_text(diagnosis: Diagnosis) -> str:
    return ", ".join(f"{h.id} {h.score:.2f}" for h in diagnosis.hypotheses[:3]) or "none (nothing to rank)"


@dataclass(frozen=True)
class CheckResult:
    name: str
    expected: str
    got: str
    rank: int | None  # of the expected root cause (of wiring-consistent for a consistent case)
    seconds: float
    misses: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.misses


def check_case(directory: Path, diagnose: Any) -> CheckResult:
    """Run a case with an expected verdict and compare (`diagnose` maps Inputs to a Diagnosis)."""
    case = load_case(directory)
    if case.expected is None:
        raise InputError(
            "the case has no [expected] table to check against",
            where=str(directory / CASE_FILE),
            fix="add [expected] with status and root_cause",
        )
    start = time.perf_counter()
    diagnosis = diagnose(case.inputs)
    seconds = time.perf_counter() - start
    wanted = case.expected.root_cause or ("wiring-consistent" if case.expected.status == "consistent" else None)
    rank = next((h.rank for h in diagnosis.hypotheses if h.id == wanted), None) if wanted else None
    expected = " ".join(part for part in (case.expected.status, case.expected.root_cause) if part)
    got = " ".join(part for part in (diagnosis.verdict.status.value, diagnosis.verdict.root_cause) if part)
    return CheckResult(directory.name, expected, got, rank, seconds, tuple(case.expected.misses(diagnosis)))
