"""Launch settings (`--serving-args`): each answers reads of its attribute on unknown objects
(`server_args.tp_size`), and the enums the files reading them import are followed, so that the
code deciding with a setting (`SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)`)
is evaluated."""

from __future__ import annotations

from rca.inputs.launch import LaunchSettings
from rca.model import StepKind
from rca.static.codeindex import ModuleInfo
from rca.static.evaluate.interface import Interpreter
from rca.static.evaluate.values import NO_SRC, ClassRef, Val, python_to_val


def apply(ev: Interpreter, settings: LaunchSettings) -> set[str]:
    """Link every setting to its attribute name; the files that read one of them."""
    for setting in settings.settings:
        node = ev.graph.from_step(StepKind.SETTING, setting.step)
        ev.graph.observe(node, f"{setting.dest} = {setting.value!r}")
        ev.link(setting.dest, python_to_val(setting.value, NO_SRC), node)
    needles = [f".{setting.dest}" for setting in settings.settings]
    return {relpath for hits in ev.index.tree.grep(needles).values() for relpath in hits}


def imported_enum(ev: Interpreter, importer: ModuleInfo, dotted: str, attr: str | None) -> Val | None:
    """An `Enum` a file that reads launch settings imports: the values settings are compared
    with (`SpeculativeAlgorithm.EAGLE3`), loaded even where no anchor chose its file. Only
    enums: they are data, so following them cannot take the analysis elsewhere."""
    if attr is None or importer.relpath not in ev.readers_of_settings:
        return None
    relpath = ev.index.resolve(dotted)
    module = ev.index.load(relpath) if relpath is not None else None
    cls = module.classes.get(attr) if module is not None else None
    return Val(ClassRef(cls)) if cls is not None and ev.is_enum(cls) else None
