"""The symbolic evaluator: Python read over abstract values, never executed.

Public interface: `Evaluator` (interp.py) with its entry points (`call`, `run_to`,
`run_to_call`, `condition_at`, `evaluate`, `run_script`, `field`, `trace`), the abstract values
(values.py), the scoped trace of what an evaluation did (trace.py), and the policy that decides
what the code cannot (policy.py).
"""
