"""Training capture (codes `RCA-T1xx`): which of the target's hidden states the draft was trained
on: the trainer's capture (a worker, a hook, an HF `output_hidden_states` script, an engine or a
server that extracted them), how its dumps are read back, and what the draft learned to predict.
Each reads the training side only."""
