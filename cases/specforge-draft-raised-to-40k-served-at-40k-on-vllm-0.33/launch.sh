vllm serve Qwen/Qwen3-30B-A3B-Instruct-2507 \
  --speculative-config '{"method": "eagle3", "model": "draft", "num_speculative_tokens": 3}' \
  --max-model-len 40960
