"""Read one landing hour into typed rows; anything that does not parse is rejected with a reason.

SPEC R1, R9. Untrusted input is read as text and cast with `try_cast` (Spark 4's ANSI mode would
otherwise raise on a bad value and stop the load). Every row keeps its origin
(`_source_file`, and `_blk`/`_rid`, which order rows exactly as they stand in the file, whatever
the file splitting) and its original text in `_raw`.

Reject reasons (short codes, in order of precedence):
  malformed           the line/row does not parse (bad JSON, not an object, wrong CSV field count)
  bad_value:<col>     a non-empty value that does not cast to the column's declared type
  null_key            a key column is null (missing, JSON null, or an empty CSV field)
  unknown_category    a categorical expiry value not in the declared categories
  bad_expiry_value    the expiry value is null or does not cast
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.storage import Storage

SPARK_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "timestamp": T.TimestampType(),
    "date": T.DateType(),
}
CORRUPT = "_corrupt_record"
V = "_v"
REASON = "_reject_reason"
META_COLS = ["_source_file", "_blk", "_rid", "_raw"]


@dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    mtime: float


def hour_dir(ds: DatasetConfig, hour: datetime) -> str:
    return f"{ds.source.path.rstrip('/')}/date={hour:%Y-%m-%d}/hour={hour:%H}"


def list_input_files(ds: DatasetConfig, hour: datetime) -> list[InputFile]:
    """The hour's data files (no markers, no hidden files); [] if the directory is absent.

    Paths are what Spark reads: plain on a local file system, full URIs (the source's own
    scheme and authority) elsewhere.
    """
    st = Storage(hour_dir(ds, hour))
    out = []
    for p in st.list_files(st.root):
        info = st.fs.info(p)
        out.append(InputFile(st.to_uri(p), int(info.get("size") or 0),
                             float(info.get("mtime") or 0.0)))
    return out


def _string_schema(ds: DatasetConfig) -> T.StructType:
    fields = [T.StructField(c, T.StringType()) for c in ds.source.schema]
    return T.StructType([*fields, T.StructField(CORRUPT, T.StringType())])


def _origin() -> list[Column]:
    return [
        F.col("_metadata.file_path").alias("_source_file"),
        F.col("_metadata.file_block_start").alias("_blk"),
        F.monotonically_increasing_id().alias("_rid"),
    ]


def _read_jsonl(spark: SparkSession, ds: DatasetConfig, paths: list[str]) -> DataFrame:
    txt = spark.read.text(paths).select(F.col("value").alias("_raw"), *_origin())
    txt = txt.filter(F.trim(F.col("_raw")) != "")  # blank lines are not records
    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    parsed = txt.withColumn("_j", F.from_json(F.col("_raw"), _string_schema(ds), opts))
    cols = [F.col(f"_j.{c}").alias(c) for c in ds.source.schema]
    malformed = F.col(f"_j.{CORRUPT}").isNotNull() | F.col("_j").isNull()
    return parsed.select(*cols, *META_COLS, malformed.alias("_malformed"))


def _read_csv(spark: SparkSession, ds: DatasetConfig, paths: list[str]) -> DataFrame:
    reader = (
        spark.read.schema(_string_schema(ds))
        .option("header", str(ds.source.csv_header).lower())
        .option("sep", ds.source.csv_delimiter)
        .option("escape", '"')  # RFC 4180: a quote inside a quoted field is doubled ("")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("enforceSchema", "true")
    )
    df = reader.csv(paths)
    names = list(ds.source.schema)
    as_text = F.to_csv(F.struct(*[F.col(c) for c in names]),
                       {"sep": ds.source.csv_delimiter, "escape": '"'})
    return df.select(
        *names,
        *_origin()[:3],
        F.coalesce(F.col(CORRUPT), as_text).alias("_raw"),
        F.col(CORRUPT).isNotNull().alias("_malformed"),
    )


def _read_parquet(spark: SparkSession, ds: DatasetConfig, paths: list[str]) -> DataFrame:
    df = spark.read.parquet(*paths)
    present = set(df.columns)
    cols = []
    for c in ds.source.schema:
        if c in present:
            # Keep the value; strings go through try_cast below like the text formats do.
            cols.append(F.col(c).cast("string").alias(c))
        else:
            cols.append(F.lit(None).cast("string").alias(c))
    raw = F.to_json(F.struct(*[F.col(c) for c in df.columns]))
    return df.select(
        *cols,
        F.col("_metadata.file_path").alias("_source_file"),
        F.lit(0).cast("long").alias("_blk"),
        F.col("_metadata.row_index").alias("_rid"),
        raw.alias("_raw"),
        F.lit(False).alias("_malformed"),
    )


def empty_batch(spark: SparkSession, ds: DatasetConfig) -> DataFrame:
    """A zero-row batch with the parsed schema (an hour with no input is a zero-row load)."""
    fields = [T.StructField(c, T.StringType()) for c in ds.source.schema]
    fields += [
        T.StructField("_source_file", T.StringType()),
        T.StructField("_blk", T.LongType()),
        T.StructField("_rid", T.LongType()),
        T.StructField("_raw", T.StringType()),
        T.StructField("_malformed", T.BooleanType()),
    ]
    return spark.createDataFrame([], T.StructType(fields))


def read_text_batch(spark: SparkSession, ds: DatasetConfig, paths: list[str]) -> DataFrame:
    """All columns still as text, plus origin and `_malformed`."""
    if not paths:
        return empty_batch(spark, ds)
    reader = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}[ds.source.format]
    return reader(spark, ds, paths)


def expiry_value(ds: DatasetConfig) -> Column:
    """The expiry value v (R6) as a number: micros, days, the number itself, or category position."""
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


def type_and_reject(raw: DataFrame, ds: DatasetConfig) -> DataFrame:
    """Cast text columns to declared types and decide `_reject_reason`; adds `_v` with expiry."""
    schema = ds.source.schema
    exp_col = ds.expiry.column if ds.expiry else None
    reason = F.when(F.col("_malformed"), F.lit("malformed"))
    casted: dict[str, Column] = {}
    for c, typ in schema.items():
        text = F.col(c)
        if typ == "string":
            casted[c] = text
            continue
        casted[c] = text.try_cast(SPARK_TYPES[typ])
        if c != exp_col:  # a bad expiry value has its own reason below
            failed = text.isNotNull() & (F.trim(text) != "") & casted[c].isNull()
            reason = reason.when(failed, F.lit(f"bad_value:{c}"))
    null_key: Column | None = None
    for k in ds.key:
        missing = casted[k].isNull()
        null_key = missing if null_key is None else (null_key | missing)
    assert null_key is not None
    reason = reason.when(null_key, F.lit("null_key"))
    df = raw.select(*[casted[c].alias(c) for c in schema], *META_COLS, reason.alias(REASON))
    if ds.expiry is not None:
        v = expiry_value(ds)
        exp_null = F.col(ds.expiry.column).isNull()
        if ds.expiry.categories is not None:
            exp_reason = (F.when(exp_null, F.lit("bad_expiry_value"))
                          .when(v < 0, F.lit("unknown_category")))
        elif ds.expiry_type == "double":
            exp_reason = F.when(exp_null | F.isnan(v), F.lit("bad_expiry_value"))
        else:
            exp_reason = F.when(exp_null, F.lit("bad_expiry_value"))
        df = df.withColumns({V: v, REASON: F.coalesce(F.col(REASON), exp_reason)})
    return df
