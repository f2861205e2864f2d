"""Chat templates: the target's own (its tokenizer files) or a file named at launch, rendered safely.

What a draft learned depends on the text its training conversations were rendered to, and what it
is asked depends on what the server renders: both are Jinja templates with keyword arguments
(`enable_thinking`). A template is untrusted input: it is rendered in jinja2's
`ImmutableSandboxedEnvironment` (no attribute access outside the sandbox, no mutation of the
values passed in, bounded `range`), with only the globals transformers gives templates. A template
that is missing, malformed or fails to render is one `TemplateError` naming the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rca.errors import InputError, brief
from rca.inputs.configs import ConfigFile, display_path
from rca.inputs.files import MIB, model_file, read_text
from rca.inputs.jsonpos import JsonSyntaxError, loads
from rca.model import Location, Step, StepKind, TemplateUse

TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILE = "tokenizer.json"
TEMPLATE_FILE = "chat_template.jinja"  # where transformers 4.43+ saves a template apart from its config
TEMPLATE_FILES = (TOKENIZER_CONFIG, TEMPLATE_FILE)  # the files beside a model's config that hold its template
_MAX_BYTES = 16 * MIB
_SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")

# A conversation both sides render, to compare their texts (what a draft sees around its turns).
SYSTEM, USER, ASSISTANT = "You are a helpful assistant.", "What is 2 + 2?", "2 + 2 is 4."


class TemplateError(InputError):
    """A chat template that cannot be read or rendered."""


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template, where it was read, and the special tokens its tokenizer config names."""

    text: str
    step: Step
    special: Mapping[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]

    @property
    def shown(self) -> str:
        return str(self.step.location)

    def use(self, arguments: Mapping[str, Any], steps: Sequence[Step]) -> TemplateUse:
        """What this template renders, with `arguments`, for the question and for the exchange."""
        question = [{"role": "user", "content": USER}]
        return TemplateUse(
            self.digest,
            tuple(sorted(arguments.items())),
            self.render(question, add_generation_prompt=True, kwargs=arguments),
            self.render(conversation(None), add_generation_prompt=False, kwargs=arguments),
            tuple(dict.fromkeys(steps)),
        )

    def render(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool, kwargs: Mapping[str, Any]
    ) -> str:
        """The text the template renders for `messages`, as `apply_chat_template(tokenize=False)` does,
        within RENDER_SECONDS and with no value larger than the sandbox's MAX_VALUE built on the way."""
        from jinja2 import TemplateError as JinjaError

        from rca.inputs.sandbox import TooLarge

        def raise_exception(message: str) -> None:
            raise TemplateError(f"the template raised: {message}", where=self.shown, fix=_FIX)

        environment = _sandbox()
        environment.globals["raise_exception"] = raise_exception
        try:
            with _time_limit(RENDER_SECONDS, self.shown):
                return environment.from_string(self.text).render(
                    messages=[dict(message) for message in messages],
                    add_generation_prompt=add_generation_prompt,
                    **{**self.special, **kwargs},
                )
        except TemplateError:
            raise
        except TooLarge as error:
            raise TemplateError(
                f"the chat template is refused: {error}",
                where=self.shown,
                fix="pass the chat template the model really uses: one renders a conversation in kilobytes",
            ) from None
        except (
            JinjaError,
            TypeError,
            ValueError,
            AttributeError,
            KeyError,
            IndexError,
            RecursionError,
            MemoryError,
            OverflowError,
        ) as error:
            raise TemplateError(
                f"the chat template does not render ({brief(error)})", where=self.shown, fix=_FIX
            ) from None


RENDER_SECONDS = 5.0  # CPU seconds: a chat template renders in milliseconds; one still running is a loop


def _sandbox() -> Any:
    """jinja2's immutable sandbox, bounded in what a template builds, with transformers' template
    globals and filters."""
    from rca.inputs.sandbox import BoundedSandbox

    environment = BoundedSandbox(
        {"tojson": _tojson}, trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.globals["strftime_now"] = _strftime_now
    return environment


def _strftime_now(format: str) -> str:
    """transformers' `strftime_now`: today's date, as a template writes it."""
    return datetime.now().strftime(format)


@contextmanager
def _time_limit(seconds: float, shown: str) -> Iterator[None]:
    """Stop a render that spends `seconds` of CPU time (where signals can: the main thread of a POSIX
    process). CPU time, not wall time: a loaded machine slows a render, only a loop spends the CPU."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise TemplateError(f"the chat template still renders after {seconds:g} s of CPU time", where=shown, fix=_FIX)

    previous = signal.signal(signal.SIGPROF, expired)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


_FIX = "pass the chat template the model really uses (its tokenizer_config.json or a .jinja file)"


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    """transformers' `tojson`: no HTML escaping, unicode kept."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def conversation(system: str | None = SYSTEM) -> list[dict[str, str]]:
    """The conversation both sides render: a system prompt (when given), a question, its answer."""
    turns = [{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT}]
    return ([{"role": "system", "content": system}] if system else []) + turns


def target_template(target: Path, base: Path | None = None) -> ChatTemplate | None:
    """The chat template of a target model directory: `chat_template.jinja`, else the
    `chat_template` of its `tokenizer_config.json` (a string, or a list whose `default` entry is
    used); None when the directory has neither."""
    directory = target if target.is_dir() else target.parent
    config_path = directory / TOKENIZER_CONFIG
    special: dict[str, str] = {}
    config = None
    if config_path.is_file():
        config = _json(model_file(config_path, "tokenizer config"), base)
        special = _special_tokens(config.data)
    jinja = directory / TEMPLATE_FILE
    if jinja.is_file():
        return _jinja_file(model_file(jinja, "chat template"), base, special)
    if config is None or "chat_template" not in config.data:
        return None
    value = config.data["chat_template"]
    shown = display_path(config_path, base)
    line = (config.doc.line_range(("chat_template",)) or (1, 1))[0]
    if isinstance(value, list):
        named = {entry.get("name"): entry.get("template") for entry in value if isinstance(entry, dict)}
        value = named.get("default")
    if not isinstance(value, str) or not value.strip():
        raise TemplateError(
            "chat_template is not a template string (nor a list with a `default` entry)",
            where=f"{shown}:{line}",
            fix="write the template as a string, as transformers saves it",
        )
    step = Step(Location("target", shown, line, line), "the target tokenizer's chat template", kind=StepKind.CONFIG)
    return ChatTemplate(value, step, special)


def template_file(path: Path, base: Path | None, setting: Step, special: Mapping[str, str]) -> ChatTemplate:
    """A template named at launch: a Jinja file, or a JSON file holding `chat_template`."""
    shown = display_path(path, base)
    if path.suffix == ".json":
        config = _json(path, base)
        value = config.data.get("chat_template")
        if not isinstance(value, str):
            raise TemplateError(
                "has no chat_template string", where=shown, fix="pass a .jinja template or a JSON with chat_template"
            )
        line = (config.doc.line_range(("chat_template",)) or (1, 1))[0]
        return ChatTemplate(value, Step(Location(setting.location.input, shown, line, line), setting.note), special)
    return _jinja_file(path, base, special, setting.location.input, setting.note)


def _jinja_file(
    path: Path, base: Path | None, special: Mapping[str, str], input_name: str = "target", note: str = ""
) -> ChatTemplate:
    shown = display_path(path, base)
    text = read_text(path, "chat template", limit=_MAX_BYTES, fix=_FIX)
    if not text.strip():
        raise TemplateError("is empty", where=shown, fix=_FIX)
    step = Step(Location(input_name, shown, 1, 1), note or "the target's chat template file", kind=StepKind.CONFIG)
    return ChatTemplate(text, step, special)


def _json(path: Path, base: Path | None) -> ConfigFile:
    shown = display_path(path, base)
    text = read_text(path, "tokenizer config", limit=_MAX_BYTES, fix=_FIX, encoding="utf-8-sig")
    try:
        doc = loads(text)
    except JsonSyntaxError as error:
        raise TemplateError(
            f"malformed JSON: {error.message}", where=f"{shown}:{error.line}:{error.column}", fix="correct the JSON"
        ) from None
    if not isinstance(doc.data, dict):
        raise TemplateError(f"is a JSON {type(doc.data).__name__}, not an object", where=shown, fix=_FIX)
    return ConfigFile("target", path, shown, doc)


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """`bos_token` and its kin as templates read them: a string, or an added token's `content`."""
    tokens = {}
    for name in _SPECIAL:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def load_tokenizer(target: Path, base: Path | None = None) -> Any:
    """The target's `tokenizer.json`, read with the `tokenizers` library from the local file only."""
    directory = target if target.is_dir() else target.parent
    path = directory / TOKENIZER_FILE
    shown = display_path(path, base)
    if not path.is_file():
        raise InputError(
            "no tokenizer.json beside the target's config",
            where=shown,
            fix="pass --target the model directory with its tokenizer files",
        )
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError("reading the tokenizer needs tokenizers", fix="pip install 'rca[probes]'") from None
    text = read_text(path, "tokenizer", limit=256 * MIB, fix="pass the model's tokenizer.json")
    try:
        return Tokenizer.from_str(text)
    except Exception as error:
        detail = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
        raise InputError(
            f"not a tokenizer ({detail})",
            where=shown,
            fix="pass the model's tokenizer.json, as its hub repository has it",
        ) from None


def served_template_use(target: Path, chat_template: Path | None, kwargs: str | None) -> TemplateUse:
    """How a server renders, from a template file (else the target's) and JSON arguments: for a
    probe run alone, without the serving source."""
    beside = target_template(target)
    if chat_template is not None:
        step = Step(Location("serving-args", display_path(chat_template, None), 1, 1), "--chat-template")
        template = template_file(chat_template, None, step, beside.special if beside is not None else {})
    elif beside is None:
        raise TemplateError(
            "the target has no chat template", where=display_path(target, None), fix="pass --chat-template FILE"
        )
    else:
        template = beside
    try:
        arguments = loads(kwargs).data if kwargs else {}
    except JsonSyntaxError as error:
        raise InputError(
            f"--chat-template-kwargs cannot be read as JSON ({error.message})",
            fix='write a flat JSON object, e.g. {"enable_thinking": false}',
        ) from None
    if not isinstance(arguments, dict):
        raise InputError("--chat-template-kwargs is not a JSON object", fix='write e.g. {"enable_thinking": false}')
    return template.use(arguments, [template.step])
