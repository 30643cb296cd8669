"""The load path: read the hour's landing files, classify against the index, write the outputs
and the index, commit (design.md L1-L3, R8-R11). It imports no wing: the Delta tables, the
contract and the upkeep steps reach it only through `Wings` (engine/load.py assembles them)."""
