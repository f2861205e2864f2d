"""Plugins are discovered, never listed: analyzers and probes are the concrete subclasses of their
contract defined in the modules of one package (`rca.analyzers`, the repository's `analyzers/`),
walked through its family packages (`serving_capture/`, `draft_contract/`, ...).

The package is imported by name when discovery first runs, so the core never imports a plugin
module statically; plugins import the core only through `rca.sdk`.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from types import ModuleType

PLUGIN_PACKAGE = "rca.analyzers"


@lru_cache(maxsize=1)
def plugin_modules() -> tuple[ModuleType, ...]:
    """Every module of the plugin package and its subpackages, in name order."""
    package = importlib.import_module(PLUGIN_PACKAGE)
    names = sorted(info.name for info in pkgutil.walk_packages(package.__path__, prefix=f"{PLUGIN_PACKAGE}."))
    return tuple(importlib.import_module(name) for name in names)


def concrete_subclasses(base: type) -> list[type]:
    """The subclasses of `base` defined (not merely imported) in the plugin modules."""
    found = []
    for module in plugin_modules():
        found += [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, base)
            and value is not base
            and value.__module__ == module.__name__
        ]
    return found
