"""Diagnoses kept on disk: case directories (inputs, reports, evidence, transcript) and remembered results."""
