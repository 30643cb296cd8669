"""Sample data for demos, tests and benchmarks: the landing-zone generator (design.md K5).

Outside `engine/` because it is plain pyarrow and file writes, no Spark: generating benchmark data
must not compete with the engine it feeds, and the engine never needs it.
"""
