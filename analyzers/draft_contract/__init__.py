"""The draft's contract (codes `RCA-D1xx`): what serving gives the draft against what it learned in
training, beyond the hidden states: its fc width, vocabulary map, norms, architecture, head,
modules, quantization, attention window and what the target's states go through. Each reads the
serving side and names, in `compares`, the two facts it compares."""
