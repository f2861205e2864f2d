"""Time the fingerprint probe on 1k dump tokens against a random Llama, and the embedding probe's reads.

    python scripts/fingerprint_benchmark.py [--layers 32] [--hidden 4096] [--tokens 1024] [--device auto]

The target is built in memory from a config (random seeded weights; bf16 on a GPU, float32 on a
CPU), its taps h3, h16 and h29 (scaled to --layers) are dumped as safetensors, and the probe
names them back. The baseline is one bare pass of the same model's decoder on the same tokens in
this process (the compute floor: the probe runs the decoder, not the lm_head); the figure is the
probe's time as a ratio to it (the cost of the hooks, the copies and the cosine matching over every
tap). The defaults are the budget's model (32 layers, 4096 wide: under 10 s on one GPU); on a CPU a
32-layer, 4096-wide model needs about 30 GB and minutes per pass, so pass smaller sizes there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from rca.analyzers.probes.fingerprint import Fingerprint  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from rca.evidence.reference import ReferenceModel, resolve_device  # noqa: E402
from rca.inputs.dumps import open_dumps  # noqa: E402


def timed(job, repeats: int) -> float:
    """The median wall time of `job` over `repeats` runs, after one warm-up run."""
    job()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        job()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 2.6875) // 64 * 64,
        num_hidden_layers=args.layers,
        num_attention_heads=max(args.hidden // 128, 1),
        num_key_value_heads=max(args.hidden // 512, 1),
        max_position_embeddings=max(4096, args.tokens),
    )
    start = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    build = time.perf_counter() - start
    reference = ReferenceModel(model, device, args.layers, f"random Llama {args.layers}x{args.hidden}")
    ids = torch.randint(0, config.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(1))
    wanted = [f"h{round(args.layers * share)}" for share in (0.1, 0.5, 0.9)]
    with torch.inference_mode():
        states = model(ids[None].to(device), output_hidden_states=True).hidden_states
    with tempfile.TemporaryDirectory() as scratch:
        stacked = torch.stack([states[int(tap[1:])][0].float().cpu() for tap in wanted], dim=1).contiguous()
        save_file({"hidden_states": stacked, "input_ids": ids}, Path(scratch) / "sample_0.safetensors")
        dumps = open_dumps(Path(scratch))
        probe = Fingerprint()

        def forward() -> None:
            with torch.inference_mode():
                model.get_decoder()(input_ids=ids[None].to(device), use_cache=False)

        observation = probe.observe(reference, dumps, args.tokens)
        baseline = timed(forward, args.repeats)
        fingerprint = timed(lambda: probe.observe(reference, dumps, args.tokens), args.repeats)
    named = list(observation.value)  # type: ignore[arg-type]
    margin = min(slot["margin"] for slot in observation.data["slots"])
    print(
        f"model: {reference.label}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, {dtype} "
        f"on {device}"
        f"{' (' + torch.cuda.get_device_name() + ')' if device.startswith('cuda') else ''}; built in {build:.1f} s "
        f"(not timed below)"
    )
    print(
        f"dumped {wanted}, fingerprint named {named} ({'right' if named == wanted else 'WRONG'}), smallest "
        f"margin {margin:.4f}"
    )
    print(f"bare decoder pass of {args.tokens} tokens: {baseline:.3f} s")
    print(
        f"fingerprint of {args.tokens} tokens:      {fingerprint:.3f} s  ({fingerprint / baseline:.2f}x the bare "
        f"pass, median of {args.repeats})"
    )


if __name__ == "__main__":
    main()
