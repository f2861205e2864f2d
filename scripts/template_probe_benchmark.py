"""Time the chat-template probe on a 1,000-file SpecForge dump directory, against reading the same files whole.

    python scripts/template_probe_benchmark.py [--files 1000] [--tokens 2048] [--hidden 1024]

Each file is a `.ckpt` as SpecForge writes it (`input_ids`, `loss_mask`, three slots of hidden
states concatenated, the last state), holding one ChatML conversation with a thinking block. The
probe decodes every file's token ids with a tiny tokenizer and checks each assistant turn's
opening and loss mask. The baseline is a plain `torch.load` of every file in this process (what a
reader that does not memory-map pays for the hidden states it never uses); the figure is the
probe's time, and its ratio to the baseline. The issue's budget is 10 s for 1,000 files.
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

from rca.evidence.probes import ProbeInputs, registered_probes  # noqa: E402
from rca.inputs.templates import served_template_use  # noqa: E402
from tests.dumpwriters import write_dumps  # noqa: E402
from tests.tinytokenizers import encode, write_tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per conversation (about)")
    parser.add_argument("--hidden", type=int, default=1024, help="the hidden size of the dumped states")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        target = write_tokenizer(root / "target")
        filler = "the draft reads this sentence again. " * max(1, args.tokens // 111)  # three fillers a turn
        turn = (
            f"<|im_start|>user\n{filler}<|im_end|>\n"
            f"<|im_start|>assistant\n<think>\n{filler}</think>\n\n{filler}<|im_end|>\n"
        )
        ids = torch.tensor(encode(target, turn))
        print(f"writing {args.files} files of {len(ids)} tokens, hidden size {args.hidden}...", file=sys.stderr)
        slots = [torch.zeros(len(ids), args.hidden, dtype=torch.bfloat16)] * 3
        for start in range(0, args.files, 100):  # in batches: the writer holds a batch's tensors
            batch = min(100, args.files - start)
            write_dumps(root / f"part{start}", "specforge-ckpt", [ids] * batch, [slots] * batch, [slots[0]] * batch)
        dumps = root / "dumps"
        dumps.mkdir()
        for index, file in enumerate(sorted(root.glob("part*/rows_*/data_*.ckpt"))):
            file.rename(dumps / f"data_{index}.ckpt")
        files = sorted(dumps.glob("*.ckpt"))
        size = sum(file.stat().st_size for file in files)
        started = time.perf_counter()
        for file in files:
            torch.load(file, weights_only=True)
        baseline = time.perf_counter() - started
        served = served_template_use(target, None, None)
        probe = registered_probes()["chat-template-tokens"]()
        started = time.perf_counter()
        seen = probe.run(ProbeInputs(dumps, target, served_template=served))
        took = time.perf_counter() - started
    print(f"{len(files)} files, {size / 2**20:,.0f} MiB, {len(ids) * len(files):,} tokens")
    print(f"baseline (torch.load of every file): {baseline:.2f} s")
    print(f"chat-template probe: {took:.2f} s ({took / baseline:.2f}x the baseline): {seen.summary}")


if __name__ == "__main__":
    main()
