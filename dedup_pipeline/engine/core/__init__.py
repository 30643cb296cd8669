"""The load path: read the hour's landing files, classify against the index, write the outputs
and the index, commit (design.md L1-L3, R8-R11). It imports no wing: `engine/load.py` calls the
core's phases and the wings' steps (the Delta tables, the contract, the upkeep) in one ordered
function."""
