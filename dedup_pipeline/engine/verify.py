"""Recheck a dataset from its files alone, trusting neither the index nor the counts (design.md K4).

- Landing content: every committed hour's landing files are the ones its load read (the commit
  record's inputs: path, size, SHA-256 of the content); a file added, removed or changed since is
  reported with the reload that takes it into account (that hour through the latest loaded one).
- Conservation (R8): for every committed hour whose landing files are unchanged, the records in
  them (counted afresh) equal unique + duplicates + expired + rejected rows of that hour.
- Uniqueness (R4, R6): no key has two unique rows unless the earlier one had expired by the later
  one's load; X_H is recomputed from the outputs (running max of the expiry value over non-rejected
  rows), not read from commit records. Without expiry, no key is in unique twice.
- Completeness: every committed hour has all four output partitions; output partitions of hours
  that are not committed (an interrupted load) are violations.
- The warehouse's own state, never crashing on it: commit records that do not parse,
  files or directories inside partitions that no load writes, Parquet files that cannot be read,
  files missing from or added to what the commit record lists (a duplicated file), and the index:
  every index file hashed against the hash recorded when it was written (`check_index(content=
  True)`). Each is reported with its path and hour.
- The dataset contract (engine/contract.py): a config that breaks it is refused (`ContractError`)
  before anything is read; each hour's expiry points are recomputed under the contract version its
  commit record names.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract, keydigest, lake
from dedup_pipeline.engine.core import commits, landing
from dedup_pipeline.engine.core.columns import LOAD_HOUR_PARTITION, PARTITION, V
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.expiry import X_COL, expiry_points, expiry_value, is_live
from dedup_pipeline.engine.core.formats import rebuild_command
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.index import health, layout
from dedup_pipeline.engine.core.lock import Lock
from dedup_pipeline.engine.core.outputs import DUPLICATES, EXPIRED, OUTPUTS, UNIQUE
from dedup_pipeline.engine.core.parse import (
    BatchPlan,
    failed_file,
    list_input_files,
    plan_batch,
    read_text_batch,
)
from dedup_pipeline.engine.core.storage import Storage, glob_escape, is_hidden
from dedup_pipeline.hours import format_hour, is_tag, parse_hour, to_tag


@dataclass
class VerifyReport:
    dataset: str
    hours_checked: int = 0
    rows_in: int = 0
    rows_out: int = 0
    violations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bad_hours: set[str] = field(default_factory=set)
    contracts: dict[str, list[str]] = field(default_factory=dict)  # "v1" / "unknown" -> hours

    @property
    def ok(self) -> bool:
        return not self.violations


def _landing_count(spark: SparkSession, ds: DatasetConfig, tag: str) -> int:
    """Records in the hour's landing files, listed and read exactly as the load reads them.

    An unreadable file counts as the one `rejected` row the load makes of it (R8).
    """
    plan = plan_batch(ds, list_input_files(ds, parse_hour(tag)))
    while True:
        try:
            return read_text_batch(spark, ds, plan).count()
        except Exception as e:  # noqa: BLE001 - the same read failures the load absorbs
            bad = failed_file(e, plan)
            if bad is None:
                raise
            plan = plan.without(bad)


# Hours whose landing files one Spark job counts: a union of that many reads is still a plan
# Spark analyses in well under a second; a year of hours is 53 jobs instead of 8,760.
COUNT_CHUNK = 168


def _landing_counts(spark: SparkSession, ds: DatasetConfig,
                    tags: list[str]) -> dict[str, int | Exception]:
    """`_landing_count` of many hours in one Spark job per `COUNT_CHUNK` hours.

    Each hour is read exactly as `_landing_count` reads it (its own plan, tagged with its hour)
    and the union is counted by hour. A chunk whose job fails (a file Spark cannot read, which
    the load rejects) is counted hour by hour instead, with the load's handling of such files;
    what still fails is returned as the exception, for the caller to report.
    """
    out: dict[str, int | Exception] = {}
    plans: dict[str, BatchPlan] = {}
    for tag in tags:
        try:
            plans[tag] = plan_batch(ds, list_input_files(ds, parse_hour(tag)))
        except Exception as e:  # noqa: BLE001 - reported per hour, never raised
            out[tag] = e
    todo = sorted(plans)
    for i in range(0, len(todo), COUNT_CHUNK):
        chunk = todo[i:i + COUNT_CHUNK]
        try:
            frames = [read_text_batch(spark, ds, plans[t]).select(F.lit(t).alias("_tag"))
                      for t in chunk]
            union = functools.reduce(DataFrame.union, frames)
            got = {r["_tag"]: int(r["n"]) for r in
                   union.groupBy("_tag").agg(F.count(F.lit(1)).alias("n")).collect()}
            out.update({t: got.get(t, 0) for t in chunk})
        except Exception:  # noqa: BLE001 - hour by hour, as the load reads each
            for t in chunk:
                try:
                    out[t] = _landing_count(spark, ds, t)
                except Exception as e:  # noqa: BLE001 - reported per hour
                    out[t] = e
    return out


@dataclass
class _Output:
    """What one output directory holds: readable Parquet files per hour, their rows."""

    files: dict[str, list[str]] = field(default_factory=dict)  # tag -> readable parquet paths
    rows: dict[str, int] = field(default_factory=dict)  # tag -> rows (footers)


def _hour(tag: str) -> str:
    try:
        return format_hour(parse_hour(tag))
    except ValueError:
        return tag


def _scan(st: Storage, name: str, rep: VerifyReport,
          records: dict[str, commits.CommitRecord | None],
          replaced: frozenset[str] = frozenset()) -> _Output:
    """List an output directory file by file; report what no load writes; read the footers.

    `replaced` (Delta tables): files (relative to the output) a rerun's table commit removed,
    kept for readers of older table versions until `vacuum`: skipped, not violations."""
    out = _Output()
    base = st.path(name)
    try:
        entries = st.fs.ls(base, detail=True)
    except FileNotFoundError:
        return out
    for e in sorted(entries, key=lambda e: e["name"]):
        entry = os.path.basename(e["name"].rstrip("/"))
        if is_hidden(entry):
            continue
        if e["type"] != "directory" or not entry.startswith(PARTITION):
            rep.violations.append(f"{name}/{entry}: unexpected {e['type']} in the {name} output "
                                  "(no load writes it; remove it)")
            continue
        tag = entry.split("=", 1)[1]
        out.files[tag], out.rows[tag] = [], 0
        rec = records.get(tag)
        listed = {f.name for f in rec.output_files.get(name, ())} if rec else None
        seen = set()
        for f in sorted(st.fs.ls(e["name"], detail=True), key=lambda f: f["name"]):
            fname = os.path.basename(f["name"].rstrip("/"))
            where = f"{name}/{entry}/{fname}"
            if is_hidden(fname):
                continue
            if f["type"] == "directory" or not fname.endswith(".parquet"):
                rep.violations.append(f"{_hour(tag)}: unexpected {f['type']} {where} inside a "
                                      "partition (no load writes it; remove it)")
                rep.bad_hours.add(tag)
                continue
            if listed is not None and fname not in listed and f"{entry}/{fname}" in replaced:
                continue
            if listed is not None and fname not in listed:
                rep.violations.append(f"{_hour(tag)}: {where} is not among the files the hour's "
                                      "commit record lists (a copied or added file; remove it)")
                rep.bad_hours.add(tag)
            seen.add(fname)
            try:
                with st.fs.open(f["name"], "rb") as fh:
                    n = pq.ParquetFile(fh).metadata.num_rows
            except Exception as err:  # noqa: BLE001 - any unreadable file is reported, not raised
                rep.violations.append(f"{_hour(tag)}: {where} is not readable Parquet "
                                      f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
                                      "rerun that hour")
                rep.bad_hours.add(tag)
                continue
            out.files[tag].append(f["name"])
            out.rows[tag] += n
        for fname in sorted((listed or set()) - seen):
            rep.violations.append(f"{_hour(tag)}: {name}/{entry}/{fname}, listed in the hour's "
                                  "commit record, is missing; rerun that hour")
            rep.bad_hours.add(tag)
    return out


def _frame(spark: SparkSession, st: Storage, name: str, scan: _Output) -> DataFrame | None:
    files = [glob_escape(st.to_uri(p)) for fs in scan.files.values() for p in fs]
    if not files:
        return None
    return spark.read.option("basePath", st.spark_path(name)).parquet(*files)


def _check_records(st: Storage, ds: DatasetConfig, rep: VerifyReport,
                   committed: list[str]) -> dict[str, commits.CommitRecord | None]:
    try:
        names = sorted(os.path.basename(n.rstrip("/"))
                       for n in st.fs.ls(st.path(commits.COMMITS), detail=False))
    except FileNotFoundError:
        names = []
    for name in names:
        tag = name[len(commits.PREFIX):-len(".json")] if name.endswith(".json") else ""
        if not is_hidden(name) and not (name.startswith(commits.PREFIX)
                                                     and is_tag(tag)):
            rep.violations.append(f"{commits.COMMITS}/{name}: unexpected file among the commit "
                                  "records (not a record of any hour; remove it)")
    records: dict[str, commits.CommitRecord | None] = {}
    start, log = to_tag(parse_hour(ds.start)), CommitLog(st)
    for tag in committed:
        if tag < start:
            rep.violations.append(f"{_hour(tag)}: commit record {commits.commit_path(st, tag)} is "
                                  f"of an hour before the dataset's start {ds.start} (no load "
                                  "writes it; delete it)")
            rep.bad_hours.add(tag)
            records[tag] = None
            continue
        try:
            records[tag] = log.read(tag)
        except commits.CommitRecordError as e:
            rep.violations.append(f"{_hour(tag)}: {e}")
            rep.bad_hours.add(tag)
            records[tag] = None
    return records


def _check_index(st: Storage, ds: DatasetConfig, rep: VerifyReport) -> None:
    """Every index file against the commit records and manifests, by listing and by content."""
    try:
        damage = health.check_index(st, ds, content=True)
    except Exception as e:  # noqa: BLE001 - report, never crash
        rep.violations.append(f"index: could not be checked ({type(e).__name__}: {e})")
        return
    fix = f"rebuild it: {rebuild_command(ds.name)}"
    for tag, rels in sorted(damage.missing.items()):
        for rel in rels:
            rep.violations.append(f"{_hour(tag)}: index file index/{rel} is missing or has "
                                  f"another size than recorded; {fix}")
        rep.bad_hours.add(tag)
    for tag, rels in sorted(damage.corrupt.items()):
        for rel in rels:
            rep.violations.append(f"{_hour(tag)}: index file index/{rel} has other content than "
                                  f"when it was written (its SHA-256 differs); {fix}")
        rep.bad_hours.add(tag)
    for rel in damage.unexpected:
        tag = layout.rel_load(rel) or ""
        rep.violations.append(f"{_hour(tag) if tag else 'index'}: index file index/{rel} was not "
                              f"written by its load (an added or copied file); {fix}")
        if tag:
            rep.bad_hours.add(tag)
    for line in damage.other_format:
        rep.violations.append(f"index: {line}")


def _check_landing(ds: DatasetConfig, rep: VerifyReport,
                   records: dict[str, commits.CommitRecord | None]) -> set[str]:
    """Hours whose landing files differ from what their load read, each reported in one line."""
    valid = {t: r for t, r in records.items() if r is not None}
    if not valid:
        return set()
    latest = format_hour(parse_hour(max(valid)))
    changed = set()

    def compare(item: tuple[str, commits.CommitRecord]) -> landing.InputChange | Exception | None:
        try:
            return landing.input_change(ds, parse_hour(item[0]), item[1], content=True)
        except Exception as e:  # noqa: BLE001 - reported per hour, never raised
            return e

    # every file is hashed: hours in parallel (hashlib releases the GIL), in order for the report
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(compare, sorted(valid.items())))
    for (tag, _), change in zip(sorted(valid.items()), found, strict=True):
        if isinstance(change, Exception):
            e = change
            rep.violations.append(f"{_hour(tag)}: cannot list the landing files ({type(e).__name__}:"
                                  f" {str(e).splitlines()[0][:200] if str(e) else ''})")
            rep.bad_hours.add(tag)
            changed.add(tag)
            continue
        if change is not None:
            rep.violations.append(change.line(ds, latest))
            rep.bad_hours.add(tag)
            changed.add(tag)
    return changed


def repair(ds: DatasetConfig, owner: str, say: Progress) -> None:
    """`verify --repair`: under the dataset lock, roll each output table forward to the commit
    records, comparing every hour's files (a table changed behind the product's back), then
    write lost or altered key digests again."""
    st = Storage(ds.output)
    with Lock(st, owner):
        if lake.enabled(ds):
            made = lake.roll_forward(st, ds, None, say, trust_tokens=False)
            say(f"{ds.name}: {len(made)} table commit(s) rolled the tables forward" if made
                else f"{ds.name}: every table already agrees with the commit records")
        else:
            say(f"{ds.name}: output_format is parquet: no tables to repair")
        if not keydigest.repair(ds, st, say):
            say(f"{ds.name}: every key digest matches its hours")


def verify_dataset(spark: SparkSession, ds: DatasetConfig) -> VerifyReport:
    st = Storage(ds.output)
    rep = VerifyReport(ds.name)
    committed = sorted(CommitLog(st).committed())
    rep.hours_checked = len(committed)
    contract.check(st, ds, "", committed)  # a config that breaks the contract: refused
    hist = contract.read_history(st, committed[-1] if committed else None)
    records = _check_records(st, ds, rep, committed)
    ds_of = _contract_terms(ds, hist, records, rep)
    scans = {name: _scan(st, name, rep, records, frozenset(lake.replaced_files(st, name))
                         if lake.enabled(ds) else frozenset()) for name in OUTPUTS}
    _check_index(st, ds, rep)
    slow = keydigest.missing(st, {t: r for t, r in records.items() if r is not None})
    if slow:
        rep.warnings.append(slow)
    if lake.enabled(ds):  # each table's files for every hour are its commit record's
        rep.violations.extend(lake.drift(st, records))

    # Completeness and conservation
    per_hour: dict[str, dict[str, int]] = {}
    present: dict[str, set[str]] = {}
    for name in OUTPUTS:
        present[name] = set(scans[name].files)
        for tag, n in scans[name].rows.items():
            per_hour.setdefault(tag, {})[name] = n
    for name in OUTPUTS:
        for tag in sorted(present[name] - set(committed)):
            rep.violations.append(f"{_hour(tag)}: partition {name}/{PARTITION}{tag} exists but "
                                  "the hour has no commit record (an interrupted load; rerun "
                                  "that hour)")
            rep.bad_hours.add(tag)
    frames = {name: _frame(spark, st, name, scans[name]) for name in OUTPUTS}
    changed = _check_landing(ds, rep, records)
    complete = [t for t in committed if all(t in present[n] for n in OUTPUTS) and t not in changed]
    counts = _landing_counts(spark, ds, complete)
    for tag in committed:
        missing = [n for n in OUTPUTS if tag not in present[n]]
        if missing:
            rep.violations.append(f"{format_hour(parse_hour(tag))}: committed but missing "
                                  f"{', '.join(missing)}")
            rep.bad_hours.add(tag)
            continue
        if tag in changed:  # counting the new files against the old outputs says nothing more
            continue
        n_in = counts[tag]
        if isinstance(n_in, Exception):  # verify reports what it cannot read, never crashes
            e = n_in
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            rep.violations.append(f"{format_hour(parse_hour(tag))}: cannot read the landing files "
                                  f"({type(e).__name__}: {first})")
            rep.bad_hours.add(tag)
            continue
        n_out = sum(per_hour.get(tag, {}).values())
        rep.rows_in += n_in
        rep.rows_out += n_out
        if n_in != n_out:
            rep.violations.append(f"{format_hour(parse_hour(tag))}: conservation broken: {n_in} rows in "
                                  f"the landing files, {n_out} in the outputs")
            rep.bad_hours.add(tag)

    # Uniqueness within the expiry window
    try:
        _check_uniqueness(spark, ds, frames, committed, rep, ds_of)
    except Exception as e:  # noqa: BLE001 - e.g. a data page that fails to decode: report it
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        rep.violations.append(f"the outputs could not be read for the uniqueness check: {first}")
    return rep


def _contract_terms(ds: DatasetConfig, hist: contract.History,
                    records: dict[str, commits.CommitRecord | None], rep: VerifyReport
                    ) -> Callable[[str], DatasetConfig]:
    """Per hour, the config terms it was loaded under (the expiry period of its contract version);
    an hour whose record is damaged is checked under the current config."""
    by_version: dict[int, DatasetConfig] = {c.version: with_period(ds, c) for c in hist.versions}
    of: dict[str, DatasetConfig] = {}
    for tag, rec in records.items():
        v = rec.contract_version if rec is not None else None
        label = f"v{v}" if v is not None and v in by_version else "unknown"
        rep.contracts.setdefault(label, []).append(tag)
        of[tag] = by_version.get(v, ds) if v is not None else ds
    return lambda tag: of.get(tag, ds)


def with_period(ds: DatasetConfig, c: contract.Contract) -> DatasetConfig:
    """`ds` with the expiry period of contract `c` (the only term an evolvable change alters that
    verify recomputes; a breaking one was refused or migrated)."""
    e, ce = ds.expiry, c.terms.expiry
    if e is None or ce is None or ce.column != e.column or ce.period == ds.expiry_period:
        return ds
    return ds.model_copy(update={"expiry": e.model_copy(update={"period_text": ce.period_text})})


def _check_uniqueness(spark: SparkSession, ds: DatasetConfig, frames: dict[str, DataFrame | None],
                      committed: list[str], rep: VerifyReport,
                      ds_of: Callable[[str], DatasetConfig] | None = None) -> None:
    uniq = frames[UNIQUE]
    if uniq is not None:
        uniq = uniq.filter(F.col(LOAD_HOUR_PARTITION).isin(committed))
        key = list(ds.key)
        w = Window.partitionBy(*key).orderBy(LOAD_HOUR_PARTITION)
        if ds.expiry is None:
            dup = uniq.withColumn("_n", F.count(F.lit(1)).over(Window.partitionBy(*key)))
            bad = dup.filter(F.col("_n") > 1).select(LOAD_HOUR_PARTITION).distinct().collect()
        else:
            xs = expiry_points(ds, (frames[n] for n in (UNIQUE, DUPLICATES, EXPIRED)), committed,
                               ds_of)
            x_df = spark.createDataFrame([(t, float(x) if x is not None else None)
                                          for t, x in xs.items()],
                                          f"{LOAD_HOUR_PARTITION} string, {X_COL} double")
            u = uniq.withColumn(V, expiry_value(ds))
            u = u.withColumn("_prev_v", F.lag(V).over(w)).join(F.broadcast(x_df), LOAD_HOUR_PARTITION)
            bad = (u.filter(F.col("_prev_v").isNotNull()
                            & is_live(F.col("_prev_v"), F.col(X_COL)))
                   .select(LOAD_HOUR_PARTITION).distinct().collect())
        for row in sorted(bad, key=lambda r: r[LOAD_HOUR_PARTITION]):
            rep.violations.append(f"{format_hour(parse_hour(row[LOAD_HOUR_PARTITION]))}: a key in unique is "
                                  "also unique in an earlier hour within the expiry window")
            rep.bad_hours.add(row[LOAD_HOUR_PARTITION])
