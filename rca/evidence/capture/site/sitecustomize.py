"""rca's serving capture: records what an EAGLE-3 draft receives, inside a serving engine.

`rca capture -- <launch command>` puts this directory first on PYTHONPATH, so every Python process
of the engine (the server and its workers) runs this file at start-up. It changes nothing until
the engine imports a draft model module (a module under `sglang.srt.models` or
`vllm.model_executor.models` whose name holds `eagle`) or a vocabulary embedding. Then:

* every embedding call outside the draft's forward remembers its token ids (the target's input;
  a draft may share the target's embedding module, so calls are told apart by who is running);
* a forward pre-hook on the draft's `fc` (the layer that takes the concatenated hidden states)
  saves, for prefill-sized batches, that input split into slots of the target's hidden size,
  with the token ids of the target call of the same length, as `capture_r<rank>_<n>.safetensors`
  in RCA_CAPTURE_DIR (`hidden_states` [S, slots, H], `input_ids` [S]).

It stops after RCA_CAPTURE_REQUESTS captures per process and skips CUDA-graph capture. Only the
standard library is imported here; torch and safetensors are used once the engine has loaded them.
Any other sitecustomize on the path still runs.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_DIR = os.environ.get("RCA_CAPTURE_DIR", "")
_LIMIT = int(os.environ.get("RCA_CAPTURE_REQUESTS", "4") or 4)
_MIN_TOKENS = int(os.environ.get("RCA_CAPTURE_MIN_TOKENS", "8") or 8)
_ENGINES = ("sglang.srt.models.", "vllm.model_executor.models.")
_EMBEDDINGS = ("sglang.srt.layers.vocab_parallel_embedding", "vllm.model_executor.layers.vocab_parallel_embedding")
_state = {"saved": 0, "target_ids": None, "width": None, "draft_embeddings": set(), "in_draft": False}


def _rank():
    for name in ("RANK", "LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:
        return 0


def _remember_target_ids(module, args, output):
    if _state["in_draft"] or id(module) in _state["draft_embeddings"] or not args:
        return  # the draft's own embedding call (it may share the target's embedding module)
    ids = args[0]
    if getattr(ids, "dim", lambda: 0)() in (1, 2) and not ids.is_floating_point():
        _state["target_ids"] = ids.detach().reshape(-1)
        _state["width"] = output.shape[-1]


def _save_fc_input(module, args):
    if _state["saved"] >= _LIMIT or not args or not _DIR:
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    hidden, ids, width = args[0], _state["target_ids"], _state["width"]
    rows = hidden.shape[0] if hidden.dim() == 2 else hidden.shape[-2]
    if ids is None or width is None or rows < _MIN_TOKENS or ids.numel() != rows or hidden.shape[-1] % width:
        return
    from safetensors.torch import save_file

    tensors = {
        "hidden_states": hidden.detach().reshape(rows, hidden.shape[-1] // width, width).float().cpu().contiguous(),
        "input_ids": ids.to(torch.int64).cpu().contiguous(),
    }
    os.makedirs(_DIR, exist_ok=True)
    path = os.path.join(_DIR, f"capture_r{_rank()}_{_state['saved']}.safetensors")
    save_file(tensors, path, metadata={"writer": "rca capture", "draft": type(module).__qualname__})
    _state["saved"] += 1


def _entering_draft(module, args):
    _state["in_draft"] = True


def _leaving_draft(module, args, output):
    _state["in_draft"] = False


def _instrument_draft(cls):
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        children = dict(self.named_modules())
        fcs = [child for name, child in children.items() if name == "fc" or name.endswith(".fc")]
        if not fcs or getattr(self, "_rca_instrumented", False):
            return  # not a draft (a model merely named Eagle), or a subclass already done
        self._rca_instrumented = True
        _state["draft_embeddings"].update(id(child) for name, child in children.items() if "embed" in name)
        self.register_forward_pre_hook(_entering_draft)
        self.register_forward_hook(_leaving_draft)
        for fc in fcs:
            fc.register_forward_pre_hook(_save_fc_input)

    cls.__init__ = __init__


def _instrument_embedding(cls):
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.register_forward_hook(_remember_target_ids)

    cls.__init__ = __init__


def _instrument(module):
    name = module.__name__
    for value in list(vars(module).values()):
        if not isinstance(value, type) or value.__module__ != name or not hasattr(value, "named_modules"):
            continue
        if name in _EMBEDDINGS and value.__name__ == "VocabParallelEmbedding":
            _instrument_embedding(value)
        elif name.startswith(_ENGINES) and "eagle" in value.__name__.lower():
            _instrument_draft(value)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        try:
            _instrument(module)
        except Exception as error:
            sys.stderr.write(f"rca capture: could not instrument {module.__name__}: {error}\n")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        wanted = name in _EMBEDDINGS or (name.startswith(_ENGINES) and "eagle" in name.rsplit(".", 1)[-1])
        if not wanted:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def _chain():
    """Run the sitecustomize this one shadows, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if _DIR:
    sys.meta_path.insert(0, _Finder())
_chain()
