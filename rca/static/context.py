"""What the analyzers of one side share: sources, configs, parsed code, the evaluator, the graph, facts."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rca.inputs.configs import ConfigFile, ConfigKey, DraftConfig, TargetConfig
from rca.inputs.launch import LaunchSettings
from rca.inputs.sources import SourceTree
from rca.model import Drafting, Note
from rca.static.builders import Converted, converted_draft, served_architectures
from rca.static.codeindex import ClassInfo, CodeIndex, ModuleInfo
from rca.static.evaluate.interp import Evaluator
from rca.static.evaluate.trace import Unmodeled
from rca.static.evaluate.values import ConfigObj, Val
from rca.static.facts import Fact, Finding
from rca.static.graph import DataflowGraph
from rca.static.parsing import standard_tree

F = TypeVar("F", bound=Fact)


@dataclass
class SideContext:
    """Everything analyzers of one side share: sources, configs, parsed code, graph, facts."""

    side: str
    tree: SourceTree
    target: TargetConfig
    draft: DraftConfig | None = None
    dumps: Path | None = None
    engine: SourceTree | None = None  # training: the engine that captured the hidden states, when given
    settings: LaunchSettings | None = None  # serving: the launch command's settings, when given
    parent: DraftConfig | None = None  # serving: the draft this one was fine-tuned from, when given
    recorded: DraftConfig | None = None  # serving: the draft config as training recorded it, where it was edited since
    base: Path | None = None  # where relative paths the inputs name are taken from (a case directory)
    memo: dict = field(default_factory=dict)  # results analyzers may reuse across runs on the same tree and target
    graph: DataflowGraph = field(default_factory=DataflowGraph)
    facts: list[Fact] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)  # what this side could not resolve or had to assume
    debug: list[str] = field(default_factory=list)
    index: CodeIndex | None = None
    _anchor_hits: dict[str, list[str]] = field(default_factory=dict)
    _evaluator: Evaluator | None = None
    _draft_model: tuple[ClassInfo, Val] | bool | None = False  # False: not built yet
    conversion: Converted | None = None  # how the serving engine converted the draft config, when it does
    read_flags: set[str] = field(default_factory=set)  # undeclared launch flags an analyzer read (no warning)

    @property
    def drafting(self) -> Drafting:
        """What the launch drafts with (a draft fed captured hidden states where no launch is given)."""
        return self.settings.drafting(self.target) if self.settings is not None else Drafting.CAPTURED

    def trial(self, keypath: tuple, value: object, draft: DraftConfig | None = None) -> SideContext:
        """This side afresh, with one key of its draft config (or of `draft`, the config as the user
        has it) set: where a fix is checked against the engine's code (parsed files and memo shared,
        facts and graph its own)."""
        edited = draft or self.draft
        assert edited is not None
        trial_draft = DraftConfig(edited.config.with_value(keypath, value))
        return SideContext(
            self.side, self.tree, self.target, trial_draft, index=self.index, memo=self.memo, settings=self.settings
        )

    @property
    def as_trained(self) -> DraftConfig:
        """The draft config that records training: the one before an edit (`recorded`), else the
        one declared (before the engine's conversion)."""
        return self.recorded if self.recorded is not None else self.declared_draft

    @property
    def declared_draft(self) -> DraftConfig:
        """The draft config as the user has it (and the trainer wrote it), before any conversion
        by the serving engine: what the draft was trained with."""
        assert self.draft is not None
        return self.conversion.original if self.conversion is not None else self.draft

    def prepare(self, anchors: set[str], index: CodeIndex | None = None) -> None:
        """Find the files worth parsing (one text search for every anchor) and index them."""
        self._anchor_hits = self.tree.grep(sorted(anchors))
        allowed = set().union(*self._anchor_hits.values()) if self._anchor_hits else set()
        self.index = index if index is not None else CodeIndex(self.tree, allowed)
        if index is not None:
            index.allowed = (index.allowed or set()) | allowed

    def restart(self) -> None:
        """Forget what this side's analysis found and evaluated, keeping the parsed code and the
        modules it allowed: the next run evaluates with all of them allowed from the start."""
        self.draft, self.conversion = self.declared_draft if self.draft is not None else None, None
        self.memo, self.graph, self.read_flags = {}, DataflowGraph(), set()
        self.facts, self.findings, self.notes, self.debug = [], [], [], []
        self._evaluator, self._draft_model = None, False
        if self.index is not None:
            self.index.denied = set()

    def convert_draft(self) -> None:
        """Read the draft config as the serving engine does when it converts it from another
        trainer's format first (vLLM and speculators' format): every analyzer then sees that."""
        if self.draft is None or self.index is None:
            return
        allowed = set(self.index.allowed) if self.index.allowed is not None else None
        converted = converted_draft(self)
        if converted is None:  # looking for a converter read code no analyzer asked for: forget it
            self.index.allowed = allowed
            self._evaluator = None
            return
        assert self.draft is not None
        before, after = list(self.draft.architectures), list(converted.draft.architectures)
        self.conversion, self.draft = converted, converted.draft
        self.evaluator.draft = converted.draft.config
        self.note(
            f"{self.tree.label} converts the draft config from its format before building the draft "
            f"({converted.converter}, {converted.location}): architectures "
            f"{before} become {after}"
        )

    def anchor_files(self, anchor: str) -> list[str]:
        if anchor not in self._anchor_hits:
            self._anchor_hits.update(self.tree.grep([anchor]))
        return self._anchor_hits[anchor]

    @property
    def evaluator(self) -> Evaluator:
        if self._evaluator is None:
            assert self.index is not None
            self._evaluator = Evaluator(
                self.index,
                self.graph,
                num_layers=self.target.num_layers,
                target=self.target.config,
                draft=self.draft.config if self.draft else None,
                settings=self.settings,
            )
        return self._evaluator

    def note(self, text: str) -> None:
        """Tell, with this side's wiring, something the analysis could not resolve or assumed."""
        self.notes.append(Note(self.side, text))

    def unmodeled(self) -> list[Unmodeled]:
        """Statements and expressions the evaluator reached but does not model."""
        return list(self._evaluator.events.unmodeled) if self._evaluator is not None else []

    def add(self, item: Fact | Finding) -> None:
        if isinstance(item, Finding):
            self.findings.append(item)
        else:
            self.facts.append(item)

    def fact(self, kind: type[F]) -> F | None:
        return next((fact for fact in self.facts if isinstance(fact, kind)), None)

    def find_class(self, name: str) -> ClassInfo | None:
        """The class a framework would build for an architecture name, found by a text search for
        its definition. When several files define it, the one the model registry lists wins
        (a module-level `EntryClass` naming it), then the one under a `models` package."""
        assert self.index is not None
        candidates: list[ClassInfo] = []
        for relpaths in self.tree.grep([f"class {name}(", f"class {name}:"]).values():
            for relpath in relpaths:
                self.index.allow(relpath)
                module = self.index.load(relpath)
                if module is not None and name in module.classes:
                    candidates.append(module.classes[name])

        def rank(cls: ClassInfo) -> tuple[bool, bool, int]:
            entry = cls.module.assignments.get("EntryClass")
            registered = entry is not None and name in cls.module.tree.code_for_node(entry)
            return (not registered, "/models/" not in f"/{cls.module.relpath}", len(cls.module.relpath))

        if candidates:
            return min(candidates, key=rank)
        return self._registered_class(name)

    def draft_model(self) -> tuple[ClassInfo, Val] | None:
        """The class the serving engine builds for the draft's `architectures`, and an instance of
        it evaluated with the draft's config (built once: analyzers read its fields)."""
        if self._draft_model is False:
            self._draft_model = None
            for name in served_architectures(self)[0] if self.draft is not None else ():
                if name in self.target.architectures:
                    continue  # the target's own class: built as a second target model, not an EAGLE-3 draft
                cls = self.find_class(name)
                if cls is not None:
                    assert self.draft is not None
                    config = Val(ConfigObj(self.draft.config))
                    self._draft_model = (cls, self.evaluator.new_object(cls, [], {"config": config}))
                    break
        return self._draft_model  # type: ignore[return-value]

    def _registered_class(self, name: str) -> ClassInfo | None:
        """An architecture a model registry maps to another class: vLLM's
        `"LlamaForCausalLMEagle3": ("llama_eagle3", "Eagle3LlamaForCausalLM")`."""
        assert self.index is not None
        needle = f'"{name}": ('
        for relpath in self.tree.grep([needle])[needle]:
            self.index.allow(relpath)
            module = self.index.load(relpath)
            if module is None:
                continue
            for module_name, class_name in _registry_entries(module, name):
                if class_name != name:
                    found = self.find_class(class_name)
                    if found is not None and found.module.relpath.rsplit("/", 1)[-1] == f"{module_name}.py":
                        return found
        return None

    def standard_tree(self, relpath: str) -> ast.Module | None:
        """A file of this side in the standard parser's tree (None: absent, or not parseable safely):
        for a reader that needs no libcst node, at a fraction of its cost."""
        loaded = self.index.modules.get(relpath) if self.index is not None else None
        if loaded is not None and loaded.parsed is not None and loaded.parsed.standard is not None:
            return loaded.parsed.standard  # the code index parsed it already
        text = self.tree.read(relpath)
        return standard_tree(text) if text is not None else None

    def config(self, which: str) -> ConfigFile | None:
        if which == "target":
            return self.target.config
        return self.draft.config if self.draft else None

    def config_key(self, which: str, *path: str | int) -> ConfigKey | None:
        """A key of the target's config (`which="target"`) or the draft's (`"draft"`, as the engine
        reads it), with its value and where it is written; None where that config or key is absent."""
        config = self.config(which)
        return config.key(path) if config is not None else None


def _registry_entries(module: ModuleInfo, key: str) -> Iterator[tuple[str, str]]:
    """`"key": ("module", "Class")` entries of dict literals anywhere in a module (read from the
    standard parser's tree: only string constants matter, and registries are long)."""
    standard = module.parsed.standard if module.parsed is not None else None
    for node in ast.walk(standard) if standard is not None else ():
        if isinstance(node, ast.Dict):
            for entry_key, value in zip(node.keys, node.values, strict=False):
                if (
                    isinstance(entry_key, ast.Constant)
                    and entry_key.value == key
                    and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2
                ):
                    parts = [
                        element.value
                        for element in value.elts
                        if isinstance(element, ast.Constant) and isinstance(element.value, str)
                    ]
                    if len(parts) == 2:
                        yield parts[0], parts[1]
