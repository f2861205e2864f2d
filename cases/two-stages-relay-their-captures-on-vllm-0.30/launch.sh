vllm serve meta-llama/Llama-3.1-8B-Instruct \
  --speculative-config '{"method": "eagle3", "model": "draft", "num_speculative_tokens": 3}' \
  --pipeline-parallel-size 2
