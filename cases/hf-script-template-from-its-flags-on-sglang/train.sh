python train/train_eagle3.py --chat-template qwen3.jinja
