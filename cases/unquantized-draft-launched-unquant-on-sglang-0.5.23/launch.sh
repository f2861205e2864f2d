#!/bin/sh
# Llama-3.1-8B quantized with AWQ (its config's quantization_config), with its EAGLE-3 draft.
python -m sglang.launch_server \
  --model-path hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4 \
  --quantization awq \
  --speculative-algorithm EAGLE3 \
  --speculative-draft-model-path draft \
  --speculative-num-steps 3 \
  --speculative-eagle-topk 1 \
  --speculative-num-draft-tokens 4 \
  --speculative-draft-model-quantization unquant
