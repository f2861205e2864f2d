"""How each side renders conversations for the draft: the chat template, its arguments, and the trainer's loss mask."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rca.sdk import (
    Analyzer,
    Aspect,
    Compares,
    Establishes,
    Example,
    Fact,
    Finding,
    InputError,
    Location,
    Reports,
    SideContext,
    Step,
    StepKind,
    TemplateUse,
    Wiring,
)
from rca.sdk.code import first_line
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.inputs import (
    TEMPLATE_FILE,
    TOKENIZER_CONFIG,
    Setting,
    conversation,
    named_file,
    target_template,
    template_file,
)
from rca.sdk.inputs import ChatTemplate as TemplateFile

_RENDER_CALL = re.compile(r"\.apply_chat_template\(")
_RENDER_ENDPOINT = re.compile(
    r"[\"'][^\"'\s]*/chat/completions/render"
)  # a server renders it (speculators 0.8+ on vLLM)
_NAME_DEFAULTS = (  # where a trainer declares its template name's default
    re.compile(r"\bchat_template\s*:\s*str\s*=\s*[\"']([^\"']+)[\"']"),
    re.compile(r"add_argument\(\s*[\"']--chat-template[\"'].*default\s*=\s*[\"']([^\"']+)[\"']"),
)
_THINKING_ARGUMENT = re.compile(r"kwargs\[\s*[\"']enable_thinking[\"']\s*\]\s*=\s*True")
_KWARGS_SETTINGS = ("chat_template_kwargs", "default_chat_template_kwargs")
_SHOWN = 48  # characters of rendered text quoted on each side of a difference

_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
_LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n"
    "{{ message.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_REGISTRY = """
class ChatTemplate(BaseModel):
    assistant_header: Optional[str] = None
    user_header: Optional[str] = None
    system_prompt: Optional[str] = None
    end_of_turn_token: Optional[str] = None
    enable_thinking: bool = False


TEMPLATE_REGISTRY.register(
    name="llama3",
    template=ChatTemplate(
        assistant_header="<|start_header_id|>assistant<|end_header_id|>\\n\\n",
        user_header="<|start_header_id|>user<|end_header_id|>",
        end_of_turn_token="<|eot_id|>",
    ),
)

TEMPLATE_REGISTRY.register(
    name="qwen",
    template=ChatTemplate(
        assistant_header="<|im_start|>assistant\\n",
        user_header="<|im_start|>user\\n",
        end_of_turn_token="<|im_end|>\\n",
    ),
)
"""
_PARSER = """
import re


class DataConfig:
    chat_template: str = "llama3"


class Parser:
    def __init__(self, tokenizer, chat_template):
        self.tokenizer = tokenizer
        self.assistant_message_separator = f"{chat_template.assistant_header}"
        self.assistant_pattern = (
            re.escape(self.assistant_message_separator)
            + r"([\\s\\S]*?(?:"
            + re.escape(chat_template.end_of_turn_token)
            + "|$))"
        )

    def parse(self, messages):
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        return list(re.finditer(self.assistant_pattern, text))
"""
_RENDERS = """
def render(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, tokenize=False)
"""
_PASSES_TEMPLATE = f"""
TEMPLATE = {_LLAMA3!r}


def render(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, chat_template=TEMPLATE, tokenize=False)
"""
_TRAINER_FLAGS = """
def add_cli_args(parser):
    parser.add_argument("--chat-template", type=str, default="llama3")
"""
_SERVING_FLAGS = """
import json


def add_cli_args(parser):
    parser.add_argument("--chat-template", type=str)
    parser.add_argument("--default-chat-template-kwargs", type=json.loads)
"""


@dataclass(frozen=True)
class _Entry:
    """A template a trainer registers by name (SpecForge's `TEMPLATE_REGISTRY.register(...)`)."""

    name: str
    fields: Mapping[str, Any]
    step: Step


class ChatTemplate(Analyzer):
    """Reads how each side renders conversations: the chat template and its arguments, and the trainer's loss mask.

    ## What it reads
    On each side, the chat template and the keyword arguments it is rendered with:
    - training: the trainer renders through the target tokenizer's template (a cited
      `apply_chat_template` call), or through the one it passes as `chat_template=X`, followed to
      its value (a string, a name assigned one, or the file its `--chat-template` setting names),
      with the arguments its settings give (`--training-args`:
      `chat_template_kwargs`, or a named template of the trainer's registry whose `enable_thinking`
      the code passes on);
    - serving: the template of `--chat-template` in `--serving-args` (a file), else the target
      tokenizer's (`tokenizer_config.json`, `chat_template.jinja`), with `--default-chat-template-kwargs`
      or `--chat-template-kwargs`.
    Both are rendered, in a sandbox, for one question and its answer. A trainer that masks the loss
    with a registered template (SpecForge) finds assistant turns by that template's separator: it is
    evaluated from the trainer's own assignment and looked for in the rendering.

    ## Why it matters
    The draft learns to continue the text training rendered; served, it continues the text the
    server renders. Another template, or another `enable_thinking`, changes the tokens around every
    turn, and acceptance drops with no error. A registered template whose separator never occurs
    in the target's rendering leaves every loss-mask position zero: no assistant token is learned.
    """

    code = "RCA-X103"
    name = "chat-template"
    formerly = ("RCA-T110",)
    sides = frozenset({"training", "serving"})
    compares = Compares(
        training="the template and keyword arguments the trainer rendered its data with",
        serving="the template the engine renders requests with, under the launch's settings",
    )
    establishes = Establishes("chat_template", "how the side renders conversations: its template and keyword arguments")
    reports = (
        Reports("rendering-differs", hypothesis="template-mismatch"),
        Reports("assistant-turns-unmatched", hypothesis="loss-mask-gap"),
    )
    VALID = (
        Example(
            files={
                "specforge/data/template.py": _REGISTRY,
                "specforge/data/parse.py": _PARSER,
                "scripts/train.py": _TRAINER_FLAGS,
            },
            target=LLAMA_8B_TARGET,
            tokenizer_config={"chat_template": _CHATML},
            training_args="--chat-template qwen",
            serving_files={"engine/serve.py": _SERVING_FLAGS},
            why="the registered template's separator occurs in the target's rendering, and both sides render alike",
        ),
    )
    INVALID = (
        Example(
            files={"specforge/data/template.py": _REGISTRY, "specforge/data/parse.py": _PARSER},
            target=LLAMA_8B_TARGET,
            tokenizer_config={"chat_template": _CHATML},
            serving_files={"engine/serve.py": _SERVING_FLAGS},
            finding="assistant-turns-unmatched",
            path="specforge/data/template.py",
            line=10,
            message=(
                "the trainer finds assistant turns by the separator "
                "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' of its template 'llama3' "
                "(specforge/data/parse.py:12), which the target's chat template never renders: every loss-mask "
                "position is 0, and no assistant token is learned"
            ),
            why="the trainer's default template name is another model family's",
        ),
        Example(
            files={"trainer/data.py": _RENDERS},
            target=LLAMA_8B_TARGET,
            tokenizer_config={"chat_template": _CHATML},
            settings="--default-chat-template-kwargs '{\"enable_thinking\": false}'",
            serving_files={"engine/serve.py": _SERVING_FLAGS},
            finding="rendering-differs",
            path="--serving-args",
            line=1,
            message=(
                "training renders the question as '…\\nWhat is 2 + 2?<|im_end|>\\n<|im_start|>assistant\\n', "
                "serving as '…\\nWhat is 2 + 2?<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' "
                "(the same template (352bc0624a4f), no arguments in training and enable_thinking=False served): the "
                "draft continues text it was not trained on"
            ),
            why="served with thinking off, trained on the template's default (thinking on)",
        ),
        Example(
            files={"train.py": _PASSES_TEMPLATE},
            target=LLAMA_8B_TARGET,
            tokenizer_config={"chat_template": _CHATML},
            serving_files={"engine/serve.py": _SERVING_FLAGS},
            finding="rendering-differs",
            path="tokenizer_config.json",
            line=2,
            message=(
                "training renders the question as '<|start_header_id|>user<|end_header_id|>\\n\\nWhat is …', "
                "serving as '<|im_start|>user\\nWhat is 2 + 2?<|im_end|>\\n<|im_sta…' (template 842a389dd999 with no "
                "arguments in training, 352bc0624a4f with no arguments served): the draft continues text it was not "
                "trained on"
            ),
            why="a training script that renders with a template of its own, passed as chat_template=",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        """Where a template is at hand: beside the target's config, or named by the side's settings."""
        directory = ctx.target.config.file.parent
        named = ctx.settings is not None and any(
            ctx.settings.get(dest) is not None for dest in ("chat_template", *_KWARGS_SETTINGS, "enable_thinking")
        )
        return named or (directory / TEMPLATE_FILE).is_file() or (directory / TOKENIZER_CONFIG).is_file()

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        try:
            if ctx.side == "training":
                yield from self._training(ctx)
            else:
                yield from self._serving(ctx)
        except InputError as error:  # a template that cannot be read or rendered: this check only is skipped
            ctx.note(f"chat templates not compared: {error}")

    def _training(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        found = ctx.tree.grep([".apply_chat_template(", "/chat/completions/render"])
        call = first_line(
            ctx,
            found["/chat/completions/render"],
            _RENDER_ENDPOINT,
            "the trainer renders conversations through its data-generation server's template (the target's)",
            StepKind.CALL,
        ) or first_line(
            ctx,
            found[".apply_chat_template("],
            _RENDER_CALL,
            "the trainer renders conversations with the tokenizer's template",
            StepKind.CALL,
        )
        if call is None:
            ctx.note(
                f"{ctx.tree.label} never calls apply_chat_template nor a render endpoint: how training rendered "
                "conversations is not read"
            )
            return
        template = target_template(ctx.target.config.file, ctx.base)
        passed = _passed_template(ctx, found[".apply_chat_template("], template.special if template else {})
        if isinstance(passed, str):
            ctx.note(f"{passed}: templates not compared")
            return
        passed_steps: tuple[Step, ...] = (call,)
        if passed is not None:
            template, passed_steps = passed
        if template is None:
            ctx.note(
                "the target has no chat template (tokenizer_config.json or chat_template.jinja): templates not compared"
            )
            return
        kwargs = _settings_kwargs(ctx)
        steps = [template.step, *passed_steps, *(step for _, _, step in kwargs)]
        name = _template_name(ctx)
        entry = None
        if name is not None:
            entries = _registry(ctx)
            entry = entries.get(name[0])
            if entry is None and entries:
                ctx.note(
                    f"the trainer's registry has no template {name[0]!r} ({name[1].location}): its loss mask is not "
                    "read"
                )
            if entry is not None:
                steps += [name[1], entry.step]
                thinking = _thinking_argument(ctx, entry)
                if thinking is not None and not any(key == "enable_thinking" for key, _, _ in kwargs):
                    kwargs.append(("enable_thinking", True, thinking))
                    steps.append(thinking)
        arguments = {key: value for key, value, _ in kwargs}
        yield self._rendering(ctx, template, arguments, steps)
        if entry is not None and name is not None:  # an entry is found by its name
            yield from self._loss_mask(ctx, template, entry, name[1], arguments)

    def _rendering(
        self, ctx: SideContext, template: TemplateFile, arguments: Mapping[str, Any], steps: list[Step]
    ) -> Aspect:
        said = f"{ctx.side} renders with {template.shown}"
        return self.aspect(ctx, template.step.location, said, template.use(arguments, steps))

    def _loss_mask(
        self, ctx: SideContext, template: TemplateFile, entry: _Entry, chosen: Step, arguments: Mapping[str, Any]
    ) -> Iterator[Finding]:
        separator = _assistant_separator(ctx, entry)
        if separator is None:
            return
        text, step = separator
        system = entry.fields.get("system_prompt")
        rendered = template.render(
            conversation(system if isinstance(system, str) else None), add_generation_prompt=False, kwargs=arguments
        )
        if text in rendered:
            return
        family = str(ctx.target.config.data.get("model_type", ""))
        matching = sorted(
            (
                other.name
                for other in _registry(ctx).values()
                if (found := _assistant_separator(ctx, other)) is not None and found[0] in rendered
            ),
            key=lambda name: (-_parting(name, family), name),  # the target's family first
        )
        fix = (
            f"train with a template whose separator the target renders ({', '.join(repr(n) for n in matching[:4])}), "
            "and regenerate the data"
            if matching
            else "register a template with the target's assistant header and end-of-turn token, and regenerate the data"
        )
        yield self.finding(
            ctx,
            "assistant-turns-unmatched",
            f"the trainer finds assistant turns by the separator {text!r} of its template {entry.name!r} "
            f"({step.location}), which the target's chat template never renders: every loss-mask position is 0, and "
            "no assistant token is learned",
            entry.step.location,
            likelihood_ratio=20.0,
            steps=(chosen, entry.step, step, template.step),
            fix=fix,
        )

    def _serving(self, ctx: SideContext) -> Iterator[Fact]:
        setting = ctx.settings.get("chat_template") if ctx.settings is not None else None
        special = {}
        beside = target_template(ctx.target.config.file, ctx.base)
        if beside is not None:
            special = dict(beside.special)
        if setting is not None:
            path = _setting_file(ctx, setting)
            if path is None:
                ctx.note(
                    f"serving uses the template {setting.value!r} ({setting.step.location}), not a file rca can read: "
                    "templates not compared"
                )
                return
            template = template_file(path, ctx.base, setting.step, special)
        elif beside is not None:
            template = beside
        else:
            ctx.note(
                "the target has no chat template (tokenizer_config.json or chat_template.jinja): templates not compared"
            )
            return
        kwargs = _settings_kwargs(ctx)
        steps = [*((setting.step,) if setting is not None else ()), template.step, *(step for _, _, step in kwargs)]
        yield self._rendering(ctx, template, {key: value for key, value, _ in kwargs}, steps)

    def across(self, training: Wiring, serving: Wiring) -> Iterator[Finding]:
        trained, served = self.established(training), self.established(serving)
        if trained is None or served is None:
            return
        for what, ours, theirs in (
            ("question", trained.prompt, served.prompt),
            ("exchange", trained.exchange, served.exchange),
        ):
            if ours == theirs:
                continue
            ours_shown, theirs_shown = _difference(ours, theirs)
            if trained.digest == served.digest:
                how = (
                    f"the same template ({served.digest}), {_arguments(trained)} in training and "
                    f"{_arguments(served)} served"
                )
                fix = (
                    f"serve with the template arguments training used ({json.dumps(dict(trained.kwargs))}) as the "
                    "server's default chat template arguments"
                    if trained.kwargs
                    else "serve without the template arguments the launch adds (training used the template's defaults)"
                ) + ", or regenerate the training data with serving's and retrain"
                changed = [step for step in (*served.steps, *trained.steps) if step.location.input.endswith("-args")]
                where = (changed or list(served.steps))[0].location
            else:
                how = (
                    f"template {trained.digest} with {_arguments(trained)} in training, {served.digest} with "
                    f"{_arguments(served)} served"
                )
                fix = (
                    "serve with the template training rendered with (--chat-template FILE), or regenerate the "
                    "training data with the served template and retrain"
                )
                where = served.steps[0].location
            yield self.finding(
                "serving",
                "rendering-differs",
                f"training renders the {what} as {ours_shown}, serving as {theirs_shown} ({how}): the draft continues "
                "text it was not trained on",
                where,
                likelihood_ratio=8.0,
                steps=(*trained.steps, *served.steps),
                fix=fix,
            )
            return


def _arguments(use: TemplateUse) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in use.kwargs) or "no arguments"


def _parting(ours: str, theirs: str) -> int:
    """Where two texts first differ (the length of their common prefix)."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))


def _difference(ours: str, theirs: str) -> tuple[str, str]:
    """The two texts from a little before where they part, quoted (`'…t is 2 + 2?<|im_end|>…'`)."""
    start = _parting(ours, theirs)
    begin = max(0, start - _SHOWN)

    def shown(text: str) -> str:
        return repr(("…" if begin else "") + text[begin : start + _SHOWN] + ("…" if start + _SHOWN < len(text) else ""))

    return shown(ours), shown(theirs)


def _settings_kwargs(ctx: SideContext) -> list[tuple[str, Any, Step]]:
    """The template arguments a side's settings give: a JSON object of them, or `enable_thinking`."""
    found: list[tuple[str, Any, Step]] = []
    for dest in (*_KWARGS_SETTINGS, "enable_thinking"):
        setting = ctx.settings.get(dest) if ctx.settings is not None else None
        if setting is None:
            continue
        value = setting.value
        if isinstance(value, str) and dest != "enable_thinking":
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise InputError(
                    f"{setting.flag} is not a JSON object", where=str(setting.step.location), fix="write it as JSON"
                ) from None
        items = value.items() if isinstance(value, dict) else [(dest, value)] if dest == "enable_thinking" else []
        found += [(str(key), item, setting.step) for key, item in items if key not in {k for k, _, _ in found}]
    return found


def _passed_template(
    ctx: SideContext, relpaths: list[str], special: Mapping[str, str]
) -> tuple[TemplateFile, tuple[Step, ...]] | str | None:
    """The template a trainer hands `apply_chat_template(..., chat_template=X)`, which renders with X
    and not the tokenizer's: X followed to its value (a string, a name assigned one, or the trainer's
    `--chat-template` file), with the call cited; a note when X cannot be read; None when no call
    passes one (the tokenizer's template renders)."""
    for relpath in relpaths:
        module = ctx.standard_tree(relpath)
        calls = (
            (node, keyword.value)
            for node in (ast.walk(module) if module is not None else ())
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if node.func.attr == "apply_chat_template"
            for keyword in node.keywords
            if keyword.arg == "chat_template"
        )
        for node, argument in calls:
            if isinstance(argument, ast.Constant) and argument.value is None:
                continue
            call = _cited(
                ctx, relpath, node, "the trainer renders conversations with the template it passes", StepKind.CALL
            )
            value = _argument_value(ctx, module, argument, node.lineno, special)  # type: ignore[arg-type]
            if value is None:
                shown = ast.unparse(argument)
                return f"the trainer renders with chat_template={shown} ({call.location}), whose value is not read"
            text, where = value
            setting = ctx.settings.get("chat_template") if ctx.settings is not None else None
            if isinstance(text, TemplateFile):  # the file the trainer's --chat-template setting names
                return text, (call, setting.step) if setting is not None else (call,)
            step = _cited(ctx, relpath, where, "the template the trainer passes as chat_template=", StepKind.CONFIG)
            return TemplateFile(text, step, special), (call,)
    return None


def _argument_value(
    ctx: SideContext, module: ast.Module, argument: ast.expr, before: int, special: Mapping[str, str]
) -> tuple[str | TemplateFile, ast.expr] | None:
    """A `chat_template=` argument's value: a string literal, the string last assigned to its name
    above the call, or the file the trainer's `--chat-template` setting names."""
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return argument.value, argument
    name = _last_name(argument)
    if isinstance(argument, ast.Name):
        assigned = [
            node.value
            for node in ast.walk(module)
            if isinstance(node, ast.Assign) and node.lineno < before
            if any(isinstance(target, ast.Name) and target.id == name for target in node.targets)
        ]
        if assigned and isinstance(assigned[-1], ast.Constant) and isinstance(assigned[-1].value, str):
            return assigned[-1].value, assigned[-1]
    setting = ctx.settings.get("chat_template") if ctx.settings is not None else None
    path = _setting_file(ctx, setting) if setting is not None and name is not None and "template" in name else None
    if setting is not None and path is not None:
        return template_file(path, ctx.base, setting.step, special), argument
    return None


def _setting_file(ctx: SideContext, setting: Setting) -> Path | None:
    """The file a side's `--chat-template` setting names, found as its launch would find it."""
    launch = ctx.settings.display if ctx.settings is not None else ""
    return named_file(str(setting.value), Path(launch) if ctx.base is None else ctx.base / launch, ctx.base)


def _template_name(ctx: SideContext) -> tuple[str, Step] | None:
    """The registered template the trainer uses: its setting, else the default it declares."""
    setting = ctx.settings.get("chat_template") if ctx.settings is not None else None
    if setting is not None and isinstance(setting.value, str):
        return setting.value, setting.step
    for pattern in _NAME_DEFAULTS:
        needle = "chat_template" if pattern is _NAME_DEFAULTS[0] else "--chat-template"
        for relpath in ctx.tree.grep([needle])[needle]:
            for number, line in enumerate((ctx.tree.read(relpath) or "").splitlines(), start=1):
                match = pattern.search(line)
                if match:
                    location = Location(ctx.tree.input, relpath, number, number)
                    note = f"the trainer's default template name {match[1]!r}"
                    return match[1], Step(location, note, line.strip(), StepKind.ASSIGN, ctx.tree.is_patched(relpath))
    return None


def _registry(ctx: SideContext) -> dict[str, _Entry]:
    """Templates registered by name: `X.register(name="llama3", template=T(assistant_header=...))`."""
    if "chat_templates" in ctx.memo:
        return ctx.memo["chat_templates"]
    entries: dict[str, _Entry] = {}
    for relpath in ctx.tree.grep(["assistant_header="])["assistant_header="]:
        module = ctx.standard_tree(relpath)
        if module is None:
            continue
        for node in ast.walk(module):
            if not (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register"
            ):
                continue
            keywords = {keyword.arg: keyword.value for keyword in node.keywords if keyword.arg}
            name, template = keywords.get("name"), keywords.get("template")
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and isinstance(template, ast.Call)):
                continue
            fields: dict[str, Any] = {}
            for keyword in template.keywords:
                if keyword.arg is None:  # **kwargs: nothing named to read
                    continue
                try:
                    fields[keyword.arg] = ast.literal_eval(keyword.value)
                except ValueError:
                    continue
            step = _cited(ctx, relpath, node, f"the trainer registers template {name.value!r}", StepKind.CALL)
            entries.setdefault(name.value, _Entry(name.value, fields, step))
    ctx.memo["chat_templates"] = entries
    return entries


def _assistant_separator(ctx: SideContext, entry: _Entry) -> tuple[str, Step] | None:
    """The text the trainer's loss mask finds assistant turns by: what it `re.escape`s under an
    assistant name, evaluated from its assignment with the entry's fields
    (`f"{t.end_of_turn_token}{t.assistant_header}"`)."""
    for relpath, node in _separator_assignments(ctx):
        value = _evaluated(node.value, entry.fields)
        if value is not None:
            return value, _cited(ctx, relpath, node, f"the loss mask's assistant separator, {value!r}", StepKind.ASSIGN)
    return None


def _separator_assignments(ctx: SideContext) -> list[tuple[str, ast.Assign]]:
    """The assignments of the names a trainer `re.escape`s to build its assistant pattern (found once)."""
    if "chat_template_separators" not in ctx.memo:
        found = []
        for relpath in ctx.tree.grep(["assistant_pattern"])["assistant_pattern"]:
            module = ctx.standard_tree(relpath)
            if module is None:
                continue
            escaped = {
                _last_name(node.args[0])
                for node in ast.walk(module)
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "re.escape" and node.args
            }
            escaped = {name for name in escaped if name and "assistant" in name}
            found += [
                (relpath, node)
                for node in ast.walk(module)
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and _last_name(node.targets[0]) in escaped
            ]
        ctx.memo["chat_template_separators"] = found
    return ctx.memo["chat_template_separators"]


def _cited(ctx: SideContext, relpath: str, node: ast.stmt | ast.expr, note: str, kind: StepKind) -> Step:
    """A step at a node of a side's file, with its first line as the code."""
    lines = (ctx.tree.read(relpath) or "").splitlines()
    code = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
    location = Location(ctx.tree.input, relpath, node.lineno, node.end_lineno or node.lineno)
    return Step(location, note, code, kind, ctx.tree.is_patched(relpath))


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _evaluated(node: ast.expr, fields: Mapping[str, Any]) -> str | None:
    """A string built from a template's fields, as Python builds it (a missing field reads None)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and "template" in node.value.id:
        return str(fields.get(node.attr))
    if isinstance(node, ast.FormattedValue) and node.conversion == -1 and node.format_spec is None:
        return _evaluated(node.value, fields)
    if isinstance(node, ast.JoinedStr):
        parts = [_evaluated(value, fields) for value in node.values]
        return None if any(part is None for part in parts) else "".join(parts)  # type: ignore[arg-type]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _evaluated(node.left, fields), _evaluated(node.right, fields)
        return None if left is None or right is None else left + right
    return None


def _thinking_argument(ctx: SideContext, entry: _Entry) -> Step | None:
    """Where the trainer passes `enable_thinking=True` to the template for an entry that asks for it."""
    if entry.fields.get("enable_thinking") is not True:
        return None
    relpaths = ctx.tree.grep(["enable_thinking"])["enable_thinking"]
    note = f"template {entry.name!r} sets enable_thinking, passed on"
    return first_line(ctx, relpaths, _THINKING_ARGUMENT, note, StepKind.CALL)
