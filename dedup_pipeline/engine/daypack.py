"""Day packs: the key digests and rejected lines of a day's hours, one file each, for `explain`
(docs/design.md L2c and "Explaining a key").

A point lookup over a long history is bound by files opened, not bytes read: 720 hourly key
digests and 720 rejected files cost more than the few rows of the key. Once every hour of a day
is committed, the load that committed the last of them (or reloaded one) writes, after its
commit, `_daypacks/day=YYYY-MM-DD/`:

- `keys-<id>.parquet`: every hour's digest values with the hour (`_key_hash`, `_hour` 0..23),
  sorted by hash, row groups of `ROW_GROUP_ROWS` with min/max statistics and page CRCs: a lookup
  reads the footer and the one row group whose range covers the key's hash;
- `rejected-<id>.parquet`: every rejected row's source file, reason and `_raw`, with the hour;
- `manifest.json` (written last, atomically): the format, per covered hour the digest files and
  rejected files its commit record listed when the pack was written, and per pack file its name,
  size, rows and the SHA-256 of its Parquet footer.

A pack is only ever a faster way to read files a commit record lists, so it never decides what is
reported: `explain` takes an hour's values from a pack only when the hour is committed now and
its commit record lists exactly the files the manifest says the pack holds (name, size, footer
hash). A rerun hour (new file names) is read from its own files until the day is packed again,
an uncommitted hour is not read at all, and a pack that is missing, of another size, whose footer
differs or whose pages fail their CRC is not used: its hours are read from their own files. A
stale or damaged pack costs time, never a wrong answer. Records are not changed by packing.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Container, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, ValidationError

from dedup_pipeline.engine import commits, keydigest
from dedup_pipeline.engine.columns import PACK_HOUR as HOUR_COL
from dedup_pipeline.engine.columns import RAW, REASON, SOURCE_FILE
from dedup_pipeline.engine.commit_log import CommitLog
from dedup_pipeline.engine.outputs import REJECTED, partition
from dedup_pipeline.engine.storage import READERS, Storage

PACKS = "_daypacks"  # {output}/_daypacks/day=YYYY-MM-DD/
PREFIX = "day="
MANIFEST = "manifest.json"
FORMAT = 1
KEYS = "keys"
REJECTS = "rejected"
REJECTED_COLUMNS = [SOURCE_FILE, REASON, RAW]
# ~2.4M digest values a day of 1e5-row hours: 37 row groups; a lookup decodes one (~0.3 MB)
ROW_GROUP_ROWS = 65_536
# Write packs after a commit, read them in explain (the benchmark turns them off to compare).
ENABLED = True


class PackFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    size: int
    rows: int
    footer_sha256: str


class FileRef(BaseModel):
    """A file as a commit record lists it: the identity a pack's hour is checked against."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    size: int | None = None
    footer_sha256: str | None = None


class HourCover(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key_digest: list[FileRef] | None = None  # None: the hour's digest is not in the keys pack
    rejected: list[FileRef] | None = None  # None: its rejected rows are not in the rejected pack


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal[1]
    day: str
    hours: dict[str, HourCover]  # hour tag -> what of it the packs hold
    keys: PackFile | None = None
    rejected: PackFile | None = None


def day_of(tag: str) -> str:
    """The day of an hour tag (`YYYY-MM-DD-HH` -> `YYYY-MM-DD`)."""
    return tag[:10]


def _dir(st: Storage, day: str) -> str:
    return st.path(PACKS, f"{PREFIX}{day}")


def _refs(files: Iterable[Any] | None) -> list[FileRef] | None:
    if files is None:
        return None
    return [FileRef(name=f.name, size=f.size, footer_sha256=getattr(f, "footer_sha256", None))
            for f in files]


def _rejected_files(rec: commits.CommitRecord) -> list[Any] | None:
    return None if rec.output_files is None else list(rec.output_files.get(REJECTED, ()))


def read_manifest(st: Storage, day: str) -> Manifest | None:
    """The day's manifest, validated; None if there is none or it does not read (then the day's
    hours are read from their own files)."""
    try:
        return Manifest.model_validate_json(st.read_text(f"{_dir(st, day)}/{MANIFEST}"))
    except (FileNotFoundError, OSError, ValidationError, UnicodeDecodeError):
        return None


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _write(st: Storage, path: str, table: pa.Table, **options: Any) -> PackFile:
    with (pa.OSFile(path, "wb") if st.local else st.fs.open(path, "wb")) as fh:
        pq.write_table(table, fh, write_page_checksum=True, **options)
    size = int(st.fs.info(path)["size"])
    footer = keydigest.footer(st, path, size)
    return PackFile(name=path.rsplit("/", 1)[1], size=size, rows=table.num_rows,
                    footer_sha256=hashlib.sha256(footer).hexdigest())


def pack_day(st: Storage, day: str, records: Mapping[str, commits.CommitRecord]) -> Manifest | None:
    """Write the packs of `day` from the committed files of its hours (`records`: tag -> its
    commit record, hours of that day). An hour whose digest or rejected file does not read is
    left out of that pack (it is read from its own files). Returns the manifest written, or None
    when there was nothing to pack."""
    hours = sorted(t for t in records if day_of(t) == day)
    key_parts: list[pa.Table] = []
    rej_parts: list[pa.Table] = []
    cover: dict[str, HourCover] = {}
    for t in hours:
        rec = records[t]
        h = np.int8(int(t[11:13]))
        digest = None
        paths = keydigest.usable(st, t, rec)
        if paths is not None:
            try:
                got = [keydigest.read_values(st, p, e) for p, e in paths.items()]
            except (OSError, ValueError, pa.ArrowException):
                got = None
            if got is not None:
                values = np.concatenate(got) if got else np.zeros(0, dtype=np.int32)
                key_parts.append(pa.table({keydigest.KEY_HASH: pa.array(values, pa.int32()),
                                           HOUR_COL: pa.array(np.full(len(values), h),
                                                              pa.int8())}))
                digest = _refs(rec.key_digest)
        rejected = None
        files = _rejected_files(rec)
        if files is not None:
            try:
                tables = [_read_rejected(st, st.path(*partition(REJECTED, t), f.name))
                          for f in files]
            except (OSError, ValueError, pa.ArrowException):
                tables = None
            if tables is not None:
                for tb in tables:
                    rej_parts.append(tb.append_column(
                        HOUR_COL, pa.array(np.full(tb.num_rows, h), pa.int8())))
                rejected = _refs(files)
        if digest is not None or rejected is not None:
            cover[t] = HourCover(key_digest=digest, rejected=rejected)
    if not cover:
        return None
    d = _dir(st, day)
    st.makedirs(d)
    tag = uuid.uuid4().hex[:12]
    keys_file = rej_file = None
    if any(c.key_digest is not None for c in cover.values()):
        table = pa.concat_tables(key_parts) if key_parts else pa.table(
            {keydigest.KEY_HASH: pa.array([], pa.int32()), HOUR_COL: pa.array([], pa.int8())})
        table = table.sort_by([(keydigest.KEY_HASH, "ascending"), (HOUR_COL, "ascending")])
        keys_file = _write(st, f"{d}/{KEYS}-{tag}.parquet", table,
                           row_group_size=ROW_GROUP_ROWS, use_dictionary=False,
                           data_page_version="2.0", compression="NONE",
                           column_encoding={keydigest.KEY_HASH: "DELTA_BINARY_PACKED",
                                            HOUR_COL: "PLAIN"})
    if any(c.rejected is not None for c in cover.values()):
        table = pa.concat_tables(rej_parts) if rej_parts else pa.table(
            {**{c: pa.array([], pa.string()) for c in REJECTED_COLUMNS},
             HOUR_COL: pa.array([], pa.int8())})
        rej_file = _write(st, f"{d}/{REJECTS}-{tag}.parquet", table, compression="snappy")
    manifest = Manifest(format=FORMAT, day=day, hours=cover, keys=keys_file, rejected=rej_file)
    st.write_text_atomic(f"{d}/{MANIFEST}", manifest.model_dump_json(indent=1))
    st.sync_tree(d)
    keep = {f.name for f in (keys_file, rej_file) if f is not None} | {MANIFEST}
    for name in st.list_names(d):  # the packs the new manifest replaced
        if name not in keep and not name.startswith("."):
            st.remove(f"{d}/{name}")
    return manifest


def _read_rejected(st: Storage, path: str) -> pa.Table:
    with (pa.OSFile(path, "rb") if st.local else st.fs.open(path, "rb")) as fh:
        table = pq.read_table(fh, columns=REJECTED_COLUMNS, use_threads=False)
    return table.select(REJECTED_COLUMNS).cast(pa.schema(
        [pa.field(c, pa.string()) for c in REJECTED_COLUMNS]))


def after_commit(st: Storage, tag: str, committed: Container[str] | None = None
                 ) -> Manifest | None:
    """After hour `tag` is committed (`committed`: the committed hours, the load's own set; by
    default listed): pack its day when every hour of the day is committed and the day's packs do
    not already cover exactly what the records list (a first pack, or a reloaded hour). Best
    effort: a pack not written only costs `explain` time."""
    if not ENABLED:
        return None
    day = day_of(tag)
    tags = [f"{day}-{h:02d}" for h in range(24)]
    log = CommitLog(st)
    have_tags = committed if committed is not None else log.committed()
    if any(t not in have_tags for t in tags):
        return None
    try:
        records = {t: r for t in tags if (r := log.read(t)) is not None}
        have = read_manifest(st, day)
        if have is not None and len(valid_hours(have, records, KEYS)) == len(records) \
                and len(valid_hours(have, records, REJECTS)) == len(records):
            return have
        return pack_day(st, day, records)
    except (OSError, ValueError, pa.ArrowException, commits.CommitRecordError):
        return None


def pack_all(st: Storage) -> list[str]:
    """Pack every day with committed hours whose packs are missing or stale (a history loaded
    before packs, or copied); returns the days written."""
    by_day: dict[str, list[str]] = {}
    log = CommitLog(st)
    for t in sorted(log.committed()):
        by_day.setdefault(day_of(t), []).append(t)
    done = []
    for day, tags in sorted(by_day.items()):
        records = {t: r for t in tags if (r := log.read(t)) is not None}
        if stale(st, day, records) and pack_day(st, day, records) is not None:
            done.append(day)
    return done


def stale(st: Storage, day: str, records: Mapping[str, commits.CommitRecord]) -> bool:
    """Whether `day`'s packs are missing or do not hold exactly what its hours' `records` list
    (a first pack, a reloaded hour, a rewritten digest, a damaged manifest)."""
    have = read_manifest(st, day)
    return have is None or any(len(valid_hours(have, records, kind)) != len(records)
                               for kind in (KEYS, REJECTS))


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------


def valid_hours(m: Manifest, records: Mapping[str, commits.CommitRecord], kind: str
                ) -> set[str]:
    """The hours of manifest `m` whose `kind` (KEYS or REJECTS) the pack holds exactly as their
    commit record (in `records`: the committed hours) lists it now."""
    if (m.keys if kind == KEYS else m.rejected) is None:
        return set()
    out = set()
    for t, c in m.hours.items():
        rec = records.get(t)
        if rec is None or day_of(t) != m.day:
            continue
        have = c.key_digest if kind == KEYS else c.rejected
        now = _refs(rec.key_digest if kind == KEYS else _rejected_files(rec))
        if have is not None and now is not None and have == now:
            out.add(t)
    return out


@dataclass(frozen=True)
class Cover:
    """A day's pack of one kind and the committed hours it may answer for."""

    day: str
    file: PackFile
    hours: frozenset[str]


def covers(st: Storage, records: Mapping[str, commits.CommitRecord], kind: str
           ) -> list[Cover]:
    """The packs of `kind` that answer for some of the committed hours `records`."""
    if not ENABLED:
        return []
    days = sorted({day_of(t) for t in records})

    def one(day: str) -> Cover | None:
        m = read_manifest(st, day)
        if m is None or m.day != day:
            return None
        f = m.keys if kind == KEYS else m.rejected
        hours = valid_hours(m, records, kind)
        return Cover(day, f, frozenset(hours)) if f is not None and hours else None

    with ThreadPoolExecutor(max_workers=READERS) as pool:
        return [c for c in pool.map(one, days) if c is not None]


def _checked(st: Storage, c: Cover) -> str:
    """The pack file's path once its size and footer agree with the manifest."""
    path = f"{_dir(st, c.day)}/{c.file.name}"
    size = int(st.fs.info(path)["size"])
    if size != c.file.size:
        raise ValueError(f"{path}: {size} bytes, the manifest says {c.file.size}")
    if hashlib.sha256(keydigest.footer(st, path, size)).hexdigest() != c.file.footer_sha256:
        raise ValueError(f"{path}: footer differs from the manifest")
    return path


def _hour_tags(c: Cover) -> dict[int, str]:
    return {int(t[11:13]): t for t in c.hours}


def keys_holding(st: Storage, packs: list[Cover], h1s: Iterable[int]
                 ) -> tuple[dict[int, set[str]], set[str]]:
    """Per key digest h1, the hours of the packs' covered hours whose digest holds it; and the
    hours the packs answered for (a pack that does not read answers for none of its hours)."""
    by_hash: dict[int, list[int]] = {}
    for h in set(h1s):
        by_hash.setdefault(keydigest.hash_of(h), []).append(h)
    out: dict[int, set[str]] = {h: set() for hs in by_hash.values() for h in hs}
    answered: set[str] = set()
    if not packs:
        return out, answered
    hashes = np.array(sorted(by_hash), dtype=np.int64)

    def one(c: Cover) -> list[tuple[int, str]] | None:
        try:
            return _keys_hits(st, c, hashes)
        except (OSError, ValueError, pa.ArrowException):
            return None

    with ThreadPoolExecutor(max_workers=READERS) as pool:
        for c, hits in zip(packs, pool.map(one, packs), strict=True):
            if hits is None:
                continue
            answered |= c.hours
            for x, t in hits:
                for h in by_hash[x]:
                    out[h].add(t)
    return out, answered


def _keys_hits(st: Storage, c: Cover, hashes: np.ndarray) -> list[tuple[int, str]]:
    path = _checked(st, c)
    tags = _hour_tags(c)
    with (pa.OSFile(path, "rb") if st.local else st.fs.open(path, "rb")) as fh:
        pf = pq.ParquetFile(fh, page_checksum_verification=True)
        md = pf.metadata
        if md.num_rows != c.file.rows:
            raise ValueError(f"{path}: {md.num_rows} rows, the manifest says {c.file.rows}")
        col = md.schema.names.index(keydigest.KEY_HASH)
        groups = []
        for i in range(md.num_row_groups):
            s = md.row_group(i).column(col).statistics
            if s is None or not s.has_min_max or \
                    np.searchsorted(hashes, s.max, side="right") > np.searchsorted(hashes, s.min):
                groups.append(i)
        if not groups:
            return []
        table = pf.read_row_groups(groups, columns=[keydigest.KEY_HASH, HOUR_COL],
                                   use_threads=False)
    values = table.column(keydigest.KEY_HASH).to_numpy()
    hours = table.column(HOUR_COL).to_numpy()
    hit = np.isin(values, hashes)
    return [(int(v), tags[int(h)]) for v, h in zip(values[hit], hours[hit], strict=True)
            if int(h) in tags]


def rejected_rows(st: Storage, c: Cover) -> pa.Table | None:
    """The rejected rows of the pack's covered hours (`_hour` as its hour tag in `load_hour`
    order is the caller's), or None when the pack does not read."""
    try:
        path = _checked(st, c)
        with (pa.OSFile(path, "rb") if st.local else st.fs.open(path, "rb")) as fh:
            pf = pq.ParquetFile(fh, page_checksum_verification=True)
            if pf.metadata.num_rows != c.file.rows:
                raise ValueError(f"{path}: row count differs from the manifest")
            table = pf.read(columns=[*REJECTED_COLUMNS, HOUR_COL], use_threads=False)
    except (OSError, ValueError, pa.ArrowException):
        return None
    wanted = pa.array(sorted(int(t[11:13]) for t in c.hours), pa.int8())
    return table.filter(pc.is_in(table.column(HOUR_COL), value_set=wanted))
