"""Rebuild the key index from the unique output (SPEC R12, K3), and detect a damaged index cheaply.

The index is derived data: every entry is a function of one unique row (digest of its key, its
expiry value, its fingerprint) and the load hour of its partition. So a rebuild reads only unique
(never the raw batches), recomputes the entries of every committed load in one Spark job, writes
them in the usual layout to a staging directory and swaps the whole index in. Entries equal the
ones the loads wrote, so every later load gives exactly the results it would have given had the
index never been lost.

Damage detection reads no data: each commit record lists the index files its load wrote, with
sizes; a committed load whose files are missing, have another size, or are joined by files nobody
committed is damaged (slices deleted by retention excepted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import commits, compaction, index
from dedup_pipeline.engine.digest import FP, H1, H2, digest_columns, fingerprint_column
from dedup_pipeline.engine.parse import V, expiry_value
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import key_of


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

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unexpected and not self.old_format

    @property
    def damaged_loads(self) -> list[str]:
        """Loads whose entries must be rebuilt: missing/changed files or stray files in their dirs."""
        strays = {rel.split("/")[1].split("=", 1)[1] for rel in self.unexpected
                  if rel.split("/")[1].startswith("load_hour=")}
        return sorted(set(self.missing) | strays | set(self.old_format))

    def summary(self) -> str:
        parts = []
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
    try:
        return st.read_json(st.path(index.INDEX, index.RETENTION_STATE)).get("kept_from")
    except FileNotFoundError:
        return None


def check_index(st: Storage, ds: DatasetConfig) -> IndexDamage:
    """Compare the index files on disk with what the commit records and compaction manifests say."""
    damage = IndexDamage()
    kept_from = _kept_from(st)
    lo = index.min_slice(ds, kept_from) if kept_from is not None else None
    committed = commits.committed_tags(st)
    compacted = [c for c in compaction.list_compacted(st) if lo is None or c.slice >= lo]
    merged = compaction.covered(compacted)
    for tag in sorted(committed):
        rec = commits.read_commit(st, tag) or {}
        if rec.get("index_files") and rec.get("index_format", 1) < index.INDEX_FORMAT:
            damage.old_format.append(tag)
        for f in rec.get("index_files", []):
            if (lo is not None and f["slice"] < lo) or (f["slice"], tag) in merged:
                continue  # deleted by retention, or merged by compaction, as intended
            entry = index.IndexFile(tag, int(f["slice"]), f["name"], int(f["size"]), f.get("rows"))
            damage.files[entry.rel] = entry
    for c in compacted:
        for f in c.files:
            entry = index.IndexFile(min(c.loads, default=""), c.slice, f["name"], int(f["size"]),
                                    f.get("rows"), c.dir, c.loads)
            damage.files[entry.rel] = entry
    actual: dict[str, int] = {}
    root = st.path(index.INDEX)
    for path in st.list_files(root, ".parquet"):
        rel = path[len(root) + 1:]
        parts = rel.split("/")
        if len(parts) != 3 or not parts[0].startswith(f"{index.SLICE}="):
            continue  # staging or compaction work areas
        n, (kind, _, name) = int(parts[0].split("=", 1)[1]), parts[1].partition("=")
        if kind == "load_hour" and (name not in committed or (n, name) in merged):
            continue  # leftovers of an interrupted attempt or compaction (their rerun clears them)
        actual[rel] = int(st.fs.info(path).get("size") or 0)
    for rel, f in damage.files.items():
        if actual.get(rel) != f.size:
            for t in f.holds:
                damage.missing.setdefault(t, []).append(rel)
    damage.unexpected = sorted(set(actual) - set(damage.files))
    bad = {rel.rsplit("/", 1)[0] for rel in damage.unexpected}
    bad |= {f.rel.rsplit("/", 1)[0] for f in damage.files.values()
            if f.loads and actual.get(f.rel) != f.size}
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
                        "rows": st.parquet_rows(p)})
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
            if c.rel in bad:
                tags = [*tags, *c.loads]
                st.remove(st.path(index.INDEX, c.rel))
    targets = committed if tags is None else sorted(set(tags) & set(committed))
    staging_name = index.INDEX + "_rebuild"
    staging = st.path(staging_name)
    st.remove(staging)
    entries = 0
    present = [t for t in targets if st.exists(st.path("unique", f"load_hour={t}"))]
    if present:
        uniq = (spark.read.option("basePath", st.spark_path("unique"))
                .parquet(*[st.spark_path("unique", f"load_hour={t}") for t in present]))
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
        rec = commits.read_commit(st, tag)
        if rec is not None:
            rec["index_files"] = files
            rec["index_format"] = index.INDEX_FORMAT
            rec["index_slices_written"] = slices
            commits.write_commit(st, tag, rec)
    if tags is None:
        st.replace_dir(staging, st.path(index.INDEX))
    else:
        st.remove(staging)
    return RebuildResult(len(targets), entries, round(time.perf_counter() - t0, 3))


class IndexDamagedError(RuntimeError):
    """The index disagrees with the commit records; loads refuse to run on it (R12)."""


def ensure_healthy(spark: SparkSession, ds: DatasetConfig, st: Storage,
                   say: object = None) -> IndexDamage:
    """Fail (or rebuild, with `on_damaged_index: rebuild`) when the index is damaged."""
    damage = check_index(st, ds)
    if damage.ok:
        return damage
    if ds.on_damaged_index == "rebuild":
        if callable(say):
            say(f"{ds.name}: {damage.summary()}; rebuilding the index from unique")
        rebuild_index(spark, ds, damage.damaged_loads)
        return check_index(st, ds)  # the rebuilt files: what the load will read
    raise IndexDamagedError(
        f"dataset {ds.name!r}: the key index is damaged ({damage.summary()}); loads will not run "
        f"on it. Rebuild it from unique: dedup-pipeline rebuild-index --config <file> "
        f"--dataset {ds.name} (or launch the {ds.name}_index_rebuild job; or set "
        "on_damaged_index: rebuild)"
    )
