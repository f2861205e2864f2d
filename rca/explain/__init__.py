"""Explanation: hypotheses scored as posteriors from the findings and probe evidence, fixes checked by
running the serving analysis again, and the verdict."""
