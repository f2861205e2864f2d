#!/bin/sh
# Kimi-K2.5 with its EAGLE-3 draft on 8 GPUs, with the FlashInfer all-reduce fusion on.
python -m sglang.launch_server \
  --model-path moonshotai/Kimi-K2.5 \
  --trust-remote-code \
  --tp 8 \
  --enable-flashinfer-allreduce-fusion \
  --speculative-algorithm EAGLE3 \
  --speculative-draft-model-path lightseekorg/kimi-k2.5-eagle3 \
  --speculative-num-steps 3 \
  --speculative-eagle-topk 1 \
  --speculative-num-draft-tokens 4
