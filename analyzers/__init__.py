"""The plugins: one static analyzer or tensor probe per module, each a class with a fixed contract
(`rca.static.analyzer.Analyzer`, `rca.evidence.probes.Probe`) carrying its own examples.

Nothing here is listed by hand: `rca.discovery` imports every module of this package and picks
out the concrete subclasses of each contract. Modules whose names start with `_` hold what the
plugins share (helpers, example fixtures) and define no plugin.
"""
