"""Decide (design.md R3-R7): the hour's expiry points L_H and X_H, the live index files of
committed loads before H (their content checked first), the candidates the batch can hit, and
every row's output, all counted in one pass. The decision itself is `classify`'s; this phase
gathers what it decides against (Apex Malhar's Deduper beside its BucketManager)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.batch import Batch, Persisted
from dedup_pipeline.engine.core.classify import candidates, classify
from dedup_pipeline.engine.core.columns import BLOCK, ROW
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.expiry import Number, expiry_point, expiry_point_frame, latest_point
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.index import layout, store
from dedup_pipeline.engine.core.index.health import IndexDamage, check_index
from dedup_pipeline.engine.core.index.layout import IndexFile
from dedup_pipeline.engine.core.index.live import EarlierLoads, check_retention, live_files
from dedup_pipeline.engine.core.index.rebuild import ensure_intact
from dedup_pipeline.engine.core.outputs import (
    CONFLICT,
    KIND,
    OUT,
    OUTPUTS,
)
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import HourSet


class Ready(Protocol):
    """The hour as `prepare` leaves it: what deciding reads."""

    hour: datetime
    tag: str
    st: Storage
    committed: HourSet  # committed loads, H excluded
    health: IndexDamage  # the index files the commit records list (healthy)
    log: CommitLog
    prev_latest: Number | None  # L_{H-1}
    batch: Batch


@dataclass(frozen=True)
class Classified:
    """The batch split into the four outputs (cached), and what the index probe read."""

    latest: Number | None
    x: Number | None
    live: list[IndexFile]
    index_rows_read: int
    index_bytes_read: int
    candidates: DataFrame | None  # cached: the unique_keys check reads it again
    frame: DataFrame  # cached: every batch row with `_out` set
    counts: dict[str, int]  # per output: unique, duplicates, expired, rejected (the record's fields)
    conflicts: int


def classify_batch(spark: SparkSession, ds: DatasetConfig, p: Ready, cache: Persisted,
                   say: Progress) -> Classified:
    """Expiry points, the live index (from the commit records' manifests), the candidates the
    batch can hit (cached: classify and the unique_keys check both use them), classification."""
    st = p.st
    latest = latest_point(ds, p.hour, p.prev_latest, p.batch.vmax)
    x = expiry_point(ds, latest)
    check_retention(st, ds, x)
    readable = EarlierLoads(p.committed, p.tag)
    live = live_files(ds, p.health.files, readable, x)
    # content: exactly the files the probe will read are hashed (one pass over what Spark reads)
    if ensure_intact(spark, ds, st, live, say, rerun=p.tag):
        fresh = check_index(st, ds)
        p.log.follow(fresh.state)
        live = live_files(ds, fresh.files, readable, x)
    idx_rows = sum(f.rows if f.rows is not None else st.parquet_rows(st.path(layout.INDEX, f.rel))
                   for f in live)
    xs = expiry_point_frame(spark, ds, x)
    cands = candidates(p.batch.frame, store.read_live(spark, ds, st, live, p.tag), ds, xs)
    if cands is not None:
        cands = cache.persist(cands)
    # only what the writers and the index need is cached (the row origin has done its job)
    frame = cache.persist(classify(p.batch.frame, cands, ds, p.tag, xs).drop(BLOCK, ROW))
    # one job builds the cache the five writes read (concurrent writes on an unbuilt cache would
    # each start building it) and counts every output on the way
    agg = frame.agg(*[F.count_if(F.col(OUT) == o).alias(o) for o in OUTPUTS],
                    F.count_if(F.col(KIND) == CONFLICT).alias("conflicts")).collect()[0]
    return Classified(latest, x, live, idx_rows, sum(f.size for f in live), cands, frame,
                      {o: int(agg[o]) for o in OUTPUTS}, int(agg["conflicts"]))
