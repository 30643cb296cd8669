"""The Spark engine: pure PySpark (no Dagster import). One module per idea:

- `parse`     landing files of one hour -> typed rows + rejected rows with a reason (R1, R9)
- `digest`    canonical key encoding and its 128-bit digest; fingerprint hash (R2, R5)
- `expiry`    expiry value, latest point and expiry point (R6)
- `classify`  in-batch order and the cross-batch probe -> unique/duplicates/expired/rejected (R3-R5)
- `index`     the persisted key index (a package): layout, live set and retention, store,
              compaction, health (R4, R7, R12)
- `rebuild`   the index rebuilt from unique (R12)
- `commits`   commit records and the load order (R10, R11)
- `load`      one hourly load end to end, crash-safe (L3, R8, R10)
- `storage`   file operations through fsspec; atomic partition replace; the dataset lock
- `verify`    recheck conservation and uniqueness from the files alone (K4)
"""
