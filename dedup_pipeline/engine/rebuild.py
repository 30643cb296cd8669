"""Rebuild the key index from the unique output (SPEC R12, K3), and detect a damaged index cheaply.

The index is derived data: every entry is a function of one unique row (digest of its key, its
expiry value, its fingerprint) and the load hour of its partition. So a rebuild reads only unique
(never the raw batches), recomputes the entries of every committed load in one Spark job, writes
them in the usual layout to a staging directory and swaps the whole index in. Entries equal the
ones the loads wrote, so every later load gives exactly the results it would have given had the
index never been lost.

Damage detection has two levels (README "Index recovery"):
- listing (`check_index`, before every load, by the recovery sensor): each commit record lists the
  index files its load wrote, with sizes and SHA-256; a committed load whose files are missing,
  have another size, or are joined by files nobody committed is damaged (slices deleted by
  retention excepted); so is a load whose commit record does not parse (`bad_records`), and a
  file a load or `verify` found with other content (recorded in ``index/_damaged.json``);
- content (`content_damage`): the SHA-256 of exactly the files a load is about to probe is compared
  with the recorded one before the probe, so the cost follows what the load reads, not history.
  `check_index(content=True)` (verify) hashes every index file.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import commits, compaction, index
from dedup_pipeline.engine.digest import FP, H1, H2, digest_columns, fingerprint_column
from dedup_pipeline.engine.parse import V, expiry_value
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import key_of, parse_key, to_tag


@dataclass
class IndexDamage:
    """What is wrong with the index of a dataset; empty means healthy."""

    missing: dict[str, list[str]] = field(default_factory=dict)  # load tag -> missing/changed files
    unexpected: list[str] = field(default_factory=list)  # files a committed load did not write
    # every index file the commit records list (retention's deletions excepted), by path below
    # index/: when healthy, exactly what is on disk, so a load needs no listing of its own
    files: dict[str, index.IndexFile] = field(default_factory=dict)
    bad_compacted: list[str] = field(default_factory=list)  # compacted dirs a rebuild must drop
    old_format: list[str] = field(default_factory=list)  # loads whose entries are an older layout
    corrupt: dict[str, list[str]] = field(default_factory=dict)  # load -> files of other content
    bad_records: dict[str, str] = field(default_factory=dict)  # load -> what is wrong with record

    @property
    def index_ok(self) -> bool:
        return not (self.missing or self.unexpected or self.old_format or self.corrupt)

    @property
    def ok(self) -> bool:
        return self.index_ok and not self.bad_records

    @property
    def damaged_loads(self) -> list[str]:
        """Loads whose entries must be rebuilt: missing/changed files or stray files in their dirs.

        Loads with a damaged commit record are not among them: a rebuild cannot restore a record
        (its counts and expiry point); rerunning the hour does.
        """
        strays = {rel.split("/")[1].split("=", 1)[1] for rel in self.unexpected
                  if rel.split("/")[1].startswith("load_hour=")}
        return sorted((set(self.missing) | strays | set(self.old_format) | set(self.corrupt))
                      - set(self.bad_records))

    def summary(self) -> str:
        parts = []
        for tag, problem in sorted(self.bad_records.items()):
            parts.append(f"hour {key_of(tag)}: {problem}")
        if self.corrupt:
            first = sorted(self.corrupt)[0]
            parts.append(f"index files whose content differs from what was recorded when they "
                         f"were written (SHA-256, or the Hadoop checksum of older files), of "
                         f"{len(self.corrupt)} load(s): "
                         f"{', '.join(key_of(t) for t in sorted(self.corrupt)[:5])}, e.g. "
                         f"index/{self.corrupt[first][0]}")
        if self.missing:
            hours = ", ".join(key_of(t) for t in self.damaged_loads[:5])
            more = f" (+{len(self.missing) - 5} more)" if len(self.missing) > 5 else ""
            parts.append(f"index files missing or changed for {len(self.missing)} committed "
                         f"load(s): {hours}{more}")
        if self.old_format:
            parts.append(f"{len(self.old_format)} committed load(s) have index entries in an "
                         f"older layout (before index format {index.INDEX_FORMAT}), e.g. "
                         f"{key_of(self.old_format[0])}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} index file(s) not written by their load, "
                         f"e.g. {self.unexpected[0]}")
        return "; ".join(parts) or "index healthy"


def _kept_from(st: Storage) -> float | None:
    """What retention deleted below; None if nothing (or unreadable: deleted slices then show as
    missing files, so a damaged state file is index damage, repaired by a rebuild)."""
    try:
        v = st.read_json(st.path(index.INDEX, index.RETENTION_STATE)).get("kept_from")
    except (FileNotFoundError, ValueError, UnicodeDecodeError, AttributeError):
        return None
    return v if isinstance(v, int | float) else None


DAMAGED = "_damaged.json"  # index/_damaged.json: {rel: recorded sha256 or ""} found corrupt


def _marker(st: Storage) -> dict[str, str]:
    try:
        m = st.read_json(st.path(index.INDEX, DAMAGED))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return {}
    return {k: v for k, v in m.items() if isinstance(v, str)} if isinstance(m, dict) else {}


def record_damage(st: Storage, found: dict[str, str]) -> None:
    """Remember index files found with other content, so check_index (every later load, the
    recovery sensor) reports them until a rebuild replaces them."""
    st.write_json_atomic(st.path(index.INDEX, DAMAGED), {**_marker(st), **found})


def _prune_marker(st: Storage, files: dict[str, index.IndexFile]) -> None:
    """Forget marked files that a rebuild replaced (another hash recorded now, or gone)."""
    m = _marker(st)
    keep = {rel: h for rel, h in m.items() if rel in files and (files[rel].sha256 or "") == h}
    if keep != m:
        if keep:
            st.write_json_atomic(st.path(index.INDEX, DAMAGED), keep)
        else:
            st.remove(st.path(index.INDEX, DAMAGED))


def content_damage(st: Storage, files: Iterable[index.IndexFile]) -> dict[str, str]:
    """The files (rel -> recorded hash) whose bytes do not hash to the recorded SHA-256.

    Files written before hashes were recorded (sha256 None) are checked against their Hadoop
    ``.crc`` sidecar if they have one (what Spark would check when reading them), else by size only
    (check_index); a ChecksumException while reading them is the same damage (load.py).
    """
    todo = list(files)
    root = st.path(index.INDEX)

    def bad(f: index.IndexFile) -> bool:
        path = f"{root}/{f.rel}"
        try:
            if f.sha256:
                return st.sha256(path) != f.sha256
            return st.crc_matches(path) is False
        except OSError:
            return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        flags = list(pool.map(bad, todo))
    return {f.rel: f.sha256 or "" for f, b in zip(todo, flags, strict=True) if b}


def scrub(st: Storage, damage: IndexDamage, cursor: str, budget_bytes: int) -> str:
    """Hash the next index files after `cursor` (by path, wrapping) up to `budget_bytes`; add what
    differs to `damage.corrupt`; return the new cursor. The recovery sensor's rolling content
    check: a bounded cost per tick, the whole index covered over successive ticks."""
    order = sorted(damage.files)
    if not order:
        return ""
    start = next((i for i, rel in enumerate(order) if rel > cursor), 0)
    chosen: list[index.IndexFile] = []
    size = 0
    for rel in order[start:] + order[:start]:
        if chosen and size + damage.files[rel].size > budget_bytes:
            break
        chosen.append(damage.files[rel])
        size += damage.files[rel].size
    for rel in sorted(content_damage(st, chosen)):
        for t in damage.files[rel].holds:
            if rel not in damage.corrupt.get(t, []):
                damage.corrupt.setdefault(t, []).append(rel)
    return chosen[-1].rel


def check_index(st: Storage, ds: DatasetConfig, content: bool = False) -> IndexDamage:
    """Compare the index files on disk with what the commit records and compaction manifests say.

    Lists files and reads no data, unless `content` (verify): then every file is hashed too.
    """
    damage = IndexDamage()
    kept_from = _kept_from(st)
    lo = index.min_slice(ds, kept_from) if kept_from is not None else None
    committed = commits.committed_tags(st)
    compacted = [c for c in compaction.list_compacted(st) if lo is None or c.slice >= lo]
    merged = compaction.covered(compacted)
    start = to_tag(parse_key(ds.start))
    for tag in sorted(committed):
        if tag < start:  # no load writes it: a copied or misnamed file, and no rerun can replace it
            path = commits.commit_path(st, tag)
            damage.bad_records[tag] = (
                f"commit record {path} is of hour {key_of(tag)}, before the dataset's start "
                f"{ds.start}: no load writes such a record (a copied or misnamed file). Delete "
                f"{path}")
            continue
        try:
            rec = commits.read_commit(st, tag)
        except commits.CommitRecordError as e:
            damage.bad_records[tag] = str(e)
            continue
        listed = rec.index_files if rec is not None else ()
        if listed and rec is not None and rec.index_format < index.INDEX_FORMAT:
            damage.old_format.append(tag)
        for f in listed:
            if (lo is not None and f.slice < lo) or (f.slice, tag) in merged:
                continue  # deleted by retention, or merged by compaction, as intended
            entry = index.IndexFile(tag, f.slice, f.name, f.size, f.rows, sha256=f.sha256)
            damage.files[entry.rel] = entry
    for c in compacted:
        for f in c.files:
            entry = index.IndexFile(min(c.loads, default=""), c.slice, f["name"], int(f["size"]),
                                    f.get("rows"), c.dir, c.loads, f.get("sha256"))
            damage.files[entry.rel] = entry
    actual: dict[str, int] = {}
    root = st.path(index.INDEX)
    for path in st.list_files(root, ".parquet"):
        rel = path[len(root) + 1:]
        parts = rel.split("/")
        if len(parts) != 3 or not parts[0].startswith(f"{index.SLICE}="):
            continue  # staging or compaction work areas (a load reads only listed files)
        n, (kind, _, name) = index.slice_number(parts[0]), parts[1].partition("=")
        if n is None:
            actual[rel] = int(st.fs.info(path).get("size") or 0)  # reported as unexpected
            continue
        if kind == "load_hour" and (name not in committed or (n, name) in merged
                                    or name in damage.bad_records):
            continue  # leftovers of an interrupted attempt or compaction (their rerun clears them)
        actual[rel] = int(st.fs.info(path).get("size") or 0)
    for rel, f in damage.files.items():
        if actual.get(rel) != f.size:
            for t in f.holds:
                damage.missing.setdefault(t, []).append(rel)
    damage.unexpected = sorted(set(actual) - set(damage.files))
    found = {rel: h for rel, h in _marker(st).items()
             if rel in damage.files and (damage.files[rel].sha256 or "") == h}
    if content:
        found |= content_damage(st, [f for rel, f in damage.files.items()
                                     if actual.get(rel) == f.size])
    for rel in sorted(found):
        for t in damage.files[rel].holds:
            damage.corrupt.setdefault(t, []).append(rel)
    bad = {rel.rsplit("/", 1)[0] for rel in damage.unexpected}
    bad |= {f.rel.rsplit("/", 1)[0] for f in damage.files.values()
            if f.loads and (actual.get(f.rel) != f.size or f.rel in found)}
    bad |= {c.rel for c in compacted if not c.loads}
    damage.bad_compacted = sorted(d for d in bad if f"/{compaction.COMPACT}=" in f"/{d}")
    return damage


def index_file_manifest(st: Storage, tag: str, slices: list[int],
                        root: str | None = None) -> list[dict]:
    """The index files of load `tag` (name, size, rows per slice), for its commit record.

    `root` is the index directory (default) or a rebuild's staging directory of the same layout.
    """
    base = root or st.path(index.INDEX)
    out = []
    for n in slices:
        for p in st.list_files(f"{base}/{index.SLICE}={n}/load_hour={tag}", ".parquet"):
            out.append({"slice": n, "name": p.rsplit("/", 1)[1],
                        "size": int(st.fs.info(p).get("size") or 0),
                        "rows": st.parquet_rows(p), "sha256": st.sha256(p)})
    return out


@dataclass
class RebuildResult:
    loads: int
    entries: int
    seconds: float


def _staged_files(st: Storage, staging: str, tag: str) -> tuple[list[int], list[dict]]:
    slices = sorted(int(s.split("=", 1)[1]) for s in st.list_dirs(staging)
                    if s.startswith(f"{index.SLICE}=") and st.exists(f"{staging}/{s}/load_hour={tag}"))
    return slices, index_file_manifest(st, tag, slices, root=staging)


def _unique_sources(st: Storage, targets: list[str]) -> dict[str, list[str]]:
    """The unique files to rebuild each load's entries from: the ones its commit record lists.

    A rebuild from a damaged unique partition would make the damage look healthy (a removed file's
    keys gone from the index, so later loads would take them for new; a copied file's keys twice),
    so it refuses instead, naming the hour and the fix. Files nobody listed are not read. Records
    without `output_files` (earlier versions) read the partition's directory as it is.
    """
    out: dict[str, list[str]] = {}
    for tag in targets:
        part = st.path("unique", f"load_hour={tag}")
        try:
            rec = commits.read_commit(st, tag)
        except commits.CommitRecordError:
            rec = None
        problem = None
        listed = (rec.output_files or {}).get("unique") if rec is not None else None
        if not st.exists(part):
            problem = f"its unique partition {part} is missing"
        elif listed is not None:
            missing = [f.name for f in listed if not st.exists(f"{part}/{f.name}")]
            if missing:
                problem = f"{part}/{missing[0]}, listed in its commit record, is missing"
            out[tag] = [st.spark_path("unique", f"load_hour={tag}", f.name) for f in listed]
        else:
            out[tag] = [st.spark_path("unique", f"load_hour={tag}")]
        if problem:
            raise IndexDamagedError(
                f"cannot rebuild the index entries of hour {key_of(tag)}: {problem}, so its keys "
                f"are not all there to rebuild from. Rerun that hour (dedup-pipeline run --from "
                f"{key_of(tag)} --to {key_of(tag)}); if it was never loaded (a copied commit "
                f"record), delete {commits.commit_path(st, tag)}")
        if not out[tag]:
            del out[tag]  # an hour with no unique rows
    return out


def rebuild_index(spark: SparkSession, ds: DatasetConfig, tags: list[str] | None = None
                  ) -> RebuildResult:
    """Recompute index entries from unique: of the given loads, or of every committed load.

    Reads only the unique output. The caller holds the dataset lock. A full rebuild swaps the whole
    index directory in; a partial one replaces the entries of each given load.
    """
    t0 = time.perf_counter()
    st = Storage(ds.output)
    committed = sorted(commits.committed_tags(st))
    if tags is not None:  # a damaged compacted directory goes, and every load it held is rebuilt
        bad = set(check_index(st, ds).bad_compacted)
        for c in compaction.list_compacted(st):
            if c.rel not in bad and set(c.loads) & set(tags) and content_damage(st, [
                    index.IndexFile(c.loads[0], c.slice, f["name"], int(f["size"]), f.get("rows"),
                                    c.dir, c.loads, f.get("sha256")) for f in c.files]):
                bad.add(c.rel)  # remove_load would copy its other loads' damaged entries
            if c.rel in bad:
                tags = [*tags, *c.loads]
                st.remove(st.path(index.INDEX, c.rel))
    targets = committed if tags is None else sorted(set(tags) & set(committed))
    staging_name = index.INDEX + "_rebuild"
    staging = st.path(staging_name)
    st.remove(staging)
    entries = 0
    sources = _unique_sources(st, targets)
    present = sorted(sources)
    if present:
        uniq = (spark.read.option("basePath", st.spark_path("unique"))
                .parquet(*[p for t in present for p in sources[t]]))
        h1, h2 = digest_columns(ds.key, ds.source.schema)
        df = uniq.withColumn(H1, h1).withColumn(H2, h2)
        if ds.expiry is not None:
            df = df.withColumn(V, expiry_value(ds))
        if ds.fingerprint:
            df = df.withColumn(FP, fingerprint_column(ds.fingerprint, ds.source.schema))
        df = df.withColumn(index.LOAD_HOUR, F.col("load_hour"))
        cols = [f.name for f in index.entry_schema(ds).fields]
        df = df.select(*cols, index.slice_of(ds).alias(index.SLICE), "load_hour")
        (df.repartition(index.SLICE, "load_hour").sortWithinPartitions(H1)
         .write.mode("overwrite").partitionBy(index.SLICE, "load_hour")
         .parquet(st.spark_path(staging_name)))
        entries = spark.read.parquet(st.spark_path(staging_name)).count()
    st.makedirs(staging)
    for tag in targets:
        slices, files = _staged_files(st, staging, tag)
        if tags is not None:  # partial: replace this load's entries in place
            index.clear_load(st, tag)
            compaction.remove_load(spark, ds, st, tag)
            for n in slices:
                st.move(f"{staging}/{index.SLICE}={n}/load_hour={tag}",
                        st.path(index.INDEX, f"{index.SLICE}={n}", f"load_hour={tag}"))
        try:
            rec = commits.read_commit(st, tag)
        except commits.CommitRecordError:
            rec = None  # only a rerun of that hour restores its record; its files stay unlisted
        if rec is not None:
            commits.write_commit(st, rec.with_(
                index_files=tuple(commits.IndexFileEntry.from_json(f) for f in files),
                index_format=index.INDEX_FORMAT, index_slices_written=tuple(slices)))
    if tags is None:
        st.replace_dir(staging, st.path(index.INDEX))
    else:
        st.remove(staging)
    _prune_marker(st, check_index(st, ds).files)
    return RebuildResult(len(targets), entries, round(time.perf_counter() - t0, 3))


class IndexDamagedError(RuntimeError):
    """The index disagrees with the commit records; loads refuse to run on it (R12)."""


def ensure_healthy(spark: SparkSession, ds: DatasetConfig, st: Storage,
                   say: object = None, rerun: str | None = None) -> IndexDamage:
    """Fail (or rebuild, with `on_damaged_index: rebuild`) when the index is damaged.

    `rerun`: the load about to be (re)done. Only damaged commit records of earlier hours stop it
    (their entries and expiry point are what it reads); its own record is what the rerun repairs,
    and a later hour's does not affect it, so that hour's own rerun stays reachable (issue 22
    acceptance: a damaged record of hour 09 with 05-08 not loaded blocked every load, its fix
    "rerun 09" was refused by the load order rule).
    """
    damage = check_index(st, ds)
    records = {t: m for t, m in damage.bad_records.items() if rerun is None or t < rerun}
    if records:
        first = sorted(records)[0]
        more = f" ({len(records) - 1} more damaged record(s))" if len(records) > 1 else ""
        raise IndexDamagedError(f"dataset {ds.name!r}: {records[first]}{more}")
    if damage.index_ok:
        return damage
    if ds.on_damaged_index == "rebuild":
        if callable(say):
            say(f"{ds.name}: {damage.summary()}; rebuilding the index from unique")
        rebuild_index(spark, ds, damage.damaged_loads)
        return check_index(st, ds)  # the rebuilt files: what the load will read
    raise IndexDamagedError(damaged_message(ds, damage.summary()))


def damaged_message(ds: DatasetConfig, what: str) -> str:
    return (f"dataset {ds.name!r}: the key index is damaged ({what}); loads will not run "
            f"on it. Rebuild it from unique: dedup-pipeline rebuild-index --config <file> "
            f"--dataset {ds.name} (or launch the {ds.name}_index_rebuild job; or set "
            "on_damaged_index: rebuild)")


_CHECKSUM_PATH = re.compile(r"(slice=-?\d+/(?:load_hour|compact)=[^/\s]+/[^/\s]+?\.parquet)")


def checksum_failure(error: BaseException) -> str | None:
    """The index file (path below index/) a Hadoop ChecksumException names, if `error` is one."""
    text = str(error)
    if "ChecksumException" not in text:
        return None
    m = (_CHECKSUM_PATH.search(text[text.index("ChecksumException"):])
         or _CHECKSUM_PATH.search(text))
    return m.group(1) if m else None


def ensure_intact(spark: SparkSession, ds: DatasetConfig, st: Storage, files: list[index.IndexFile],
                  say: Callable[[str], None] | None = None, rerun: str | None = None) -> bool:
    """Hash the files a load is about to probe; on damage record it, then fail or rebuild.

    Returns True if damaged loads were rebuilt (the caller must take the new file list).
    """
    found = content_damage(st, files)
    if not found:
        return False
    record_damage(st, found)
    ensure_healthy(spark, ds, st, say, rerun)  # raises, or rebuilds the damaged loads
    return True
