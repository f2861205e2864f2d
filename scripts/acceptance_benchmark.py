"""Time `rca probe acceptance` on a 64-sample dump of a toy Llama, against the target's own pass.

    python scripts/acceptance_benchmark.py [--samples 64] [--tokens 256] [--vocab 32000] [--steps 600]

The target is a random seeded Llama (8 layers, 64 wide, --vocab tokens: the vocabulary, not the
width, is what a surrogate head's training pays for), built from a config and saved; its taps h3,
h5 and h7 are dumped as speculators safetensors, and the probe trains its surrogate head and
measures [h3, h5, h7] against the founding case's [h0, h3, h5]. The baseline is what the probe
cannot avoid, run in this process: the target over every dump sample for its taps and greedy
tokens. The figure is the probe's wall time, and its ratio to that floor (the cost of training the
head and measuring each wiring).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from rca.evidence.acceptance import measure_acceptance  # noqa: E402
from rca.evidence.reference import ReferenceModel  # noqa: E402
from rca.inputs.dumps import open_dumps  # noqa: E402

LAYERS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(512, args.tokens),
        tie_word_embeddings=False,
        initializer_range=0.05,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, args.vocab, (args.tokens,), generator=generator) for _ in range(args.samples)]
    with tempfile.TemporaryDirectory() as scratch:
        target, dumps = Path(scratch) / "target", Path(scratch) / "dumps"
        model.save_pretrained(target, safe_serialization=True)
        dumps.mkdir()
        with torch.inference_mode():
            for index, ids in enumerate(prompts):
                states = model(ids[None], output_hidden_states=True).hidden_states
                captured = torch.stack([states[layer][0] for layer in (3, 5, 7, LAYERS)], dim=1).contiguous()
                save_file({"hidden_states": captured, "token_ids": ids}, dumps / f"hs_{index}.safetensors")

        reference = ReferenceModel.load(target, "cpu")
        start = time.perf_counter()
        for sample in open_dumps(dumps).samples(32768):
            reference.greedy(reference.taps(sample.token_ids)[f"h{LAYERS}+norm"])
        floor = time.perf_counter() - start

        start = time.perf_counter()
        report = measure_acceptance(dumps, target, [("h0", "h3", "h5")], device="cpu", steps=args.steps)
        probe = time.perf_counter() - start
    print(
        f"toy Llama {LAYERS}x64, vocabulary {args.vocab}; {args.samples} dump samples of {args.tokens} tokens; "
        f"{args.steps} head steps on {torch.get_num_threads()} CPU threads"
    )
    print(f"target over every sample (taps and greedy tokens): {floor:.2f} s")
    print(f"rca probe acceptance:                              {probe:.2f} s  ({probe / floor:.1f}x that floor)")
    print(report.summary)


if __name__ == "__main__":
    main()
