"""Explain a key: where each of its records went, and which rule put it there (docs/design.md,
"Explaining a key", E1-E5). Read-only, and no Spark: the key is typed and digested in Python
(`engine/core/keys.py`), every file is read by pyarrow.

- The hours are the committed ones (E1), of each only the Parquet files its commit record lists;
  an hour being loaded again answers from its last committed record (L1b), with a note.
- The rule of each line (E2) is read off the columns the load wrote, X_H off the commit record.
- Rejected rows have no typed key: listed when `_raw` holds every non-null key value (E2).
- The index state (E3): the entries of committed loads with the key's digest.
- Speed (E5): the hours' key digests (`engine/keydigest.py`) name the hours that can hold the key;
  only those hours' outputs are read, with the key pushed down as a filter (row-group
  statistics). An hour without a usable digest is read the same way. Without expiry, a key with
  an index entry has no unique, duplicate or expired row before that entry's load.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import keydigest, lake
from dedup_pipeline.engine.core import commits, keys
from dedup_pipeline.engine.core.classify import order_criteria, order_key
from dedup_pipeline.engine.core.columns import (
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
from dedup_pipeline.engine.core.columns import LOAD_HOUR_PARTITION as LOAD_HOUR
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.expiry import live_value, value_of
from dedup_pipeline.engine.core.formats import rebuild_command
from dedup_pipeline.engine.core.index import layout, live
from dedup_pipeline.engine.core.index.health import check_index
from dedup_pipeline.engine.core.index.store import entry_slice
from dedup_pipeline.engine.core.outputs import (
    ARROW_TYPES,
    DUPLICATES,
    EXPIRED,
    OUTPUTS,
    REJECTED,
    UNIQUE,
    columns,
    partition,
)
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.keydigest import READERS
from dedup_pipeline.hours import compress_ranges, format_tag, parse_hour, to_tag

# rules, as the JSON names them
FIRST_SEEN = "first_seen"
UNIQUE_AGAIN = "unique_again"
IN_BATCH = "in_batch_duplicate"
NATURAL_DUP = "natural_duplicate"
CONFLICT_DUP = "conflict"
EXPIRED_RULE = "expired"
REJECTED_RULE = "rejected"

CANONICAL = {"timestamp": pa.int64(), "date": pa.int32()}  # micros, days


class ExplainKeyError(ValueError):
    """A key given on the command line or in run config that does not fit the dataset's key."""


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
    digests: tuple[tuple[int, int], ...] = ()  # (h1, h2) of every spelling of a double column

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


def type_keys(ds: DatasetConfig, given: list[dict[str, str | None]]) -> list[Key]:
    """Type each key's text exactly as a load types landing text and digest it (E4), in Python."""
    schema = ds.source.schema
    out = []
    for g in given:
        values: dict[str, Any] = {}
        for k in ds.key:
            text = g.get(k)
            values[k] = None if text is None else keys.cast(schema[k], text)
            if text is not None and values[k] is None and text.strip(" ") != "":
                raise ExplainKeyError(
                    f"dataset {ds.name!r}: key column {k!r} is {schema[k]}; {text!r} does not "
                    f"cast to it ({_type_hint(schema[k])})")
        texts = {k: g.get(k) for k in ds.key}
        if any(v is None for v in values.values()):  # empty text of a typed column: a null
            out.append(Key(texts, values, None, None))
        else:
            found = keys.key_digests([values[k] for k in ds.key], [schema[k] for k in ds.key])
            out.append(Key(texts, values, *found[0], tuple(found)))
    return out


def _fix(ds: DatasetConfig) -> str:
    return (f"run `dedup-pipeline verify --config <file> --dataset {ds.name}` to see every "
            f"violation, then `{rebuild_command(ds.name)}` to rebuild the index from unique")


def _type_hint(typ: str) -> str:
    return {"long": "an integer, e.g. 4711", "double": "a number, e.g. 1.5",
            "boolean": "true or false",
            "timestamp": "ISO-8601, e.g. 2026-11-27T07:15:00Z (UTC when no offset is given)",
            "date": "YYYY-MM-DD"}.get(typ, "text")



def _fmt(ds: DatasetConfig, col: str | None, value: Any, typ: str | None = None) -> str:
    return keys.fmt(typ or (ds.source.schema[col] if col else "string"), value)


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
    return [st.path(*partition(name, tag), f.name) for f in rec.output_files.get(name, ())]


def _filesystem(st: Storage) -> pafs.FileSystem:
    return pafs.LocalFileSystem() if st.local else pafs.PyFileSystem(pafs.FSSpecHandler(st.fs))


def _scan(ds: DatasetConfig, st: Storage, name: str, files: list[str], cols: list[str],
          where: pds.Expression) -> pa.Table:
    """The rows of `files` (of output `name`, any hours) that `where` keeps, with their load hour:
    one dataset of the declared types, the filter pushed down to row-group statistics, the files
    read in parallel."""
    schema = lake.arrow_schema(ds, name)
    fmt = pds.ParquetFileFormat(read_options=pds.ParquetReadOptions(
        coerce_int96_timestamp_unit="us"))
    data = pds.dataset(files, schema=schema, format=fmt, filesystem=_filesystem(st),
                       partitioning=pds.partitioning(pa.schema([(LOAD_HOUR, pa.string())]),
                                                     flavor="hive"),
                       partition_base_dir=st.path(name))
    table = data.to_table(columns=[*cols, LOAD_HOUR], filter=where)
    return pa.table({c: table[c].cast(CANONICAL[t]) if (t := dict(columns(ds, name)).get(c))
                     in CANONICAL else table[c] for c in table.column_names})


def _norm(value: Any) -> Any:
    """A key value as a dict key: every NaN one value (R2); -0.0 already equals 0.0."""
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def _key_filter(ds: DatasetConfig, typed: dict[int, Key]) -> pds.Expression:
    schema = ds.source.schema
    any_key: pds.Expression | None = None
    for key in typed.values():
        one: pds.Expression | None = None
        for k in ds.key:
            v = key.values[k]
            f = pc.field(k)
            c = (f.is_nan() if _norm(v) == "NaN" else
                 f == pa.scalar(v, CANONICAL.get(schema[k], ARROW_TYPES[schema[k]]))
                 .cast(ARROW_TYPES[schema[k]]))
            one = c if one is None else one & c
        any_key = one if any_key is None else any_key | one
    assert any_key is not None
    return any_key


def _find_rows(ds: DatasetConfig, st: Storage, hist: History, typed: dict[int, Key],
               since: dict[int, str]) -> dict[int, list[tuple[str, dict]]]:
    """(output, row) of every unique / duplicates / expired row of the keys: the key digests name
    the hours that can hold them; those hours and the hours without a usable digest are read."""
    found: dict[int, list[tuple[str, dict]]] = {i: [] for i in typed}
    if not typed:
        return found
    lo = min(since.get(i, "") for i in typed)
    hours = [t for t in hist.records if t >= lo]
    digests = {t: p for t in hours if (p := keydigest.usable(st, t, hist.records[t]))}
    unreadable: set[str] = set()
    h1s = [h for k in typed.values() for h, _ in k.digests]
    held = keydigest.hours_holding(st, digests, h1s, unreadable)
    read = set().union(*held.values()) | {t for t in hours if t not in digests} | unreadable
    by_value: dict[tuple, list[int]] = {}
    for i, key in typed.items():
        by_value.setdefault(tuple(_norm(key.values[k]) for k in ds.key), []).append(i)
    where = _key_filter(ds, typed)

    def scan(name: str) -> list[tuple[int, str, dict]]:
        files = [f for t in sorted(read) for f in output_files(st, name, t, hist.records[t])]
        if not files:
            return []
        out = []
        for r in _scan(ds, st, name, files, [c for c, _ in columns(ds, name)], where).to_pylist():
            row = {KIND: None, FIRST: None, EXPIRY_POINT: None, **r}
            for i in by_value.get(tuple(_norm(r[k]) for k in ds.key), []):
                out.append((i, name, row))
        return out

    with ThreadPoolExecutor(max_workers=3) as pool:
        for part in pool.map(scan, (UNIQUE, DUPLICATES, EXPIRED)):
            for i, name, row in part:
                if row[LOAD_HOUR] >= since.get(i, ""):
                    found[i].append((name, row))
    return found


def _find_rejected(ds: DatasetConfig, st: Storage, hist: History,
                   texts: dict[int, Key]) -> dict[int, list[dict]]:
    """Rejected rows whose `_raw` holds every non-null key value (E2): the substrings pushed down
    as a filter on the `_raw` column, every hour's files read in parallel."""
    found: dict[int, list[dict]] = {i: [] for i in texts}
    needles = {i: k.needles() for i, k in texts.items()}
    flat = sorted({n for ns in needles.values() for group in ns for n in group})
    files = [f for t in hist.records for f in output_files(st, REJECTED, t, hist.records[t])]
    if not flat or not files:
        return found
    hit: pds.Expression | None = None
    for n in flat:
        m = pc.match_substring(pc.field(RAW), n)
        hit = m if hit is None else hit | m
    assert hit is not None
    for r in _scan(ds, st, REJECTED, files, [SOURCE_FILE, REASON, RAW], hit).to_pylist():
        for i, groups in needles.items():
            if groups and all(any(n in r[RAW] for n in g) for g in groups):
                found[i].append(r)
    return found


def _index_entries(ds: DatasetConfig, st: Storage, typed: dict[int, Key], committed: set[str]
                   ) -> dict[int, list[dict]]:
    """The index entries of committed loads with the keys' digests (E3): of every slice with expiry
    (a point lookup does not know the key's expiry value), of the keys' hash slices without."""
    out: dict[int, list[dict]] = {i: [] for i in typed}
    digests = {d: i for i, k in typed.items() for d in k.digests}
    if not digests:
        return out
    files = [f for f in check_index(st, ds).files.values() if any(t in committed for t in f.holds)]
    if ds.expiry is None:  # an entry's slice is its h1's hash bucket (index.store.slice_of)
        slices = {entry_slice(ds, h1, None) for h1, _ in digests}
        files = [f for f in files if f.slice in slices]
    cols = [H1, H2, ENTRY_LOAD_HOUR, *([V] if ds.expiry is not None else []),
            *([FP] if ds.fingerprint else [])]
    wanted = pa.array(sorted({h for h, _ in digests}), pa.int64())

    def one(rel: str) -> list[dict]:
        path = st.path(layout.INDEX, rel)
        with (pa.OSFile(path, "rb") if st.local else st.fs.open(path, "rb")) as fh:
            pf = pq.ParquetFile(fh)
            hit = pc.is_in(pf.read(columns=[H1], use_threads=False).column(H1), value_set=wanted)
            if not pc.any(hit).as_py():  # most files: the digests alone were read
                return []
            return pf.read(columns=cols, use_threads=False).filter(hit).to_pylist()

    with ThreadPoolExecutor(max_workers=READERS) as pool:
        for r in [r for part in pool.map(one, [f.rel for f in files]) for r in part]:
            i = digests.get((r[H1], r[H2]))
            if i is not None and r[ENTRY_LOAD_HOUR] in committed:
                r["_slice"] = entry_slice(ds, r[H1], r.get(V))
                out[i].append(r)
    return out


# --------------------------------------------------------------------------------------------
# from rows to reasons
# --------------------------------------------------------------------------------------------


def _v_of(ds: DatasetConfig, row: dict) -> Any:
    """The expiry value v of an output row (canonical form), comparable with X_H."""
    return value_of(ds, row[ds.expiry.column]) if ds.expiry is not None else None


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
    """Which R3 criterion (`classify.order_criteria`) put `win` before `lose` (both of one load
    and key; output rows, so without their position: equal up to it, it was the position)."""
    parts = []
    for c in order_criteria(ds):
        if c == ds.order_by:
            if win[c] != lose[c]:
                if lose[c] is None:
                    return (f"{c} {_fmt(ds, c, win[c])} before null (nulls last)",
                            {"criterion": "order_by", c: [win[c], None]})
                return (f"{c} {_fmt(ds, c, win[c])} < {_fmt(ds, c, lose[c])}",
                        {"criterion": "order_by", c: [win[c], lose[c]]})
            parts.append(f"{c} tie ({_fmt(ds, c, win[c])})")
        elif c == V:
            vw, vl = _v_of(ds, win), _v_of(ds, lose)
            if vw != vl:
                return (", then ".join([*parts, f"expiry value {_fmt_v(ds, vw)} < "
                                                f"{_fmt_v(ds, vl)}"]),
                        {"criterion": "expiry_value", "expiry_value": [vw, vl]})
            parts.append("expiry value tie")
        elif c == SOURCE_FILE and win[c] != lose[c]:
            return (", then ".join([*parts, f"source file {_base(win[c])} < {_base(lose[c])}"]),
                    {"criterion": "source_file", "source_file": [win[c], lose[c]]})
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
    """Each row of the key as an occurrence with its rule and reason, by load hour; within an
    hour unique, duplicates, expired (each in R3 order), then rejected."""
    rank = {o: i for i, o in enumerate(OUTPUTS)}
    rows = sorted(rows, key=lambda item: (item[1][LOAD_HOUR], rank[item[0]],
                                          order_key(ds, {**item[1], V: _v_of(ds, item[1])})))
    uniques = {r[LOAD_HOUR]: r for name, r in rows if name == UNIQUE}
    out: list[Occurrence] = []
    for name, r in rows:
        if name == UNIQUE:
            losers = [d for n, d in rows if n == DUPLICATES and d[LOAD_HOUR] == d[FIRST]
                      == r[LOAD_HOUR]]
            out.append(_unique(ds, hist, r, uniques, losers, searched_from_start))
        elif name == DUPLICATES:
            out.append(_duplicate(ds, r, uniques.get(r[FIRST])))
        elif name == EXPIRED:
            out.append(_expired(ds, hist, r))
    for r in sorted(rejected, key=lambda r: (r[LOAD_HOUR], r[SOURCE_FILE] or "", r[RAW])):
        raw = r[RAW]
        shown = raw if len(raw) <= 120 else raw[:117] + "..."
        out.append(Occurrence(r[LOAD_HOUR], REJECTED, REJECTED_RULE,
                              f"rejected: {r[REASON]} (file {r[SOURCE_FILE]}): {shown}",
                              r[SOURCE_FILE], {RAW: raw}, {"reason": r[REASON]}))
    out.sort(key=lambda o: o.load_hour)  # stable: within an hour, the order above
    return out


def _unique(ds: DatasetConfig, hist: History, r: dict, uniques: dict[str, dict],
            losers: list[dict], searched_from_start: bool) -> Occurrence:
    """A unique row: first seen, or loaded again once its earlier entry expired (R6); with the
    copies it won over in its batch (R3)."""
    tag, src = r[LOAD_HOUR], r[SOURCE_FILE]
    earlier = [t for t in uniques if t < tag]
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
    return Occurrence(tag, UNIQUE, rule, text, src, _print_values(ds, r), deciding)


def _duplicate(ds: DatasetConfig, r: dict, kept: dict | None) -> Occurrence:
    """A duplicate: lost in its batch (R3), or of an earlier hour's row, natural or a conflict
    (R4, R5); `kept` is the unique row it duplicates, if among the hours searched."""
    tag, src, first, kind = r[LOAD_HOUR], r[SOURCE_FILE], r[FIRST], r[KIND]
    fp_cols = list(ds.fingerprint)
    deciding: dict[str, Any] = {"duplicate_kind": kind, "first_load_hour": first}
    changes = ""
    if kept is not None and fp_cols:
        changes = _diff(ds, kept, r, fp_cols)
        if changes:
            deciding["fingerprint_changes"] = {c: [_printable(ds, c, kept[c]),
                                                   _printable(ds, c, r[c])]
                                               for c in fp_cols if kept[c] != r[c]}
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
    return Occurrence(tag, DUPLICATES, rule, text, src, _print_values(ds, r), deciding)


def _expired(ds: DatasetConfig, hist: History, r: dict) -> Occurrence:
    """An expired row: its expiry value against its hour's expiry point (R6)."""
    exp = ds.expiry
    assert exp is not None
    tag, src = r[LOAD_HOUR], r[SOURCE_FILE]
    rec = hist.records[tag]
    x, v = rec.expiry_point, _v_of(ds, r)
    basis = "latest event value" if exp.basis == "event" else "end of the hour"
    text = (f"{exp.column} {_fmt_v(ds, v)} is older than the hour's expiry point "
            f"{_fmt_v(ds, x)} ({basis} − {exp.period_text}) (file {src})")
    return Occurrence(tag, EXPIRED, EXPIRED_RULE, text, src, _print_values(ds, r), {
        "expiry_value": _fmt_v(ds, v), "expiry_point": _fmt_v(ds, x),
        "latest_point": _fmt_v(ds, rec.latest_point), "period": exp.period_text,
        "basis": exp.basis})


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


def explain_keys(ds: DatasetConfig, given: list[dict[str, str | None]],
                 first: str | None = None, last: str | None = None) -> list[Explanation]:
    """Explain many keys with one pass over the outputs (the CLI and the Dagster job give one).

    `given` are keys as `parse_key_args` returns them; `first` / `last` limit the hours searched
    (partition keys or tags, inclusive).
    """
    st = Storage(ds.output)
    by_id = dict(enumerate(type_keys(ds, given)))
    typed = {i: k for i, k in by_id.items() if not k.has_null}
    all_committed = sorted(CommitLog(st).committed())  # one list for the index and the records
    with ThreadPoolExecutor(max_workers=3) as pool:
        f_entries = pool.submit(_index_entries, ds, st, typed, set(all_committed))
        hist = committed_history(st, first, last, all_committed)
        f_rejected = pool.submit(_find_rejected, ds, st, hist, by_id)
        since: dict[int, str] = {}
        if ds.expiry is None:  # nothing of the key before its entry's load (module docstring)
            for i, es in f_entries.result().items():
                if es:
                    since[i] = min(e[ENTRY_LOAD_HOUR] for e in es)
        rows = _find_rows(ds, st, hist, typed, since)
        entries, rejected = f_entries.result(), f_rejected.result()
    full_range = first is None and last is None
    searched_from_start = first is None or (bool(hist.all_committed)
                                            and to_tag(parse_hour(first)) <= hist.all_committed[0])
    tags = list(hist.records)
    searched = compress_ranges([parse_hour(t) for t in tags]) if tags else \
        "no committed hours"
    last_rec = None  # the latest committed load decides what is live now, whatever the range
    if hist.all_committed:
        newest = hist.all_committed[-1]
        last_rec = hist.records.get(newest) or CommitLog(st).read_intact(newest)
    x_now = last_rec.expiry_point if last_rec is not None else None
    out = []
    for i, key in by_id.items():
        key_rows = rows.get(i, [])
        idx = []
        for e in sorted(entries.get(i, []), key=lambda e: e[ENTRY_LOAD_HOUR]):
            v = e.get(V)
            alive = ds.expiry is None or live_value(v, x_now)
            idx.append(IndexEntry(e[ENTRY_LOAD_HOUR], e["_slice"],
                                  _fmt_v(ds, v) if ds.expiry is not None else None, alive))
        notes = []
        if hist.damaged:
            notes.append("commit records that do not read were skipped (hours "
                         f"{', '.join(format_tag(t) for t in hist.damaged)}); {_fix(ds)}")
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
                problems.append(_fix(ds))
        occ = _occurrences(ds, hist, key_rows, rejected.get(i, []), searched_from_start)
        out.append(Explanation(ds.name, {k: _printable(ds, k, key.values[k]) for k in ds.key},
                               ", ".join(f"{k}={_fmt(ds, k, key.values[k])}" for k in ds.key),
                               occ, searched, idx, agree, problems, notes))
    return out


def explain_key(ds: DatasetConfig, given: dict[str, str | None],
                first: str | None = None, last: str | None = None) -> Explanation:
    return explain_keys(ds, [given], first, last)[0]


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


def sample_keys(ds: DatasetConfig, tag: str, conflicts_only: bool,
                limit: int = 10) -> list[dict[str, str | None]]:
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
    where = pc.field(KIND) == "conflict" if conflicts_only else pc.scalar(True)
    table = _scan(ds, st, DUPLICATES, files, list(ds.key), where)
    schema = ds.source.schema
    found = {tuple(r[k] for k in ds.key) for r in table.to_pylist()}
    rows = sorted(found, key=lambda r: [(v is not None, _norm(v) == "NaN", v if v == v else 0)
                                        for v in r])[:limit]
    return [{k: keys.key_text(schema[k], v) for k, v in zip(ds.key, r, strict=True)} for r in rows]


def explain_command(ds: DatasetConfig, key: dict[str, str | None], config: str) -> str:
    """The `dedup-pipeline explain` command line for a key (shell-quoted)."""

    parts = ["dedup-pipeline", "explain", "--config", config, "--dataset", ds.name]
    nulls = {k: None for k, v in key.items() if v is None}
    for k, v in key.items():
        if v is not None:
            parts += ["--key", f"{k}={v}"]
    if nulls:
        parts += ["--key-json", json.dumps(nulls)]
    return " ".join(shlex.quote(p) for p in parts)
