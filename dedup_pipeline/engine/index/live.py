"""Which entries a load reads: the slice of an entry, the live files, and retention (R6, R7).

With expiry, slice n holds the entries with floor(v / slice_span) = n (Apex's time buckets), so a
load reads only slices at or after its expiry point X_H; without expiry, slice n is the hash bucket
pmod(_h1, buckets). A load reads only files of loads that are committed and earlier than itself, so
a rerun of H never sees its own or later entries.

Retention (R7): slices wholly below X_{H - retention_lag} are deleted after load H. Reads filter on
v >= X_H anyway, so results never depend on it; the lag keeps reruns of recent hours possible.
"""

from __future__ import annotations

import math
from collections.abc import Container

from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.columns import H1, V
from dedup_pipeline.engine.index.layout import INDEX, RETENTION_STATE, IndexFile, slice_number
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.errors import UserError


class IndexRetentionError(UserError, RuntimeError):
    """A rerun needs index entries that retention already deleted; rebuild the index first."""

    stage = "index retention"
    fix = "see the error; rerun {hours} once the index is consistent"


def slice_of(ds: DatasetConfig) -> F.Column:
    """The slice an entry belongs to, as a column of the entries."""
    if ds.expiry is None:
        return F.pmod(F.col(H1), F.lit(ds.index.buckets))
    return F.floor(F.col(V) / F.lit(ds.slice_span)).cast("long")


def min_slice(ds: DatasetConfig, x: float | None) -> int | None:
    """The lowest slice that can hold entries with v >= X_H."""
    if ds.expiry is None or x is None:
        return None
    return math.floor(x / ds.slice_span)


class EarlierLoads:
    """Committed loads before `tag`, tested by membership: a load never walks every hour."""

    def __init__(self, committed: Container[str], tag: str):
        self.committed, self.tag = committed, tag

    def __contains__(self, t: object) -> bool:
        return isinstance(t, str) and t < self.tag and t in self.committed


def live_files(ds: DatasetConfig, files: dict[str, IndexFile], readable: Container[str],
               x: float | None) -> list[IndexFile]:
    """The index files a load may match: holding committed earlier loads, in slices >= slice(X_H).

    Taken from the commit records' and compacted directories' manifests (`health.check_index`),
    so a load lists no directory and opens no footer to know what it will read.
    """
    lo = min_slice(ds, x)
    return [f for f in files.values()
            if any(t in readable for t in f.holds) and (lo is None or f.slice >= lo)]


def kept_from(st: Storage) -> float | None:
    """What retention deleted below; None if nothing (or unreadable: the slices it deleted then
    show as missing files, so a damaged state file is index damage, repaired by a rebuild)."""
    try:
        state = st.read_json(st.path(INDEX, RETENTION_STATE))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    v = state.get("kept_from") if isinstance(state, dict) else None
    return v if isinstance(v, int | float) else None


def check_retention(st: Storage, ds: DatasetConfig, x: float | None) -> None:
    """Fail clearly if entries this load needs (v >= X_H) were already deleted by retention."""
    kept = kept_from(st)
    if kept is not None and (x is None or x < kept):
        raise IndexRetentionError(
            f"dataset {ds.name!r}: this load needs index entries with expiry value >= {x}, but "
            f"retention deleted everything below {kept}. Rebuild the index from unique "
            "(dedup-pipeline rebuild-index) or raise index.retention_lag_hours."
        )


def apply_retention(st: Storage, ds: DatasetConfig, floor_x: float | None) -> int:
    """Delete slices entirely below `floor_x` (= X of the hour retention_lag before); count them."""
    if ds.expiry is None or floor_x is None:
        return 0
    lo = min_slice(ds, floor_x)
    assert lo is not None
    deleted = 0
    for sdir in st.list_dirs(st.path(INDEX)):
        n = slice_number(sdir)
        if n is not None and n < lo:
            st.remove(st.path(INDEX, sdir))
            deleted += 1
    if deleted:
        st.write_json_atomic(st.path(INDEX, RETENTION_STATE), {"kept_from": lo * ds.slice_span})
    return deleted
