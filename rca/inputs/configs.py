"""Draft and target `config.json` files, read with line numbers for citations."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rca.errors import InputError
from rca.inputs.files import model_file, read_text, resolved
from rca.inputs.hub import display as hub_display
from rca.inputs.jsonpos import JsonDocument, JsonSyntaxError, KeyPath, loads
from rca.model import ConfigEdit, Location, Step

if TYPE_CHECKING:
    from rca.inputs.draftweights import DraftWeights

_MAX_CONFIG_BYTES = 8 * 1024 * 1024
MAX_LAYERS = 10_000  # the deepest models have a few hundred decoder layers

# Where multimodal and wrapper configs keep the language model's settings.
TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config", "thinker_config")


def display_path(path: Path, base: Path | None) -> str:
    """A path as users should see it: a file of a cached Hub snapshot as `org/name@commit/file`,
    else relative to the case or working directory when inside it."""
    shown = hub_display(path)
    if shown is not None:
        return shown
    for root in (base, Path.cwd()):
        if root is None:
            continue
        try:
            return resolved(path).relative_to(resolved(root)).as_posix()
        except ValueError:
            continue
    return path.as_posix()


@dataclass(frozen=True)
class ConfigKey:
    """A config key's value with where it is written: what an analyzer compares, and cites."""

    value: Any
    location: Location
    source: str  # the line as written

    def step(self, note: str) -> Step:
        return Step(self.location, note, self.source)


@dataclass(frozen=True)
class ConfigFile:
    input: str  # "draft" or "target"
    file: Path
    display: str
    doc: JsonDocument

    @classmethod
    def from_data(cls, input_name: str, file: Path, display: str, data: dict[str, Any]) -> ConfigFile:
        """A config made up by the analysis (a trial's ids), laid out as JSON so it has lines to cite."""
        return cls(input_name, file, display, loads(json.dumps(data, indent=2)))

    def with_value(self, path: KeyPath, value: object) -> ConfigFile:
        """A copy with one key set (parents created as needed), for a trial of a fix."""
        return ConfigFile.from_data(self.input, self.file, self.display, ConfigEdit(path, value).apply(self.data))

    @property
    def data(self) -> dict[str, Any]:
        return self.doc.data

    def location(self, path: KeyPath) -> Location:
        first, last = self.doc.line_range(path) or (1, 1)
        return Location(self.input, self.display, first, last)

    def step(self, path: KeyPath, note: str) -> Step:
        location = self.location(path)
        return Step(location, note, self.doc.source_line(location.line))

    def edit_diff(self, path: KeyPath, value: Any) -> str:
        """A unified diff that sets `path` to `value` in the file as written (one line replaced,
        or one line inserted into the nearest existing parent); empty when the layout is too
        unusual to edit by lines."""
        lines = self.doc.text.splitlines(keepends=True)
        asked = path, value
        found, _ = self.lookup(path)
        present = max((n for n in range(len(path)) if self.lookup(path[:n])[0]), default=0)
        if not found and present and not isinstance(self.lookup(path[:present])[1], dict):
            for key in reversed(path[present:]):  # a parent that is not a mapping (null): replace it by one
                value = {key: value}
            path, found = path[:present], True
        if found and path in self.doc.lines:
            first, last = self.doc.lines[path]
            head = lines[first - 1]
            key = json.dumps(path[-1])
            if key not in head:
                return ""
            prefix = head[: head.index(":", head.index(key) + len(key)) + 1]
            comma = "," if lines[last - 1].rstrip().endswith(",") else ""
            edited = [*lines[: first - 1], f"{prefix} {json.dumps(value)}{comma}\n", *lines[last:]]
        else:
            depth = max(
                (
                    n
                    for n in range(len(path))
                    if path[:n] in self.doc.lines and isinstance(self.lookup(path[:n])[1], dict)
                ),
                default=None,
            )
            if depth is None:
                return ""
            parent = path[:depth]
            first, last = self.doc.lines[parent]
            if first == last:
                return ""
            nested: Any = value
            for key in reversed(path[depth + 1 :]):
                nested = {key: nested}
            following = lines[first] if first < len(lines) else ""
            indent = (
                following[: len(following) - len(following.lstrip())]
                if last > first + 1
                else lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())] + "  "
            )
            comma = "," if self.lookup(parent)[1] else ""
            edited = [
                *lines[:first],
                f"{indent}{json.dumps(path[depth])}: {json.dumps(nested)}{comma}\n",
                *lines[first:],
            ]
        try:
            edit = ConfigFile(self.input, self.file, self.display, loads("".join(edited)))
        except JsonSyntaxError:
            return ""
        if edit.lookup(asked[0]) != (True, asked[1]):  # the line held other values too (a one-line file)
            return ""
        return "".join(difflib.unified_diff(lines, edited, f"a/{self.display}", f"b/{self.display}", n=1))

    def key(self, path: KeyPath) -> ConfigKey | None:
        """The value at `path` with its location, or None where the file does not set it."""
        found, value = self.lookup(path)
        if not found:
            return None
        location = self.location(path)
        return ConfigKey(value, location, self.doc.source_line(location.line))

    def lookup(self, path: KeyPath) -> tuple[bool, Any]:
        node: Any = self.data
        for key in path:
            if isinstance(key, int) and isinstance(node, list) and -len(node) <= key < len(node):
                node = node[key]
            elif isinstance(key, str) and isinstance(node, dict) and key in node:
                node = node[key]
            else:
                return False, None
        return True, node


def load_config(input_name: str, path: Path, base: Path | None = None) -> ConfigFile:
    """Read a config.json (or a directory holding one); bad input raises one clear InputError."""
    flag = f"--{input_name}"
    if not path.exists() and not path.is_symlink():  # a symlink loop is said as such when it is read
        raise InputError(
            f"{flag} path does not exist", where=str(path), fix="pass a config.json or the directory that holds it"
        )
    if path.is_dir():
        candidate = path / "config.json"
        if not candidate.is_file():
            raise InputError(
                f"{flag} directory has no config.json",
                where=str(path),
                fix="pass the config.json itself or its directory",
            )
        path = candidate
    text = read_text(
        model_file(path, f"{flag} file"),
        f"{flag} file",
        limit=_MAX_CONFIG_BYTES,
        fix="pass the model's config.json",
        encoding="utf-8-sig",
    )
    try:
        doc = loads(text)
    except JsonSyntaxError as error:
        raise InputError(
            f"malformed JSON: {error.message}",
            where=f"{path}:{error.line}:{error.column}",
            fix="correct the JSON syntax",
        ) from None
    if not isinstance(doc.data, dict):
        raise InputError(
            f"{flag} config is a JSON {type(doc.data).__name__}, not an object",
            where=str(path),
            fix="pass the model's config.json",
        )
    return ConfigFile(input_name, path, display_path(path, base), doc)


# Config keys that count a checkpoint's multi-token-prediction layers (beyond its decoder layers).
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


@dataclass(frozen=True)
class TargetConfig:
    """The target model's config: layer count, width and architecture, wherever they are nested."""

    config: ConfigFile

    def mtp_layers(self) -> tuple[str, int] | None:
        """The multi-token-prediction layers the checkpoint declares beyond its decoder layers (the
        key and their count), which an MTP launch drafts with: DeepSeek's, GLM's and MiMo's
        `num_nextn_predict_layers`, Qwen3-Next's and Qwen3.5's `mtp_num_hidden_layers`."""
        for key in MTP_LAYER_KEYS:
            found = self._find(key)
            if found is not None and isinstance(found[1], int) and not isinstance(found[1], bool) and found[1] > 0:
                return ".".join(str(part) for part in found[0]), found[1]
        return None

    def _find(self, key: str) -> tuple[KeyPath, Any] | None:
        data = self.config.data
        if key in data and data[key] is not None:
            return (key,), data[key]
        for nest in TEXT_CONFIG_KEYS:
            inner = data.get(nest)
            if isinstance(inner, dict) and inner.get(key) is not None:
                return (nest, key), inner[key]
        return None

    @property
    def num_layers_path(self) -> KeyPath:
        found = self._find("num_hidden_layers")
        if found is None:
            nests = ", ".join(TEXT_CONFIG_KEYS)
            raise InputError(
                "target config has no num_hidden_layers (looked at the top level and under " + nests + ")",
                where=self.config.display,
                fix="pass the target model's config.json",
            )
        path, value = found
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(
                f"num_hidden_layers is {json.dumps(value)[:80]}, not a positive integer",
                where=str(self.config.location(path)),
                fix="correct the target config",
            )
        if value > MAX_LAYERS:
            raise InputError(
                f"num_hidden_layers is {value}: no model has that many decoder layers "
                f"(at most {MAX_LAYERS} are analyzed)",
                where=str(self.config.location(path)),
                fix="correct the target config",
            )
        return path

    @property
    def num_layers(self) -> int:
        return self.config.lookup(self.num_layers_path)[1]

    @property
    def hidden_size(self) -> int | None:
        found = self._find("hidden_size")
        return found[1] if found and isinstance(found[1], int) else None

    @property
    def vocab_size(self) -> int | None:
        found = self._find("vocab_size")
        return found[1] if found and isinstance(found[1], int) and not isinstance(found[1], bool) else None

    def key_path(self, key: str) -> KeyPath | None:
        """Where the config holds `key`: the top level or a nested language-model config."""
        found = self._find(key)
        return found[0] if found else None

    @property
    def architectures(self) -> tuple[str, ...]:
        found = self._find("architectures")
        if found and isinstance(found[1], list):
            return tuple(str(name) for name in found[1])
        return ()

    def text_architectures(self) -> tuple[str, ...]:
        """Architectures named by the nested language-model config, tried after the top level."""
        names: list[str] = []
        for nest in TEXT_CONFIG_KEYS:
            inner = self.config.data.get(nest)
            if isinstance(inner, dict) and isinstance(inner.get("architectures"), list):
                names.extend(str(name) for name in inner["architectures"])
        return tuple(names)


def declared_layers(config: ConfigFile) -> int:
    """The decoder layers a draft config declares (`num_hidden_layers`), one where it gives no count."""
    _, layers = config.lookup(("num_hidden_layers",))
    return layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else 1


@dataclass(frozen=True)
class DraftConfig:
    """The draft's config (which layer ids it declares, and where) and, when the draft directory
    holds them, what the static checks know of its weights."""

    config: ConfigFile
    weights: DraftWeights | None = None

    @property
    def architectures(self) -> tuple[str, ...]:
        value = self.config.data.get("architectures")
        return tuple(str(name) for name in value) if isinstance(value, list) else ()

    def declared_ids(self) -> list[tuple[KeyPath, Any]]:
        """Every place the draft config declares aux layer ids (nested and top level)."""
        found = []
        for path in (("eagle_config", "eagle_aux_hidden_state_layer_ids"), ("eagle_aux_hidden_state_layer_ids",)):
            present, value = self.config.lookup(path)
            if present:
                found.append((path, value))
        return found

    # Sizes an engine builds the draft with: a value of another type fails (or is misread) when served.
    SIZES = ("draft_vocab_size", "vocab_size", "max_position_embeddings", "hidden_size", "target_hidden_size")

    def check_sizes(self) -> None:
        """Refuse a size that no engine could build the draft with (a string, a float, zero or less);
        `null` stays: engines then fall back to a default."""
        for key in self.SIZES:
            present, value = self.config.lookup((key,))
            if present and value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise InputError(
                    f"{key} is {json.dumps(value)[:80]}, not a positive integer",
                    where=str(self.config.location((key,))),
                    fix=f"set {key} to the size the draft was trained with",
                )

    def check_ids(self) -> None:
        """Refuse declared ids that no engine could use: a value that is not a list of layer numbers
        (a string, floats, a mapping, an empty list). `null` stays: it means the engine's defaults."""
        for path, value in self.declared_ids():
            if value is None:
                continue
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(item, int) and not isinstance(item, bool) for item in value)
            ):
                raise InputError(
                    f"{'.'.join(path)} is {json.dumps(value)[:80]}, not a list of layer ids",
                    where=str(self.config.location(path)),
                    fix=f"set {'.'.join(path)} to the target layers the draft was trained on, e.g. [2, 30, 58]",
                )
