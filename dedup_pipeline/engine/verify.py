"""Recheck a dataset from its files alone, trusting neither the index nor the counts (SPEC K4).

- Conservation (R8): for every committed hour, the records in its landing files (counted afresh)
  equal unique + duplicates + expired + rejected rows of that hour.
- Uniqueness (R4, R6): no key has two unique rows unless the earlier one had expired by the later
  one's load; X_H is recomputed from the outputs (running max of the expiry value over non-rejected
  rows), not read from commit records. Without expiry, no key is in unique twice.
- Completeness: every committed hour has all four output partitions; output partitions of hours
  that are not committed (an interrupted load) are reported as warnings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import commits
from dedup_pipeline.engine.classify import DUPLICATES, EXPIRED, OUTPUTS, UNIQUE
from dedup_pipeline.engine.expiry import expiry_point, latest_point
from dedup_pipeline.engine.parse import (
    V,
    expiry_value,
    failed_file,
    list_input_files,
    plan_batch,
    read_text_batch,
)
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import parse_key, to_key


@dataclass
class VerifyReport:
    dataset: str
    hours_checked: int = 0
    rows_in: int = 0
    rows_out: int = 0
    violations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bad_hours: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.violations


def _landing_count(spark: SparkSession, ds: DatasetConfig, tag: str) -> int:
    """Records in the hour's landing files, listed and read exactly as the load reads them.

    An unreadable file counts as the one `rejected` row the load makes of it (R8).
    """
    plan = plan_batch(ds, list_input_files(ds, parse_key(tag)))
    while True:
        try:
            return read_text_batch(spark, ds, plan).count()
        except Exception as e:  # noqa: BLE001 - the same read failures the load absorbs
            bad = failed_file(e, plan)
            if bad is None:
                raise
            plan = plan.without(bad)


def _read(spark: SparkSession, st: Storage, name: str) -> DataFrame | None:
    path = st.path(name)
    if not st.exists(path) or not st.list_dirs(path):
        return None
    return spark.read.option("basePath", st.spark_path(name)).parquet(st.spark_path(name))


def verify_dataset(spark: SparkSession, ds: DatasetConfig) -> VerifyReport:
    st = Storage(ds.output)
    rep = VerifyReport(ds.name)
    committed = sorted(commits.committed_tags(st))
    rep.hours_checked = len(committed)
    frames = {name: _read(spark, st, name) for name in OUTPUTS}

    # Completeness and conservation
    per_hour: dict[str, dict[str, int]] = {}
    present: dict[str, set[str]] = {}
    for name in OUTPUTS:
        present[name] = {d.split("=", 1)[1] for d in st.list_dirs(st.path(name))
                         if d.startswith("load_hour=")}
        df = frames[name]
        if df is None:
            continue
        for row in df.groupBy("load_hour").count().collect():
            per_hour.setdefault(row["load_hour"], {})[name] = int(row["count"])
    for name in OUTPUTS:
        for tag in sorted(present[name] - set(committed)):
            rep.warnings.append(f"{to_key(parse_key(tag))}: {name} partition exists but the hour "
                                "is not committed (an interrupted load; rerun that hour)")
    for tag in committed:
        missing = [n for n in OUTPUTS if tag not in present[n]]
        if missing:
            rep.violations.append(f"{to_key(parse_key(tag))}: committed but missing "
                                  f"{', '.join(missing)}")
            rep.bad_hours.add(tag)
            continue
        try:
            n_in = _landing_count(spark, ds, tag)
        except Exception as e:  # noqa: BLE001 - verify reports what it cannot read, never crashes
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            rep.violations.append(f"{to_key(parse_key(tag))}: cannot read the landing files "
                                  f"({type(e).__name__}: {first})")
            rep.bad_hours.add(tag)
            continue
        n_out = sum(per_hour.get(tag, {}).values())
        rep.rows_in += n_in
        rep.rows_out += n_out
        if n_in != n_out:
            rep.violations.append(f"{to_key(parse_key(tag))}: conservation broken: {n_in} rows in "
                                  f"the landing files, {n_out} in the outputs")
            rep.bad_hours.add(tag)

    # Uniqueness within the expiry window
    uniq = frames[UNIQUE]
    if uniq is not None:
        uniq = uniq.filter(F.col("load_hour").isin(committed))
        key = list(ds.key)
        w = Window.partitionBy(*key).orderBy("load_hour")
        if ds.expiry is None:
            dup = uniq.withColumn("_n", F.count(F.lit(1)).over(Window.partitionBy(*key)))
            bad = dup.filter(F.col("_n") > 1).select("load_hour").distinct().collect()
        else:
            xs = _expiry_points(spark, ds, frames, committed)
            x_df = spark.createDataFrame([(t, float(x) if x is not None else None)
                                          for t, x in xs.items()], "load_hour string, _x double")
            u = uniq.withColumn(V, expiry_value(ds))
            u = u.withColumn("_prev_v", F.lag(V).over(w)).join(F.broadcast(x_df), "load_hour")
            bad = (u.filter(F.col("_prev_v").isNotNull()
                            & (F.col("_x").isNull() | (F.col("_prev_v") >= F.col("_x"))))
                   .select("load_hour").distinct().collect())
        for row in sorted(bad, key=lambda r: r["load_hour"]):
            rep.violations.append(f"{to_key(parse_key(row['load_hour']))}: a key in unique is "
                                  "also unique in an earlier hour within the expiry window")
            rep.bad_hours.add(row["load_hour"])
    return rep


def _expiry_points(spark: SparkSession, ds: DatasetConfig, frames: dict[str, DataFrame | None],
                   committed: list[str]) -> dict[str, float | int | None]:
    """X_H per committed hour, recomputed from the non-rejected outputs."""
    maxima: dict[str, float | int] = {}
    for name in (UNIQUE, DUPLICATES, EXPIRED):
        df = frames[name]
        if df is None:
            continue
        for row in df.groupBy("load_hour").agg(F.max(expiry_value(ds)).alias("m")).collect():
            if row["m"] is not None:
                cur = maxima.get(row["load_hour"])
                maxima[row["load_hour"]] = row["m"] if cur is None else max(cur, row["m"])
    out: dict[str, float | int | None] = {}
    latest = None
    for tag in committed:
        latest = latest_point(ds, parse_key(tag), latest, maxima.get(tag))
        out[tag] = expiry_point(ds, latest)
    return out
