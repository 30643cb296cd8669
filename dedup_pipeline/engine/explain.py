"""Explain a key: where each of its records went, and which rule put it there (docs/design.md,
"Explaining a key").

Correct by construction (design.md E1): every line is read back from what a load committed, never
recomputed by running the rules again.
- The hours are the committed ones (a commit record exists); an hour without one (never loaded, or
  being loaded again right now) is not reported. Of each hour only the Parquet files its commit
  record lists are read (records of earlier versions without a file list: the partition).
- The rule of each line (E2): the output a row went to, its `_duplicate_kind`, `_first_load_hour`
  and `_expiry_point` are the columns the load wrote; X_H is the commit record's `expiry_point`.
  The in-batch winner is the unique row of its hour; which R3 criterion separated it from a loser
  is read off the two rows (order_by, then expiry value, then source file, then position in the
  file).
- Rejected rows have no typed key: a rejected row is listed when its `_raw` holds every non-null
  value of the key (as given, or JSON- / CSV-escaped).
- The index state (E3) is the entries of committed loads with the key's digest.

Speed (E5: a point lookup must not scan every output row): each committed hour's key digest
(`engine/keydigest.py`, listed in its commit record) names the hours that can hold the key, so
whole rows are read of only those hours (one Spark job; bloom filters and row-group statistics
prune within them). An hour without a usable digest is searched in two passes as before: its key
columns first, then rows. Rejected `_raw` lines are read by pyarrow. Without expiry, a key with an
index entry has no unique, duplicate or expired row before that entry's load (its first record
would have been unique), so those outputs are read from that hour on. Every output file is read
in `_read` (Spark) or `_arrow_read` (pyarrow), nowhere else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import commits, daypack, keydigest, lake
from dedup_pipeline.engine.columns import (
    ENTRY_LOAD_HOUR,
    EXPIRY_POINT,
    FIRST,
    FP,
    H1,
    H2,
    KIND,
    RAW,
    REASON,
    SOURCE_FILE,
    V,
)
from dedup_pipeline.engine.columns import LOAD_HOUR_PARTITION as LOAD_HOUR
from dedup_pipeline.engine.commit_log import CommitLog
from dedup_pipeline.engine.digest import digest_columns, string_key_digest
from dedup_pipeline.engine.index import layout, live, store
from dedup_pipeline.engine.index.health import check_index
from dedup_pipeline.engine.outputs import (
    DUPLICATES,
    EXPIRED,
    OUTPUTS,
    REJECTED,
    UNIQUE,
    columns,
    expiry_point_type,
    partition,
)
from dedup_pipeline.engine.parse import SPARK_TYPES
from dedup_pipeline.engine.storage import READERS, Storage
from dedup_pipeline.hours import compress_ranges, format_tag, parse_hour, to_tag

KID = "_kid"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# rules, as the JSON names them
FIRST_SEEN = "first_seen"
UNIQUE_AGAIN = "unique_again"
IN_BATCH = "in_batch_duplicate"
NATURAL_DUP = "natural_duplicate"
CONFLICT_DUP = "conflict"
EXPIRED_RULE = "expired"
REJECTED_RULE = "rejected"

FIX = ("run `dedup-pipeline verify --config <file> --dataset {ds}` to see every violation, then "
       "`dedup-pipeline rebuild-index --config <file> --dataset {ds}` to rebuild the index from "
       "unique")


class ExplainKeyError(ValueError):
    """A key given on the command line or in run config that does not fit the dataset's key."""


# --------------------------------------------------------------------------------------------
# the key as given
# --------------------------------------------------------------------------------------------


def parse_key_args(ds: DatasetConfig, pairs: Sequence[str] = (), key_json: str | None = None
                   ) -> dict[str, str | None]:
    """`col=value` pairs and/or a JSON object -> {key column: text, or None for null} (design.md E4).

    `--key col=value`: everything after the first `=` is the value, verbatim (commas, quotes,
    `=`, unicode; `col=` is the empty string). `--key-json '{"col": value}'`: JSON, where `null` is
    a null and numbers / booleans are their JSON text. Every key column exactly once.
    """
    got: dict[str, str | None] = {}
    where = f"dataset {ds.name!r}"

    def put(col: str, value: str | None) -> None:
        if col not in ds.key:
            raise ExplainKeyError(
                f"{where}: {col!r} is not a key column; the key is ({', '.join(ds.key)}). "
                f"Give each as --key COLUMN=VALUE")
        if col in got:
            raise ExplainKeyError(f"{where}: key column {col!r} given twice")
        got[col] = value

    for pair in pairs:
        col, eq, value = pair.partition("=")
        if not eq:
            raise ExplainKeyError(f"{where}: --key {pair!r} is not COLUMN=VALUE "
                                  f"(e.g. --key {ds.key[0]}=4711)")
        put(col.strip(), value)
    if key_json is not None:
        try:
            obj = json.loads(key_json)
        except json.JSONDecodeError as e:
            raise ExplainKeyError(f"{where}: --key-json is not JSON ({e.msg} at {e.pos}); "
                                  f"e.g. --key-json '{{\"{ds.key[0]}\": 4711}}'") from None
        if not isinstance(obj, dict):
            raise ExplainKeyError(f"{where}: --key-json must be a JSON object of key columns")
        for col, v in obj.items():
            if isinstance(v, dict | list):
                raise ExplainKeyError(f"{where}: --key-json value of {col!r} must be a JSON "
                                      "string, number, boolean or null")
            put(col, None if v is None else v if isinstance(v, str)
                else json.dumps(v))
    missing = [k for k in ds.key if k not in got]
    if missing:
        raise ExplainKeyError(f"{where}: the key is ({', '.join(ds.key)}); missing "
                              f"{', '.join(missing)} (give --key {missing[0]}=VALUE, or "
                              "--key-json with null for a null)")
    return {k: got[k] for k in ds.key}


@dataclass(frozen=True)
class Key:
    """A key typed by the dataset's schema: values as the outputs compare them."""

    texts: dict[str, str | None]  # as given
    values: dict[str, Any]  # typed: str, int, float, bool; micros (timestamp), days (date); None
    h1: int | None  # the digest (None when a column is null: such a key is always rejected)
    h2: int | None

    @property
    def has_null(self) -> bool:
        return any(v is None for v in self.values.values())

    def needles(self) -> list[list[str]]:
        """Per non-null key column, the spellings a rejected line may hold it in."""
        out = []
        for text in self.texts.values():
            if text is None:
                continue
            forms = {text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1],
                     text.replace('"', '""')}
            out.append(sorted(f for f in forms if f))
        return out


# Type string keys on the driver (the benchmark turns it off to compare with a Spark job).
TYPE_ON_DRIVER = True


def type_keys(spark: SparkSession, ds: DatasetConfig, given: list[dict[str, str | None]]
              ) -> list[Key]:
    """Cast each key's text exactly as a load casts landing values; compute its digest (E4). One
    job, or none when every key column is a string (nothing to cast: the digest on the driver)."""
    schema = ds.source.schema
    if TYPE_ON_DRIVER and all(schema[k] == "string" for k in ds.key):
        try:
            return [_string_key(ds, g) for g in given]
        except UnicodeEncodeError:
            pass  # a lone surrogate: Spark spells it as a load does
    text_schema = T.StructType([T.StructField(KID, T.LongType()),
                                *[T.StructField(k, T.StringType()) for k in ds.key]])
    df = spark.createDataFrame([(i, *[g[k] for k in ds.key]) for i, g in enumerate(given)],
                               text_schema)
    typed = df.select(KID, *[F.col(k).alias(f"_t_{k}") for k in ds.key],
                      *[F.col(k).try_cast(SPARK_TYPES[schema[k]]).alias(k) for k in ds.key])
    h1, h2 = digest_columns(ds.key, schema)
    rows = typed.select(KID, *[f"_t_{k}" for k in ds.key],
                        *[_canonical(F.col(k), schema[k]).alias(k) for k in ds.key],
                        h1.alias(H1), h2.alias(H2)).collect()
    keys: list[Key] = [None] * len(given)  # type: ignore[list-item]
    for r in rows:
        values = {k: r[k] for k in ds.key}
        for k in ds.key:
            text = r[f"_t_{k}"]
            if text is not None and values[k] is None:
                if schema[k] == "string" or text.strip() == "":
                    continue  # an empty text for a typed column reads as null, like a load's
                raise ExplainKeyError(
                    f"dataset {ds.name!r}: key column {k!r} is {schema[k]}; {text!r} does not "
                    f"cast to it ({_type_hint(schema[k])})")
        null = any(v is None for v in values.values())
        keys[r[KID]] = Key({k: r[f"_t_{k}"] for k in ds.key}, values,
                           None if null else r[H1], None if null else r[H2])
    return keys


def _string_key(ds: DatasetConfig, given: dict[str, str | None]) -> Key:
    """A key of string columns: its values are its texts, as a load reads them."""
    values = {k: given.get(k) for k in ds.key}
    if any(v is None for v in values.values()):
        return Key(values, dict(values), None, None)
    h1, h2 = string_key_digest([values[k] for k in ds.key])  # type: ignore[misc]
    return Key(values, dict(values), h1, h2)


def _type_hint(typ: str) -> str:
    return {"long": "an integer, e.g. 4711", "double": "a number, e.g. 1.5",
            "boolean": "true or false",
            "timestamp": "ISO-8601, e.g. 2026-11-27T07:15:00Z (UTC when no offset is given)",
            "date": "YYYY-MM-DD"}.get(typ, "text")


def _canonical(col: Column, typ: str) -> Column:
    """A value in the form explain compares and prints: micros / days for time types."""
    if typ == "timestamp":
        return F.unix_micros(col)
    if typ == "date":
        return F.unix_date(col)
    return col


def _literal(value: Any, typ: str) -> Column:
    if typ == "timestamp":
        return F.timestamp_micros(F.lit(value))
    if typ == "date":
        return F.date_from_unix_date(F.lit(value))
    return F.lit(value)


def _fmt(ds: DatasetConfig, col: str | None, value: Any, typ: str | None = None) -> str:
    """A value for a person: timestamps as ISO-8601 UTC, dates ISO, text in JSON quotes."""
    typ = typ or (ds.source.schema[col] if col else "string")
    if value is None:
        return "null"
    if typ == "timestamp":
        dt = EPOCH + timedelta(microseconds=int(value))
        text = dt.strftime("%Y-%m-%dT%H:%M:%S")
        if dt.microsecond:
            text += f".{dt.microsecond:06d}".rstrip("0")
        return text + "Z"
    if typ == "date":
        return (date(1970, 1, 1) + timedelta(days=int(value))).isoformat()
    if typ == "string":
        return json.dumps(value, ensure_ascii=False)
    if typ == "boolean":
        return "true" if value else "false"
    return str(value)


# --------------------------------------------------------------------------------------------
# the result
# --------------------------------------------------------------------------------------------


@dataclass
class Occurrence:
    """One record of the key, where a load put it and why."""

    load_hour: str  # YYYY-MM-DD-HH
    output: str  # unique | duplicates | expired | rejected
    rule: str
    text: str  # the human line's reason
    source_file: str | None
    values: dict[str, Any] = field(default_factory=dict)  # the row's source values (as printed)
    deciding: dict[str, Any] = field(default_factory=dict)  # the values that decided it


@dataclass
class IndexEntry:
    load_hour: str
    slice: int | None
    expiry_value: str | None
    live: bool


@dataclass
class Explanation:
    dataset: str
    key: dict[str, Any]  # the key's values (timestamps, dates as ISO-8601 text; null as None)
    label: str  # the key as printed: col="text", col=4711
    occurrences: list[Occurrence]
    hours_searched: str  # ranges of the committed hours read
    index: list[IndexEntry]
    index_agrees: bool | None  # None: not checked (a partial range)
    inconsistencies: list[str]
    notes: list[str]

    @property
    def seen(self) -> bool:
        return bool(self.occurrences)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["seen"] = self.seen
        current = next((e for e in reversed(self.index) if e.live), None)
        out["index_now"] = (
            {"live": True, "first_load_hour": current.load_hour,
             "expiry_value": current.expiry_value, "slice": current.slice}
            if current else {"live": False, "first_load_hour": None, "expiry_value": None,
                             "slice": None})
        return out

    def lines(self) -> list[str]:
        """The report a person reads: one line per occurrence, oldest first, then the index."""
        head = f"{self.dataset}: key {self.label}"
        out = [head]
        if not self.occurrences:
            out.append(f"  never seen in the committed hours searched ({self.hours_searched})")
        width = max([len(o) for o in OUTPUTS])
        for o in self.occurrences:
            out.append(f"  {format_tag(o.load_hour)}  {o.output.ljust(width)}  {o.text}")
        return out + [f"  {line}" for line in self.footer()]

    def footer(self) -> list[str]:
        """The index state, agreement, notes and the hours searched."""
        out = []
        current = next((e for e in reversed(self.index) if e.live), None)
        if current is not None:
            exp = f", expiry value {current.expiry_value}" if current.expiry_value else ""
            out.append(f"index now: live, first loaded {format_tag(current.load_hour)}{exp}, "
                       f"slice {current.slice}")
        elif self.index:
            last = self.index[-1]
            out.append(f"index now: not live (the entry of {format_tag(last.load_hour)} has "
                       "expired; a later record of the key is unique again)")
        else:
            out.append("index now: no entry (a later record of the key would be unique)")
        if self.index_agrees is False:
            out += [f"INCONSISTENT: {m}" for m in self.inconsistencies]
        elif self.index_agrees:
            out.append("index and outputs agree")
        out += [f"note: {n}" for n in self.notes]
        out.append(f"searched the committed hours {self.hours_searched}")
        return out


# --------------------------------------------------------------------------------------------
# reading what was committed
# --------------------------------------------------------------------------------------------


@dataclass
class History:
    records: dict[str, commits.CommitRecord]  # committed hours in the range, by tag, ascending
    damaged: list[str]
    all_committed: list[str]
    reruns: list[str] = field(default_factory=list)  # hours answered from their last commit


def committed_history(st: Storage, first: str | None, last: str | None,
                      tags: list[str] | None = None) -> History:
    """The records of the committed hours (`tags`, else the commit log's) from `first` to `last`."""
    log = CommitLog(st)
    tags = sorted(log.committed()) if tags is None else tags
    lo = to_tag(parse_hour(first)) if first else None
    hi = to_tag(parse_hour(last)) if last else None
    records: dict[str, commits.CommitRecord] = {}
    damaged = []
    for t in tags:
        if (lo and t < lo) or (hi and t > hi):
            continue
        try:
            rec = log.read(t)
        except commits.CommitRecordError:
            damaged.append(t)
            continue
        if rec is not None:
            records[t] = rec
    # an hour being rerun (or whose rerun was cut short) answers from its last committed record,
    # as its tables still serve it (L1b)
    reruns = []
    for t, rec in lake.reruns(st).items():
        if t not in records and t not in damaged and not (lo and t < lo) and not (hi and t > hi):
            records[t] = rec
            reruns.append(t)
    records = dict(sorted(records.items()))
    return History(records, damaged, tags, sorted(reruns))


def output_files(st: Storage, name: str, tag: str, rec: commits.CommitRecord) -> list[str]:
    """The files of `name`'s partition of `tag` its commit record vouches for."""
    if rec.output_files is not None:
        return [st.spark_path(*partition(name, tag), f.name)
                for f in rec.output_files.get(name, ())]
    return [st.spark_path(*partition(name, tag))] if st.exists(st.path(*partition(name, tag))) \
        else []


def _local_files(st: Storage, name: str, tag: str, rec: commits.CommitRecord) -> list[str]:
    """`output_files` as paths of the storage's own file system (for pyarrow)."""
    if rec.output_files is not None:
        return [st.path(*partition(name, tag), f.name) for f in rec.output_files.get(name, ())]
    return st.list_files(st.path(*partition(name, tag)), ".parquet")


def _arrow_read(st: Storage, path: str, cols: list[str]) -> pa.Table:
    """Columns of one committed output file, read by pyarrow (the rejected lines)."""
    if st.local:  # pyarrow's own file I/O: no Python file layer
        return pq.read_table(path, columns=cols, use_threads=False)
    with st.fs.open(path, "rb") as fh:  # one file per thread of the caller's pool
        return pq.read_table(fh, columns=cols, use_threads=False)


def _schema(ds: DatasetConfig, name: str) -> T.StructType:
    return T.StructType([*[T.StructField(c, SPARK_TYPES[t]) for c, t in columns(ds, name)],
                         T.StructField(LOAD_HOUR, T.StringType())])


def _read(spark: SparkSession, ds: DatasetConfig, st: Storage, name: str,
          files: list[str]) -> DataFrame:
    return (spark.read.schema(_schema(ds, name)).option("basePath", st.spark_path(name))
            .parquet(*files))


def _key_filter(ds: DatasetConfig, keys: list[Key]) -> Column:
    schema = ds.source.schema
    if len(ds.key) == 1:
        k = ds.key[0]
        vals = sorted({key.values[k] for key in keys})
        if len(vals) == 1:
            return F.col(k) == _literal(vals[0], schema[k])
        return F.col(k).isin(*[_literal(v, schema[k]) for v in vals])
    cond: Column | None = None
    for key in keys:
        one: Column | None = None
        for k in ds.key:
            c = F.col(k) == _literal(key.values[k], schema[k])
            one = c if one is None else one & c
        cond = one if cond is None else cond | one
    assert cond is not None
    return cond


def _keys_frame(spark: SparkSession, ds: DatasetConfig, keys: dict[int, Key]) -> DataFrame:
    schema = ds.source.schema
    fields = [T.StructField(KID, T.LongType()),
              *[T.StructField(f"_c_{k}", T.LongType() if schema[k] in ("timestamp", "date")
                              else SPARK_TYPES[schema[k]]) for k in ds.key]]
    df = spark.createDataFrame([(i, *[key.values[k] for k in ds.key]) for i, key in keys.items()],
                               T.StructType(fields))
    return df.select(KID, *[_from_canonical(F.col(f"_c_{k}"), schema[k]).alias(k)
                            for k in ds.key])


def _from_canonical(col: Column, typ: str) -> Column:
    if typ == "timestamp":
        return F.timestamp_micros(col)
    if typ == "date":
        return F.date_from_unix_date(col.cast("int"))
    return col


# Consult the hours' key digests (the benchmark turns it off to measure what it buys).
USE_DIGEST = True

# Up to this many keys are also given to the Parquet reader as literals (pushed down); more (a
# test explaining every key of a corpus) only join, as one expression per key would grow the plan.
PUSHDOWN_KEYS = 32


def _match(spark: SparkSession, ds: DatasetConfig, df: DataFrame, keys: dict[int, Key],
           ) -> DataFrame:
    """The rows of `df` with one of `keys`, tagged with its `_kid`."""
    if len(keys) <= PUSHDOWN_KEYS:
        # literals: pushed down to Parquet statistics / bloom filters; `_kid` by a CASE over the
        # same literals (no join, no shuffle: a point lookup is one scan)
        kid: Column | None = None
        for i, key in keys.items():
            kid = (F.when(_key_filter(ds, [key]), F.lit(i)) if kid is None
                   else kid.when(_key_filter(ds, [key]), F.lit(i)))
        assert kid is not None
        return df.filter(_key_filter(ds, list(keys.values()))).withColumn(KID, kid)
    return df.join(F.broadcast(_keys_frame(spark, ds, keys)), on=list(ds.key))


def _row_select(ds: DatasetConfig, name: str) -> list[Column]:
    schema = ds.source.schema
    cols = [F.col(KID), F.col(LOAD_HOUR), F.col(SOURCE_FILE)]
    cols += [_canonical(F.col(c), t).alias(c) for c, t in schema.items()]
    if name == DUPLICATES:
        cols += [F.col(KIND), F.col(FIRST)]
    if name == EXPIRED:
        typ = expiry_point_type(ds)
        cols.append(_canonical(F.col(EXPIRY_POINT), typ).alias(EXPIRY_POINT))
    return cols


def _find_rows(spark: SparkSession, ds: DatasetConfig, st: Storage, hist: History,
               keys: dict[int, Key], since: dict[int, str]) -> dict[int, list[tuple[str, dict]]]:
    """(output, row) of every unique / duplicates / expired row of the keys, in two passes."""
    found: dict[int, list[tuple[str, dict]]] = {i: [] for i in keys}
    if not keys:
        return found
    lo = min(since.get(i, "") for i in keys)
    hours = [t for t in hist.records if t >= lo]
    where: dict[str, set[str]] = {}
    # pass 0: the hours' key digests name the hours that can hold the keys (engine/keydigest.py):
    # a day's from its pack where it answers for the hour (engine/daypack.py), else the hour's own
    if USE_DIGEST:
        h1s = [k.h1 for k in keys.values() if k.h1 is not None]
        packs = daypack.covers(st, {t: hist.records[t] for t in hours}, daypack.KEYS)
        held, answered = daypack.keys_holding(st, packs, h1s)
        tags = set().union(*held.values())
        digests = {t: paths for t in hours if t not in answered
                   and (paths := keydigest.usable(st, t, hist.records[t]))}
        unreadable: set[str] = set()
        if digests:
            held = keydigest.hours_holding(st, digests, h1s, unreadable)
            tags |= set().union(*held.values())
        for name in (UNIQUE, DUPLICATES, EXPIRED):
            where[name] = set(tags)
        hours = [t for t in hours if t not in answered
                 and (t not in digests or t in unreadable)]
    # pass 1: only the key columns of every other hour's files, to learn which hours hold them
    probes = []
    for name in (UNIQUE, DUPLICATES, EXPIRED):
        files = [f for t in hours for f in output_files(st, name, t, hist.records[t])]
        if files:
            probes.append(_match(spark, ds, _read(spark, ds, st, name, files)
                                 .select(*ds.key, LOAD_HOUR), keys)
                          .select(F.lit(name).alias("_name"), LOAD_HOUR))
    if probes:
        union = probes[0]
        for p in probes[1:]:
            union = union.unionByName(p)
        for r in union.collect():
            where.setdefault(r["_name"], set()).add(r[LOAD_HOUR])
    # pass 2: whole rows of only the hours that hold them: a few files by pyarrow, else every
    # output in one Spark job
    got = _arrow_rows(ds, st, hist, where, keys)
    if got is not None:
        for i, name, d in got:
            if d[LOAD_HOUR] >= since.get(i, ""):
                found[i].append((name, d))
        return found
    parts = []
    for name, tags in sorted(where.items()):
        files = [f for t in sorted(tags) for f in output_files(st, name, t, hist.records[t])]
        if not files:
            continue
        parts.append(_match(spark, ds, _read(spark, ds, st, name, files), keys)
                     .select(F.lit(name).alias("_name"), *_row_select(ds, name)))
    if not parts:  # the key is in none of the hours searched
        return found
    rows = parts[0]
    for p in parts[1:]:
        rows = rows.unionByName(p, allowMissingColumns=True)
    for r in rows.collect():
        d = r.asDict()
        name = d.pop("_name")
        if d[LOAD_HOUR] >= since.get(d[KID], ""):
            found[d[KID]].append((name, d))
    return found


# Rows of at most this many output files are read by pyarrow (no Spark job: ~0.4 s less per
# lookup); more by one Spark job, which prunes by the outputs' bloom filters.
ARROW_ROW_FILES = 24
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32()}


def _arrow_rows(ds: DatasetConfig, st: Storage, hist: History, where: dict[str, set[str]],
                keys: dict[int, Key]) -> list[tuple[int, str, dict]] | None:
    """(`_kid`, output, row) of the keys' rows in the hours `where` names, read by pyarrow and
    put in the form `_row_select` gives Spark's rows; None when Spark is to read them instead
    (many files, a double key column whose NaN / -0.0 equality is Spark's, or a file pyarrow
    does not read as the declared types)."""
    schema = ds.source.schema
    jobs = [(name, t, path) for name, tags in sorted(where.items()) for t in sorted(tags)
            for path in _local_files(st, name, t, hist.records[t])]
    if len(jobs) > ARROW_ROW_FILES or any(schema[k] == "double" for k in ds.key):
        return None
    key_table = pa.table({KID: pa.array(list(keys), pa.int64()),
                          **{k: pa.array([key.values[k] for key in keys.values()],
                                         _canonical_arrow_type(schema[k])) for k in ds.key}})

    def one(job: tuple[str, str, str]) -> list[tuple[int, str, dict]]:
        name, tag, path = job
        cols = dict(columns(ds, name))
        with (pa.OSFile(path, "rb") if st.local else st.fs.open(path, "rb")) as fh:
            pf = pq.ParquetFile(fh, coerce_int96_timestamp_unit="us")
            present = [c for c in cols if c in pf.schema_arrow.names]
            table = pf.read(columns=present, use_threads=False)
        data = {}
        for c, typ in cols.items():
            arr = (table.column(c).cast(ARROW_TYPES[typ]) if c in present
                   else pa.nulls(table.num_rows, ARROW_TYPES[typ]))
            data[c] = _canonical_arrow(arr, typ)
        hits = pa.table(data).join(key_table, keys=list(ds.key), join_type="inner")
        out = []
        for r in hits.to_pylist():
            i = r.pop(KID)
            row = {KID: i, LOAD_HOUR: tag, KIND: None, FIRST: None, EXPIRY_POINT: None, **r}
            out.append((i, name, row))
        return out

    try:
        with ThreadPoolExecutor(max_workers=READERS) as pool:
            return [r for part in pool.map(one, jobs) for r in part]
    except (OSError, ValueError, pa.ArrowException):
        return None


def _canonical_arrow_type(typ: str) -> pa.DataType:
    return {"timestamp": pa.int64(), "date": pa.int32()}.get(typ, ARROW_TYPES[typ])


def _canonical_arrow(arr: pa.ChunkedArray, typ: str) -> pa.ChunkedArray:
    """As `_canonical`: micros for timestamps, days for dates."""
    if typ in ("timestamp", "date"):
        return arr.cast(_canonical_arrow_type(typ))
    return arr


def _find_rejected(spark: SparkSession, ds: DatasetConfig, st: Storage, hist: History,
                   keys: dict[int, Key]) -> dict[int, list[dict]]:
    """Rejected rows whose `_raw` holds every non-null key value. Only the small `_raw` column of
    each hour is read, by pyarrow in parallel (a Spark job over every hour's file costs seconds
    of per-file planning on a long history)."""
    found: dict[int, list[dict]] = {i: [] for i in keys}
    needles = {i: k.needles() for i, k in keys.items()}
    flat = sorted({n for ns in needles.values() for group in ns for n in group})
    if not flat:
        return found

    def matching(table: pa.Table) -> list[dict]:
        raw = table.column(RAW)
        hit = None
        for n in flat:
            m = pc.match_substring(raw, n)
            hit = m if hit is None else pc.or_(hit, m)
        return table.filter(pc.fill_null(hit, False)).to_pylist()

    def scan_pack(c: daypack.Cover) -> tuple[daypack.Cover, list[dict] | None]:
        table = daypack.rejected_rows(st, c)
        if table is None:  # does not read: its hours are read from their own files
            return c, None
        tags = {int(t[11:13]): t for t in c.hours}
        return c, [{LOAD_HOUR: tags[r.pop(daypack.HOUR_COL)], **r} for r in matching(table)]

    def scan(item: tuple[str, str]) -> list[dict]:
        tag, path = item
        return [{LOAD_HOUR: tag, **r}
                for r in matching(_arrow_read(st, path, [SOURCE_FILE, REASON, RAW]))]

    rows: list[dict] = []
    answered: set[str] = set()
    packs = daypack.covers(st, hist.records, daypack.REJECTS)
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        for c, got in pool.map(scan_pack, packs):
            if got is not None:
                answered |= c.hours
                rows += got
        files = [(t, f) for t in hist.records if t not in answered
                 for f in _local_files(st, REJECTED, t, hist.records[t])]
        rows += [r for part in pool.map(scan, files) for r in part]
    for r in rows:
        raw = r[RAW]
        for i, groups in needles.items():
            if groups and all(any(n in raw for n in g) for g in groups):
                found[i].append(r)
    return found


def _index_entries(spark: SparkSession, ds: DatasetConfig, st: Storage,
                   keys: dict[int, Key], committed: set[str]) -> dict[int, list[dict]]:
    """The index entries of committed loads with the keys' digests (E3): of every slice with expiry
    (a point lookup does not know the key's expiry value), of the keys' hash slices without.
    Read by pyarrow (no Spark job); by Spark if a file does not read that way."""
    out: dict[int, list[dict]] = {i: [] for i in keys}
    health = check_index(st, ds)
    digests = {(k.h1, k.h2): i for i, k in keys.items() if k.h1 is not None}
    if not digests:
        return out
    files = [f for f in health.files.values() if any(t in committed for t in f.holds)]
    if ds.expiry is None:  # an entry's slice is its h1's hash bucket (index.live.slice_of)
        slices = {h1 % ds.index.buckets for h1, _ in digests}
        files = [f for f in files if f.slice in slices]
    if not files:
        return out
    h1s = sorted({h for h, _ in digests})
    cols = [H1, H2, ENTRY_LOAD_HOUR]
    if ds.expiry is not None:
        cols.append(V)
    if ds.fingerprint:
        cols.append(FP)
    try:
        rows = _arrow_entries(st, [f.rel for f in files], cols, h1s)
    except (OSError, ValueError, pa.ArrowException):
        df = spark.read.schema(store.entry_schema(ds)).parquet(
            *[st.spark_path(layout.INDEX, f.rel) for f in files])
        hits = df.filter(F.col(H1).isin(*h1s) if len(h1s) > 1 else F.col(H1) == F.lit(h1s[0]))
        rows = [r.asDict() for r in hits.select(*cols).collect()]
    for r in rows:
        i = digests.get((r[H1], r[H2]))
        if i is not None and r[ENTRY_LOAD_HOUR] in committed:
            r["_slice"] = _slice_of(ds, r)
            out[i].append(r)
    return out


def _slice_of(ds: DatasetConfig, entry: dict) -> int | None:
    """`index.live.slice_of` of one entry."""
    if ds.expiry is None:
        return entry[H1] % ds.index.buckets  # Spark's pmod: never negative
    v = entry[V]
    return None if v is None else math.floor(float(v) / ds.slice_span)


def _arrow_entries(st: Storage, rels: list[str], cols: list[str], h1s: list[int]) -> list[dict]:
    wanted = pa.array(h1s, pa.int64())

    def one(rel: str) -> list[dict]:
        path = st.path(layout.INDEX, rel)
        with (pa.OSFile(path, "rb") if st.local else st.fs.open(path, "rb")) as fh:
            pf = pq.ParquetFile(fh)
            hit = pc.is_in(pf.read(columns=[H1], use_threads=False).column(H1),
                           value_set=wanted)
            if not pc.any(hit).as_py():  # most files: the digests alone were read
                return []
            table = pf.read(columns=cols, use_threads=False)
        return table.filter(hit).to_pylist()

    with ThreadPoolExecutor(max_workers=READERS) as pool:
        return [r for part in pool.map(one, rels) for r in part]


# --------------------------------------------------------------------------------------------
# from rows to reasons
# --------------------------------------------------------------------------------------------


def _v_of(ds: DatasetConfig, row: dict) -> Any:
    """The expiry value v of an output row (canonical form), comparable with X_H."""
    exp = ds.expiry
    if exp is None:
        return None
    val = row[exp.column]
    if exp.categories is not None:
        return exp.categories.index(val) if val in exp.categories else None
    return val


def _fmt_v(ds: DatasetConfig, v: Any) -> str:
    """An expiry value / point in the expiry column's own terms."""
    exp = ds.expiry
    if exp is None or v is None:
        return "null"
    if exp.categories is not None:
        i = int(v)
        name = exp.categories[i] if 0 <= i < len(exp.categories) else f"position {i}"
        return json.dumps(name, ensure_ascii=False)
    return _fmt(ds, exp.column, int(v) if float(v).is_integer() else v)


def _diff(ds: DatasetConfig, a: dict, b: dict, cols: Sequence[str]) -> str:
    parts = [f"{c}: {_fmt(ds, c, a[c])} → {_fmt(ds, c, b[c])}" for c in cols if a[c] != b[c]]
    return ", ".join(parts)


def _order_reason(ds: DatasetConfig, win: dict, lose: dict) -> tuple[str, dict]:
    """Which R3 criterion put `win` before `lose` (both of one load and key)."""
    parts = []
    if ds.order_by:
        c = ds.order_by
        if win[c] != lose[c]:
            if lose[c] is None:
                return (f"{c} {_fmt(ds, c, win[c])} before null (nulls last)",
                        {"criterion": "order_by", c: [win[c], None]})
            return (f"{c} {_fmt(ds, c, win[c])} < {_fmt(ds, c, lose[c])}",
                    {"criterion": "order_by", c: [win[c], lose[c]]})
        parts.append(f"{c} tie ({_fmt(ds, c, win[c])})")
    if ds.expiry is not None:
        vw, vl = _v_of(ds, win), _v_of(ds, lose)
        if vw != vl:
            return (", then ".join([*parts, f"expiry value {_fmt_v(ds, vw)} < {_fmt_v(ds, vl)}"]),
                    {"criterion": "expiry_value", "expiry_value": [vw, vl]})
        parts.append("expiry value tie")
    if win[SOURCE_FILE] != lose[SOURCE_FILE]:
        return (", then ".join([*parts, f"source file {_base(win[SOURCE_FILE])} < "
                                        f"{_base(lose[SOURCE_FILE])}"]),
                {"criterion": "source_file", "source_file": [win[SOURCE_FILE], lose[SOURCE_FILE]]})
    return (", then ".join([*parts, "same file, earlier position in it"]),
            {"criterion": "position_in_file"})


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _print_values(ds: DatasetConfig, row: dict) -> dict[str, Any]:
    return {c: _printable(ds, c, row[c]) for c in ds.source.schema}


def _printable(ds: DatasetConfig, col: str, value: Any) -> Any:
    typ = ds.source.schema[col]
    if value is None or typ not in ("timestamp", "date"):
        return value
    return _fmt(ds, col, value)


def _occurrences(ds: DatasetConfig, hist: History, rows: list[tuple[str, dict]],
                 rejected: list[dict], searched_from_start: bool) -> list[Occurrence]:
    rank = {o: i for i, o in enumerate(OUTPUTS)}
    order_col = ds.order_by

    def sort_key(item: tuple[str, dict]) -> tuple:
        name, r = item
        o = r[order_col] if order_col else None
        v = _v_of(ds, r)
        return (r[LOAD_HOUR], rank[name], (o is None, o if o is not None else 0),
                v if v is not None else 0, r[SOURCE_FILE])

    rows = sorted(rows, key=sort_key)
    uniques = {r[LOAD_HOUR]: r for name, r in rows if name == UNIQUE}
    out: list[Occurrence] = []
    period = ds.expiry.period_text if ds.expiry else None
    for name, r in rows:
        tag = r[LOAD_HOUR]
        src = r[SOURCE_FILE]
        vals = _print_values(ds, r)
        if name == UNIQUE:
            earlier = [t for t in uniques if t < tag]
            losers = [d for n, d in rows if n == DUPLICATES and d[LOAD_HOUR] == tag
                      and d[FIRST] == tag]
            deciding: dict[str, Any] = {}
            if earlier:
                prev = uniques[earlier[-1]]
                v_prev = _v_of(ds, prev)
                gone = next((t for t, rec in hist.records.items() if earlier[-1] < t <= tag
                             and rec.expiry_point is not None and v_prev is not None
                             and v_prev < rec.expiry_point), None)
                rule = UNIQUE_AGAIN
                when = (f"at {format_tag(gone)} (expiry point {_fmt_v(ds, hist.records[gone].expiry_point)}"
                        f" > its {_fmt_v(ds, v_prev)})" if gone else "")
                text = (f"loaded again: the earlier entry (loaded {format_tag(earlier[-1])}) expired "
                        f"from the index {when}".rstrip() + f" (file {src})")
                deciding = {"earlier_load_hour": earlier[-1], "earlier_expiry_value":
                            _fmt_v(ds, v_prev), "expired_at_load_hour": gone}
            else:
                rule = FIRST_SEEN
                text = f"first seen (file {src})" if searched_from_start else \
                    f"first seen in the hours searched (file {src})"
            if losers:
                reason, _ = _order_reason(ds, r, losers[0])
                text += f"; won in its batch over {len(losers)} other cop" \
                        f"{'y' if len(losers) == 1 else 'ies'} ({reason})"
                deciding["in_batch_losers"] = len(losers)
            out.append(Occurrence(tag, name, rule, text, src, vals, deciding))
        elif name == DUPLICATES:
            first = r[FIRST]
            kept = uniques.get(first)
            kind = r[KIND]
            fp_cols = list(ds.fingerprint)
            deciding = {"duplicate_kind": kind, "first_load_hour": first}
            if kept is not None and fp_cols:
                changes = _diff(ds, kept, r, fp_cols)
                if changes:
                    deciding["fingerprint_changes"] = {c: [_printable(ds, c, kept[c]),
                                                           _printable(ds, c, r[c])]
                                                       for c in fp_cols if kept[c] != r[c]}
            else:
                changes = ""
            if kind == "conflict":
                fp_text = f"fingerprint differs ({changes})" if changes else \
                    "fingerprint differs" + ("" if kept is not None
                                             else " (the kept row is outside the hours searched)")
            else:
                fp_text = "fingerprint equal" if fp_cols else "no fingerprint configured"
            if first == tag:
                rule = IN_BATCH
                if kept is not None:
                    reason, crit = _order_reason(ds, kept, r)
                    deciding.update(crit)
                else:
                    reason = "R3 order"
                text = (f"in-batch duplicate: lost to this load's unique row ({reason}); "
                        f"{'conflict, ' if kind == 'conflict' else ''}{fp_text} (file {src})")
            elif kind == "conflict":
                rule = CONFLICT_DUP
                what = f"({changes})" if changes else "(fingerprint hash differs)"
                text = (f"conflict: fingerprint differs from the {format_tag(first)} row {what} "
                        f"(file {src})")
            else:
                rule = NATURAL_DUP
                text = f"natural duplicate of the {format_tag(first)} row ({fp_text}) (file {src})"
            out.append(Occurrence(tag, name, rule, text, src, vals, deciding))
        elif name == EXPIRED:
            exp = ds.expiry
            assert exp is not None
            rec = hist.records[tag]
            x = rec.expiry_point
            v = _v_of(ds, r)
            basis = "latest event value" if exp.basis == "event" else "end of the hour"
            text = (f"{exp.column} {_fmt_v(ds, v)} is older than the hour's expiry point "
                    f"{_fmt_v(ds, x)} ({basis} − {period}) (file {src})")
            out.append(Occurrence(tag, name, EXPIRED_RULE, text, src, vals, {
                "expiry_value": _fmt_v(ds, v), "expiry_point": _fmt_v(ds, x),
                "latest_point": _fmt_v(ds, rec.latest_point), "period": period,
                "basis": exp.basis}))
    for r in sorted(rejected, key=lambda r: (r[LOAD_HOUR], r[SOURCE_FILE] or "", r[RAW])):
        raw = r[RAW]
        shown = raw if len(raw) <= 120 else raw[:117] + "..."
        out.append(Occurrence(r[LOAD_HOUR], REJECTED, REJECTED_RULE,
                              f"rejected: {r[REASON]} (file {r[SOURCE_FILE]}): {shown}",
                              r[SOURCE_FILE], {"_raw": raw}, {"reason": r[REASON]}))
    out.sort(key=lambda o: o.load_hour)  # stable: within an hour, the order above
    return out


def _agreement(ds: DatasetConfig, st: Storage, hist: History, rows: list[tuple[str, dict]],
               entries: list[dict]) -> list[str]:
    """What the index holds for the key against what its unique rows say it must hold (E3)."""
    problems = []
    uniques = {r[LOAD_HOUR]: r for name, r in rows if name == UNIQUE}
    by_load = {e[ENTRY_LOAD_HOUR]: e for e in entries}
    kept = live.kept_from(st)
    for tag, r in sorted(uniques.items()):
        e = by_load.get(tag)
        v = _v_of(ds, r)
        if e is None:
            retired = ds.expiry is not None and kept is not None and v is not None and v < kept
            if not retired:
                problems.append(f"the unique row of {format_tag(tag)} has no index entry (a later "
                                "record of the key would wrongly be unique)")
        elif ds.expiry is not None and v is not None and e.get(V) is not None \
                and float(e[V]) != float(v):
            problems.append(f"the index entry of {format_tag(tag)} holds expiry value "
                            f"{_fmt_v(ds, e[V])}, its unique row {_fmt_v(ds, v)}")
    for tag in sorted(set(by_load) - set(uniques)):
        problems.append(f"the index holds an entry of {format_tag(tag)} but that hour has no unique "
                        "row of the key (a later record would wrongly be a duplicate)")
    return problems


# --------------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------------


def explain_keys(spark: SparkSession, ds: DatasetConfig, given: list[dict[str, str | None]],
                 first: str | None = None, last: str | None = None) -> list[Explanation]:
    """Explain many keys with one pass over the outputs (the CLI and the Dagster job give one).

    `given` are keys as `parse_key_args` returns them; `first` / `last` limit the hours searched
    (partition keys or tags, inclusive).
    """
    st = Storage(ds.output)
    # the key is typed (on the driver, or by a Spark job while the records are read); then the
    # rejected lines (which need only the key's text), the index entries and the outputs are read
    # beside each other. Reading the index while the records are read (GIL-bound validation) was
    # slower: a point lookup is bound by per-file latency and by contention for 2 cores
    texts = {i: Key({k: g.get(k) for k in ds.key}, {}, None, None) for i, g in enumerate(given)}
    all_committed = sorted(CommitLog(st).committed())  # one list for the index and the records
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        typing = pool.submit(type_keys, spark, ds, given)
        hist = committed_history(st, first, last, all_committed)
        f_rejected = pool.submit(_find_rejected, spark, ds, st, hist, texts)
        by_id = dict(enumerate(typing.result()))
        typed = {i: k for i, k in by_id.items() if not k.has_null}
        f_entries = pool.submit(_index_entries, spark, ds, st, typed, set(all_committed))
        since: dict[int, str] = {}
        if ds.expiry is None:  # lever: nothing of the key before its entry's load (docstring)
            for i, es in f_entries.result().items():
                if es:
                    since[i] = min(e[ENTRY_LOAD_HOUR] for e in es)
        f_rows = pool.submit(_find_rows, spark, ds, st, hist, typed, since)
        entries, rejected, rows = f_entries.result(), f_rejected.result(), f_rows.result()
    full_range = first is None and last is None
    searched_from_start = first is None or (bool(hist.all_committed)
                                            and to_tag(parse_hour(first)) <= hist.all_committed[0])
    tags = list(hist.records)
    searched = compress_ranges([parse_hour(t) for t in tags]) if tags else \
        "no committed hours"
    last_rec = None  # the latest committed load decides what is live now, whatever the range
    if hist.all_committed:
        newest = hist.all_committed[-1]
        try:
            last_rec = hist.records.get(newest) or CommitLog(st).read(newest)
        except commits.CommitRecordError:
            last_rec = None
    x_now = last_rec.expiry_point if last_rec is not None else None
    out = []
    for i, key in by_id.items():
        key_rows = rows.get(i, [])
        idx = []
        for e in sorted(entries.get(i, []), key=lambda e: e[ENTRY_LOAD_HOUR]):
            v = e.get(V)
            alive = ds.expiry is None or x_now is None or (v is not None and v >= x_now)
            idx.append(IndexEntry(e[ENTRY_LOAD_HOUR], e["_slice"],
                                  _fmt_v(ds, v) if ds.expiry is not None else None, alive))
        notes = []
        if hist.damaged:
            notes.append("commit records that do not read were skipped (hours "
                         f"{', '.join(format_tag(t) for t in hist.damaged)}); {FIX.format(ds=ds.name)}")
        if hist.reruns:
            notes.append(f"a rerun of {', '.join(format_tag(t) for t in hist.reruns)} is in progress "
                         "(or was cut short): answered from its last committed load, which the "
                         "tables still serve")
        if key.has_null:
            notes.append("a key with a null column is always rejected (null_key): only rejected "
                         "lines are searched")
        agree: bool | None = None
        problems: list[str] = []
        if full_range and not key.has_null and not hist.damaged and not hist.reruns:
            problems = _agreement(ds, st, hist, key_rows, entries.get(i, []))
            agree = not problems
            if problems:
                problems.append(FIX.format(ds=ds.name))
        occ = _occurrences(ds, hist, key_rows, rejected.get(i, []), searched_from_start)
        out.append(Explanation(ds.name, {k: _printable(ds, k, key.values[k]) for k in ds.key},
                               ", ".join(f"{k}={_fmt(ds, k, key.values[k])}" for k in ds.key),
                               occ, searched, idx, agree, problems, notes))
    return out


def explain_key(spark: SparkSession, ds: DatasetConfig, given: dict[str, str | None],
                first: str | None = None, last: str | None = None) -> Explanation:
    return explain_keys(spark, ds, [given], first, last)[0]


def markdown(ex: Explanation) -> str:
    """The explanation as a Markdown table (the Dagster job's run metadata)."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    head = f"**{ex.dataset}** key `{ex.label}`\n\n"
    if not ex.occurrences:
        body = f"Never seen in the committed hours searched ({ex.hours_searched}).\n"
    else:
        body = "| load hour | output | rule | why |\n|---|---|---|---|\n" + "".join(
            f"| {format_tag(o.load_hour)} | {o.output} | {o.rule} | {cell(o.text)} |\n"
            for o in ex.occurrences)
    return head + body + "\n" + "".join(f"- {cell(line)}\n" for line in ex.footer())


def sample_keys(spark: SparkSession, ds: DatasetConfig, tag: str, conflicts_only: bool,
                limit: int = 10) -> list[dict[str, str]]:
    """Up to `limit` keys of hour `tag`'s duplicates (its conflicts only), as `--key` texts.

    For failing checks' metadata: read only when a check fails, and only the key columns of the
    files the hour's commit record lists (a duplicate's key is a live key of this or an earlier
    load, so `explain` tells its whole story).
    """
    st = Storage(ds.output)
    rec = CommitLog(st).read(tag)
    files = output_files(st, DUPLICATES, tag, rec) if rec is not None else []
    if not files:
        return []
    df = _read(spark, ds, st, DUPLICATES, files)
    if conflicts_only:
        df = df.filter(F.col(KIND) == F.lit("conflict"))
    return key_texts(ds, df, limit)


def key_texts(ds: DatasetConfig, df: DataFrame, limit: int = 10) -> list[dict[str, str | None]]:
    """Up to `limit` distinct keys of `df` (smallest first), as `--key` texts (None: null)."""
    schema = ds.source.schema
    rows = (df.select(*[_canonical(F.col(k), schema[k]).alias(k) for k in ds.key])
            .distinct().orderBy(*ds.key).limit(limit).collect())
    return [{k: None if r[k] is None else _key_text(ds, k, r[k]) for k in ds.key} for r in rows]


def _key_text(ds: DatasetConfig, col: str, value: Any) -> str:
    typ = ds.source.schema[col]
    return value if typ == "string" else _fmt(ds, col, value)


def explain_command(ds: DatasetConfig, key: dict[str, str | None], config: str) -> str:
    """The `dedup-pipeline explain` command line for a key (shell-quoted)."""
    import shlex

    parts = ["dedup-pipeline", "explain", "--config", config, "--dataset", ds.name]
    nulls = {k: None for k, v in key.items() if v is None}
    for k, v in key.items():
        if v is not None:
            parts += ["--key", f"{k}={v}"]
    if nulls:
        parts += ["--key-json", json.dumps(nulls)]
    return " ".join(shlex.quote(p) for p in parts)
