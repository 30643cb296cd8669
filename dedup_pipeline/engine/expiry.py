"""The expiry rule (SPEC R6): latest point L_H, expiry point X_H = L_H - period, v < X_H expires.

v is the record's expiry value in numeric form (see `parse.expiry_value`): microseconds for
timestamps, days for dates, the number itself for ordered keys, the position for categories.
- basis `event`:      L_H = max v over all non-rejected records of loads <= H (a running max kept
                      in the commit record of each load, so a rerun sees the same L_{H-1});
- basis `processing`: L_H = end of hour H, from the partition key, never the wall clock.
A record with v = X_H is kept. Without expiry nothing expires (X_H is None).
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.hours import HOUR, epoch_micros

Number = int | float


def _num(x: Number) -> Number:
    """Keep whole numbers as ints so JSON commit records and comparisons stay exact."""
    return int(x) if float(x).is_integer() else float(x)


def latest_point(
    ds: DatasetConfig, hour: datetime, previous: Number | None, batch_max: Number | None
) -> Number | None:
    """L_H for load `hour`, given L_{H-1} (from the previous commit) and max v of this batch."""
    if ds.expiry is None:
        return None
    if ds.expiry.basis == "processing":
        return epoch_micros(hour + HOUR)
    candidates = [x for x in (previous, batch_max) if x is not None]
    return _num(max(candidates)) if candidates else None


def expiry_point(ds: DatasetConfig, latest: Number | None) -> Number | None:
    """X_H = L_H - period, or None when nothing can expire yet."""
    if ds.expiry is None or latest is None:
        return None
    return _num(latest - ds.expiry.period)


def expiry_point_literal(ds: DatasetConfig, x: Number | None) -> Column:
    """X_H in the expiry column's own type, for the expired output's `_expiry_point`."""
    kind = ds.expiry_type
    if x is None or kind is None:
        return F.lit(None).cast("string")
    if kind == "timestamp":
        return F.timestamp_micros(F.lit(int(x)))
    if kind == "date":
        return F.date_from_unix_date(F.lit(int(x)))
    if kind == "category":
        cats = ds.expiry.categories or ()  # type: ignore[union-attr]
        i = int(x)
        return F.lit(cats[i] if 0 <= i < len(cats) else None).cast("string")
    if kind == "long":
        return F.lit(int(x)).cast("long")
    return F.lit(float(x)).cast("double")


def is_expired(v: Column, x: Number | None) -> Column:
    return F.lit(False) if x is None else (v < F.lit(x))
