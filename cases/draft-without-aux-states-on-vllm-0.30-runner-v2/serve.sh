#!/bin/sh
# Serve the target with its EAGLE-3 draft on Model Runner V2.
export VLLM_USE_V2_MODEL_RUNNER=1
vllm serve meta-llama/Llama-3.1-8B-Instruct \
  --speculative-config '{"method": "eagle3", "model": "draft", "num_speculative_tokens": 3}'
