"""Each output as a Delta table over the Parquet files the load wrote (delta-rs; no file rewritten).

The commit record stays the product's truth; the tables are rolled forward to it (design.md L1a):
- a load writes its files under ``<output>/load_hour=<tag>/`` beside any earlier version's (a
  rerun's new files never replace files a reader may be reading), writes its commit record, then
  gives each table ONE Delta commit for the hour: adds of the record's files, removes of the files
  the table held for the hour that the record no longer lists (a rerun's swap);
- each commit carries an idempotency token (`app_transactions`, app id ``dedup_pipeline:<tag>``
  in that table's log) whose version is the record's `publish_token` and only goes up, so a
  repeated publish of the same record is skipped;
- an hour whose tables may lag its record is marked pending (``_publish/<tag>``) before its record
  is written (and before a rerun invalidates the old record), and unmarked once its four tables
  agree. The next load, `verify --repair` and the vacuum job roll pending hours forward: per table,
  skip if the token is current, else compare the table's files for the hour with the record's,
  else commit the difference. An hour without a record is removed from the tables.
- delta-rs accepts add actions for missing files or files of another schema, so each file is
  opened (its footer: existence, schema, row count for the stats) before it is added;
- files a rerun removed from a table stay on disk until `vacuum` with a retention (at least
  `MIN_RETENTION_HOURS`): readers holding an older version keep reading it. The vacuum is never
  "full": files no table ever listed are deleted only by the next load of their hour, under the
  dataset lock (a full vacuum could delete the files of a load in progress).

The table schema is the output's contract columns (engine/core/outputs.py) plus the partition column
``load_hour``; a column the contract adds (an evolvable change) is a Delta schema change commit.
Pure Python and delta-rs: no Spark session, no Dagster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    PostCommitHookProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits, formats, hooks
from dedup_pipeline.engine.core.columns import LOAD_HOUR_PARTITION
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.index.health import IndexDamagedError
from dedup_pipeline.engine.core.lock import Lock
from dedup_pipeline.engine.core.outputs import ARROW_TYPES, OUTPUTS, UNIQUE, columns, partition
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import STAMP_FMT, format_tag
from dedup_pipeline.objectstore import S3Settings

PART = LOAD_HOUR_PARTITION  # the partition column: in the Delta log and the directory names, not the files
PENDING = "_publish"  # hours whose tables may lag their commit record
APP = "dedup_pipeline"
DELTA_LOG = "_delta_log"
MIN_RETENTION_HOURS = 1  # a vacuum never deletes a file removed from a table less than this ago
DEFAULT_RETENTION_HOURS = 24
# After each commit delta-rs writes a checkpoint every 100 commits (kept: opens stay fast) and, by
# default, lists the whole log to delete expired entries (dropped: `vacuum` does it, on schedule)
_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


class LakeError(UserError, RuntimeError):
    """A file cannot be published to an output table (missing, or not of the table's schema)."""

    stage = "publishing the hour to its output tables (Delta)"
    fix = ("the hour's commit record is written and the hour is marked for roll-forward; fix the "
           "file named in the error, then run `dedup-pipeline verify --repair` or the next load of "
           "{ds}, which publish it again")


class PublishRefusedError(UserError, RuntimeError):
    """The hour's written files could not be published to its tables: found before its commit
    record is written, so nothing of the attempt is committed."""

    stage = "checking that the hour can be published to its output tables (Delta), before its commit"
    fix = ("nothing was committed and the tables still serve the hour's last committed version; "
           "see the error for the cause (a column type change needs `dedup-pipeline migrate`)")


@dataclass(frozen=True)
class Published:
    """One output table after the publish of one hour."""

    output: str
    uri: str
    version: int  # the table version that holds the hour as its record says
    files: int  # the hour's files in that version
    committed: bool  # False: the table already agreed (token current, or the same files)


def enabled(ds: DatasetConfig) -> bool:
    return ds.output_format == "delta"


def app_id(tag: str) -> str:
    """The idempotency token's app id of hour `tag` (one per hour in each table's own log)."""
    return f"{APP}:{tag}"


def table_path(st: Storage, name: str) -> str:
    """Output `name`'s table as a person or a reader names it (a local path stays plain)."""
    return st.to_uri(st.path(name))


def table_uri(st: Storage, name: str) -> str:
    """The URI delta-rs opens for output `name`: a local path as a percent-encoded ``file://`` URI
    (given a plain path, delta-rs would decode a `%41` in it and cut it at a `#`); ``s3a://`` is
    Hadoop's spelling of ``s3://``."""
    if st.local:
        return Path(st.path(name)).as_uri()
    uri = st.to_uri(st.path(name))
    if uri.startswith("memory://"):
        raise LakeError(f"{uri}: delta-rs cannot open fsspec's memory:// file system; set "
                        "output_format: parquet for an in-memory output")
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def table_options(st: Storage) -> dict[str, str] | None:
    """delta-rs's storage options for the tables of `st` (S3: objectstore.py's one mapping)."""
    return S3Settings.from_env().delta_options() if st.s3 else None


def new_token(previous: int | None = None) -> int:
    """A publish token for a load committing now: microseconds since the epoch, above `previous`."""
    now = time.time_ns() // 1000
    return now if previous is None or now > previous else previous + 1


def record_token(rec: commits.CommitRecord) -> int:
    """The token a record publishes with; for an hour loaded with `output_format: parquet` (no
    token), from its commit time."""
    if rec.publish_token is not None:
        return rec.publish_token
    at = datetime.strptime(rec.committed_at, STAMP_FMT).replace(tzinfo=UTC)
    return int(at.timestamp()) * 1_000_000


# -- the schema ------------------------------------------------------------------------------------

def arrow_schema(ds: DatasetConfig, name: str) -> pa.Schema:
    """Output `name`'s table schema: its contract columns (all nullable), then ``load_hour``."""
    return pa.schema([pa.field(c, ARROW_TYPES[t]) for c, t in columns(ds, name)]
                     + [pa.field(PART, pa.string())])


def _schema_of(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def _check_file(st: Storage, path: str, table: pa.Schema) -> int:
    """Rows of Parquet file `path` after checking it exists and its columns are the table's
    (a subset by name, each of the table's type: an hour loaded under an earlier contract lacks a
    column added since)."""
    try:
        with st.fs.open(path, "rb") as fh:
            f = pq.ParquetFile(fh)
            schema, rows = f.schema_arrow, f.metadata.num_rows
    except FileNotFoundError:
        raise LakeError(f"{path} is listed in its hour's commit record but missing; rerun that "
                        "hour") from None
    except Exception as e:  # noqa: BLE001 - anything unreadable is named with its cause
        raise LakeError(f"{path} is not readable Parquet ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:160] if str(e) else ''}); rerun that hour") from e
    for field in schema:
        if field.name not in table.names:
            raise LakeError(f"{path} has column {field.name!r}, which its table does not; the "
                            "dataset's contract decides the columns (rerun that hour)")
        want = table.field(field.name).type
        if field.type != want:
            raise LakeError(f"{path}: column {field.name!r} is {field.type}, its table's is "
                            f"{want}; rerun that hour")
    return rows


def _type_changes(have: pa.Schema, want: pa.Schema) -> list[str]:
    """The columns both schemas hold with different types, one phrase each."""
    return [f"column {f.name!r} is {f.type} in the table and {want.field(f.name).type} in the "
            "contract" for f in have if f.name in want.names and want.field(f.name).type != f.type]


def check_publishable(st: Storage, ds: DatasetConfig, files: dict[str, list[str]], tag: str) -> None:
    """Before hour `tag`'s commit record is written: each table can take the hour's files (the
    table's columns have the contract's types; each file exists, reads, and has the table's
    columns after the contract's new ones are added). Raises `PublishRefusedError`."""
    if not enabled(ds):
        return
    for name in OUTPUTS:
        target = arrow_schema(ds, name)
        dt = open_table(st, name)
        if dt is None:
            schema = target
        else:
            have = _schema_of(dt)
            bad = _type_changes(have, target)
            if bad:
                raise PublishRefusedError(
                    f"hour {format_tag(tag)} not committed: the {name} table's {bad[0]}; a column "
                    f"type changes only through `{formats.migrate_command(ds.name)}`, which "
                    "rewrites the tables under the new schema")
            schema = pa.schema([*have, *[f for f in target if f.name not in have.names]])
        for path in files.get(name, []):
            try:
                _check_file(st, path, schema)
            except LakeError as e:
                raise PublishRefusedError(f"hour {format_tag(tag)} not committed: {e}") from None


def _evolve(dt: DeltaTable, want: pa.Schema) -> pa.Schema:
    """Add the contract's new columns to the table (one schema change commit); the schema now."""
    have = _schema_of(dt)
    new = [f for f in want if f.name not in have.names]
    if new:
        dt.alter.add_columns(Schema.from_arrow(pa.schema(new)).fields)
        dt.update_incremental()
        have = _schema_of(dt)
    return have


# -- reading a table -------------------------------------------------------------------------------

def open_table(st: Storage, name: str, version: int | None = None) -> DeltaTable | None:
    """Output `name`'s table (at `version`), or None where it is not a Delta table (yet)."""
    try:
        return DeltaTable(table_uri(st, name), version=version, storage_options=table_options(st))
    except TableNotFoundError:
        return None


def files_by_hour(dt: DeltaTable) -> dict[str, dict[str, int]]:
    """Per hour (tag), the table's files (paths relative to the table) and their sizes."""
    acts = pa.table(dt.get_add_actions(flatten=True)).select(
        ["path", "size_bytes", f"partition.{PART}"]).to_pydict()
    out: dict[str, dict[str, int]] = {}
    for path, size, tag in zip(acts["path"], acts["size_bytes"], acts[f"partition.{PART}"],
                               strict=True):
        out.setdefault(tag, {})[path] = int(size)
    return out


def record_files(st: Storage, name: str, rec: commits.CommitRecord | None) -> dict[str, int | None]:
    """The files (relative to the table) and sizes the record vouches for in output `name`."""
    if rec is None:
        return {}
    rel = "/".join(partition(name, rec.load_hour)[1:])
    return {f"{rel}/{f.name}": f.size for f in rec.output_files.get(name, ())}


def check_rebuild_sources(st: Storage, ds: DatasetConfig, tags: Iterable[str]) -> None:
    """Before an index rebuild from unique: the unique table must serve each hour's record files
    (else a rebuild would vouch for what readers do not see); the fix rolls the table forward."""
    if not enabled(ds):
        return
    table = open_table(st, UNIQUE)
    if table is None:
        return
    held = files_by_hour(table)
    log = CommitLog(st)
    for tag in tags:
        rec = log.read_intact(tag)  # the rebuild names a damaged record itself
        if rec is not None and set(held.get(tag, {})) != set(record_files(st, UNIQUE, rec)):
            raise IndexDamagedError(
                f"cannot rebuild the index entries of hour {format_tag(tag)}: the unique table "
                f"({table_path(st, UNIQUE)}) does not hold the files its commit record lists. "
                "Roll the table forward first: dedup-pipeline verify --repair")


# -- publishing ------------------------------------------------------------------------------------

def publish_hour(st: Storage, ds: DatasetConfig, name: str, tag: str,
                 rec: commits.CommitRecord | None, dt: DeltaTable | None = None,
                 have: dict[str, int] | None = None, trust_token: bool = True) -> Published:
    """Make table `name` hold exactly the files `rec` lists for hour `tag` (none without a record),
    in one Delta commit carrying the hour's token; no commit if the token is current
    (`trust_token`; `verify --repair` compares the files regardless) or the files already agree
    (a token that lags is then committed alone, so the next check is O(1))."""
    uri = table_uri(st, name)
    reused = dt is not None  # the caller's table object: kept current after a commit
    if dt is None:
        dt = open_table(st, name)
    token = record_token(rec) if rec is not None else None
    current = dt.transaction_version(app_id(tag)) if dt is not None else None
    if dt is not None and token is not None and current == token and trust_token:
        return Published(name, uri, dt.version(), len(record_files(st, name, rec)), False)
    if have is None:
        have = files_by_hour(dt).get(tag, {}) if dt is not None else {}
    want = record_files(st, name, rec)
    agree = set(want) == set(have)
    if (rec is None and not have) or (
            agree and dt is not None and current is not None and token is not None
            and current >= token):
        return Published(name, uri, dt.version() if dt is not None else -1, len(want), False)
    # the token never goes down: a record with a lower one (a clock set back) commits above it
    version = token if token is not None else 0
    if current is not None and version < current:
        version = current + 1
    target = arrow_schema(ds, name)
    schema = _evolve(dt, target) if dt is not None else target
    now = int(time.time() * 1000)
    values = {PART: tag}
    removes = [RemoveAction(p, True, now, size, values) for p, size in sorted(have.items())
               if p not in want]
    adds = []
    for rel in sorted(set(want) - set(have)):
        path = st.path(name, rel)
        rows = _check_file(st, path, schema)
        size = want[rel]
        if size is None:
            size = int(st.fs.info(path)["size"])
        adds.append(AddAction(rel, size, values, now, True, json.dumps({"numRecords": rows})))
    props = CommitProperties(app_transactions=[Transaction(app_id(tag), version)],
                             custom_metadata={"dedup_pipeline.load_hour": format_tag(tag)})
    if dt is None:
        create_table_with_add_actions(uri, Schema.from_arrow(schema), adds, mode="error",
                                      storage_options=table_options(st),
                                      partition_by=[PART], commit_properties=props,
                                      post_commithook_properties=_HOOKS)
        return Published(name, uri, 0, len(want), True)
    before = dt.version()
    dt.create_write_transaction([*removes, *adds], "append", Schema.from_arrow(schema),
                                partition_by=[PART], commit_properties=props,
                                post_commithook_properties=_HOOKS)
    if reused:
        dt.update_incremental()
        return Published(name, uri, dt.version(), len(want), True)
    # one writer per dataset (the lock): the commit is the version after the one it read
    return Published(name, uri, before + 1, len(want), True)


def _mark(st: Storage, tag: str) -> None:
    if previous_record(st, tag) is None:  # a rerun's mark keeps the hour's last committed record
        st.write_text_atomic(st.path(PENDING, tag), format_tag(tag))


def mark_rerun(st: Storage, ds: DatasetConfig, rec: commits.CommitRecord) -> None:
    """Before a rerun deletes hour `rec.load_hour`'s record: the mark keeps that record, so until
    the rerun's own commit the tables keep serving it (a roll-forward publishes it, never
    removes the hour) and `explain` answers from it."""
    if enabled(ds):
        st.write_text_atomic(st.path(PENDING, rec.load_hour), json.dumps(rec.to_json()))


def previous_record(st: Storage, tag: str) -> commits.CommitRecord | None:
    """The last committed record of hour `tag` while a rerun of it is under way (or was cut
    short): kept in its pending mark; None otherwise (or if the mark does not read)."""
    try:
        text = st.read_text(st.path(PENDING, tag))
    except (FileNotFoundError, OSError, UnicodeDecodeError):
        return None
    if not text.startswith("{"):
        return None
    try:
        return commits.CommitRecord.from_text(text, tag)
    except Exception:  # noqa: BLE001 - a damaged mark: the hour is treated as never committed
        return None


def reruns(st: Storage) -> dict[str, commits.CommitRecord]:
    """Hours whose rerun is under way or was cut short, with their last committed record."""
    out = {}
    for tag in pending(st):
        rec = previous_record(st, tag)
        if rec is not None:
            out[tag] = rec
    return out


def _unmark(st: Storage, tag: str) -> None:
    st.remove(st.path(PENDING, tag))


def mark_pending(st: Storage, ds: DatasetConfig, tag: str) -> None:
    """Before hour `tag`'s record is written or invalidated: its tables may lag it from now on."""
    if enabled(ds):
        _mark(st, tag)


def pending(st: Storage) -> list[str]:
    return sorted(n for n in st.list_names(st.path(PENDING)) if commits.is_tag(n))


def publish_load(st: Storage, ds: DatasetConfig, rec: commits.CommitRecord) -> dict[str, Published]:
    """After hour `rec.load_hour`'s record is written: one commit per table, then unmark it."""
    out = {}
    for name in OUTPUTS:
        out[name] = publish_hour(st, ds, name, rec.load_hour, rec)
        hooks.at(f"after_publish:{name}")
    _unmark(st, rec.load_hour)
    return out


def tables_missing(st: Storage) -> list[str]:
    return [n for n in OUTPUTS if not st.exists(st.path(n, DELTA_LOG))]


def roll_forward(st: Storage, ds: DatasetConfig, tags: Iterable[str] | None = None,
                 say: Progress | None = None, *, trust_tokens: bool = True,
                 ) -> list[tuple[str, Published]]:
    """Bring every table to the commit records for `tags` (None: every hour a record or a table
    has); returns the (hour, table) commits made. Pending marks of the hours done are removed.
    `trust_tokens=False` compares every hour's files even where its token is current (a table
    changed behind the product's back: `verify --repair`)."""
    say = say or (lambda _m: None)
    tables = {n: open_table(st, n) for n in OUTPUTS}
    held = {n: files_by_hour(dt) if dt is not None else {} for n, dt in tables.items()}
    log = CommitLog(st)
    committed = log.committed()
    todo = set(committed) | {t for h in held.values() for t in h} if tags is None else set(tags)
    made: list[tuple[str, Published]] = []
    for tag in sorted(todo):
        try:
            rec = log.read(tag) if tag in committed else None
        except commits.CommitRecordError as e:
            say(f"{ds.name} {format_tag(tag)}: tables not rolled forward: {e}")
            continue  # stays pending: the record's own problem is reported where it is read
        rerun = rec is None and (rec := previous_record(st, tag)) is not None
        try:
            pubs = [publish_hour(st, ds, name, tag, rec, tables[name], held[name].get(tag, {}),
                                 trust_tokens) for name in OUTPUTS]
        except LakeError as e:  # stays pending; a rerun of the hour writes files that publish
            say(f"{ds.name} {format_tag(tag)}: tables not rolled forward: {e}")
            continue
        for name, pub in zip(OUTPUTS, pubs, strict=True):
            if pub.committed:
                if tables[name] is None:
                    tables[name] = open_table(st, name)
                made.append((tag, pub))
                what = ("kept at its last committed version (a rerun of it is under way)" if rerun
                        else "published" if rec is not None else "removed (no commit record)")
                say(f"{ds.name} {format_tag(tag)}: {name} table {what} at version {pub.version}")
        if not rerun:  # a rerun's mark stays until its own commit is published
            _unmark(st, tag)
    return made


def repair_pending(st: Storage, ds: DatasetConfig,
                   say: Progress | None = None) -> list[tuple[str, Published]]:
    """At the start of a load: roll forward the hours marked pending (a publish a crash cut
    short), or every committed hour where a table does not exist yet (the first load in delta
    mode of a dataset loaded before). O(pending) when nothing is missing."""
    if not enabled(ds):
        return []
    if tables_missing(st) and CommitLog(st).committed():
        return roll_forward(st, ds, None, say)
    marked = pending(st)
    return roll_forward(st, ds, marked, say) if marked else []


def drop_unpublished(st: Storage, ds: DatasetConfig, tag: str) -> int:
    """Delete the files under hour `tag`'s partitions that no table version lists now (what a
    crashed attempt left). Only under the dataset lock, with the tables rolled forward: no load
    of the dataset is writing. Files a rerun removed from a table stay for `vacuum`."""
    if not enabled(ds):
        return 0
    gone = 0
    for name in OUTPUTS:
        part = st.path(*partition(name, tag))
        on_disk = st.list_files(part, ".parquet")
        if not on_disk:
            continue
        dt = open_table(st, name)
        listed = set(files_by_hour(dt).get(tag, {})) if dt is not None else set()
        tomb = _tombstones(dt) if dt is not None else set()
        if tomb is None:
            continue
        for path in on_disk:
            rel = path[len(st.path(name)) + 1:]
            if rel not in listed and rel not in tomb:
                st.remove(path)
                gone += 1
    return gone


def replaced_files(st: Storage, name: str) -> set[str]:
    """Files (relative to the table) a table version removed that `vacuum` has not deleted yet:
    the files of a rerun hour's previous version, which readers of older versions still read."""
    dt = open_table(st, name)
    return (_tombstones(dt) or set()) if dt is not None else set()


def _tombstones(dt: DeltaTable) -> set[str] | None:
    """Files removed from the table that a vacuum has not deleted yet (older versions read them);
    None if they cannot be listed (then nothing is deleted)."""
    try:
        return set(dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False))
    except Exception:  # noqa: BLE001 - a listing problem keeps every file
        return None


def hour_files(st: Storage, name: str, tag: str) -> tuple[int, int] | None:
    """(the table version that committed hour `tag` as the table holds it now, its files) of
    output `name`'s table, or None without a table. The version is the newest commit carrying the
    hour's load_hour in its commit info (each publish of an hour is one such commit); the latest
    version if log cleanup removed it (every later version holds the hour alike)."""
    dt = open_table(st, name)
    if dt is None:
        return None
    return hour_version(dt, tag), len(files_by_hour(dt).get(tag, {}))


def hour_version(dt: DeltaTable, tag: str, limit: int = 1000) -> int:
    """The newest version of `dt` whose commit published hour `tag` (see `hour_files`).

    The history is read newest first in growing windows (16, 128, then `limit` commits): each
    commit read is a request on an object store, and the hour's commit is usually among the
    newest (a load's own events), so a long table history is not read for it."""
    key = format_tag(tag)
    n = 16
    while True:
        n = min(n, limit)
        hist = dt.history(n)
        for h in hist:
            if h.get("dedup_pipeline.load_hour") == key and "version" in h:
                return int(h["version"])
        if n >= limit or len(hist) < n:
            return dt.version()
        n *= 8


# -- drift and upkeep ------------------------------------------------------------------------------

def drift(st: Storage, records: dict[str, commits.CommitRecord | None]) -> list[str]:
    """Where a table's files for an hour differ from the hour's commit record (`records`: the
    committed hours' records, None for one that does not read), one line each. An hour being
    rerun is compared with its last committed record (the tables serve it until the rerun
    commits)."""
    out = []
    records = {**{t: r for t, r in reruns(st).items() if t not in records}, **records}
    for name in OUTPUTS:
        dt = open_table(st, name)
        if dt is None:
            if records:
                out.append(f"{name}: not a Delta table yet ({st.path(name, DELTA_LOG)} missing); "
                           "verify --repair publishes every committed hour")
            continue
        held = files_by_hour(dt)
        for tag in sorted(set(held) | set(records)):
            rec = records.get(tag)
            if tag in records and rec is None:
                continue  # an unreadable record is reported as such
            want = set(record_files(st, name, rec))
            have = set(held.get(tag, {}))
            if want == have:
                continue
            hour = format_tag(tag)
            if rec is None:
                out.append(f"{hour}: the {name} table holds {len(have)} file(s) of an hour with no "
                           "commit record; verify --repair removes them")
            else:
                out.append(f"{hour}: the {name} table holds {len(have & want)} of the "
                           f"{len(want)} file(s) the commit record lists and {len(have - want)} "
                           "it does not; verify --repair rolls it forward")
    return out


@dataclass(frozen=True)
class Upkeep:
    output: str
    deleted: int  # files removed from the table longer ago than the retention, now deleted
    version: int


def vacuum(st: Storage, retention_hours: int = DEFAULT_RETENTION_HOURS) -> list[Upkeep]:
    """Per table: delete files removed from it more than `retention_hours` ago (never below
    `MIN_RETENTION_HOURS`; never a full vacuum), write a checkpoint, and delete log entries older
    than the table's log retention. Run under the dataset lock."""
    if retention_hours < MIN_RETENTION_HOURS:
        raise ValueError(f"vacuum retention {retention_hours} h is below the minimum of "
                         f"{MIN_RETENTION_HOURS} h: a reader of an older table version could "
                         "lose its files mid-read; use a retention of at least "
                         f"{MIN_RETENTION_HOURS} h")
    out = []
    for name in OUTPUTS:
        dt = open_table(st, name)
        if dt is None:
            continue
        deleted = dt.vacuum(retention_hours=retention_hours, dry_run=False,
                            enforce_retention_duration=False, full=False)
        dt.update_incremental()
        dt.create_checkpoint()
        dt.cleanup_metadata()
        out.append(Upkeep(name, len(deleted), dt.version()))
    return out


def upkeep(st: Storage, ds: DatasetConfig, retention_hours: int, owner: str,
           say: Progress) -> list[Upkeep]:
    """The table upkeep of `ds` (the `vacuum` command and the upkeep job): under the dataset lock,
    roll pending hours forward, then `vacuum`; says one line per table."""
    with Lock(st, owner):
        roll_forward(st, ds, pending(st), say)
        done = vacuum(st, retention_hours)
    for u in done:
        say(f"{ds.name}: {u.output}: {u.deleted} replaced file(s) deleted, "
            f"checkpoint at version {u.version}")
    return done


def overwrite(st: Storage, ds: DatasetConfig, records: dict[str, commits.CommitRecord],
              say: Progress | None = None) -> list[Published]:
    """`migrate`: each table whose schema is not the contract's (a column of another type, or
    one the contract no longer has) gets ONE overwrite commit: the contract's schema, every
    committed hour's files as its record lists them (each checked against it), every hour's
    token. Readers see the old schema and rows, then the new, nothing between; time travel keeps
    the old version. Tables that agree are left alone."""
    say = say or (lambda _m: None)
    if not enabled(ds):
        return []
    out = []
    for name in OUTPUTS:
        dt = open_table(st, name)
        if dt is None:
            continue  # the next load creates it from the records
        target = arrow_schema(ds, name)
        have = _schema_of(dt)
        if not _type_changes(have, target) and set(have.names) <= set(target.names):
            continue
        now = int(time.time() * 1000)
        adds, txns = [], []
        for tag, rec in sorted(records.items()):
            values = {PART: tag}
            for rel, size in sorted(record_files(st, name, rec).items()):
                path = st.path(name, rel)
                rows = _check_file(st, path, target)
                if size is None:
                    size = int(st.fs.info(path)["size"])
                adds.append(AddAction(rel, size, values, now, True,
                                      json.dumps({"numRecords": rows})))
            txns.append(Transaction(app_id(tag), record_token(rec)))
        props = CommitProperties(app_transactions=txns,
                                 custom_metadata={"dedup_pipeline.operation": "migrate"})
        dt.create_write_transaction(adds, "overwrite", Schema.from_arrow(target),
                                    partition_by=[PART], commit_properties=props,
                                    post_commithook_properties=_HOOKS)
        dt.update_incremental()
        say(f"{ds.name}: {name} table rewritten under the contract's schema at version "
            f"{dt.version()} ({len(adds)} file(s) of {len(records)} hour(s))")
        out.append(Published(name, table_uri(st, name), dt.version(), len(adds), True))
    for tag in records:
        if previous_record(st, tag) is None:
            _unmark(st, tag)
    return out
