"""The output contract (design.md L1, L2): the four outputs, their columns and the columns' types
(the column names themselves are `engine.columns`').

One home for what a reader of the lake relies on: classification names rows' outputs with these
names, the load writes exactly these columns in these types, and the Dagster layer shows them as
the assets' column schemas (`orchestration/assets.py` only converts them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from dedup_pipeline.config import DatasetConfig

if TYPE_CHECKING:  # the module is read by explain, which runs no Spark
    from pyspark.sql import DataFrame
from dedup_pipeline.engine.core.columns import (
    EXPIRY_POINT,
    FIRST,
    KIND,
    OUT,
    PARTITION,
    RAW,
    REASON,
    SOURCE_FILE,
)

UNIQUE, DUPLICATES, EXPIRED, REJECTED = "unique", "duplicates", "expired", "rejected"
OUTPUTS = (UNIQUE, DUPLICATES, EXPIRED, REJECTED)

NATURAL, CONFLICT = "natural", "conflict"

# A column type as the outputs' Parquet files hold it (Spark writes TIMESTAMP_MICROS, UTC-adjusted)
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32()}


def partition(name: str, tag: str) -> tuple[str, str]:
    """Path parts of output `name`'s partition of load `tag`, below the dataset's output root."""
    return name, f"{PARTITION}{tag}"


def expiry_point_type(ds: DatasetConfig) -> str:
    """The type of `_expiry_point`: the expiry column's own (a category is its name: string)."""
    kind = ds.expiry_type
    return "string" if kind is None or kind == "category" else kind


def columns(ds: DatasetConfig, name: str) -> list[tuple[str, str]]:
    """(column, type) of output `name`, in order; types as the config declares them."""
    src = list(ds.source.schema.items())
    return {
        UNIQUE: [*src, (SOURCE_FILE, "string")],
        DUPLICATES: [*src, (SOURCE_FILE, "string"), (KIND, "string"), (FIRST, "string")],
        EXPIRED: [*src, (SOURCE_FILE, "string"), (EXPIRY_POINT, expiry_point_type(ds))],
        REJECTED: [(SOURCE_FILE, "string"), (REASON, "string"), (RAW, "string")],
    }[name]


def column_names(ds: DatasetConfig, name: str) -> list[str]:
    return [c for c, _ in columns(ds, name)]


def select_output(classified: DataFrame, ds: DatasetConfig, name: str) -> DataFrame:
    """The rows of output `name` from a classified batch, in exactly the contract's columns.

    A column the classification has not produced (`_expiry_point` when nothing could expire) is
    null of its type, so every partition of an output has one schema.
    """
    cols = []
    for c, typ in columns(ds, name):  # SQL text: the declared type names are Spark SQL's
        q = "`" + c.replace("`", "``") + "`"
        if c not in classified.columns:
            cols.append(f"CAST(NULL AS {typ}) AS {q}")
        else:
            cols.append(f"CAST({q} AS {typ}) AS {q}" if c == EXPIRY_POINT else q)
    return classified.filter(f"{OUT} = '{name}'").selectExpr(*cols)


# Parquet bloom filters on the key columns of unique, duplicates and expired (design.md L2a;
# rejected has no typed key): `explain`'s point lookup skips every row group whose filter rules
# its key out, where min/max statistics of an unsorted key column rule out almost nothing. Sized
# for the batch's rows at a 1% false-positive rate (parquet-mr's default NDV of 1e6 would write
# ~1 MB per column per file). Cost and footprint: docs/notes.md, "Explain locates a key".
BLOOM_FILTERS = True
BLOOM_FPP = 0.01


def write_options(ds: DatasetConfig, name: str, rows: int) -> dict[str, str]:
    """Parquet writer options of output `name` for a batch of `rows` rows."""
    if not BLOOM_FILTERS or name == REJECTED:
        return {}
    ndv = str(max(1_000, rows))
    opts = {}
    for k in ds.key:
        opts[f"parquet.bloom.filter.enabled#{k}"] = "true"
        opts[f"parquet.bloom.filter.expected.ndv#{k}"] = ndv
        opts[f"parquet.bloom.filter.fpp#{k}"] = str(BLOOM_FPP)
    return opts

