"""Across the sides (codes `RCA-X1xx`): analyzers that establish one fact on each side and compare
the two once both are analyzed (`across`): the chat template, the positions the draft sees, the
embedding's scale, the final norm's use and which layer feeds the draft's later layers."""
