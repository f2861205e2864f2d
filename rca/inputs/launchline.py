"""The launch line as the input: the command that serves the draft says which engine serves it, its
release, the target and the draft.

An engineer has the command (`vllm serve ORG/TARGET --speculative-config '{"model": "ORG/DRAFT"}'`,
`python -m sglang.launch_server --model-path ... --speculative-draft-model-path ...`, a container
line, a launch script), not a set of directories. Which words start an engine and which settings
name each model are data (knowledge/engines/*.toml); which flags set those settings is read from
the release's own flag declarations (`launch.declared_options`), so aliases (`--model`,
`--model-path`) are the engine's. The release is, in order: the one given with `--serving`, the
version installed in the environment of the interpreter (or console script) the launch names, the
tag of a container image. Models are local directories (relative to the launch file, the case or
here), cached Hub repositories (`models--ORG--NAME` roots too), or Hub ids (`rca.inputs.hub`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rca.errors import InputError
from rca.inputs import Inputs
from rca.inputs.draft import VOCAB_MAPS
from rca.inputs.files import MIB, read_text
from rca.inputs.hub import HubModel, is_hub_id, repository_snapshot, resolve
from rca.inputs.hub import display as hub_display
from rca.inputs.launch import LaunchSettings, declared_options, parse_launch, shell_words
from rca.inputs.sources import SourceSpec, materialize
from rca.knowledge import Engine, engines

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_TAG_VERSION = re.compile(r"v?(\d+\.\d+(?:\.\d+)?(?:(?:\.post|rc|\.dev)\d+)?)")
_ENGINES_SAID = (
    "vllm serve, python -m vllm.entrypoints.openai.api_server, python -m sglang.launch_server, "
    "lmdeploy serve api_server, or a container image of theirs"
)


@dataclass(frozen=True)
class Started:
    """Where the launch starts the engine: which engine, the program that runs it, the word after
    the command (where a console script takes the model), and the container image."""

    engine: Engine
    program: str | None  # the interpreter or console script as written (None in a container)
    after: int  # the index of the first word after the command
    takes_model: bool  # a console script's subcommand takes the model as its next word
    image: str | None = None


@dataclass(frozen=True)
class LaunchReading:
    """What was read from the launch, and from where: shown first, and kept with the diagnosis."""

    engine: str
    release: str
    release_from: str
    target: str | None  # as the launch names it
    draft: str | None
    target_path: str | None  # where it was found
    draft_path: str | None
    settings: tuple[str, ...] = ()  # the launch's other settings, `dest=value`
    mtp_source: str | None = None  # the checkpoint an MTP launch loads its MTP layers from, as named

    def summary(self) -> str:
        def model(named: str | None, path: str | None) -> str:
            if named is None:
                return "not named"
            shown = path if path is None else hub_display(Path(path)) or path
            return named if shown is None or named == shown else f"{named} ({shown})"

        installed = "installed in" in self.release_from  # the release is that installation's code
        said = [
            self.release_from if installed else f"{self.release} ({self.release_from})",
            f"target {model(self.target, self.target_path)}",
            f"MTP layers from {self.mtp_source}" if self.mtp_source else f"draft {model(self.draft, self.draft_path)}",
        ]
        if self.settings:
            said.append(", ".join(self.settings))
        return "read from the launch: " + "; ".join(said)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"settings": list(self.settings)}


def read_launch(
    text: str, display: str, given: Inputs, *, launch_file: Path | None = None, no_network: bool = False, progress=None
) -> tuple[Inputs, LaunchReading]:
    """`given` completed from the launch `text`: the release, the target and the draft, each only
    where not given already (what is given wins), and the launch itself as the serving settings."""
    words = [word for word, _line, _source, assigns in shell_words(text, display) if not assigns]
    started = _started(words, display)
    engine = started.engine
    release, release_from = _release(given.serving, started, display)
    tree = materialize(SourceSpec.parse(release, "--serving", given.base), "serving", progress)
    settings = parse_launch(text, display, declared_options(tree))
    roots = [root for root in (launch_file.parent if launch_file else None, given.base, Path.cwd()) if root]
    found: dict[str, tuple[str | None, str | None]] = {}
    for which, names, revisions in (
        ("target", engine.launch.target, engine.launch.target_revision),
        ("draft", engine.launch.draft, engine.launch.draft_revision),
    ):
        named = _setting(settings, names)
        if named is None and which == "target" and started.takes_model:
            following = words[started.after] if started.after < len(words) else ""
            named = following if following and not following.startswith("-") else None
        if getattr(given, which) is not None:
            found[which] = (named, getattr(given, which))
            continue
        if named is None or (which == "draft" and settings.mtp_source() is not None):
            found[which] = (None, None)  # an MTP launch's source of its MTP layers is no draft
            continue
        revision = _setting(settings, revisions)
        flag = f"{display} ({which})"
        path = model_directory(str(named), revision, flag, roots, no_network=no_network, draft=which == "draft")
        found[which] = (str(named), str(path))
    if found["target"][1] is None:
        raise InputError(
            "it names no target model",
            where=display,
            fix=f"name it as {engine.name} does ({_flags_of(engine)}), or pass --target DIR",
        )
    completed = dataclasses.replace(
        given,
        serving=given.serving or release,
        target=found["target"][1],
        draft=found["draft"][1],
        serving_args=given.serving_args or (str(launch_file) if launch_file is not None else text),
    )
    launch = engine.launch
    read = {
        name.split(".")[0] for name in (*launch.target, *launch.draft, *launch.target_revision, *launch.draft_revision)
    }
    shown = tuple(
        f"{setting.dest}={setting.value!r}"
        for setting in settings.settings
        if setting.dest not in read and setting.flag.startswith("-")
    )
    reading = LaunchReading(
        engine.id, release, release_from, found["target"][0], found["draft"][0], found["target"][1], found["draft"][1]
    )
    return completed, dataclasses.replace(reading, settings=shown, mtp_source=settings.mtp_source())


def model_directory(
    value: str, revision: str | None, flag: str, roots: list[Path], *, no_network: bool = False, draft: bool = False
) -> Path:
    """The local directory of a model named as a launch or an option names it: a directory (or a
    config file) under one of `roots`, a cached Hub repository root, or a Hub id (for a `draft`,
    fetched with its checkpoint's headers and vocab maps)."""
    candidate = Path(value).expanduser()
    places = [candidate] if candidate.is_absolute() else [root / candidate for root in roots]
    for place in places:
        if place.exists():
            snapshot = repository_snapshot(place, revision)
            if snapshot is not None:
                return snapshot.path
            if place.name.startswith("models--") and place.is_dir():
                raise InputError(
                    f"{place} is a Hugging Face cache repository with no snapshot"
                    + (f" for {revision}" if revision else " for main"),
                    where=flag,
                    fix=f"pass {place}/snapshots/COMMIT, or download it again (hf download ...)",
                )
            return place
    if is_hub_id(value):
        hub: HubModel = resolve(value, revision, flag, no_network=no_network, values=VOCAB_MAPS if draft else None)
        return hub.path
    raise InputError(
        f"{value!r} is neither a model directory here nor a Hugging Face id (org/name)",
        where=flag,
        fix="pass the model's directory (with its config.json) or its Hub id",
    )


def _started(words: list[str], display: str) -> Started:
    """The engine the launch starts: in a container, by its image (and the command run in it);
    else by its console script or module."""
    for index, word in enumerate(words):
        for engine in engines().values():
            if _image_name(word) in engine.launch.images:
                inner = _command(words[index + 1 :])
                if inner is not None:
                    return dataclasses.replace(inner, program=None, after=index + 1 + inner.after, image=word)
                return Started(engine, None, index + 1, False, word)  # the image's entry point serves
    started = _command(words)
    if started is None:
        raise InputError(
            "it starts no serving engine rca reads",
            where=display,
            fix=f"give the command that runs {_ENGINES_SAID}",
        )
    return started


def _command(words: list[str]) -> Started | None:
    """The engine a command line runs, by its console script (`vllm serve`) or module (`-m`)."""
    for index, word in enumerate(words):
        for engine in engines().values():
            for command in engine.launch.commands:
                if (
                    os.path.basename(word) == command[0]
                    and tuple(words[index + 1 : index + len(command)]) == command[1:]
                ):
                    return Started(engine, word, index + len(command), True)
            if word == "-m" and index + 1 < len(words) and words[index + 1] in engine.launch.modules:
                program = next((w for w in reversed(words[:index]) if _PYTHON.fullmatch(os.path.basename(w))), None)
                return Started(engine, program, index + 2, False)
    return None


def _image_name(word: str) -> str:
    """A container image reference without its tag or digest (`vllm/vllm-openai:v0.11.0` ->
    `vllm/vllm-openai`), and without a registry host (`docker.io/...`)."""
    name = word.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    parts = name.split("/")
    if len(parts) > 2 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    return "/".join(parts)


def _release(given: str | None, started: Started, display: str) -> tuple[str, str]:
    """The release that serves the launch, and where that was read."""
    engine = started.engine
    if given:
        named = SourceSpec.parse(given, "--serving").name
        if named is not None and named not in (engine.id, *engine.launch.distributions):
            raise InputError(
                f"--serving names {named}, but the launch starts {engine.name}",
                where=display,
                fix=f"pass the {engine.name} release it runs (--serving {engine.id}==VERSION)",
            )
        return given, "given with --serving"
    if started.image is not None:
        tag = started.image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
        match = _TAG_VERSION.match(tag)
        if match:
            return f"{engine.id}=={match[1]}", f"the image tag {started.image}"
        raise InputError(
            f"the image {started.image} has no version in its tag",
            where=display,
            fix=f"pass --serving {engine.id}==VERSION (the release the image holds)",
        )
    installed = _installed(started.program, engine)
    if installed is not None:
        return installed
    raise InputError(
        f"which {engine.name} release serves it is not said: none given, none installed where it runs, no image tag",
        where=display,
        fix=f"pass --serving {engine.id}==VERSION (pip show {engine.id} where it runs)",
    )


def _installed(program: str | None, engine: Engine) -> tuple[str, str] | None:
    """The engine installed in the environment of `program` (an interpreter or a console script; a
    bare name is looked up on PATH, as the shell would): its package directory, the very code that
    serves (a CPU build, a patched install), with the distribution and version it was installed as."""
    if program is None:
        return None
    path = Path(program).expanduser() if "/" in program else Path(shutil.which(program) or program)
    if not path.is_absolute():
        return None
    environment = path.parent.parent  # ENV/bin/python -> ENV; the link itself, not where it leads
    names = {re.sub(r"[-_.]+", "_", distribution).lower(): distribution for distribution in engine.launch.distributions}
    for site in sorted(
        [*environment.glob("lib/python3*/site-packages"), *environment.glob("lib64/python3*/site-packages")]
    ):
        for info in sorted(site.glob("*.dist-info")):
            name, _, version = info.name.removesuffix(".dist-info").partition("-")
            distribution = names.get(re.sub(r"[-_.]+", "_", name).lower())
            if distribution is None or not (site / engine.id / "__init__.py").is_file():
                continue
            return str(site / engine.id), f"{distribution} {version} installed in {environment}"
    return None


def _setting(settings: LaunchSettings, names: tuple[str, ...]) -> Any | None:
    """The first of the settings `names` the launch sets (`setting.key` reads a JSON setting's key)."""
    for name in names:
        dest, _, key = name.partition(".")
        setting = settings.get(dest)
        if setting is None:
            continue
        value = setting.value
        if key:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            return value
    return None


def _flags_of(engine: Engine) -> str:
    commands = [" ".join(command) + " MODEL" for command in engine.launch.commands]
    return ", ".join([*commands, *(f"the {name} setting" for name in engine.launch.target)])


MODEL_INPUTS = ("target", "draft", "parent_draft", "trained_draft")


def complete(
    inputs: Inputs, launch: list[str], *, serve_with: bool = False, no_network: bool = False, progress=None
) -> tuple[Inputs, LaunchReading | None]:
    """`inputs` as a diagnosis reads them: models named by Hub id or cache repository root found as
    snapshot directories, and what is missing read from the launch: the words after `--` (unless
    they are only the command `--serve-with` runs beside inputs given in full), else a
    `--serving-args` launch that starts an engine. The command `--serve-with` runs beside inputs
    given in full is read for its settings where rca can read it as a launch."""
    base = [inputs.base or Path.cwd()]
    for name in MODEL_INPUTS:
        value = getattr(inputs, name)
        if value is not None and (is_hub_id(value, inputs.base) or Path(value).name.startswith("models--")):
            flag = f"--{name.replace('_', '-')}"
            found = model_directory(value, None, flag, base, no_network=no_network, draft=name != "target")
            inputs = inputs.with_values({name: str(found)})
    missing = inputs.serving is None or inputs.target is None or inputs.draft is None
    required = missing or not serve_with  # else it is the command --serve-with runs: read for its settings
    if launch and (required or inputs.serving_args is None):
        try:
            return read_launch(shlex.join(launch), "the launch", inputs, no_network=no_network, progress=progress)
        except InputError:
            if required:
                raise
            return inputs, None  # a command rca does not read as a launch (a script of the user's): served as given
    if launch or inputs.serving_args is None or not missing:
        return inputs, None
    value = inputs.serving_args
    path = inputs.path(value)
    is_file = not value.lstrip().startswith("-") and path is not None and path.is_file()
    text = (
        read_text(path, "launch file", limit=MIB, fix="pass the script that starts the server")
        if is_file and path is not None
        else value
    )
    try:
        _started([word for word, _l, _s, assigns in shell_words(text, value) if not assigns], value)
    except InputError:
        return inputs, None  # flags alone: the settings of a launch given otherwise
    return read_launch(
        text, value, inputs, launch_file=path if is_file else None, no_network=no_network, progress=progress
    )
