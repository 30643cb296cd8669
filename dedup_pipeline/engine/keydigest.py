"""The key digest of an hour: which keys its unique, duplicates and expired rows hold, in a few
hundred kilobytes (docs/design.md L2b, L2d, E5). No Spark import: explain reads it.

Each load writes `{output}/_keys/load_hour=<tag>/`: one Parquet file, one column `_key_hash` (the
top 32 bits of the key digest h1) of every typed row, sorted, delta-encoded, small row groups, page
CRCs. Its commit record lists it (`key_digest`: name, size, SHA-256 of the footer), so only a
committed, unaltered digest is consulted: explain reads the footers and the one row group per hour
whose min/max covers the key's hash, then the outputs of only the hours that hold it. An hour
whose digest is not listed, missing, resized or unreadable is read in full: a lost digest costs
time, never a line. `verify` warns about such hours, `verify --repair` writes them again.

A 32-bit hash is a filter: about one hour in 40,000 per 1e5-row hour matches a key it does not
hold; explain then reads that hour's rows and finds none.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits, keys
from dedup_pipeline.engine.core.columns import H1, KEY_HASH, PARTITION
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord, DigestFileEntry
from dedup_pipeline.engine.core.outputs import DUPLICATES, EXPIRED, UNIQUE, partition
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import compress_ranges, parse_hour

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DIGEST = "_keys"  # {output}/_keys/load_hour=<tag>/
# Threads that read small files at once (explain's digests, index entries, rows): pyarrow
# releases the GIL while it reads, so as many as cores; more only contend. One point lookup over
# 720 hours on 2 cores (2026-11-28, medians of 10): 8 threads 0.71 s, 4 0.58 s, 3 0.58 s,
# 2 0.47 s, 1 0.64 s.
READERS = min(8, os.cpu_count() or 2)
OPTIONS: dict[str, Any] = {  # 8,192-value row groups: a lookup reads ~16 KB per hour
    "row_group_size": 8192, "use_dictionary": False, "data_page_version": "2.0",
    "compression": "snappy", "column_encoding": {KEY_HASH: "DELTA_BINARY_PACKED"},
    "write_page_checksum": True, "data_page_size": 16 * 1024}


def parts(tag: str) -> tuple[str, str]:
    return DIGEST, f"{PARTITION}{tag}"


def hash_of(h1: int) -> int:
    """The digest's value of a key: the top 32 bits of its 64-bit digest h1."""
    return h1 >> 32


def write_digest(st: Storage, frame: DataFrame, target: str) -> None:
    """Write the digest of `frame` (typed rows with `_h1`) to the directory `target` (a storage
    path): one small job collects the hashes, pyarrow writes the file."""
    got = frame.selectExpr(f"CAST(shiftright({H1}, 32) AS INT) AS {KEY_HASH}").toArrow()
    write_values(st, got.column(0).combine_chunks(), target)


def write_values(st: Storage, values: pa.Array, target: str) -> None:
    values = pc.array_take(values, pc.array_sort_indices(values)).drop_null()
    st.makedirs(target)
    path = f"{target}/part-00000-{uuid.uuid4()}.parquet"
    with (pa.OSFile(path, "wb") if st.local else st.fs.open(path, "wb")) as fh:
        pq.write_table(pa.table({KEY_HASH: values.cast(pa.int32())}), fh, **OPTIONS)


def _open(st: Storage, path: str) -> Any:
    return pa.OSFile(path, "rb") if st.local else st.fs.open(path, "rb")


def footer(st: Storage, path: str, size: int) -> bytes:
    """The Parquet footer of `path` (metadata, its length, magic): where the statistics live."""
    with _open(st, path) as fh:
        fh.seek(max(0, size - 8))
        tail = fh.read(8)
        n = int.from_bytes(tail[:4], "little") if len(tail) == 8 else 0
        if tail[4:] != b"PAR1" or n + 8 > size:
            raise ValueError(f"{path} has no Parquet footer")
        fh.seek(size - 8 - n)
        return fh.read(n + 8)


def entries(st: Storage, tag: str) -> tuple[DigestFileEntry, ...]:
    """The digest files of hour `tag` as its commit record lists them."""
    out = []
    for p in st.list_files(st.path(*parts(tag)), ".parquet"):
        size = int(st.fs.info(p)["size"])
        out.append(DigestFileEntry(name=p.rsplit("/", 1)[1], size=size,
                                   footer_sha256=hashlib.sha256(footer(st, p, size)).hexdigest()))
    return tuple(out)


def usable(st: Storage, tag: str, rec: CommitRecord) -> dict[str, DigestFileEntry] | None:
    """Hour `tag`'s digest files (path -> entry) if its record lists a digest whose files are all
    there with their recorded size; else None. Footers and pages are checked when read."""
    if not rec.key_digest:
        return None
    paths = {}
    for f in rec.key_digest:
        p = st.path(*parts(tag), f.name)
        try:
            if int(st.fs.info(p)["size"]) != f.size:
                return None
        except OSError:
            return None
        paths[p] = f
    return paths


def _holds(st: Storage, path: str, entry: DigestFileEntry, hashes: pa.Array) -> set[int] | None:
    """Which of `hashes` the file holds: its footer, then the row groups whose min/max covers one.
    None when it does not read (footer hash, page CRCs)."""
    try:
        if entry.footer_sha256 is not None and hashlib.sha256(
                footer(st, path, entry.size)).hexdigest() != entry.footer_sha256:
            return None
        wanted = hashes.to_pylist()
        with _open(st, path) as fh:
            pf = pq.ParquetFile(fh, page_checksum_verification=True)
            groups = [i for i in range(pf.metadata.num_row_groups)
                      if (s := pf.metadata.row_group(i).column(0).statistics) is None
                      or not s.has_min_max or any(s.min <= h <= s.max for h in wanted)]
            if not groups:
                return set()
            values = pf.read_row_groups(groups, columns=[KEY_HASH], use_threads=False).column(0)
        return set(pc.filter(hashes, pc.is_in(hashes, value_set=values.combine_chunks())).to_pylist())
    except (OSError, ValueError, pa.ArrowException):
        return None


def hours_holding(st: Storage, digests: Mapping[str, Mapping[str, DigestFileEntry]],
                  h1s: Iterable[int], unreadable: set[str] | None = None) -> dict[int, set[str]]:
    """Per key digest h1, the hours of `digests` whose digest holds it; hours whose digest does
    not read are added to `unreadable`."""
    h1s = set(h1s)
    out: dict[int, set[str]] = {h: set() for h in h1s}
    hashes = pa.array(sorted({hash_of(h) for h in h1s}), pa.int32())
    jobs = [(tag, p, e) for tag, paths in digests.items() for p, e in paths.items()]
    if not h1s or not jobs:
        return out
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        for tag, hit in pool.map(lambda j: (j[0], _holds(st, j[1], j[2], hashes)), jobs):
            if hit is None and unreadable is not None:
                unreadable.add(tag)
            for h in h1s:
                if hit and hash_of(h) in hit:
                    out[h].add(tag)
    return out


def _ok(st: Storage, tag: str, rec: CommitRecord) -> bool:
    files = usable(st, tag, rec)
    try:
        return files is not None and all(
            e.footer_sha256 is None or hashlib.sha256(footer(st, p, e.size)).hexdigest()
            == e.footer_sha256 for p, e in files.items())
    except (OSError, ValueError):
        return False


def missing(st: Storage, records: Mapping[str, CommitRecord]) -> str | None:
    """`verify`'s warning about committed hours without a usable digest (L2d), or None."""
    bad = [t for t, r in sorted(records.items()) if not _ok(st, t, r)]
    if not bad:
        return None
    more = ", ..." if len(bad) > 24 else ""
    return (f"{len(bad)} hour(s) without a usable key digest "
            f"({compress_ranges([parse_hour(t) for t in bad[:24]])}{more}): explain reads those "
            "hours in full instead (slower, the same answer); dedup-pipeline verify --repair "
            "writes them again")


def rebuild(ds: DatasetConfig, st: Storage, rec: CommitRecord) -> CommitRecord:
    """Write hour `rec.load_hour`'s digest again from the unique, duplicates and expired files its
    record lists (pyarrow, digests in Python) and return the record naming it."""
    tag = rec.load_hour
    types = [ds.source.schema[k] for k in ds.key]
    canonical = {"timestamp": pa.int64(), "date": pa.int32()}
    hashes = []
    for name in (UNIQUE, DUPLICATES, EXPIRED):
        names = ([f.name for f in rec.output_files.get(name, ())] if rec.output_files is not None
                 else [p.rsplit("/", 1)[1] for p in st.list_files(st.path(*partition(name, tag)),
                                                                   ".parquet")])
        for n in names:
            with _open(st, st.path(*partition(name, tag), n)) as fh:
                table = pq.read_table(fh, columns=list(ds.key))
            cols = [table[k].cast(canonical[t]) if t in canonical else table[k]
                    for k, t in zip(ds.key, types, strict=True)]
            hashes += [hash_of(keys.key_digests(row, types)[0][0])
                       for row in zip(*[c.to_pylist() for c in cols], strict=True)]
    tmp = st.path("_tmp", f"{tag}-digest-{uuid.uuid4().hex[:12]}")
    write_values(st, pa.array(hashes, pa.int64()), tmp)
    st.replace_dir(tmp, st.path(*parts(tag)))
    st.sync_tree(st.path(*parts(tag)))
    return rec.with_(key_digest=entries(st, tag))


def repair(ds: DatasetConfig, st: Storage, say: Callable[[str], None] = lambda _m: None
           ) -> list[str]:
    """Write the digest of every committed hour without a usable one again; each record then
    names its new digest. The caller holds the dataset lock. Returns the hours written."""
    log = CommitLog(st)
    todo = []
    for t in sorted(log.committed()):
        try:
            if (r := log.read(t)) is not None and not _ok(st, t, r):
                todo.append(r)
        except commits.CommitRecordError as e:
            say(f"{ds.name}: hour {t} skipped: {e}")
    if todo:
        log.drop_summary()  # records are rewritten in place: the next check reads them again
    for i, r in enumerate(todo, 1):
        log.write(rebuild(ds, st, r))
        if i % 24 == 0 or i == len(todo):
            say(f"{ds.name}: key digests written again: {i}/{len(todo)} hour(s)")
    return [r.load_hour for r in todo]
