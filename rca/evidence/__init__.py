"""Tensor evidence: probes over dumps and checkpoints, the reference model, draft acceptance, serving
captures, and the agent that chooses which probe to run. torch is imported only when a probe runs."""
