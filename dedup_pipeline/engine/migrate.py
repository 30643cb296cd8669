"""Migrate a dataset to a new contract: re-derive its index from `unique` under the config as it
is now, in one committed step (docs/design.md, "The dataset contract").

The outputs are not rewritten: every hour keeps the rows it was loaded with, and its commit record
the contract version it was loaded under. What a breaking change invalidates is the index (digests
of another key, another layout, fingerprints of other columns), and the index is derived data: a
function of the unique rows (`rebuild.rebuild_index`). So a migration

1. refuses, writing nothing, if `unique` holds rows that are duplicates under the new contract
   (a narrowed key, a longer window): the index under the new key would hold a key twice and
   history would contradict the new rule. It reports how many and a sample. Moving the later
   copies to `duplicates` would rewrite the outputs of past hours; it is not offered: revert the
   change, or load the landing history again under the new config into a new output;
2. refuses if a unique file a commit record lists is missing (the rebuild would drop its keys);
3. writes the new contract version, marked as a migration (atomic, fsynced): the COMMIT POINT.
   Before it the dataset is fully old; from it on every path (load, rebuild, verify) refuses with
   "finish the migration" until step 4 is done, so nothing runs on a half-migrated index;
4. rebuilds the whole index under the new contract (a staging directory swapped in, records
   updated: `rebuild_index`), then writes ``v000N.done``. Running migrate again after a crash in
   step 4 redoes step 4 (it is idempotent: entries are a function of unique).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract, lake
from dedup_pipeline.engine.core import hooks
from dedup_pipeline.engine.core.columns import EXPIRY_POINT, H1, H2, LOAD_HOUR_PARTITION, V
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord, OutputFileEntry
from dedup_pipeline.engine.core.digest import digest_columns
from dedup_pipeline.engine.core.expiry import (
    X_COL,
    expiry_point_column,
    expiry_points,
    expiry_value,
    hour_maxima,
    is_live,
    latest_point,
)
from dedup_pipeline.engine.core.index.rebuild import rebuild_index, unique_sources
from dedup_pipeline.engine.core.outputs import (
    DUPLICATES,
    EXPIRED,
    OUTPUTS,
    UNIQUE,
    columns,
    partition,
    write_options,
)
from dedup_pipeline.engine.core.storage import ROWS_PER_FILE, TMP, Storage, glob_escape, place_files
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import HOUR, format_hour, format_tag, now_stamp, parse_hour

SAMPLE = 5


class MigrationRefusedError(UserError, RuntimeError):
    """The history cannot be migrated as it is (duplicates under the new contract)."""

    stage = "the migration's duplicate check"
    fix = "nothing was written; see the error for the rows and the choices"


@dataclass(frozen=True)
class MigrateResult:
    dataset: str
    from_version: int | None
    to_version: int | None  # None: nothing to migrate
    changes: tuple[str, ...]
    loads: int = 0
    entries: int = 0
    seconds: float = 0.0
    rewritten: int = 0  # output files written again under the contract's columns

    def summary(self) -> str:
        if self.to_version is None and self.rewritten:
            return (f"{self.dataset}: the config matches contract v{self.from_version}; "
                    f"{self.rewritten} output file(s) written again under its columns")
        if self.to_version is None:
            return (f"{self.dataset}: nothing to migrate: the config matches contract "
                    f"v{self.from_version}" if self.from_version else
                    f"{self.dataset}: nothing to migrate: no hour is loaded")
        return (f"{self.dataset}: migrated to contract v{self.to_version} "
                f"({'; '.join(self.changes)}); index re-derived from unique: {self.entries} "
                f"entries of {self.loads} hour(s) in {self.seconds:.1f}s")


class Reader:
    """The committed outputs as the new contract reads them: exactly the files each hour's commit
    record lists (never a directory: a rerun's replaced files are not rows), each column under
    its new name and type (a renamed column by its old name, a retyped one cast as Spark casts,
    `_expiry_point` of another type from the hour's recorded expiry point)."""

    def __init__(self, spark: SparkSession, ds: DatasetConfig, st: Storage,
                 records: dict[str, CommitRecord], old: contract.Terms | None) -> None:
        self.spark, self.ds, self.st, self.records = spark, ds, st, records
        self.renames = _renames(old, ds)
        self.xs = {t: r.expiry_point for t, r in records.items()}

    def files(self, name: str) -> dict[str, list[str]]:
        return {t: [self.st.path(name, rel) for rel in lake.record_files(self.st, name, r)]
                for t, r in sorted(self.records.items())}

    def stale(self, name: str) -> dict[str, list[str]]:
        """Per hour, the listed files whose columns are not the new contract's (to rewrite)."""
        target = lake.arrow_schema(self.ds, name)
        out: dict[str, list[str]] = {}
        for tag, paths in self.files(name).items():
            for p in paths:
                sch = self.st.parquet_schema(p)
                if any(f.name not in target.names or target.field(f.name).type != f.type
                       for f in sch):
                    out.setdefault(tag, []).append(p)
        return out

    def _read(self, name: str, paths: list[str]) -> DataFrame:
        return (self.spark.read.option("basePath", self.st.spark_path(name))
                .option("mergeSchema", "true")
                .parquet(*[glob_escape(self.st.to_uri(p)) for p in paths]))

    def converted(self, name: str, paths: list[str]) -> tuple[DataFrame, Column]:
        """The rows of `paths` in the new contract's columns, and a count of the values a cast
        turned into null (a migration that would lose them is refused)."""
        df = self._read(name, paths)
        have = dict(df.dtypes)
        back = {new: old for old, new in self.renames.items()}
        cols, lost = [], F.lit(0)
        for c, typ in columns(self.ds, name):
            src = back.get(c, c) if back.get(c, c) in have else None
            if src is None:
                cols.append(F.lit(None).cast(typ).alias(c))
            elif c == EXPIRY_POINT and have[src] != typ:
                if self.xs:
                    x_df = self.spark.createDataFrame(
                        [(t, float(x) if x is not None else None) for t, x in self.xs.items()],
                        f"{LOAD_HOUR_PARTITION} string, {X_COL} double")
                    df = df.join(F.broadcast(x_df), LOAD_HOUR_PARTITION, "left")
                    xv = F.col(X_COL) if self.ds.expiry_type == "double" else \
                        F.col(X_COL).cast("long")
                    cols.append(F.when(F.col(src).isNotNull(),
                                       expiry_point_column(self.ds, xv)).alias(c))
                else:
                    cols.append(F.lit(None).cast(typ).alias(c))
            elif have[src] != typ:
                cast = F.col(src).cast(typ)
                cols.append(cast.alias(c))
                lost = lost + F.count_if(F.col(src).isNotNull() & cast.isNull())
            else:
                cols.append(F.col(src).alias(c))
        return df.select(*cols, LOAD_HOUR_PARTITION), lost

    def frame(self, name: str) -> DataFrame | None:
        """Every committed row of output `name` under the new contract."""
        files = self.files(name)
        stale = self.stale(name)
        fresh = [p for t, ps in files.items() for p in ps if p not in set(stale.get(t, ()))]
        parts = []
        if fresh:
            df = self._read(name, fresh)
            parts.append(df.select(*[F.col(c) if c in df.columns else F.lit(None).cast(t).alias(c)
                                     for c, t in columns(self.ds, name)], LOAD_HOUR_PARTITION))
        old = [p for ps in stale.values() for p in ps]
        if old:
            parts.append(self.converted(name, old)[0])
        if not parts:
            return None
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out


def _renames(old: contract.Terms | None, ds: DatasetConfig) -> dict[str, str]:
    """Old column -> new column: columns only the old schema has, paired in order with columns
    only the new one has, of the same type."""
    if old is None:
        return {}
    new = ds.source.schema
    olds = [(c, t) for c, t in old.schema_ if c not in new]
    news = [(c, t) for c, t in new.items() if c not in dict(old.schema_)]
    return {o: n for (o, ot), (n, nt) in zip(olds, news, strict=False) if ot == nt}


def lossy_casts(reader: Reader) -> list[str]:
    """Per output, the values of retyped columns that do not cast (would become null)."""
    out = []
    for name in OUTPUTS:
        old = [p for ps in reader.stale(name).values() for p in ps]
        if not old:
            continue
        _df, lost = reader.converted(name, old)
        n = _df.agg(lost.alias("n")).collect()[0]["n"] if not isinstance(lost, int) else 0
        if n:
            out.append(f"{n} value(s) of {name}")
    return out


def latest_points(reader: Reader, committed: list[str]) -> dict[str, int | float | None] | None:
    """L_H of every committed hour under the new expiry terms (basis event): the running max of
    the new expiry value over the non-rejected rows of the hours up to it."""
    ds = reader.ds
    if ds.expiry is None:
        return None
    maxima = hour_maxima(ds, (reader.frame(n) for n in (UNIQUE, DUPLICATES, EXPIRED)), LOAD_HOUR_PARTITION)
    out: dict[str, int | float | None] = {}
    latest = None
    for tag in committed:
        latest = latest_point(ds, parse_hour(tag), latest, maxima.get(tag))
        out[tag] = latest
    return out


def rewrite_outputs(reader: Reader, say: Callable[[str], None]) -> int:
    """After the commit point: every listed file whose columns are not the new contract's is
    written again under them (beside the old one, which table versions before keep reading), the
    hours' records list the new files, and each table gets one overwrite commit. Idempotent: a
    second run finds nothing stale. Returns the files written."""
    st, ds = reader.st, reader.ds
    new_files: dict[str, dict[str, tuple[OutputFileEntry, ...]]] = {}
    old_paths: list[str] = []
    for name in OUTPUTS:
        stale = reader.stale(name)
        if not stale:
            continue
        paths = [p for ps in stale.values() for p in ps]
        df, _lost = reader.converted(name, paths)
        tmp = st.path(TMP, f"migrate-{uuid.uuid4().hex[:12]}", name)
        rows = sum(reader.records[t].rows_in for t in stale)
        (df.write.mode("overwrite").partitionBy(LOAD_HOUR_PARTITION)
         .option("maxRecordsPerFile", ROWS_PER_FILE)
         .options(**write_options(ds, name, max(rows, 1)))
         .parquet(st.to_uri(tmp)))
        for tag in stale:
            target = st.path(*partition(name, tag))
            src = f"{tmp}/{LOAD_HOUR_PARTITION}={tag}"
            placed = place_files(st, src, target) if st.exists(src) else []
            for f in placed:
                st.sync_tree(f)
            rec = reader.records[tag]
            keep = [f for f in rec.output_files.get(name, ())
                    if st.path(*partition(name, tag), f.name) not in set(stale[tag])]
            new_files.setdefault(tag, {})[name] = tuple(keep) + tuple(
                OutputFileEntry(name=p.rsplit("/", 1)[1], size=int(st.fs.info(p)["size"]))
                for p in placed)
        st.remove(tmp.rsplit("/", 1)[0])
        old_paths += paths
    log = CommitLog(st)
    for tag, outs in sorted(new_files.items()):
        rec = reader.records[tag]
        lake.mark_pending(st, ds, tag)
        rec = rec.with_(output_files={**(rec.output_files or {}), **outs},
                        publish_token=lake.new_token(lake.record_token(rec))
                        if lake.enabled(ds) else rec.publish_token)
        log.write(rec)
        reader.records[tag] = rec
    if new_files:
        log.save_summary()
        say(f"{ds.name}: {sum(len(v) for o in new_files.values() for v in o.values())} output "
            f"file(s) of {len(new_files)} hour(s) written again under the new contract's columns")
    lake.overwrite(st, ds, reader.records, say)
    if not lake.enabled(ds):  # plain directories: the old files would be read beside the new
        for p in old_paths:
            st.remove(p)
    return sum(len(v) for o in new_files.values() for v in o.values())


def duplicates_under(spark: SparkSession, ds: DatasetConfig, reader: Reader,
                     committed: list[str]) -> tuple[int, list[str]]:
    """Rows of unique that the new contract makes duplicates of an earlier unique row: how many,
    and a sample (key values and both hours). Keys compare by their digest, as the index does."""
    uniq = reader.frame(UNIQUE)
    if uniq is None:
        return 0, []
    h1, h2 = digest_columns(ds.key, ds.source.schema)
    u = uniq.withColumns({H1: h1, H2: h2})
    w = Window.partitionBy(H1, H2).orderBy(LOAD_HOUR_PARTITION)
    u = u.withColumn("_prev_hour", F.lag(LOAD_HOUR_PARTITION).over(w))
    if ds.expiry is None:
        bad = u.filter(F.col("_prev_hour").isNotNull())
    else:
        xs = expiry_points(ds, (reader.frame(n) for n in (UNIQUE, DUPLICATES, EXPIRED)),
                           committed)
        x_df = spark.createDataFrame([(t, float(x) if x is not None else None)
                                      for t, x in xs.items()],
                                      f"{LOAD_HOUR_PARTITION} string, {X_COL} double")
        u = u.withColumn(V, expiry_value(ds)).withColumn("_prev_v", F.lag(V).over(w))
        u = u.join(F.broadcast(x_df), LOAD_HOUR_PARTITION)
        bad = u.filter(F.col("_prev_v").isNotNull()
                       & is_live(F.col("_prev_v"), F.col(X_COL)))
    bad = bad.select(*ds.key, LOAD_HOUR_PARTITION, "_prev_hour").persist()
    try:
        n = bad.count()
        rows = bad.orderBy(LOAD_HOUR_PARTITION, *ds.key).limit(SAMPLE).collect() if n else []
    finally:
        bad.unpersist()
    sample = [", ".join(f"{k}={r[k]!r}" for k in ds.key) + f" unique in {format_tag(r['_prev_hour'])} "
              f"and {format_tag(r[LOAD_HOUR_PARTITION])}" for r in rows]
    return n, sample


def migrate(spark: SparkSession, ds: DatasetConfig,
            say: Callable[[str], None] | None = None) -> MigrateResult:
    """Migrate the dataset to the contract of `ds`. The caller holds the dataset lock."""
    say = say or (lambda _m: None)
    t0 = time.perf_counter()
    st = Storage(ds.output)
    log = CommitLog(st)
    committed = sorted(log.committed())
    last = committed[-1] if committed else None
    hist = contract.read_history(st, last, other_formats=True)
    replaced = hist.other_formats  # versions of another format: the current config replaces all
    if replaced:
        say(f"{ds.name}: {len(replaced)} contract version(s) of another format, e.g. {replaced[0]}: "
            "the current config is recorded as the contract of the history")
        hist = contract.History((), frozenset())
    terms = contract.Terms.of(ds)
    target = hist.pending
    if target is not None:
        if target.terms != terms:
            raise contract.ContractError(
                f"contract error: dataset {ds.name!r}: the migration to contract "
                f"v{target.version} did not finish, and the config now differs from what it "
                f"migrates to; set the config back to it ({contract.contract_path(st, target.version)}"
                f") and run migrate again")
        say(f"{ds.name}: finishing the migration to contract v{target.version}")
        prior = hist.version(target.migration.from_version) if target.migration else None
        reader = Reader(spark, ds, st, _records(log, committed),
                        prior.terms if prior is not None else None)
    else:
        cur = hist.current
        if cur is not None and cur.terms == terms:
            # outputs a migration before rewrites left in the old columns are rewritten now
            prior = hist.version(cur.migration.from_version) if cur.migration else None
            rewritten = rewrite_outputs(Reader(spark, ds, st, _records(log, committed),
                                               prior.terms if prior else None), say)
            return MigrateResult(ds.name, cur.version, None, (), rewritten=rewritten)
        if not committed and cur is None:
            if replaced:  # nothing loaded: the first load records the contract
                st.remove(st.path(contract.CONTRACT))
            return MigrateResult(ds.name, None, None, ())
        # the tables first agree with the records (a publish a crash cut short)
        lake.repair_pending(st, ds, say)
        if cur is not None:
            changes = tuple(c.describe() for c in contract.compare(
                cur.terms, terms, expiry_kind=ds.expiry_type, window_held=False))
        else:
            changes = ("the current config recorded as the contract of the history",)
        say(f"{ds.name}: migrating {len(committed)} hour(s) to a new contract: "
            f"{'; '.join(changes)}; checking unique for duplicates under it")
        reader = Reader(spark, ds, st, _records(log, committed),
                        cur.terms if cur is not None else None)
        lost = lossy_casts(reader)
        if lost:
            raise MigrationRefusedError(
                f"migrate refused: dataset {ds.name!r}: {', '.join(lost)} do not cast to the new "
                f"type ({'; '.join(changes)}); nothing was written. Keep the old type, or load "
                "the landing history again under the new config into a new output")
        n, sample = duplicates_under(spark, ds, reader, committed)
        if n:
            raise MigrationRefusedError(
                f"migrate refused: dataset {ds.name!r}: {n} row(s) of unique are duplicates of "
                f"earlier unique rows under the new contract ({'; '.join(changes)}), e.g. "
                f"{' | '.join(sample)}; nothing was written. Keep the old config, or load the "
                f"landing history again under the new config into a new output")
        unique_sources(st, committed)  # every listed unique file is there to rebuild from
        nxt = format_hour(parse_hour(format_tag(last)) + HOUR) if last else ds.start
        target = contract.Contract(
            dataset=ds.name, version=(cur.version + 1) if cur else 1, effective_from=nxt,
            recorded_at=now_stamp(),
            migration=contract.Migration(from_version=cur.version if cur else None,
                                         changes=changes,
                                         latest_points=latest_points(reader, committed)),
            terms=terms)
        hooks.at("migrate_before_contract")
        if replaced:
            st.remove(st.path(contract.CONTRACT))
        # the commit point: from here on the dataset is under the new contract
        st.write_json_atomic(contract.contract_path(st, target.version), target.to_json())
        hooks.at("migrate_after_contract")
    # the outputs' files and tables under the new columns (idempotent), then the index
    rewrite_outputs(reader, say)
    res = rebuild_index(spark, ds, None)
    hooks.at("migrate_before_done")
    st.write_json_atomic(contract.done_path(st, target.version),
                         {"finished_at": now_stamp(),
                          "loads": res.loads, "entries": res.entries})
    assert target.migration is not None
    return MigrateResult(ds.name, target.migration.from_version, target.version,
                         target.migration.changes, res.loads, res.entries,
                         round(time.perf_counter() - t0, 3))


def _records(log: CommitLog, committed: list[str]) -> dict[str, CommitRecord]:
    out = {}
    for tag in committed:
        rec = log.read(tag)
        if rec is not None:
            out[tag] = rec
    return out
