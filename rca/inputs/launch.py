"""The serving engine's launch settings: the command line a deployment starts the server with.

Some wiring is decided at launch, not in a config file: `--speculative-algorithm EAGLE` leaves
an EAGLE-3 draft without its captured layers, `--enable-flashinfer-allreduce-fusion` with
`--tp 8` defers an all-reduce past a capture. The flags are read the way the engine reads them:
its own `add_argument` declarations (found in the serving source) map each flag and alias to the
attribute the code reads (`--tp` -> `tp_size`), and say which flags take no value. The
environment a launch script sets for the server (`VLLM_USE_V2_MODEL_RUNNER=1 vllm serve ...`,
`export NAME=value`) is read too: each variable a setting by its own name, valued as written.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from rca.errors import InputError
from rca.inputs.configs import TargetConfig
from rca.inputs.files import read_text
from rca.inputs.jsonpos import JsonSyntaxError, check_depth
from rca.inputs.sources import SourceTree
from rca.knowledge import engines
from rca.model import Drafting, Location, Step, StepKind

_MAX_BYTES = 1024 * 1024
_NO_VALUE_ACTIONS = {"store_true": True, "store_false": False}
_OPTIONAL_VALUE = "optional"  # `nargs="?"`: the value may follow; alone, the flag is its `const`
_BOOLEAN_OPTIONAL = "boolean_optional"  # argparse.BooleanOptionalAction: `--flag` and `--no-flag`


@dataclass(frozen=True)
class Option:
    """One flag as the engine declares it."""

    dests: tuple[str, ...]  # the attribute argparse sets, and any the engine copies it to (`tp_size`)
    action: str = "store"  # store, store_true, store_false, optional (a value may follow)
    kind: str = ""  # the declared type's name (int, str, json.loads, ...)
    const: object = True  # optional: the value of the flag given alone


@dataclass(frozen=True)
class Setting:
    dest: str  # the attribute the engine's code reads (`speculative_algorithm`)
    value: object
    flag: str  # as written (`--speculative-algorithm`)
    step: Step  # where it is set: the launch file's line


@dataclass(frozen=True)
class LaunchSettings:
    display: str
    settings: tuple[Setting, ...]
    unknown: tuple[str, ...] = ()  # flags the serving source does not declare
    # the same flags as argparse would read them undeclared (`--use-off-policy-tokens` ->
    # `use_off_policy_tokens`, True with no value): read only by an analyzer that finds that very
    # name in the code (a trainer whose training script, which declares it, is not in its package)
    undeclared: tuple[Setting, ...] = ()

    def get(self, dest: str) -> Setting | None:
        return next((setting for setting in self.settings if setting.dest == dest), None)

    def speculative_method(self) -> str | None:
        """The speculative method the launch names, lower case: vLLM's `speculative_config.method`,
        SGLang's and lmdeploy's `--speculative-algorithm`."""
        config = self.get("speculative_config")
        method = config.value.get("method") if config is not None and isinstance(config.value, dict) else None
        algorithm = self.get("speculative_algorithm")
        for given in (method, algorithm.value if algorithm is not None else None):
            if isinstance(given, str) and given:
                return given.lower()
        return None

    def names_a_draft(self) -> bool:
        """Whether the launch names a draft model of its own (vLLM's `speculative_config.model`,
        SGLang's `--speculative-draft-model-path`)."""
        config = self.get("speculative_config")
        if config is not None and isinstance(config.value, dict) and config.value.get("model"):
            return True
        path = self.get("speculative_draft_model_path")
        return path is not None and bool(path.value)

    def drafts_with_mtp_layers(self, declared: bool) -> str | None:
        """The speculative method where the launch drafts with multi-token-prediction layers (SGLang's
        NEXTN, vLLM's and lmdeploy's MTP methods; SGLang's EAGLE with no draft where the target
        `declared` them: knowledge/engines, `[own_layers]`): the target checkpoint's own, or those of
        the checkpoint the launch names for them (`mtp_source`); None for any other launch."""
        method = self.speculative_method()
        if method is None:
            return None
        for engine in engines().values():
            if any(fnmatchcase(method, pattern) for pattern in engine.own_layer_methods):
                return method
            if declared and not self.names_a_draft():
                if any(fnmatchcase(method, pattern) for pattern in engine.own_layer_methods_if_declared):
                    return method
        return None

    def drafting(self, target: TargetConfig) -> Drafting:
        """What this launch drafts with for `target`: MTP layers (`drafts_with_mtp_layers`, where the
        target declares them or the method needs none declared), else a draft fed captured states."""
        own = self.drafts_with_mtp_layers(declared=target.mtp_layers() is not None) is not None
        return Drafting.OWN_LAYERS if own else Drafting.CAPTURED

    def mtp_source(self) -> str | None:
        """The checkpoint an MTP launch loads its MTP layers from, where it names one (in a setting
        that names a draft: vLLM's `speculative_config.model`, SGLang's `--speculative-draft-model-path`,
        lmdeploy's `--speculative-draft-model`; knowledge/engines, `[launch] draft`): not a draft fed
        captured hidden states."""
        if self.drafts_with_mtp_layers(declared=False) is None:
            return None
        found = self._named(name for engine in engines().values() for name in engine.launch.draft)
        return found[0] if found is not None and isinstance(found[0], str) and found[0] else None

    def draft_steps(self) -> tuple[int, Setting] | None:
        """How many draft steps the launch chains per verification, where it says (vLLM's
        `speculative_config.num_speculative_tokens`, SGLang's `--speculative-num-steps`; knowledge/engines,
        `[launch] draft_steps`), with the setting that says it."""
        found = self._named(name for engine in engines().values() for name in engine.launch.draft_steps)
        if found is None or isinstance(found[0], bool):
            return None
        value, setting = found
        try:
            return int(str(value)), setting
        except ValueError:
            return None

    def _named(self, names: Iterable[str]) -> tuple[object, Setting] | None:
        """The first of the settings `names` the launch gives (`setting.key` for a key of a JSON
        setting), with its value."""
        for name in names:
            dest, _, key = name.partition(".")
            found = self.get(dest)
            value = found.value if found is not None else None
            named = value.get(key) if key and isinstance(value, dict) else None if key else value
            if found is not None and named is not None and named != "":
                return named, found
        return None

    def mtp_directory(self, target: Path) -> Path | None:
        """The local directory an MTP launch loads its MTP layers from: the one it names, else the
        target's (`target`); None where the one it names is no local directory (a Hub id)."""
        source = self.mtp_source()
        if source is None:
            return target
        named = Path(source).expanduser()
        return named if named.is_dir() else None


# What marks the module that declares the engine's own server flags (not a benchmark's or another
# server's): its speculative-decoding flags, declared by `add_argument` or as generated fields.
_SPECULATIVE_FLAGS = ('"--speculative-', "speculative_algorithm:", "speculative_config:")


def declared_options(tree: SourceTree) -> dict[str, Option]:
    """The flags the serving source declares: `add_argument("--flag", "--alias", ...)` calls, and
    dataclass fields a parser is generated from (`tp_size: A[int, Arg(aliases=[...])] = 1`, or the
    plain fields of a dataclass the file hands `get_kwargs`, as vLLM's `FrontendArgs`, and the
    `**get_kwargs(ModelConfig)["trust_remote_code"]` an `add_argument` spreads).
    The modules that declare the speculative flags, and the field modules beside them, are read
    first: their declaration of a flag wins over a benchmark's or another server's. Then the three
    files with the most `add_argument` calls and every file of such fields."""
    needles = ["add_argument(", ": A[", "get_kwargs(", *_SPECULATIVE_FLAGS]
    hits = tree.grep(needles)
    declaring = {relpath for needle in _SPECULATIVE_FLAGS for relpath in hits[needle]}
    main = sorted(declaring & (set(hits["add_argument("]) | set(hits[": A["])))
    folders = {relpath.rpartition("/")[0] for relpath in main}
    main += sorted(relpath for relpath in hits[": A["] if relpath.rpartition("/")[0] in folders)
    counted = sorted(((tree.raw(relpath) or b"").count(b"add_argument("), relpath) for relpath in hits["add_argument("])
    fielded = sorted(((tree.raw(relpath) or b"").count(b": A["), relpath) for relpath in hits[": A["])
    chosen = main + [relpath for _, relpath in counted[::-1][:3]]
    chosen += [relpath for count, relpath in fielded[::-1] if count >= 3] + sorted(hits["get_kwargs("])
    generated = _GeneratedFields(tree)
    options: dict[str, Option] = {}
    for relpath in dict.fromkeys(chosen):
        try:
            module = ast.parse(tree.read(relpath) or "")
        except (SyntaxError, ValueError):
            continue
        renames = _renames(module)
        declared = (
            *_options_in(module, generated),
            *_dataclass_options(module),
            *_generated_options(module, generated),
        )
        for flag, option in declared:
            copies = tuple(renames.get(option.dests[0], ()))
            options.setdefault(flag, Option(option.dests + copies, option.action, option.kind) if copies else option)
    return options


class _GeneratedFields:
    """The fields of the config classes a parser generates flags from (vLLM's `get_kwargs(ModelConfig)`),
    found by their class definitions in the tree, and how the generator makes a bool field a flag."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self.classes: dict[str, dict[str, str]] = {}

    def annotation(self, cls: str, field: str) -> str | None:
        if cls not in self.classes:
            self.classes[cls] = {}
            needles = [f"class {cls}(", f"class {cls}:"]
            for relpath in sorted({path for found in self.tree.grep(needles).values() for path in found}):
                try:
                    module = ast.parse(self.tree.read(relpath) or "")
                except (SyntaxError, ValueError):
                    continue
                for node in module.body:
                    if isinstance(node, ast.ClassDef) and node.name == cls:
                        self.classes[cls] = {
                            item.target.id: ast.unparse(item.annotation)
                            for item in node.body
                            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                        }
                        break
        return self.classes[cls].get(field)

    def bool_action(self) -> str:
        """`boolean_optional` where the generator gives a bool field `argparse.BooleanOptionalAction`
        (`--flag` and `--no-flag`), else `store_true`."""
        for relpath in self.tree.grep(["def get_kwargs("])["def get_kwargs("]:
            if "BooleanOptionalAction" in (self.tree.read(relpath) or ""):
                return _BOOLEAN_OPTIONAL
        return "store_true"


def _dataclass_options(module: ast.Module):
    """Fields annotated `A[type, "help"]` or `A[type, Arg(aliases=..., cli_name=...)]`: the flag
    is `--field-name` (or `cli_name`), a bool field takes no value."""
    for node in ast.walk(module):
        if not (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(node.annotation, ast.Subscript)
        ):
            continue
        holder = node.annotation.value
        if not (isinstance(holder, ast.Name) and holder.id in ("A", "Annotated")) or not isinstance(
            node.annotation.slice, ast.Tuple
        ):
            continue
        kind_node, *metadata = node.annotation.slice.elts
        kind = ast.unparse(kind_node)
        arg = next(
            (item for item in metadata if isinstance(item, ast.Call) and ast.unparse(item.func).endswith("Arg")), None
        )
        keywords = {keyword.arg: keyword.value for keyword in arg.keywords if keyword.arg} if arg is not None else {}
        no_cli = keywords.get("no_cli")
        if isinstance(no_cli, ast.Constant) and no_cli.value is True:
            continue
        cli_name = keywords.get("cli_name")
        flags = [
            cli_name.value
            if isinstance(cli_name, ast.Constant) and isinstance(cli_name.value, str)
            else "--" + node.target.id.replace("_", "-")
        ]
        aliases = keywords.get("aliases")
        if isinstance(aliases, (ast.List, ast.Tuple)):
            flags += [
                item.value for item in aliases.elts if isinstance(item, ast.Constant) and isinstance(item.value, str)
            ]
        bare = kind.removeprefix("Optional[").removesuffix("]")
        option = Option(
            (node.target.id,),
            "store_true" if bare == "bool" else "store",
            bare if bare in ("int", "float", "str") else "",
        )
        for flag in flags:
            yield flag, option


def _generated_options(module: ast.Module, generated: _GeneratedFields):
    """The fields of the dataclasses a module hands `get_kwargs(...)` (vLLM generates its server's
    flags so): `chat_template: str | None = None` is `--chat-template`; a bool field is a switch
    as the generator makes it (`--flag` / `--no-flag` where it is a boolean optional action)."""
    handed = {
        node.args[0].id
        for node in ast.walk(module)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).endswith("get_kwargs")
        and node.args
        and isinstance(node.args[0], ast.Name)
    }
    if "cls" in handed:  # `get_kwargs(cls)` in a classmethod: the classes that define it
        handed |= {node.name for node in module.body if isinstance(node, ast.ClassDef)}
    for node in module.body:
        if not isinstance(node, ast.ClassDef) or node.name not in handed:
            continue
        for field_node in node.body:
            if not (isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name)):
                continue
            name, kind = field_node.target.id, ast.unparse(field_node.annotation).replace(" | None", "")
            if name.startswith("_") or kind.startswith("ClassVar"):
                continue
            yield from _field_flags("--" + name.replace("_", "-"), name, kind, generated)


def _renames(module: ast.Module) -> dict[str, list[str]]:
    """`args.tp_size = args.tensor_parallel_size`: the parser's attribute copied to the name the
    engine's code reads."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if (
                isinstance(target, ast.Attribute)
                and isinstance(value, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and isinstance(value.value, ast.Name)
                and target.value.id == value.value.id != "self"
                and target.attr != value.attr
            ):
                found.setdefault(value.attr, []).append(target.attr)
    return found


def _lookup(options: dict[str, Option], flag: str) -> Option | None:
    """An option by its flag or, as argparse allows, by an unambiguous prefix (`--tp` for `--tp-size`)."""
    if flag in options:
        return options[flag]
    if flag.startswith("--") and len(flag) > 3:
        matches = {option for name, option in options.items() if name.startswith(flag)}
        if len(matches) == 1:
            return matches.pop()
    return None


def _field_flags(flag: str, name: str, annotation: str, generated: _GeneratedFields):
    """The flags a generated field makes, as its generator does for its type: a bool is a switch,
    `bool | str` a flag whose value may follow, a number or string takes its value."""
    kinds = {part.strip() for part in annotation.replace("Optional[", "").rstrip("]").split("|")} - {"None"}
    if kinds == {"bool"}:
        action = generated.bool_action()
        yield flag, Option((name,), "store_true")
        if action == _BOOLEAN_OPTIONAL:
            yield "--no-" + flag[2:], Option((name,), "store_false")
    elif kinds == {"bool", "str"}:
        yield flag, Option((name,), _OPTIONAL_VALUE, "str")
    else:
        kind = next(iter(kinds)) if len(kinds) == 1 else ""
        yield flag, Option((name,), "store", kind if kind in ("int", "float", "str") else "")


def _generator_classes(module: ast.Module) -> dict[str, str]:
    """`model_kwargs = get_kwargs(ModelConfig)`: the name bound to the flags generated from a class."""
    found: dict[str, str] = {}
    for node in ast.walk(module):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).endswith("get_kwargs")
            and node.value.args
            and isinstance(node.value.args[0], ast.Name)
        ):
            found[node.targets[0].id] = node.value.args[0].id
    return found


def _options_in(module: ast.Module, generated: _GeneratedFields):
    spread_from = _generator_classes(module)
    for node in ast.walk(module):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        ):
            continue
        flags = [
            arg.value
            for arg in node.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-")
        ]
        if not flags:
            continue
        keywords = {keyword.arg: keyword.value for keyword in node.keywords if keyword.arg}
        dest_node = keywords.get("dest")
        long_flags = [flag for flag in flags if flag.startswith("--")] or flags
        dest = (
            dest_node.value
            if isinstance(dest_node, ast.Constant) and isinstance(dest_node.value, str)
            else long_flags[0].lstrip("-").replace("-", "_")
        )
        action_node = keywords.get("action")
        action = (
            action_node.value
            if isinstance(action_node, ast.Constant) and isinstance(action_node.value, str)
            else "store"
        )
        spread = next((keyword.value for keyword in node.keywords if keyword.arg is None), None)
        if isinstance(spread, ast.Dict):  # `**{**cache_kwargs["name"], "default": None}`
            spread = next((value for key, value in zip(spread.keys, spread.values, strict=True) if key is None), None)
        if (
            action_node is None
            and isinstance(spread, ast.Subscript)
            and isinstance(spread.value, ast.Name)
            and spread.value.id in spread_from
            and isinstance(spread.slice, ast.Constant)
        ):
            annotation = generated.annotation(spread_from[spread.value.id], str(spread.slice.value))
            if annotation is not None:  # `**model_kwargs["trust_remote_code"]`: as the generator makes it
                for flag in long_flags:
                    yield from _field_flags(flag, dest, annotation, generated)
                continue
        if action_node is not None and ast.unparse(action_node).endswith("BooleanOptionalAction"):
            for flag in long_flags:
                yield flag, Option((dest,), "store_true")
                yield "--no-" + flag[2:], Option((dest,), "store_false")
            continue
        kind_node = keywords.get("type")
        kind = ast.unparse(kind_node) if kind_node is not None else ""
        nargs, const = keywords.get("nargs"), keywords.get("const")
        if isinstance(nargs, ast.Constant) and nargs.value == "?":
            value = const.value if isinstance(const, ast.Constant) else None
            for flag in flags:
                yield flag, Option((dest,), _OPTIONAL_VALUE, kind, value)
            continue
        for flag in flags:
            yield flag, Option((dest,), action if action in _NO_VALUE_ACTIONS else "store", kind)


def read_launch_settings(
    value: str, base: Path | None, tree: SourceTree, input_name: str = "serving-args"
) -> LaunchSettings:
    """Settings from `value`: a file holding the launch command (a shell script, a command line),
    or the flags themselves."""
    flags = value.lstrip().startswith("-")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if not flags and os.path.lexists(path):  # never raises, even for a name too long to be a file's
        text = read_text(
            path,
            "launch file",
            limit=_MAX_BYTES,
            fix=f"pass the script or command line that starts the {_LAUNCHED[input_name]}",
        )
        display = value
    elif flags or " " in value.strip():
        text, display = value, f"--{input_name}"
    else:
        raise InputError(
            "no such launch file",
            where=value,
            fix=f'pass the script that starts the {_LAUNCHED[input_name]}, or its flags in quotes ("--tp 8 ...")',
        )
    return parse_launch(text, display, declared_options(tree), input_name)


_LAUNCHED = {"serving-args": "server", "training-args": "trainer"}
_RUN_CONFIGS = (".yaml", ".yml", ".json")


def read_training_settings(value: str, base: Path | None, tree: SourceTree) -> LaunchSettings:
    """How training was launched: a YAML or JSON run config (SpecForge 0.2's `specforge train
    --config run.yaml`), whose leaf keys become settings named by their last key
    (`data.chat_template` -> `chat_template`), else a command line read like the server's."""
    from rca.inputs.runconfig import read_run_config

    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if path.suffix not in _RUN_CONFIGS or not os.path.lexists(path):
        return read_launch_settings(value, base, tree, "training-args")
    text = read_text(path, "run config", limit=_MAX_BYTES, fix="pass the trainer's YAML or JSON run config")
    lines = text.splitlines()
    settings = []
    for leaf in read_run_config(text, value) or ():
        source = lines[leaf.line - 1].strip() if leaf.line <= len(lines) else ""
        dotted = ".".join(leaf.keys)
        location = Location("training-args", value, leaf.line, leaf.line)
        step = Step(location, f"run config {dotted}", source, kind=StepKind.CONFIG)
        settings.append(Setting(leaf.keys[-1], leaf.value, dotted, step))
    return LaunchSettings(value, tuple(settings))


def parse_launch(
    text: str, display: str, options: dict[str, Option], input_name: str = "serving-args"
) -> LaunchSettings:
    tokens = shell_words(text, display)
    settings: dict[str, Setting] = {}
    environment: dict[str, Setting] = {}  # `NAME=value` before a command, `export NAME=value`
    unknown: list[str] = []
    undeclared: dict[str, Setting] = {}
    position = 0
    while position < len(tokens):
        token, line, source, assigns = tokens[position]
        position += 1
        if assigns:
            name, _, assigned = token.partition("=")
            location = Location(input_name, display, line, line)
            step = Step(location, f"launch environment {name}", source, kind=StepKind.CONFIG)
            environment[name] = Setting(name, assigned, name, step)  # a later assignment wins, as in the shell
            continue
        if not token.startswith("-") or token in ("-", "--"):
            continue
        flag, _, inline = token.partition("=")
        option = _lookup(options, flag)
        if option is None:
            if settings or flag.startswith("--"):
                unknown.append(flag)
            if flag.startswith("--") and len(flag) > 2:
                follows = position < len(tokens) and not tokens[position][0].startswith("-") and not tokens[position][3]
                raw: object = inline if "=" in token else tokens[position][0] if follows else True
                step = Step(
                    Location(input_name, display, line, line), f"launch flag {flag}", source, kind=StepKind.CONFIG
                )
                dest = flag[2:].replace("-", "_")
                undeclared[dest] = Setting(dest, raw, flag, step)
            continue
        follows = position < len(tokens) and not tokens[position][0].startswith("--") and not tokens[position][3]
        if option.action in _NO_VALUE_ACTIONS:
            value: object = _NO_VALUE_ACTIONS[option.action]
        elif "=" in token:
            value = _typed(inline, option, flag, f"{display}:{line}")
        elif follows and not (option.action == _OPTIONAL_VALUE and tokens[position][0].startswith("-")):
            value = _typed(tokens[position][0], option, flag, f"{display}:{line}")
            position += 1
        elif option.action == _OPTIONAL_VALUE:
            value = option.const
        else:
            raise InputError(f"{flag} needs a value", where=f"{display}:{line}", fix=f"write {flag} VALUE")
        step = Step(Location(input_name, display, line, line), f"launch setting {flag}", source, kind=StepKind.CONFIG)
        for dest in option.dests:
            settings[dest] = Setting(dest, value, flag, step)
    return LaunchSettings(
        display,
        (*settings.values(), *environment.values()),
        tuple(dict.fromkeys(unknown)),
        tuple(undeclared.values()),
    )


def _typed(raw: str, option: Option, flag: str, where: str) -> object:
    """A value as the declared type reads it; JSON (numbers, objects) where no type says otherwise."""
    if option.kind in ("int", "float"):
        try:
            return int(raw) if option.kind == "int" else float(raw)
        except ValueError:
            return raw
    if option.kind == "str" and not raw.startswith(("{", "[")):
        return raw
    try:
        check_depth(raw)  # the JSON parser recurses once per level
    except JsonSyntaxError as error:
        raise InputError(
            f"the value of {flag} is {error.message}", where=where, fix=f"write {flag} as flat JSON"
        ) from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = (";", "&&", "||", "|", "&")  # words that end one command and start another


def shell_words(text: str, display: str) -> list[tuple[str, int, str, bool]]:
    """Shell words with the line each starts on; backslash-continued lines join, comments drop.
    A word is marked when it sets the command's environment: a `NAME=value` before the command
    (`VLLM_USE_V2_MODEL_RUNNER=1 vllm serve ...`, `env NAME=value ...`) or after `export`."""
    words: list[tuple[str, int, str, bool]] = []
    logical, first = "", 0
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not logical:
            first = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            logical += stripped[:-1] + f" \0{number + 1}\0 "
            continue
        logical += stripped
        try:
            parts = shlex.split(logical, comments=True)
        except ValueError as error:
            raise InputError(
                f"cannot read the launch command: {error}", where=f"{display}:{first}", fix="check the quoting"
            ) from None
        current, leading = first, True  # leading: no command word yet, so `NAME=value` sets the environment
        for part in parts:
            if part.startswith("\0") and part.endswith("\0"):
                current = int(part.strip("\0"))
                continue
            ends = part in _SEPARATORS or part.endswith(";")
            bare = part[:-1] if part.endswith(";") and part not in _SEPARATORS else part
            assigns = leading and _ASSIGNMENT.match(bare) is not None
            word = bare if assigns else part
            if part not in _SEPARATORS:
                words.append((word, current, lines[current - 1].strip(), assigns))
            leading = ends or (leading and (assigns or word in ("export", "env")))
        logical = ""
    return words


REDACTED = "***"  # stands where a launch held a secret; the flag or variable that gave it is kept
# Flags whose value is a credential (an API key, a hub or auth token, a password), not those that
# merely end so and take a setting or a path (`--eos-token`, `--num-speculative-tokens`, `--api-keys FILE`).
_SECRET_FLAG = re.compile(
    r"--(?:token|(?:[a-z0-9]+[-_])*(?:(?:api|access|secret|private)[-_]key|(?:hf|hub|auth|access|api)[-_]token"
    r"|secret|password|passwd))"
)
_SECRET_VARIABLE = re.compile(r"(?:[A-Z0-9]+_)*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD)(?:_[A-Z0-9]+)*")
_URL_USERINFO = re.compile(r"(?<=://)([^\s/@:'\"]*)(:[^\s/@]*)?@")
_SHELL_WORD = re.compile(r"""(?:'[^']*'|"(?:\\[\s\S]|[^"\\])*"|\\[^\r\n]|[^\s'"\\])+""")
_CONTINUATION = re.compile(r"\\\r?\n")


def redact_secrets(launch: str) -> str:
    """`launch` (flags, a command line, a launch script) as a case keeps it, which travels: each
    credential replaced by REDACTED, the flag or variable that gave it kept, so that a reader sees
    one was given. Credentials are the values of secret flags (`--api-key sk-1`, `--hf-token=hf_x`)
    and of secret variables (`HF_TOKEN=hf_x vllm serve`), and a URL's password or token
    (`http://user:***@host`). The rest keeps its place: a launch file's lines are cited by number."""
    kept: list[str] = []
    end, value_follows = 0, False
    for match in _SHELL_WORD.finditer(launch):
        gap, raw = launch[end : match.start()], match.group()
        word = shlex.split(raw)[0]  # one shell word, unquoted
        name, assigns, _ = word.partition("=")
        continued = "\n" not in _CONTINUATION.sub("", gap)  # a flag's value may follow on a continued line
        if value_follows and continued and not word.startswith("-") and word not in _SEPARATORS:
            raw = REDACTED
        elif assigns and (_SECRET_FLAG.fullmatch(name) or _SECRET_VARIABLE.fullmatch(name)):
            raw = f"{name}={REDACTED}"
        else:
            hidden = _URL_USERINFO.sub(lambda url: f"{url[1]}:{REDACTED}@" if url[2] else f"{REDACTED}@", word)
            if hidden != word:  # quoted again only where it was quoted
                raw = hidden if raw == word else shlex.quote(hidden)
        value_follows = not assigns and _SECRET_FLAG.fullmatch(word) is not None
        kept += [gap, raw]
        end = match.end()
    return "".join([*kept, launch[end:]])


TEMPLATE_FLAG = "--chat-template"  # the one flag whose file a diagnosis reads (a Jinja or JSON chat template)


def named_files(value: str | None, launch: Path | None, base: Path | None, flag: str | None = None) -> list[Path]:
    """Files a launch command names; with `flag`, only the one given as that flag's value (the
    `--chat-template` file, which the diagnosis reads)."""
    if value is None:
        return []
    text = launch.read_text(errors="replace") if launch is not None and launch.is_file() else value
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return []
    if flag is not None:
        words = [
            word.partition("=")[2] if word.startswith(f"{flag}=") else word
            for before, word in zip(["", *words], words, strict=False)
            if before == flag or word.startswith(f"{flag}=")
        ]
    found = [named_file(word.partition("=")[2] if word.startswith("--") else word, launch, base) for word in words]
    return [path for path in found if path is not None]


def named_file(word: str, launch: Path | None, base: Path | None) -> Path | None:
    """The file a launch command's word names: absolute, or relative to the launch file's directory,
    the case directory or here; None when it names none (a flag, a value, a release)."""
    if not word or word.startswith("-") or len(word) >= 1024:
        return None
    path = Path(word).expanduser()
    if path.is_absolute():
        return path if path.is_file() else None
    roots = [*([launch.parent] if launch is not None and launch.is_file() else []), *([base] if base else []), Path()]
    return next((root / path for root in roots if (root / path).is_file()), None)
