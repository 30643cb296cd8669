"""The expiry rule (design.md R6), its one home: the expiry value v, latest point L_H, expiry point
X_H = L_H - period, and v < X_H expires.

v is the record's expiry value in numeric form (`expiry_value`): microseconds for timestamps, days
for dates, the number itself for ordered keys, the position for categories. Those units, the
period in them and the default index slice width are in `dedup_pipeline/units.py` (pure Python,
so the config can validate with them without importing pyspark); everything that needs Spark is here.
- basis `event`:      L_H = max v over all non-rejected records of loads <= H (a running max kept
                      in the commit record of each load, so a rerun sees the same L_{H-1});
- basis `processing`: L_H = end of hour H, from the partition key, never the wall clock.
A record with v = X_H is kept. Without expiry nothing expires (X_H is None).

Inside a load's queries X_H is data, not a literal: `expiry_point_frame` is a one-row relation that
the queries comparing rows with X_H broadcast-join. Spark inlines numeric literals into the code it
generates, so a literal X_H made every hour's classification and index probe new code: 8 classes
compiled and JIT-compiled again each hour (in a warm JVM, a new hour cost ~1 s more than a rerun of
the last one, and 2-3 more CPU-seconds of JIT). As data, the code is the same every hour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.columns import LOAD_HOUR_PARTITION
from dedup_pipeline.hours import HOUR, epoch_micros, parse_hour

Number = int | float


def _num(x: Number) -> Number:
    """Keep whole numbers as ints so JSON commit records and comparisons stay exact (an int stays
    itself: through a float, 2**63 - 1 would become 2**63)."""
    if isinstance(x, int):
        return x
    return int(x) if float(x).is_integer() else float(x)


# X_H below the smallest value v can hold expires nothing; clamped there, it still fits the
# column it is compared with (a long, or a date's int day number)
_FLOOR = {"long": -(2**63), "timestamp": -(2**63), "date": -(2**31)}


def expiry_value(ds: DatasetConfig) -> Column:
    """The expiry value v (R6) as a number: micros, days, the number itself, or category position.

    Parsing adds it to every typed row (`_v`); verify and rebuild recompute it from unique rows.
    """
    assert ds.expiry is not None
    col = F.col(ds.expiry.column)
    kind = ds.expiry_type
    if kind == "timestamp":
        return F.unix_micros(col)
    if kind == "date":
        return F.unix_date(col).cast("long")
    if kind == "category":
        cats = F.array(*[F.lit(c) for c in ds.expiry.categories or ()])
        return (F.array_position(cats, col) - 1).cast("long")
    return col  # long or double


def value_of(ds: DatasetConfig, value: Any) -> Number | None:
    """`expiry_value` for one value in plain Python (explain reads outputs without Spark), the
    value canonical (timestamps in micros, dates in days): a category's position (-1 when it is
    not listed, as Spark's `array_position` - 1 gives), else the value itself."""
    assert ds.expiry is not None
    if value is None:
        return None
    cats = ds.expiry.categories
    if ds.expiry_type == "category" and cats is not None:
        return cats.index(value) if value in cats else -1
    return value


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
    x = _num(_num(latest) - _num(ds.expiry_period))  # exact for whole numbers
    floor = _FLOOR.get(ds.expiry_type or "")
    return x if floor is None or x >= floor else floor


X_COL = "_x"  # the column of `expiry_point_frame`


def expiry_point_frame(spark: SparkSession, ds: DatasetConfig, x: Number | None
                       ) -> DataFrame | None:
    """X_H as a one-row relation (column `_x`, in the type of the expiry value v); None when
    nothing can expire. Join it with `F.broadcast` where rows are compared with X_H."""
    if ds.expiry is None or x is None:
        return None
    if ds.expiry_type == "double":
        return spark.createDataFrame([(float(x),)], f"{X_COL} double")
    return spark.createDataFrame([(int(x),)], f"{X_COL} long")


def expiry_point_column(ds: DatasetConfig, x: Column) -> Column:
    """X_H (a column of `expiry_point_frame`) in the expiry column's own type, for the expired
    output's `_expiry_point`."""
    kind = ds.expiry_type
    if kind == "timestamp":
        return F.timestamp_micros(x)
    if kind == "date":
        return F.date_from_unix_date(x.cast("int"))
    if kind == "category":
        cats = ds.expiry.categories or ()  # type: ignore[union-attr]
        known = (x >= 0) & (x < len(cats))
        return F.when(known, F.element_at(F.array(*[F.lit(c) for c in cats]),
                                          (x + 1).cast("int")))
    if kind == "long":
        return x.cast("long")
    return x.cast("double")


def is_live(v: Column, x: Column | Number | None) -> Column:
    """v >= X_H (R6): a row or index entry not behind the expiry point. X_H None (or a null X_H
    column: nothing can expire yet at that load) keeps everything live."""
    if x is None:
        return F.lit(True)
    xc = x if isinstance(x, Column) else F.lit(x)
    return xc.isNull() | (v >= xc)


def live_value(v: Number | None, x: Number | None) -> bool:
    """`is_live` for one value in plain Python (explain reads entries without Spark): nothing is
    behind a missing X_H; a null v is behind any X_H."""
    return x is None or (v is not None and v >= x)


def is_expired(v: Column, x: Column | Number | None) -> Column:
    """v < X_H; X_H as a column (of `expiry_point_frame`) or a number (the benchmark's peers)."""
    if x is None:
        return F.lit(False)
    return v < (x if isinstance(x, Column) else F.lit(x))


def hour_maxima(ds: DatasetConfig, frames: Iterable[DataFrame | None], hour_col: str
                ) -> dict[str, Number]:
    """The largest expiry value v of each load hour over `frames` (outputs with the expiry column
    and `hour_col`): what L_H is re-derived from (verify, migrate)."""
    maxima: dict[str, Number] = {}
    for df in frames:
        if df is None:
            continue
        for row in df.groupBy(hour_col).agg(F.max(expiry_value(ds)).alias("m")).collect():
            if row["m"] is not None:
                cur = maxima.get(row[hour_col])
                maxima[row[hour_col]] = row["m"] if cur is None else max(cur, row["m"])
    return maxima


def expiry_points(ds: DatasetConfig, frames: Iterable[DataFrame | None], committed: list[str],
                  ds_of: Callable[[str], DatasetConfig] | None = None) -> dict[str, Number | None]:
    """X_H of every committed hour (`committed`, in order), re-derived from the outputs `frames`
    (unique, duplicates, expired: the non-rejected rows); `ds_of(tag)`: the terms hour `tag` was
    loaded under (default `ds`). What verify and migrate check and migrate against."""
    maxima = hour_maxima(ds, frames, LOAD_HOUR_PARTITION)
    out: dict[str, Number | None] = {}
    latest = None
    for tag in committed:
        d = ds_of(tag) if ds_of is not None else ds
        latest = latest_point(d, parse_hour(tag), latest, maxima.get(tag))
        out[tag] = expiry_point(d, latest)
    return out
