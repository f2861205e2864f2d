"""A stand-in for a serving engine, in SGLang's shape: the target (loaded with transformers) runs a
prompt through a vocabulary-parallel embedding, the taps named by --taps are concatenated and fed
to the EAGLE-3 draft's fc, as the engine does after a prefill. With --ranks N it starts one worker
process per rank (as tensor parallelism does); --partial makes each rank feed its partial sum;
--share-embedding gives the draft the target's embedding module."""

import argparse
import json
import os
import subprocess
import sys

import torch
import transformers

from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3


def worker(args):
    target = transformers.AutoModelForCausalLM.from_pretrained(args.target).eval()
    decoder = target.get_decoder()
    embedding = VocabParallelEmbedding(*decoder.embed_tokens.weight.shape)
    embedding.weight = decoder.embed_tokens.weight
    decoder.embed_tokens = embedding
    ids = torch.tensor(json.loads(open(args.prompt).read()))
    with torch.inference_mode():
        states = target(ids[None], output_hidden_states=True).hidden_states
        rank = int(os.environ.get("RANK", "0"))
        taps = []
        for layer in args.taps:
            tap = states[layer][0]
            if args.partial and layer > 0:
                share = 0.2 if rank == 0 else 0.8
                tap = states[layer - 1][0] + share * (tap - states[layer - 1][0])
            taps.append(tap)
        draft = LlamaForCausalLMEagle3(*decoder.embed_tokens.weight.shape, len(taps))
        if args.share_embedding:  # as engines do for a draft exported without its own embedding
            draft.model.embed_tokens = decoder.embed_tokens
        draft(torch.cat([ids[1:], ids[:1]]), torch.cat(taps, dim=-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--taps", type=int, nargs="+", required=True)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--partial", action="store_true")
    parser.add_argument("--share-embedding", action="store_true")
    args = parser.parse_args()
    if args.ranks == 1 or "RANK" in os.environ:
        worker(args)
        return
    children = [subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "RANK": str(rank)}) for rank in range(args.ranks)]
    sys.exit(max(child.wait() for child in children))


if __name__ == "__main__":
    main()
