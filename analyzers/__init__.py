"""The plugins: static analyzers and tensor probes, one class per module (or per package, for one
with helpers of its own), in family packages: `serving_capture/`, `training_capture/`,
`draft_contract/`, `across/` and `probes/`. Each is written against `rca.sdk` alone and carries
its own examples.

Nothing here is listed by hand: `rca.discovery` walks these packages and picks out the concrete
subclasses of each contract. docs/adding-an-analyzer.md adds one.
"""
