"""Serving capture (codes `RCA-S1xx`): how the engine that serves the draft captures the target's
hidden states and hands them to it: where it reads the layer ids, which layers it captures and at
which point of the layer, how it orders and concatenates them, and what gates the capture.
Each reads the serving side (the capture site also the training side's own capture code)."""
