"""Static analysis: the code index, the symbolic evaluator, the analyzers' engine, the dataflow graph
and the wiring each side resolves to. Nothing analyzed is imported or executed."""
