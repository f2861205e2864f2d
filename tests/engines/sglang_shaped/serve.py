"""A stand-in for a serving engine, in SGLang's shape: the target (loaded with transformers) runs a
prompt through a vocabulary-parallel embedding, the taps named by --taps are concatenated and fed
to the EAGLE-3 draft's fc, as the engine does after a prefill. With --ranks N it starts one worker
process per rank (as tensor parallelism does); --partial makes each rank feed its partial sum;
--share-embedding gives the draft the target's embedding module. With --batch, the prompt is served
as an engine batches it: beside another request's prefill and a third one's decode rows, each at
its own positions; --no-positions calls the draft without them."""

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
    rank = int(os.environ.get("RANK", "0"))
    requests = [ids]
    if args.batch:  # a decode request (4 rows at positions 30..33) first, the prompt, another prompt
        requests = [torch.arange(40) % decoder.embed_tokens.weight.shape[0], ids, ids.flip(0)[:12]]
    with torch.inference_mode():
        tokens, taps, positions = [], [], []
        for number, request in enumerate(requests):
            states = target(request[None], output_hidden_states=True).hidden_states
            rows = slice(30, 34) if args.batch and number == 0 else slice(0, len(request))
            request_taps = []
            for layer in args.taps:
                tap = states[layer][0]
                if args.partial and layer > 0:
                    share = 0.2 if rank == 0 else 0.8
                    tap = states[layer - 1][0] + share * (tap - states[layer - 1][0])
                request_taps.append(tap[rows])
            tokens.append(request[rows])
            taps.append(torch.cat(request_taps, dim=-1))
            positions.append(torch.arange(len(request))[rows])
        batch_ids = torch.cat(tokens)
        decoder.embed_tokens(batch_ids)  # the target's forward over the whole batch
        draft = LlamaForCausalLMEagle3(*decoder.embed_tokens.weight.shape, len(args.taps))
        if args.share_embedding:  # as engines do for a draft exported without its own embedding
            draft.model.embed_tokens = decoder.embed_tokens
        shifted = torch.cat([batch_ids[1:], batch_ids[:1]])
        if args.no_positions:
            draft.model(shifted, None, torch.cat(taps))
        else:
            draft(shifted, torch.cat(positions), torch.cat(taps))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--taps", type=int, nargs="+", required=True)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--partial", action="store_true")
    parser.add_argument("--share-embedding", action="store_true")
    parser.add_argument("--batch", action="store_true")
    parser.add_argument("--no-positions", action="store_true")
    args = parser.parse_args()
    if args.ranks == 1 or "RANK" in os.environ:
        worker(args)
        return
    children = [subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "RANK": str(rank)}) for rank in range(args.ranks)]
    sys.exit(max(child.wait() for child in children))


if __name__ == "__main__":
    main()
