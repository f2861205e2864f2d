"""The knowledge rca explains with: the hypothesis catalog (one self-describing TOML file per
hypothesis, named by its id), the trainers a draft config identifies (one file per trainer), and
what analyzers look for in each serving engine's code (one file per engine)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from rca.errors import ExitCode, RcaError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CATALOG_DIR = Path(__file__).parent / "hypotheses"
CONTRACT = "contract"  # the generator of every break of the contract (scope "contract" or "training")


class CatalogError(RcaError):
    """A file of rca's own knowledge is malformed: rca cannot run as installed."""

    exit_code = ExitCode.INTERNAL


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    prior: float
    summary: str
    why: str
    evidence_for: tuple[str, ...]
    evidence_against: tuple[str, ...]
    fix: str
    references: tuple[str, ...]
    # "wiring": what the draft is fed; "contract": how the engine serves the draft itself; "training":
    # what the trainer taught the draft, against what serving asks of it
    scope: str = "wiring"
    # wiring differences (`width`, `count`) that a break of the contract accounts for as well, where a
    # finding shows it: the engine's fc sized wrong is also why fc does not take what is fed
    explains: tuple[str, ...] = ()
    # what makes its candidates: "contract" (one generator serves every break an analyzer finds), or
    # the name of the wiring generator written for it (rca.explain.hypotheses.GENERATORS)
    generator: str = ""
    path: Path | None = field(default=None, compare=False)  # the file it was read from

    @property
    def contract(self) -> bool:
        """A break of one of the draft's contracts (with its engine or its training), which a finding
        shows on its own, with or without both wirings."""
        return self.scope in ("contract", "training")

    def render(self) -> str:
        """The entry as `rca explain` prints it."""
        lines = [
            f"{self.id}: {self.title}",
            "",
            self.summary.strip(),
            "",
            "Why it hurts acceptance:",
            f"  {self.why.strip()}",
        ]
        lines += ["", "Evidence for:"] + [f"  - {item}" for item in self.evidence_for]
        if self.evidence_against:
            lines += ["", "Evidence against:"] + [f"  - {item}" for item in self.evidence_against]
        lines += ["", "Fix:", f"  {self.fix.strip()}", "", f"Prior: {self.prior}"]
        if self.references:
            lines += ["", "References:"] + [f"  - {item}" for item in self.references]
        return "\n".join(lines)


@lru_cache(maxsize=1)
def catalog() -> dict[str, Entry]:
    return load_catalog(CATALOG_DIR)


def load_catalog(directory: Path) -> dict[str, Entry]:
    """The entries of the TOML files of `directory`, by id (their file names), in file-name order."""
    entries: dict[str, Entry] = {}
    for path in sorted(directory.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        entry = Entry(
            id=data["id"],
            title=data["title"],
            prior=float(data["prior"]),
            summary=data["summary"],
            why=data["why"],
            evidence_for=tuple(data.get("evidence_for", ())),
            evidence_against=tuple(data.get("evidence_against", ())),
            fix=data["fix"],
            references=tuple(data.get("references", ())),
            scope=str(data.get("scope", "wiring")),
            explains=tuple(data.get("explains", ())),
            generator=str(data.get("generator", "")),
            path=path,
        )
        if entry.scope not in ("wiring", "contract", "training"):
            raise CatalogError(
                f"scope {entry.scope!r} is not 'wiring', 'contract' or 'training'",
                where=str(path),
                fix="set scope to one of them",
            )
        if entry.id != path.stem:
            raise CatalogError(
                f"id {entry.id!r} does not match the file name", where=str(path), fix=f'set id = "{path.stem}"'
            )
        entries[entry.id] = entry
    declared = sorted({entry.generator for entry in entries.values() if entry.generator})
    for entry in entries.values():
        _check_generator(entry, declared)
    return entries


def _check_generator(entry: Entry, declared: list[str]) -> None:
    """An entry declares what makes its candidates, and it fits its scope: a break of the contract is
    made by the contract's generator, a wiring hypothesis by a wiring generator of its own. Whether
    that wiring generator exists, rca.explain.hypotheses checks (rca.explain.hypotheses.generation):
    the functions live there."""
    path = str(entry.path)
    wiring = "the name of its wiring generator (a key of GENERATORS in rca/explain/hypotheses.py)"
    if not entry.generator:
        raise CatalogError(
            "declares no generator" + (f" (the other entries declare {', '.join(declared)})" if declared else ""),
            where=path,
            fix=f'add generator = "{CONTRACT}" (a break of the contract an analyzer finds) or generator = {wiring}',
        )
    if entry.contract != (entry.generator == CONTRACT):
        raise CatalogError(
            f"generator {entry.generator!r} does not fit scope {entry.scope!r}",
            where=path,
            fix=f'scope "contract" or "training" takes generator = "{CONTRACT}"; scope "wiring" takes {wiring}',
        )


TRAINERS_DIR = Path(__file__).parent / "trainers"


@dataclass(frozen=True)
class Marker:
    """A key of a draft config (dotted path), present, or holding exactly `equals`."""

    key: str
    equals: object = None

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))


@dataclass(frozen=True)
class Release:
    """The release analyzed for a config whose keys show `range`, when it records no release."""

    analyze: str
    range: str
    requires: tuple[str, ...]


@dataclass(frozen=True)
class Trainer:
    """A trainer whose exported draft config identifies it: the keys its exporter writes."""

    id: str
    name: str
    package: str
    summary: str
    markers: tuple[Marker, ...]
    releases: tuple[Release, ...]
    version_key: str = ""
    converted: tuple[Marker, ...] = ()
    references: tuple[str, ...] = ()


@lru_cache(maxsize=1)
def trainers() -> dict[str, Trainer]:
    found: dict[str, Trainer] = {}
    for path in sorted(TRAINERS_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        trainer = Trainer(
            id=data["id"],
            name=data["name"],
            package=data["package"],
            summary=data["summary"],
            markers=tuple(Marker(**marker) for marker in data["markers"]),
            releases=tuple(
                Release(release["analyze"], release["range"], tuple(release["requires"])) for release in data["release"]
            ),
            version_key=data.get("version_key", ""),
            converted=tuple(Marker(**marker) for marker in data.get("converted", ())),
            references=tuple(data.get("references", ())),
        )
        if trainer.id != path.stem:
            raise RuntimeError(f"{path.name}: id {trainer.id!r} does not match the file name")
        if not trainer.releases or trainer.releases[-1].requires:
            raise RuntimeError(f"{path.name}: its last [[release]] must require no key (the oldest range)")
        found[trainer.id] = trainer
    return found


LAYOUTS_DIR = Path(__file__).parent / "layouts"


@dataclass(frozen=True)
class IdsPlacement:
    """Where a draft config puts its layer ids, and the tap id k feeds: h(k + offset)."""

    key: str
    offset: int
    convention: str
    decides: bool = True  # False: ids placed here alone do not say which numbering they are in
    engine: str = ""  # the engine whose numbering it is: served by that engine, its own reading holds

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))


@dataclass(frozen=True)
class Layout:
    """What a draft family's config says of its training when it names no trainer: which configs
    are the family's, the numbering each placement of ids implies, the taps trained on without ids."""

    id: str
    name: str
    summary: str
    architecture_names: tuple[str, ...]
    keys: tuple[str, ...]
    ids: tuple[IdsPlacement, ...]
    default_taps: tuple[str, ...]  # `2`, `L//2`, `L-3`: L is the target's decoder-layer count; none
    # where the family's trainers pick layers the config does not record
    default_convention: str
    references: tuple[str, ...] = ()
    off: tuple[str, ...] = ()  # keys that, set false, mean the draft was trained without the aux states

    def default_layers(self, layers: int) -> tuple[int, ...]:
        """The default taps for a target of `layers` decoder layers."""
        return tuple(_layer_term(term, layers) for term in self.default_taps)


def _layer_term(term: str, layers: int) -> int:
    """One default tap: an integer, `L//N` or `L-N`."""
    text = term.replace(" ", "")
    if text.isdigit():
        return int(text)
    if text.startswith("L//") and text[3:].isdigit():
        return layers // int(text[3:])
    if text.startswith("L-") and text[2:].isdigit():
        return layers - int(text[2:])
    raise RuntimeError(f"layout tap {term!r} is not an integer, L//N or L-N")


@lru_cache(maxsize=1)
def layouts() -> dict[str, Layout]:
    found: dict[str, Layout] = {}
    for path in sorted(LAYOUTS_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        layout = Layout(
            id=data["id"],
            name=data["name"],
            summary=data["summary"],
            architecture_names=tuple(data.get("architecture_names", ())),
            keys=tuple(data.get("keys", ())),
            ids=tuple(IdsPlacement(**placement) for placement in data.get("ids", ())),
            default_taps=tuple(data.get("default", {}).get("taps", ())),
            default_convention=data.get("default", {}).get("convention", ""),
            references=tuple(data.get("references", ())),
            off=tuple(data.get("off", ())),
        )
        if layout.id != path.stem:
            raise RuntimeError(f"{path.name}: id {layout.id!r} does not match the file name")
        layout.default_layers(64)  # every term parses
        found[layout.id] = layout
    return found


ENGINES_DIR = Path(__file__).parent / "engines"


@dataclass(frozen=True)
class EngineLaunch:
    """How a launch line starts an engine and names what it serves: the words that start it, and the
    settings (argument names, whose flags the release's own declarations give) naming each model."""

    commands: tuple[tuple[str, ...], ...] = ()  # a console script and its subcommand (`vllm serve`)
    modules: tuple[str, ...] = ()  # run with `python -m`
    images: tuple[str, ...] = ()  # container images (without the tag) that serve it
    distributions: tuple[str, ...] = ()  # the names an environment installs it under
    target: tuple[str, ...] = ()
    target_revision: tuple[str, ...] = ()
    draft: tuple[str, ...] = ()  # `setting.key` for a key of a JSON setting (`speculative_config.model`)
    draft_revision: tuple[str, ...] = ()
    draft_steps: tuple[str, ...] = ()  # the settings saying how many draft steps are chained per verification


@dataclass(frozen=True)
class Engine:
    """What analyzers look for in a serving engine's code: names to find, never answers to assume."""

    id: str
    name: str
    layer_handoffs: tuple[str, ...]  # the methods through which its runner hands layer ids to the target
    # for a speculative method whose runner hands them over through others (SGLang's DFlash), those
    pipeline_settings: tuple[str, ...]  # its launch settings (argparse dests) that split the target into stages
    references: tuple[str, ...]
    launch: EngineLaunch = EngineLaunch()
    method_handoffs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # speculative methods (shell-style patterns) that draft with the target checkpoint's own
    # multi-token-prediction layers, and those that do where no draft is named and the target declares them
    own_layer_methods: tuple[str, ...] = ()
    own_layer_methods_if_declared: tuple[str, ...] = ()
    draft_config_holders: tuple[str, ...] = ()  # names of the objects whose `.hf_config` is the draft's config

    def handoffs(self, method: str) -> tuple[str, ...]:
        """The hand-off methods of a speculative method: its own where declared, else EAGLE-3's."""
        return self.method_handoffs.get(method, self.layer_handoffs)


@lru_cache(maxsize=1)
def engines() -> dict[str, Engine]:
    return load_engines(ENGINES_DIR)


def load_engines(directory: Path) -> dict[str, Engine]:
    found: dict[str, Engine] = {}
    for path in sorted(directory.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        engine = Engine(
            id=data["id"],
            name=data["name"],
            layer_handoffs=tuple(data["layer_handoffs"]),
            pipeline_settings=tuple(data["pipeline_settings"]),
            references=tuple(data.get("references", ())),
            launch=_engine_launch(data.get("launch", {})),
            method_handoffs={method: tuple(names) for method, names in data.get("method_handoffs", {}).items()},
            own_layer_methods=tuple(data.get("own_layers", {}).get("methods", ())),
            own_layer_methods_if_declared=tuple(data.get("own_layers", {}).get("methods_if_declared", ())),
            draft_config_holders=tuple(data.get("draft_config_holders", ())),
        )
        if engine.id != path.stem:
            raise CatalogError(f"{path}: id {engine.id!r} does not match the file name", fix="rename one of them")
        found[engine.id] = engine
    return found


def _engine_launch(data: dict[str, Any]) -> EngineLaunch:
    """The `[launch]` table: each field a list of names, `commands` a list of word lists."""
    lists = {name.name: tuple(data.get(name.name, ())) for name in fields(EngineLaunch)}
    return EngineLaunch(**{**lists, "commands": tuple(tuple(words) for words in lists["commands"])})


QUANTIZED_EXPORTS = Path(__file__).parent / "quantized-exports.toml"


@dataclass(frozen=True)
class QuantizedExports:
    """What marks a checkpoint as a quantized export: the tensors its exporters write beside (or
    instead of) a layer's weight, by name suffix, and the storage dtypes of quantized weights."""

    suffixes: frozenset[str]
    dtypes: frozenset[str]

    def marks(self, name: str, dtype: str) -> bool:
        """Whether a tensor (its name, its safetensors dtype) is one a quantized export writes."""
        suffix = name.rsplit(".", 1)[-1]
        return suffix in self.suffixes or (dtype in self.dtypes and suffix == "weight")


@lru_cache(maxsize=1)
def quantized_exports() -> QuantizedExports:
    data = tomllib.loads(QUANTIZED_EXPORTS.read_text(encoding="utf-8"))
    formats = data.get("formats", {})
    return QuantizedExports(
        frozenset(suffix for entry in formats.values() for suffix in entry["suffixes"]),
        frozenset(data["dtypes"]),
    )
