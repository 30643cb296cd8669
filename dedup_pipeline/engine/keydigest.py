"""The key digest of an hour: which keys its unique, duplicates and expired rows hold, in a few
hundred kilobytes (docs/design.md, E5).

Each load writes, beside its outputs, one small Parquet file `{output}/_keys/load_hour=<tag>/`
with one column `_key_hash` (the top 32 bits of the key's digest h1) for every unique, duplicate
and expired row, sorted. Its commit record lists it (`key_digest`: file name and size), so only a
committed, unaltered digest is ever consulted. `explain` reads only the footers and the one row
group per hour whose min/max covers the key's hash (pyarrow, in parallel), and then opens the
outputs of only the hours whose digest holds the hash. An hour whose record lists no digest
(loaded before digests), or whose digest is missing or of another size, is searched in its
outputs as before: the digest only ever narrows the hours read, so a stale or lost digest costs
time, never a wrong answer. `write_digest` rebuilds one from the committed outputs.

A 32-bit hash is a filter, not an identity: about one hour in 40,000 per 1e5-row hour matches a
key it does not hold; explain then reads that hour's rows and finds none.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.commits import CommitRecord, OutputFileEntry
from dedup_pipeline.engine.digest import H1, digest_columns
from dedup_pipeline.engine.outputs import DUPLICATES, EXPIRED, UNIQUE, partition
from dedup_pipeline.engine.parse import SPARK_TYPES
from dedup_pipeline.engine.storage import Storage

DIGEST = "_keys"  # {output}/_keys/load_hour=<tag>/
KEY_HASH = "_key_hash"
PARTITION = "load_hour="
# Rows per row group: a lookup reads one ~16 KB row group per hour besides the footer.
ROW_GROUP_BYTES = 16 * 1024
# Written by every load (the benchmark turns it off to measure its cost).
ENABLED = True


def hash_column(h1: Column | None = None) -> Column:
    """The digest's value of a key: the top 32 bits of its 64-bit digest h1."""
    return F.shiftright(F.col(H1) if h1 is None else h1, 32).cast("int")


def hash_of(h1: int) -> int:
    return h1 >> 32


def parts(tag: str) -> tuple[str, str]:
    return DIGEST, f"{PARTITION}{tag}"


def write_digest(frame: DataFrame, target_uri: str) -> None:
    """Write the digest of `frame` (rows with `_h1`; only typed rows belong in it) to the
    directory `target_uri`: one sorted file, delta-encoded (Parquet v2), small row groups."""
    (frame.select(hash_column().alias(KEY_HASH)).coalesce(1).sortWithinPartitions(KEY_HASH)
     .write.mode("overwrite")
     .option("parquet.writer.version", "v2")
     .option("parquet.block.size", str(ROW_GROUP_BYTES))
     .option("parquet.page.size.row.check.min", "1000")
     .option("parquet.page.size.row.check.max", "4000")
     .option("parquet.enable.dictionary", "false")
     .parquet(target_uri))


def entries(st: Storage, tag: str) -> tuple[OutputFileEntry, ...]:
    """The digest files of hour `tag` as its commit record lists them (name, size)."""
    return tuple(OutputFileEntry(p.rsplit("/", 1)[1], int(st.fs.info(p)["size"]))
                 for p in st.list_files(st.path(*parts(tag)), ".parquet"))


def usable(st: Storage, tag: str, rec: CommitRecord) -> list[str] | None:
    """The paths of hour `tag`'s digest if its record lists one and every listed file is there
    with its recorded size; None otherwise (the hour is then searched in its outputs)."""
    if not rec.key_digest:
        return None
    paths = []
    for f in rec.key_digest:
        p = st.path(*parts(tag), f.name)
        try:
            size = int(st.fs.info(p)["size"])
        except (FileNotFoundError, OSError):
            return None
        if f.size is not None and size != f.size:
            return None
        paths.append(p)
    return paths


def _holds(st: Storage, path: str, hashes: np.ndarray) -> np.ndarray:
    """Which of the sorted `hashes` the digest file holds: footer first, then only the row
    groups whose min/max covers one of them."""
    with st.fs.open(path, "rb") as fh:
        pf = pq.ParquetFile(fh)
        md = pf.metadata
        groups = []
        for i in range(md.num_row_groups):
            s = md.row_group(i).column(0).statistics
            if s is None or not s.has_min_max:
                groups.append(i)
                continue
            if np.searchsorted(hashes, s.max, side="right") > np.searchsorted(hashes, s.min):
                groups.append(i)
        if not groups:
            return np.zeros(len(hashes), dtype=bool)
        values = pf.read_row_groups(groups, columns=[KEY_HASH]).column(0).to_numpy()
    return np.isin(hashes, values)


def hours_holding(st: Storage, digests: Mapping[str, list[str]], h1s: Iterable[int]
                  ) -> dict[int, set[str]]:
    """Per key digest h1, the hours (of `digests`: tag -> digest paths) whose digest holds it."""
    by_hash: dict[int, list[int]] = {}
    for h in set(h1s):
        by_hash.setdefault(hash_of(h), []).append(h)
    out: dict[int, set[str]] = {h: set() for hs in by_hash.values() for h in hs}
    if not by_hash or not digests:
        return out
    hashes = np.array(sorted(by_hash), dtype=np.int64)
    jobs = [(tag, p) for tag, paths in digests.items() for p in paths]
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = pool.map(lambda j: (j[0], _holds(st, j[1], hashes)), jobs)
        for tag, hit in found:
            for x in hashes[hit]:
                for h in by_hash[int(x)]:
                    out[h].add(tag)
    return out


def rebuild(spark: SparkSession, ds: DatasetConfig, st: Storage, rec: CommitRecord
            ) -> CommitRecord:
    """Write hour `rec.load_hour`'s digest again from its committed unique, duplicates and
    expired files (those its record lists) and return the record naming it (the caller writes
    it). For hours loaded before digests, or whose digest was lost or altered."""
    tag = rec.load_hour
    files = []
    for name in (UNIQUE, DUPLICATES, EXPIRED):
        if rec.output_files is not None:
            files += [st.spark_path(*partition(name, tag), f.name)
                      for f in rec.output_files.get(name, ())]
        elif st.exists(st.path(*partition(name, tag))):
            files.append(st.read_path(*partition(name, tag)))
    tmp = st.path("_tmp", f"{tag}-digest-{uuid.uuid4().hex[:12]}")
    h1, _ = digest_columns(ds.key, ds.source.schema)
    schema = T.StructType([T.StructField(k, SPARK_TYPES[ds.source.schema[k]]) for k in ds.key])
    frame = (spark.read.schema(schema).parquet(*files) if files
             else spark.createDataFrame([], schema))
    write_digest(frame.select(h1.alias(H1)), st.to_uri(tmp))
    st.replace_dir(tmp, st.path(*parts(tag)))
    st.sync_tree(st.path(*parts(tag)))
    return rec.with_(key_digest=entries(st, tag))
