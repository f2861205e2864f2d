"""Probes: tensor evidence (the target's forward pass against the training dumps, the draft's
checkpoint, a serving capture). A probe observes and weighs hypotheses; it reports no finding of
its own, so it carries a name but no code."""
