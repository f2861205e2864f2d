"""rca: why an EAGLE-3 draft accepts so few tokens when served, and where in the code the cause is.

The packages follow the path data takes through a diagnosis:

* `inputs`: what the user names (source trees, patches, configs, launch settings, dumps, checkpoints);
* `static`: reading the code without running it (code index, symbolic evaluator, analyzers'
  engine, dataflow graph) into each side's wiring;
* `evidence`: tensors (dump probes, the reference model, acceptance, serving captures) and the
  agent that chooses which probe to run;
* `explain`: hypotheses scored against the evidence, the fix checked by re-analysis, the verdict;
* `report`: text, JSON, Markdown and SARIF renderings of a diagnosis or a change;
* `history`: git revisions, `rca diff` and `rca history`;
* `cases`: diagnoses kept on disk (case directories, remembered results);
* `cli`: the command line.

`model` holds the data model every stage shares, `errors` the domain errors and exit codes, and
`diagnose` runs the stages in order.
"""
