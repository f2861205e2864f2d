"""The target model as a reference: run it on a dump's tokens and read every tap.

Taps are read with hooks on the decoder itself rather than from `output_hidden_states`, whose
last entry transformers replaces with the post-norm state: `h0` is what enters decoder layer 0,
`hJ` what decoder layer J-1 returns (the residual stream before the final norm), `hN+norm` what
the final norm returns. Loading uses transformers' own classes only (never a checkpoint's remote
code), from a local directory.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rca.errors import RcaError, brief
from rca.inputs.configs import TargetConfig, display_path, load_config
from rca.inputs.files import readable

if TYPE_CHECKING:
    import torch


class ProbeUnavailable(RcaError):
    """A probe cannot run here (no torch, no weights, an architecture transformers lacks); the
    diagnosis goes on without its evidence and says what is missing."""


def require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ProbeUnavailable("probes need torch", fix="pip install 'rca[probes]'") from None
    return torch


def resolve_device(device: str) -> str:
    """`auto` is the GPU when there is one, else the CPU; `cuda` without a GPU is an error."""
    torch = require_torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ProbeUnavailable("--device cuda, but torch sees no GPU", fix="pass --device cpu or auto")
    if device != "cpu" and not device.startswith("cuda"):
        raise ProbeUnavailable(f"unknown device {device!r}", fix="pass --device auto, cpu or cuda")
    return device


@dataclass
class ReferenceModel:
    model: Any
    device: str
    num_layers: int
    label: str

    @classmethod
    def load(cls, directory: Path, device: str = "auto", base: Path | None = None) -> ReferenceModel:
        torch = require_torch()
        device = resolve_device(device)
        shown = display_path(directory, base)
        try:
            import transformers
        except ImportError:
            raise ProbeUnavailable(
                "the fingerprint probe needs transformers", fix="pip install 'rca[probes]'"
            ) from None
        transformers.utils.logging.set_verbosity_error()  # rca reports its own progress
        transformers.utils.logging.disable_progress_bar()
        weights = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
        if not weights:
            raise ProbeUnavailable(
                "the target has no safetensors weights",
                where=shown,
                fix="pass --target DIR with the model's config.json and *.safetensors",
            )
        layers = TargetConfig(load_config("target", directory, base)).num_layers  # 1 to MAX_LAYERS, or refused
        for file in weights:
            readable(file, "a safetensors shard", "pass the directory the complete checkpoint was downloaded to")
        try:
            config = transformers.AutoConfig.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
        except (ValueError, KeyError, OSError) as error:
            raise ProbeUnavailable(
                f"transformers cannot build this architecture without the checkpoint's own code ({brief(error)})",
                where=shown,
                fix="run the probe on a transformers-native architecture of the same family, or compare a serving "
                "capture instead (rca probe compare)",
            ) from None
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        several = (
            device == "cuda" and torch.cuda.device_count() > 1 and importlib.util.find_spec("accelerate") is not None
        )  # device_map needs accelerate
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                directory,
                config=config,
                dtype=dtype,
                trust_remote_code=False,
                local_files_only=True,
                **({"device_map": "auto"} if several else {}),
            )
        except Exception as error:  # a checkpoint fails to load in many ways; each is the input's fault
            raise ProbeUnavailable(
                f"the target's weights do not load ({brief(error)})",
                where=shown,
                fix="pass the directory the complete checkpoint was downloaded to",
            ) from None
        if not several:
            model = model.to(device)  # type: ignore[arg-type]  # a device name, as transformers takes it
        model.eval()
        return cls(model, device, layers, f"{type(model).__name__} ({shown})")

    def greedy(self, final: torch.Tensor) -> torch.Tensor:
        """The target's greedy next token at each position, from its post-norm state (`hN+norm`)."""
        torch = require_torch()
        head = self.model.get_output_embeddings()
        with torch.inference_mode():
            return head(final.to(head.weight.device, head.weight.dtype)).argmax(-1).cpu()

    def taps(self, token_ids: torch.Tensor, on_device: bool = False, source: str = "") -> dict[str, torch.Tensor]:
        """Every tap for one sequence ([S] ids): h0..hN and hN+norm, float32 [S, H], on the CPU
        (or, `on_device`, where the model ran, so that matching need not copy them back).
        `source` names where the ids come from, for the error when the target has no such token."""
        torch = require_torch()
        vocabulary = self.model.get_input_embeddings().num_embeddings
        if len(token_ids) and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocabulary):
            outside = int(token_ids.min()) if int(token_ids.min()) < 0 else int(token_ids.max())
            raise ProbeUnavailable(
                f"token id {outside} is outside the target's vocabulary ({vocabulary} tokens)",
                where=source or self.label,
                fix="pass the target the dumps were generated with",
            )
        decoder = self.model.get_decoder()
        found: dict[str, Any] = {}  # tensors

        def keep(name: str, value: Any) -> None:
            tensor = (value[0] if isinstance(value, (tuple, list)) else value).detach()[0].float()
            found[name] = tensor if on_device else tensor.cpu()

        def layer_input(module: Any, args: tuple, kwargs: dict) -> None:
            keep("h0", args[0] if args else kwargs["hidden_states"])

        handles = [decoder.layers[0].register_forward_pre_hook(layer_input, with_kwargs=True)]
        for index, layer in enumerate(decoder.layers):
            handles.append(
                layer.register_forward_hook(lambda module, args, output, name=f"h{index + 1}": keep(name, output))
            )
        handles.append(
            decoder.norm.register_forward_hook(lambda module, args, output: keep(f"h{self.num_layers}+norm", output))
        )
        try:
            with torch.inference_mode():
                decoder(input_ids=token_ids.reshape(1, -1).to(self.model.device), use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        return found
