"""rca's serving capture: records what an EAGLE-3 draft receives, inside a serving engine.

`rca capture -- <launch command>` puts this directory first on PYTHONPATH, so every Python process
of the engine (the server and its workers) runs this file at start-up. It changes nothing until
the engine imports a draft model module (a module under `sglang.srt.models` or
`vllm.model_executor.models` whose name holds `eagle`) or a vocabulary embedding. Then:

* every embedding call outside the draft's forward remembers its token ids (the target's input;
  a draft may share the target's embedding module, so calls are told apart by who is running);
* the draft's forward remembers its positions (vLLM calls the draft's `fc` just before its
  forward, SGLang inside it: the fc input waits for the positions, or takes the current ones);
* a forward pre-hook on the draft's `fc` (the layer that takes the concatenated hidden states)
  takes that input, split into slots of the target's hidden size, with the target's token ids of
  the same batch. A batch holds several requests' prefills and decode rows; the positions cut it
  where they do not run on by one, and each run that starts at position 0 (a request's prompt
  from its start) of at least RCA_CAPTURE_MIN_TOKENS tokens is saved on its own, as
  `capture_r<rank>_<n>.safetensors` in RCA_CAPTURE_DIR (`hidden_states` [S, slots, H],
  `input_ids` [S]), so that replaying its tokens through the target reproduces it. Without
  positions (an engine that gives none) a batch is saved whole, as one sequence.

It stops after RCA_CAPTURE_REQUESTS captures per process and skips CUDA-graph capture. The hook
never changes what the engine computes and never raises into it: the wrappers keep the wrapped
`__init__`'s signature (engines inspect it), and any failure of its own is appended to
`hook-errors.log` in RCA_CAPTURE_DIR for `rca capture` to report, while the engine runs on. Only
the standard library is imported here; torch and safetensors are used once the engine has loaded
them. Any other sitecustomize on the path still runs.
"""

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import traceback
from typing import Any


def _setting(name, default):
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else default


_DIR = os.environ.get("RCA_CAPTURE_DIR", "")
_LIMIT = _setting("RCA_CAPTURE_REQUESTS", 4)
_MIN_TOKENS = _setting("RCA_CAPTURE_MIN_TOKENS", 8)
_ENGINES = ("sglang.srt.models.", "vllm.model_executor.models.")
_EMBEDDINGS = ("sglang.srt.layers.vocab_parallel_embedding", "vllm.model_executor.layers.vocab_parallel_embedding")
ERRORS = "hook-errors.log"
_state: dict[str, Any] = {
    "saved": 0,
    "target_ids": None,
    "width": None,
    "draft_embeddings": set(),
    "in_draft": False,
    "positions": None,  # the running draft forward's positions (SGLang calls fc inside it)
    "pending": None,  # an fc input waiting for the draft forward's positions (vLLM calls fc first)
}


def _guarded(where):
    """Run a hook body so that nothing it raises reaches the engine: record it instead."""

    def decorate(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except Exception as error:
                _record_failure(where, error)
                return None

        return run

    return decorate


def _record_failure(where, error):
    try:
        os.makedirs(_DIR, exist_ok=True)
        detail = "".join(traceback.format_exception(type(error), error, error.__traceback__)[-3:])
        with open(os.path.join(_DIR, ERRORS), "a", encoding="utf-8") as log:
            log.write(f"pid {os.getpid()} {where}: {type(error).__name__}: {error}\n")
            log.write("".join(f"    {line}\n" for line in detail.rstrip().splitlines()))
    except Exception:
        pass  # nowhere to record it: the engine still runs untouched


def _rank():
    for name in ("RANK", "LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:
        return 0


@_guarded("the embedding hook")
def _remember_target_ids(module, args, output):
    if _state["in_draft"] or id(module) in _state["draft_embeddings"] or not args:
        return  # the draft's own embedding call (it may share the target's embedding module)
    ids = args[0]
    if getattr(ids, "dim", lambda: 0)() in (1, 2) and not ids.is_floating_point():
        _flush()  # a new target batch: an fc input still waiting for positions gets none
        _state["target_ids"] = ids.detach().reshape(-1)
        _state["width"] = output.shape[-1]


def _positions_of(args, kwargs):
    """The positions a draft forward is called with (vLLM passes them by keyword, SGLang second)."""
    positions = kwargs.get("positions")
    if positions is None and len(args) > 1:
        positions = args[1]
    if positions is None or not hasattr(positions, "is_floating_point") or positions.is_floating_point():
        return None
    return positions[0] if positions.dim() == 2 else positions  # M-RoPE: [3, N], the first is the text's


@_guarded("the draft's forward hook")
def _entering_draft(module, args, kwargs):
    _state["in_draft"] = True
    positions = _positions_of(args, kwargs)
    _state["positions"] = positions
    if _state["pending"] is not None and positions is not None:
        pending, _state["pending"] = _state["pending"], None
        _save(*pending, positions)


@_guarded("the draft's forward hook")
def _leaving_draft(module, args, output):
    _state["in_draft"] = False
    _state["positions"] = None


def _fc_hook(draft_class):
    @_guarded("the fc hook")
    def save_fc_input(module, args):
        if _state["saved"] >= _LIMIT or not args or not _DIR:
            return
        import torch

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        hidden, ids, width = args[0], _state["target_ids"], _state["width"]
        if ids is None or width is None or hidden.shape[-1] % width:
            return
        rows = hidden.shape[0] if hidden.dim() == 2 else hidden.shape[-2]
        if ids.numel() < rows:
            return
        slots = hidden.detach().reshape(rows, hidden.shape[-1] // width, width)  # copied only where saved
        batch = (slots, ids[:rows], draft_class)
        if _state["in_draft"]:  # SGLang: fc inside the draft's forward, whose positions are known
            _save(*batch, _state["positions"])
        else:  # vLLM: fc before the draft's forward, which brings the positions
            _flush()
            _state["pending"] = batch

    return save_fc_input


def _flush():
    """An fc input whose draft forward never came (or gave no positions): saved whole."""
    if _state["pending"] is not None:
        pending, _state["pending"] = _state["pending"], None
        _save(*pending, None)


def _requests(positions, rows):
    """(start, end) of each run of positions that starts at 0 and goes on by one."""
    values = positions.reshape(-1)[:rows].tolist()
    runs, start = [], 0
    for index in range(1, len(values) + 1):
        if index == len(values) or values[index] != values[index - 1] + 1:
            if values[start] == 0:
                runs.append((start, index))
            start = index
    return runs


def _save(slots, ids, draft_class, positions):
    from safetensors.torch import save_file

    rows = slots.shape[0]
    if positions is not None and positions.numel() >= rows:
        runs, cut = _requests(positions, rows), "per request, from position 0"
    else:
        runs, cut = [(0, rows)], "the whole batch (no positions)"
    for start, end in runs:
        if _state["saved"] >= _LIMIT or end - start < _MIN_TOKENS:
            continue
        os.makedirs(_DIR, exist_ok=True)
        path = os.path.join(_DIR, f"capture_r{_rank()}_{_state['saved']}.safetensors")
        tensors = {
            "hidden_states": slots[start:end].float().cpu().contiguous(),
            "input_ids": ids[start:end].long().cpu().contiguous(),
        }
        metadata = {"writer": "rca capture", "draft": draft_class, "rows": f"{start}-{end} of {rows}", "cut": cut}
        save_file(tensors, path, metadata=metadata)
        _state["saved"] += 1


def _instrument_draft(cls):
    original = cls.__init__

    @functools.wraps(original)  # engines read the signature (vLLM looks for vllm_config and prefix)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _hook_draft(self)

    cls.__init__ = __init__


@_guarded("instrumenting the draft")
def _hook_draft(draft):
    children = dict(draft.named_modules())
    fcs = [child for name, child in children.items() if name == "fc" or name.endswith(".fc")]
    if not fcs or getattr(draft, "_rca_instrumented", False):
        return  # not a draft (a model merely named Eagle), or a subclass already done
    draft._rca_instrumented = True
    _state["draft_embeddings"].update(id(child) for name, child in children.items() if "embed" in name)
    draft.register_forward_pre_hook(_entering_draft, with_kwargs=True)
    draft.register_forward_hook(_leaving_draft)
    for fc in fcs:
        fc.register_forward_pre_hook(_fc_hook(type(draft).__name__))


def _instrument_embedding(cls):
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _hook_embedding(self)

    cls.__init__ = __init__


@_guarded("instrumenting the embedding")
def _hook_embedding(embedding):
    embedding.register_forward_hook(_remember_target_ids)


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
            _record_failure(f"instrumenting {module.__name__}", error)


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
    import atexit

    sys.meta_path.insert(0, _Finder())
    atexit.register(_guarded("saving at exit")(_flush))
_chain()
