"""The persisted key index, the "HashSet index" (design.md R2, R4, R6, R7, R12, N1).

One entry per unique row: the 128-bit digest (`_h1`, `_h2`), the load that wrote it
(`_load_hour`), and when configured the expiry value `_v`, the fingerprint hash `_fp` and the key
values themselves (`index.store_keys`). Entries live in ``{output}/index/slice=<n>/load_hour=<H>/``
(per load) and ``slice=<n>/compact=<first>_<last>/`` (merged loads). With expiry, slice n holds
the entries with floor(v / slice_span) = n, so a load reads only slices at or after its expiry
point X_H; without expiry, slice n is the hash bucket pmod(_h1, buckets). A load reads only files
of loads that are committed and earlier than itself, so a rerun of H never sees its own or later
entries; it stages its entries and moves them in place before its commit record, and a retry first
deletes whatever that load left (R10).

One owner per job, as Apex Malhar's dedup operator splits deciding, holding and persisting
(Deduper / BucketManager / BucketStore); the decision itself is `engine.classify`'s:

- `layout`      the path grammar: every directory and file name of the index, built and parsed;
                `IndexFile` (a file as a record lists it, `commits.IndexFileEntry`, and where it
                lies), `INDEX_FORMAT`
- `live`        which entries a load reads: `min_slice`, `live_files`, `EarlierLoads`;
                retention
                (`check_retention`, `apply_retention`, `IndexRetentionError`)
- `store`       the entries as data: `slice_of`, `entry_schema`, `match_columns`, `read_live`,
                `stage_entries`, `publish_entries`, `clear_load`
- `compaction`  merging a slice's per-load directories: `compact`, `remove_load`,
                (`list_compacted`, `covered` and the manifest live in `layout`)
- `health`      damage and the manifests that detect it: `check_index`, `IndexDamage`,
                `content_damage`, `scrub`, the damaged marker (`record_damage`),
                `index_file_manifest`, `index_read_failure`, `IndexDamagedError`; it reads the
                records through `engine.commit_log` (`CommitLog.to_check`), whose summary keeps
                a check O(live)

Repair is `rebuild`'s job: `rebuild_index` from unique, and a load's gate that fails or
rebuilds on damage (`ensure_healthy`, `ensure_intact`), which needs both health and the rebuild.
"""

from dedup_pipeline.engine.core.index.health import (
    IndexDamage,
    IndexDamagedError,
    check_index,
    damaged_message,
    index_read_failure,
    record_damage,
)
from dedup_pipeline.engine.core.index.rebuild import ensure_healthy, forget_attempt

# what the load asks of the index as a whole: its health, and an hour's earlier attempt gone
__all__ = ["IndexDamage", "IndexDamagedError", "check_index", "damaged_message", "ensure_healthy",
           "forget_attempt", "index_read_failure", "record_damage"]
