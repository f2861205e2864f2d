vllm serve meta-llama/Llama-3.1-8B-Instruct \
  --speculative-config '{"method": "eagle3", "model": "draft", "num_speculative_tokens": 3}' \
  --tensor-parallel-size 2
