python -m sglang.launch_server --model-path Qwen/Qwen3-8B \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path ./draft
