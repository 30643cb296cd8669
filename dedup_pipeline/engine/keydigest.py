"""The key digest of an hour: which keys its unique, duplicates and expired rows hold, in a few
hundred kilobytes (docs/design.md, L2b and E5).

Each load writes, beside its outputs, one small Parquet file `{output}/_keys/load_hour=<tag>/`
with one column `_key_hash` (the top 32 bits of the key's digest h1) for every unique, duplicate
and expired row, sorted. Its commit record lists it (`key_digest`: file name, size and the
SHA-256 of the Parquet footer, whose row-group statistics a lookup prunes by; the pages carry
CRCs), so only a committed, unaltered digest is ever consulted. `explain` reads only the footers
and the one row group per hour whose min/max covers the key's hash (pyarrow, in parallel), and
then opens the outputs of only the hours whose digest holds the hash. An hour whose record lists
no digest (loaded before digests), or whose digest is missing, of another size or does not read
back (footer hash, page CRCs), is searched in its outputs as before: the digest only ever narrows
the hours read, so a stale or lost digest costs time, never a wrong answer. `rebuild` writes one
again from the committed outputs.

A 32-bit hash is a filter, not an identity: about one hour in 40,000 per 1e5-row hour matches a
key it does not hold; explain then reads that hour's rows and finds none.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.columns import H1, KEY_HASH, PARTITION
from dedup_pipeline.engine.commits import CommitRecord, DigestFileEntry
from dedup_pipeline.engine.digest import digest_columns
from dedup_pipeline.engine.outputs import DUPLICATES, EXPIRED, UNIQUE, partition
from dedup_pipeline.engine.parse import SPARK_TYPES
from dedup_pipeline.engine.storage import READERS, Storage

DIGEST = "_keys"  # {output}/_keys/load_hour=<tag>/
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


# How a load writes the digest: "arrow" collects the hashes (one small job over the cached
# classification, no shuffle) and writes the file with pyarrow; "spark" is a Spark write with a
# sort (the benchmark compares the two).
WRITER = "arrow"
# pyarrow's settings for a digest file: what the Spark writer's options below produce
ARROW_OPTIONS: dict[str, Any] = {
    "row_group_size": 8192, "use_dictionary": False, "data_page_version": "2.0",
    "compression": "snappy", "column_encoding": {KEY_HASH: "DELTA_BINARY_PACKED"},
    "write_page_checksum": True, "data_page_size": 16 * 1024}


def write_digest(st: Storage, frame: DataFrame, target: str) -> None:
    """Write the digest of `frame` (rows with `_h1`; only typed rows belong in it) to the
    directory `target` (a storage path): one sorted file, delta-encoded (Parquet v2), small row
    groups, page CRCs."""
    if WRITER == "spark":
        _write_with_spark(frame, st.to_uri(target))
        return
    got = frame.select(hash_column().alias(KEY_HASH)).toArrow().column(0)
    values = np.sort(got.drop_null().to_numpy())
    st.makedirs(target)
    path = f"{target}/part-00000-{uuid.uuid4()}.parquet"
    with (pa.OSFile(path, "wb") if st.local else st.fs.open(path, "wb")) as fh:
        pq.write_table(pa.table({KEY_HASH: pa.array(values, pa.int32())}), fh, **ARROW_OPTIONS)


def _write_with_spark(frame: DataFrame, target_uri: str) -> None:
    (frame.select(hash_column().alias(KEY_HASH)).coalesce(1).sortWithinPartitions(KEY_HASH)
     .write.mode("overwrite")
     .option("parquet.writer.version", "v2")
     .option("parquet.block.size", str(ROW_GROUP_BYTES))
     .option("parquet.page.size.row.check.min", "1000")
     .option("parquet.page.size.row.check.max", "4000")
     .option("parquet.enable.dictionary", "false")
     .parquet(target_uri))


def read_values(st: Storage, path: str, entry: DigestFileEntry | None) -> np.ndarray:
    """Every value of one digest file (footer checked against its record entry, page CRCs):
    what a day pack is written from. Raises on a file that does not read."""
    if entry is not None and entry.footer_sha256 is not None and hashlib.sha256(
            footer(st, path, entry.size)).hexdigest() != entry.footer_sha256:
        raise ValueError(f"{path}: footer differs from its commit record")
    with _open(st, path) as fh:
        pf = pq.ParquetFile(fh, page_checksum_verification=True)
        return pf.read(columns=[KEY_HASH], use_threads=False).column(0).to_numpy()


def _open(st: Storage, path: str) -> Any:
    """A file for pyarrow: natively where local (no Python file layer), else through fsspec."""
    return pa.OSFile(path, "rb") if st.local else st.fs.open(path, "rb")


def footer(st: Storage, path: str, size: int) -> bytes:
    """The Parquet footer of `path` (metadata + its length + magic): what the row-group
    statistics live in."""
    with _open(st, path) as fh:
        fh.seek(max(0, size - 8))
        tail = fh.read(8)
        n = int.from_bytes(tail[:4], "little") if len(tail) == 8 else 0
        if tail[4:] != b"PAR1" or n + 8 > size:
            raise ValueError(f"{path} has no Parquet footer")
        fh.seek(size - 8 - n)
        return fh.read(n + 8)


def entries(st: Storage, tag: str) -> tuple[DigestFileEntry, ...]:
    """The digest files of hour `tag` as its commit record lists them (name, size, the SHA-256
    of the footer)."""
    out = []
    for p in st.list_files(st.path(*parts(tag)), ".parquet"):
        size = int(st.fs.info(p)["size"])
        out.append(DigestFileEntry(name=p.rsplit("/", 1)[1], size=size,
                                   footer_sha256=hashlib.sha256(footer(st, p, size)).hexdigest()))
    return tuple(out)


def usable(st: Storage, tag: str, rec: CommitRecord) -> dict[str, DigestFileEntry] | None:
    """Hour `tag`'s digest files (path -> record entry) if its record lists a digest and every
    listed file is there with its recorded size; None otherwise (the hour is then searched in
    its outputs). Footers and pages are checked when read (`hours_holding`)."""
    if not rec.key_digest:
        return None
    paths = {}
    for f in rec.key_digest:
        p = st.path(*parts(tag), f.name)
        try:
            size = int(st.fs.info(p)["size"])
        except (FileNotFoundError, OSError):
            return None
        if size != f.size:
            return None
        paths[p] = f
    return paths


def _holds(st: Storage, path: str, entry: DigestFileEntry | None, hashes: np.ndarray
           ) -> np.ndarray | None:
    """Which of the sorted `hashes` the digest file holds: footer first, then only the row
    groups whose min/max covers one of them. None when the file does not read (its pages carry
    CRCs, checked here): the hour is then searched in its outputs."""
    try:
        return _read_holds(st, path, entry, hashes)
    except (OSError, ValueError, pa.ArrowException):
        return None


def _read_holds(st: Storage, path: str, entry: DigestFileEntry | None, hashes: np.ndarray
                ) -> np.ndarray:
    if entry is not None and entry.footer_sha256 is not None and hashlib.sha256(
            footer(st, path, entry.size)).hexdigest() != entry.footer_sha256:
        raise ValueError(f"{path}: footer differs from its commit record")
    with _open(st, path) as fh:
        pf = pq.ParquetFile(fh, page_checksum_verification=True)
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
        values = np.sort(pf.read_row_groups(groups, columns=[KEY_HASH], use_threads=False)
                         .column(0).to_numpy())  # sorted already, but a sort of few is cheap
    at = np.minimum(np.searchsorted(values, hashes), max(len(values) - 1, 0))
    return (values[at] == hashes) if len(values) else np.zeros(len(hashes), dtype=bool)


def hours_holding(st: Storage, digests: Mapping[str, Mapping[str, DigestFileEntry | None]],
                  h1s: Iterable[int],
                  unreadable: set[str] | None = None) -> dict[int, set[str]]:
    """Per key digest h1, the hours (of `digests`: tag -> {path: record entry}) whose digest
    holds it.
    Hours whose digest does not read are added to `unreadable` (when given) and to no key."""
    by_hash: dict[int, list[int]] = {}
    for h in set(h1s):
        by_hash.setdefault(hash_of(h), []).append(h)
    out: dict[int, set[str]] = {h: set() for hs in by_hash.values() for h in hs}
    if not by_hash or not digests:
        return out
    hashes = np.array(sorted(by_hash), dtype=np.int64)
    jobs = [(tag, p, e) for tag, paths in digests.items() for p, e in paths.items()]
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        found = pool.map(lambda j: (j[0], _holds(st, j[1], j[2], hashes)), jobs)
        for tag, hit in found:
            if hit is None:
                if unreadable is not None:
                    unreadable.add(tag)
                continue
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
    write_digest(st, frame.select(h1.alias(H1)), tmp)
    st.replace_dir(tmp, st.path(*parts(tag)))
    st.sync_tree(st.path(*parts(tag)))
    return rec.with_(key_digest=entries(st, tag))
