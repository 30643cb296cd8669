"""The hour's batch: its landing files listed, parsed, typed, rejected and digested once, and
cached for the phases after (design.md R9, R9a, R2). Also how a load caches frames: `Persisted`
releases every frame it persisted however the load ends."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.columns import FP, H1, H2, RAW
from dedup_pipeline.engine.core.digest import digest_columns, fingerprint_column
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.landing import with_content_hashes
from dedup_pipeline.engine.core.parse import (
    REASON,
    BatchPlan,
    InputFile,
    V,
    check_landing_root,
    failed_file,
    list_input_files,
    plan_batch,
    read_text_batch,
    type_and_reject,
)

__all__ = ["Batch", "Persisted", "check_landing_root", "prepare_batch", "read_batch"]

# How the batch, its candidates and its classification are cached. PySpark's MEMORY_AND_DISK keeps
# the column batches serialized; the deserialized level (what DataFrame.cache() uses) was measured
# no faster (interleaved in one warm process, 1e5-row hours: median 9.78 s vs 8.81 s).
CACHE = StorageLevel.MEMORY_AND_DISK
class Persisted:
    """Every DataFrame a load persists, released on leaving the `with` whatever happened (a
    failed check, an I/O error, an interrupt), so a long-lived session never keeps a dead load's
    batch in executor memory."""

    def __init__(self) -> None:
        self.frames: list[DataFrame] = []

    def persist(self, df: DataFrame) -> DataFrame:
        df = df.persist(CACHE)
        self.frames.append(df)
        return df

    def drop(self, df: DataFrame) -> None:
        df.unpersist()
        self.frames.remove(df)

    def __enter__(self) -> Persisted:
        return self

    def release(self, failed: bool = False) -> None:
        """Unpersist every frame. After a `failed` load its error is the one to report: a release
        error is swallowed, and a session that cannot release one frame releases none (each try
        would wait out the client's retries again)."""
        frames, self.frames = self.frames, []
        for df in frames:
            try:
                df.unpersist()
            except Exception:
                if not failed:
                    raise
                return

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.release(failed=exc is not None)


def prepare_batch(spark: SparkSession, ds: DatasetConfig,
                  plan: BatchPlan | list[str]) -> DataFrame:
    """Parse, type, reject, digest: everything a load needs from the landing files."""
    df = type_and_reject(read_text_batch(spark, ds, plan), ds)
    h1, h2 = digest_columns(ds.key, ds.source.schema)
    ok = F.col(REASON).isNull()
    # the original text is kept only where an output needs it (rejected rows): half the cache
    cols = {RAW: F.when(~ok, F.col(RAW)), H1: F.when(ok, h1), H2: F.when(ok, h2)}
    if ds.fingerprint:
        cols[FP] = F.when(ok, fingerprint_column(ds.fingerprint, ds.source.schema))
    return df.withColumns(cols)  # one call: each withColumn re-analyses the whole plan


@dataclass(frozen=True)
class Batch:
    """The hour's landing files, parsed once and cached."""

    inputs: list[InputFile]
    frame: DataFrame  # cached
    rows_in: int
    vmax: Any  # the max expiry value of its valid rows (None without expiry)
    hashed: Future[list[InputFile]] | None = None  # `inputs` with content hashes, for the record

    def recorded_inputs(self) -> tuple[InputFile, ...]:
        """The inputs as the commit record keeps them: with their content hashes."""
        return tuple(self.hashed.result() if self.hashed is not None else self.inputs)


# Hashes the hour's landing files while Spark parses them (the driver waits on Spark meanwhile).
_HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dedup-input-hash")


def read_batch(spark: SparkSession, ds: DatasetConfig, hour: datetime, partition_key: str,
               cache: Persisted, say: Progress) -> Batch:
    """The hour's landing files, parsed once: one job caches the batch and yields rows in and
    its max expiry value."""
    inputs = list_input_files(ds, hour)
    hashed = _HASHER.submit(with_content_hashes, inputs)
    plan = plan_batch(ds, inputs)
    vmax = F.max(F.when(F.col(REASON).isNull(), F.col(V))) if ds.expiry else F.lit(None)
    while True:  # a file Spark fails to read is set aside as unreadable and the batch re-read
        frame = cache.persist(prepare_batch(spark, ds, plan))
        try:
            first = frame.agg(F.count(F.lit(1)).alias("n"), vmax.alias("vmax")).collect()[0]
            return Batch(inputs, frame, int(first["n"]), first["vmax"], hashed)
        except Exception as e:  # noqa: BLE001 - only a read failure naming a file is absorbed
            cache.drop(frame)
            bad = failed_file(e, plan)
            if bad is None:
                raise
            say(f"{ds.name} {partition_key}: {bad.path} is unreadable ({bad.error}); rejected")
            plan = plan.without(bad)
