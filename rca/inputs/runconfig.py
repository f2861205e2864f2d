"""A trainer's YAML or JSON run config, read as plain values within bounds.

YAML can say far more than a run config needs: aliases that repeat aliases expand a few lines into
billions of values ("billion laughs"), an alias inside the value it names makes a cycle, tags ask
for Python objects (`!!python/object/apply:os.system`), and the composer recurses once per level
of nesting. Each is refused with one line naming the file and its line, before it costs anything:
PyYAML's safe loader composes the document with nesting, cycles and tags checked as each node
starts, and the values the aliases expand to are counted before any is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from rca.errors import InputError
from rca.inputs.jsonpos import MAX_DEPTH

MAX_VALUES = 100_000  # values (keys, scalars, sections) once aliases are expanded; a run config has hundreds
_FIX = "pass the trainer's YAML or JSON run config"
_STANDARD = "tag:yaml.org,2002:"


@dataclass(frozen=True)
class RunConfigValue:
    """One leaf of the run config: its section keys, its line and its plain value."""

    keys: tuple[str, ...]
    line: int  # 1-based
    value: Any


class _Refused(Exception):
    """What the loader refuses, at the YAML mark where it starts (the file is named by the reader)."""

    def __init__(self, what: str, mark: Any, fix: str) -> None:
        super().__init__(what)
        self.what, self.line, self.fix = what, mark.line + 1, fix


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, checking each node as it starts: its depth, an alias to a value still
    being composed (a cycle), a tag the safe constructor does not know."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.open_anchors: list[str | None] = []  # of the collections being composed, outermost first

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) and event.anchor in self.open_anchors:
            raise _Refused(
                f"the alias *{event.anchor} refers to the value that holds it",
                event.start_mark,
                "replace the alias with the value it stands for",
            )
        tag = getattr(event, "tag", None)
        if tag not in (None, "!") and tag not in self.yaml_constructors:
            raise _Refused(
                f"the tag {tag.replace(_STANDARD, '!!')} is not a plain YAML value",
                event.start_mark,
                "remove the tag: a run config holds plain values, and rca builds no other",
            )
        if not isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            return super().compose_node(parent, index)
        if len(self.open_anchors) >= MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", event.start_mark, _FIX)
        self.open_anchors.append(event.anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self.open_anchors.pop()


def read_run_config(text: str, shown: str) -> list[RunConfigValue] | None:
    """The leaves of a run config's sections (None for an empty document); `shown` names the file."""
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters at once
        root = loader.get_single_node()
        if root is None:
            return None
        if not isinstance(root, yaml.MappingNode):
            raise InputError("the run config is not a mapping of sections", where=shown, fix=_FIX)
        _check_expansion(root, shown)
        return list(_leaves(loader, root, ()))
    except _Refused as refused:
        raise InputError(refused.what, where=f"{shown}:{refused.line}", fix=refused.fix) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{shown}:{mark.line + 1}" if mark is not None else shown
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise InputError(f"malformed run config: {problem}", where=where, fix="correct its YAML or JSON") from None


def _check_expansion(root: yaml.Node, shown: str) -> None:
    """Refuse a document whose aliases expand to more than MAX_VALUES values, counted on the
    composed graph (each node once: aliases are shared nodes, and cycles were refused)."""
    counts: dict[int, int] = {}

    def count(node: yaml.Node) -> int:
        if id(node) not in counts:
            children = node.value if isinstance(node, yaml.SequenceNode) else ()
            if isinstance(node, yaml.MappingNode):
                children = [child for pair in node.value for child in pair]
            counts[id(node)] = 1 + sum(count(child) for child in children)
        return counts[id(node)]

    if count(root) > MAX_VALUES:
        raise InputError(
            f"its aliases expand to more than {MAX_VALUES:,} values",
            where=shown,
            fix="write the values out: a run config's aliases do not repeat other aliases",
        )


def _leaves(loader: _BoundedLoader, node: yaml.Node, keys: tuple[str, ...]) -> Iterator[RunConfigValue]:
    if isinstance(node, yaml.MappingNode):
        for key, child in node.value:
            yield from _leaves(loader, child, (*keys, str(key.value)))
        return
    try:
        value = loader.construct_object(node, deep=True)
    except (ValueError, TypeError, OverflowError) as error:  # `!!int x`, a date of month 13
        detail = (str(error).splitlines() or [type(error).__name__])[0][:120]
        raise _Refused(
            f"the value of {'.'.join(keys)} cannot be read as its type ({detail})", node.start_mark, "correct the value"
        ) from None
    yield RunConfigValue(keys, node.start_mark.line + 1, value)
