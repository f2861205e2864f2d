#!/bin/sh
# How the draft was trained: speculators 0.4.0's scripts/train.py with its defaults for the
# training-time-test loop (three steps, no --use-off-policy-tokens).
torchrun --nnodes=1 --nproc_per_node=8 scripts/train.py \
    --verifier-name-or-path meta-llama/Llama-3.1-8B-Instruct \
    --data-path ./training_data \
    --save-path ./checkpoints \
    --epochs 10 \
    --lr 1e-4 \
    --ttt-steps 3
