#!/bin/sh
# How the draft was trained: speculators 0.4.0's scripts/train.py with the flag that feeds the
# training-time-test loop the data's next token (teacher forcing).
torchrun --nnodes=1 --nproc_per_node=8 scripts/train.py \
    --verifier-name-or-path meta-llama/Llama-3.1-8B-Instruct \
    --data-path ./training_data \
    --save-path ./checkpoints \
    --epochs 10 \
    --lr 1e-4 \
    --ttt-steps 3 \
    --use-off-policy-tokens
