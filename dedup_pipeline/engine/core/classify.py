"""Split one parsed batch into unique / duplicates / expired / rejected (design.md R3, R4, R5, R6).

In-batch (R3): records sharing a key are ordered by (order_by asc nulls last, expiry value,
`_source_file`, position in the file); the first is the candidate for unique.
Cross-batch (R4): the live index (entries of earlier committed loads with v >= X_H) is probed with
the reversed semi-join: ``index LEFT SEMI JOIN broadcast(batch digests)`` streams the index once and
never shuffles it, leaving only the entries the batch can hit; the batch is then joined with those
few candidates on the full digest. A hit makes every batch record of that key a duplicate of the
earlier load, whose hour becomes `_first_load_hour`.
Fingerprint (R5): a duplicate is 'natural' when its fingerprint equals the kept record's, else
'conflict'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.columns import (
    BLOCK,
    ENTRY_LOAD_HOUR,
    EXPIRY_POINT,
    FIRST,
    FP,
    H1,
    KIND,
    OUT,
    REASON,
    ROW,
    SOURCE_FILE,
    V,
)
from dedup_pipeline.engine.core.expiry import X_COL, expiry_point_column, is_expired, is_live
from dedup_pipeline.engine.core.index.store import match_columns
from dedup_pipeline.engine.core.outputs import (
    CONFLICT,
    DUPLICATES,
    EXPIRED,
    NATURAL,
    REJECTED,
    UNIQUE,
)

LOAD_HOUR_ALIAS = "_idx_load_hour"


def order_criteria(ds: DatasetConfig) -> list[str]:
    """The R3 order, its one home: the columns compared, first to last: order_by (earliest first,
    nulls last), the expiry value, the source file, the position in it."""
    return [*([ds.order_by] if ds.order_by else []), *([V] if ds.expiry is not None else []),
            SOURCE_FILE, BLOCK, ROW]


def batch_order(ds: DatasetConfig) -> list[Column]:
    """The R3 order as Spark sort expressions (a load's in-batch window)."""
    return [F.col(c).asc_nulls_last() if c == ds.order_by else F.col(c).asc()
            for c in order_criteria(ds)]


def order_key(ds: DatasetConfig, row: Mapping[str, Any]) -> tuple:
    """The R3 order for one row in plain Python (explain reads outputs without Spark): a sort key
    over `order_criteria`; a criterion the row lacks (an output row has no position) is skipped.
    Values are canonical (`_v` as `expiry.value_of` gives it)."""
    key: list[Any] = []
    for c in order_criteria(ds):
        if c not in row:
            continue
        val = row[c]
        if c == ds.order_by:
            key.append((val is None, val if val is not None else 0))  # nulls last
        else:
            key.append(val if val is not None else 0)
    return tuple(key)


def candidates(batch: DataFrame, index: DataFrame | None, ds: DatasetConfig,
               xs: DataFrame | None) -> DataFrame | None:
    """Live index entries whose `_h1` occurs among the batch's valid records (the reversed probe).

    `index` holds the entries of earlier loads in the slices that can be live; `xs` is X_H
    (`expiry.expiry_point_frame`, None without one): live means v >= X_H (R6).

    The batch's digests are broadcast and the index streams past them once, never shuffled. The
    result is small (at most one entry per batch key) and is used twice: to classify, and by the
    unique_keys check. At most one live entry per key exists: a key goes to unique again only once
    its earlier entry has expired (v < X), and X never decreases. So no de-duplication of the hits
    is needed; if the invariant were ever broken the join would double rows and the conservation
    check would stop the load.
    """
    if index is None:
        return None
    probe = F.broadcast(batch.filter(F.col(REASON).isNull()).select(H1))  # no distinct(): semi-join
    hits = index.join(probe, on=H1, how="left_semi")
    if xs is not None:  # after the semi-join: compared only where the batch can hit
        hits = hits.crossJoin(F.broadcast(xs)).filter(is_live(F.col(V), F.col(X_COL)))
    fp = F.col(FP) if ds.fingerprint else F.lit(None).cast("int")
    return hits.select(*match_columns(ds), F.col(ENTRY_LOAD_HOUR).alias(LOAD_HOUR_ALIAS),
                       fp.alias("_idx_fp"))


def classify(
    batch: DataFrame, cands: DataFrame | None, ds: DatasetConfig, tag: str, xs: DataFrame | None
) -> DataFrame:
    """Every batch row with `_out` set, plus `_duplicate_kind`, `_first_load_hour`, `_expiry_point`.

    `cands` are the index entries the batch can hit (`candidates`), None without an index; `xs`
    is X_H (`expiry.expiry_point_frame`), None when nothing can expire.
    """
    rejected = batch.filter(F.col(REASON).isNotNull()).withColumn(OUT, F.lit(REJECTED))
    valid = batch.filter(F.col(REASON).isNull())
    parts = [rejected]
    if xs is not None:
        with_x = valid.crossJoin(F.broadcast(xs))
        expired_flag = is_expired(F.col(V), F.col(X_COL))
        parts.append(with_x.filter(expired_flag).withColumns(
            {OUT: F.lit(EXPIRED), EXPIRY_POINT: expiry_point_column(ds, F.col(X_COL))}
        ).drop(X_COL))
        live = with_x.filter(~expired_flag).drop(X_COL)
    else:
        live = valid

    w = Window.partitionBy(*match_columns(ds)).orderBy(*batch_order(ds))
    ranks = {"_rn": F.row_number().over(w)}
    if ds.fingerprint:
        ranks["_first_fp"] = F.first(F.col(FP)).over(w)
    live = live.withColumns(ranks)
    if cands is not None:
        # the candidates are few (at most one per batch key): broadcast them, never shuffle the batch
        live = live.join(F.broadcast(cands), on=match_columns(ds), how="left")
        hit = F.col(LOAD_HOUR_ALIAS).isNotNull()
    else:
        live = live.withColumns({LOAD_HOUR_ALIAS: F.lit(None).cast("string"),
                                 "_idx_fp": F.lit(None).cast("int")})
        hit = F.lit(False)
    is_unique = ~hit & (F.col("_rn") == 1)
    if ds.fingerprint:
        kept_fp = F.when(hit, F.col("_idx_fp")).otherwise(F.col("_first_fp"))
        kind = F.when(F.col(FP) == kept_fp, F.lit(NATURAL)).otherwise(F.lit(CONFLICT))
    else:
        kind = F.lit(NATURAL)
    live = live.select(
        *[c for c in live.columns if c not in ("_rn", "_first_fp", "_idx_fp", LOAD_HOUR_ALIAS)],
        F.when(is_unique, F.lit(UNIQUE)).otherwise(F.lit(DUPLICATES)).alias(OUT),
        F.when(is_unique, F.lit(None)).otherwise(kind).alias(KIND),
        F.when(is_unique, F.lit(None))
        .otherwise(F.coalesce(F.col(LOAD_HOUR_ALIAS), F.lit(tag))).alias(FIRST),
    )
    parts.append(live)
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p, allowMissingColumns=True)
    return out
