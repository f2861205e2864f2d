"""The library: models of what analyzed code uses, each saying what an operation does to abstract
values. Python built-ins and containers (`builtins`), HF-style configs (`configs`), tensors with
torch and transformers calls (`tensors`), the target's decoder layers and capture hooks
(`layers`), launch settings (`settings`), and calls of functions the analyzed files do not
define (`calls`). They reach the evaluator only through `interface.Interpreter`."""
