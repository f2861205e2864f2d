"""The engine lab's overlay: modules whose source RCA_LAB_OVERLAY holds (at their module path,
`vllm/model_executor/models/llama.py`) are loaded from there instead of the installed package, so
the lab runs an engine with a serving patch applied without changing its installation. Any other
sitecustomize on the path still runs."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_OVERLAY = os.environ.get("RCA_LAB_OVERLAY", "")


class _Overlay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        candidate = os.path.join(_OVERLAY, *name.split(".")) + ".py"
        return importlib.util.spec_from_file_location(name, candidate) if os.path.isfile(candidate) else None


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if _OVERLAY:
    sys.meta_path.insert(0, _Overlay())
_chain()
