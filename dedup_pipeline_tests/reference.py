"""A pure-Python reference implementation of SPEC R1-R8: the independent oracle of test_reference.

No Spark, nothing from `dedup_pipeline.engine`: the rules are implemented directly from the SPEC,
the simple way (dicts and sorted lists), so that the Spark engine can be checked against it.

Rows are returned in a plain comparable form, per output:

    unique      (*source values, basename of _source_file)
    duplicates  (*source values, basename, _duplicate_kind, _first_load_hour)
    expired     (*source values, basename, _expiry_point)
    rejected    (basename, _reject_reason, raw)

Source values are typed: string -> str, long -> int, double -> float, boolean -> bool,
timestamp -> epoch microseconds (int), date -> days since the epoch (int). `_expiry_point` is in
the expiry column's form (micros, the number, or the category name). `raw` is the original line,
except for a CSV row that parsed into the right number of fields but was rejected for its values:
there the engine re-serializes the row, so raw is the tuple of its fields ("" for null) — see
`normalise_raw`.

Interpretations of the SPEC made here (the engine agrees):
- JSONL: a line that is empty or only spaces is not a record; any other line that is not a JSON
  object is `malformed`; a field that is absent or JSON null is null; a JSON scalar given for a
  string column is taken as its JSON text.
- CSV (RFC 4180, `csv` module): the first line of each file is the header; empty lines are not
  records; a row with the wrong number of fields is `malformed`; an empty field is null.
- A value for a non-string column that is empty (or only spaces) is null, not a bad value.
- Types accept the plain spellings only (integers, decimals, ISO-8601 timestamps with optional
  fraction and zone, `true`/`false`-like booleans); anything else does not cast.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from dedup_pipeline.config import DatasetConfig

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
OUTPUTS = ("unique", "duplicates", "expired", "rejected")

_LONG_RE = re.compile(r"^[+-]?\d+$")
_DOUBLE_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_TS_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})?$"
)
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TRUE = {"t", "true", "y", "yes", "1"}
_FALSE = {"f", "false", "n", "no", "0"}


class BadCast(ValueError):
    """A non-empty value that does not cast to the declared type."""


def micros(dt: datetime) -> int:
    return (dt - EPOCH) // timedelta(microseconds=1)


def cast_text(text: str | None, typ: str) -> Any:
    """Text -> typed value (None for null); raises BadCast for a value that does not cast."""
    if text is None:
        return None
    if typ == "string":
        return text
    t = text.strip(" ")
    if t == "":
        return None
    if typ == "long":
        if not _LONG_RE.match(t):
            raise BadCast(text)
        n = int(t)
        if not -(2**63) <= n < 2**63:
            raise BadCast(text)
        return n
    if typ == "double":
        if not _DOUBLE_RE.match(t):
            raise BadCast(text)
        return float(t)
    if typ == "boolean":
        if t.lower() in _TRUE:
            return True
        if t.lower() in _FALSE:
            return False
        raise BadCast(text)
    if typ == "timestamp":
        m = _TS_RE.match(t)
        if not m:
            raise BadCast(text)
        day, clock, frac, zone = m.groups()
        try:
            dt = datetime.fromisoformat(f"{day}T{clock}")
        except ValueError:
            raise BadCast(text) from None
        us = int((frac or ".")[1:].ljust(6, "0")) if frac else 0
        dt = dt.replace(microsecond=us)
        if zone is None or zone == "Z":
            dt = dt.replace(tzinfo=UTC)  # the session time zone is UTC
        else:
            sign = 1 if zone[0] == "+" else -1
            off = timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            dt = dt.replace(tzinfo=UTC) - sign * off
        return micros(dt)
    if typ == "date":
        if not _DATE_RE.match(t):
            raise BadCast(text)
        try:
            return (date.fromisoformat(t) - date(1970, 1, 1)).days
        except ValueError:
            raise BadCast(text) from None
    raise AssertionError(f"unknown type {typ}")


def _json_text(value: Any) -> str | None:
    """A JSON value as the text the column gets (strings as they are, others as JSON)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, separators=(",", ":"))


@dataclass
class Record:
    """One record of a landing file, parsed and typed."""

    path: str  # absolute path of its file
    pos: int  # position of the record in its file
    raw: str  # the original line
    fields: list[str | None] | None = None  # CSV: the row's fields (None = null)
    values: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    v: int | float | None = None  # expiry value
    faults: int = 0  # how many reasons applied (the first one wins, by precedence)

    @property
    def basename(self) -> str:
        return Path(self.path).name


def _parse_jsonl(path: Path) -> list[tuple[str, dict[str, str | None] | None, None]]:
    out: list[tuple[str, dict[str, str | None] | None, None]] = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.strip(" ") == "":
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            out.append((line, None, None))
            continue
        out.append((line, {k: _json_text(v) for k, v in obj.items()}, None))
    return out


def _parse_csv(path: Path, ds: DatasetConfig) -> list[tuple[str, Any, list[str | None] | None]]:
    names = list(ds.source.schema)
    lines = path.read_text(encoding="utf-8").split("\n")
    if ds.source.csv_header and lines:
        lines = lines[1:]
    out: list[tuple[str, Any, list[str | None] | None]] = []
    for line in lines:
        if line == "":
            continue
        row = next(csv.reader([line], delimiter=ds.source.csv_delimiter))
        if len(row) != len(names):
            out.append((line, None, None))
            continue
        fields: list[str | None] = [f if f != "" else None for f in row]
        out.append((line, dict(zip(names, fields, strict=True)), fields))
    return out


def parse_file(ds: DatasetConfig, path: Path) -> list[Record]:
    """Every record of one landing file, typed, with its reject reason (R1, R6, R9)."""
    schema = ds.source.schema
    exp = ds.expiry
    parsed = _parse_jsonl(path) if ds.source.format == "jsonl" else _parse_csv(path, ds)
    records = []
    for pos, (line, texts, fields) in enumerate(parsed):
        rec = Record(str(path), pos, line, fields)
        records.append(rec)
        if texts is None:
            rec.reason = "malformed"
            continue
        bad_value = None
        exp_bad = False
        for col, typ in schema.items():
            try:
                rec.values[col] = cast_text(texts.get(col), typ)
            except BadCast:
                rec.values[col] = None
                if exp is not None and col == exp.column:
                    exp_bad = True
                elif bad_value is None:
                    bad_value = f"bad_value:{col}"
        reasons = [bad_value] if bad_value else []
        if any(rec.values[k] is None for k in ds.key):
            reasons.append("null_key")
        if exp is not None:
            value = rec.values[exp.column]
            if exp_bad or value is None:
                reasons.append("bad_expiry_value")
            elif exp.categories is not None:
                if value in exp.categories:
                    rec.v = exp.categories.index(value)
                else:
                    reasons.append("unknown_category")
            elif isinstance(value, float) and math.isnan(value):
                reasons.append("bad_expiry_value")
            else:
                rec.v = value
        if reasons:  # precedence: bad_value > null_key > unknown_category / bad_expiry_value
            rec.reason, rec.faults = reasons[0], len(reasons)
            rec.v = None
    return records


def hour_dir(ds: DatasetConfig, hour: datetime) -> Path:
    return Path(ds.source.path) / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}"


def read_hour(ds: DatasetConfig, hour: datetime) -> list[Record]:
    d = hour_dir(ds, hour)
    if not d.is_dir():
        return []
    files = sorted(p for p in d.iterdir()
                   if p.is_file() and not p.name.startswith(("_", ".")))
    return [r for p in files for r in parse_file(ds, p)]


def normalise_raw(ds: DatasetConfig, reason: str, raw: str) -> Any:
    """The comparable form of `_raw`: the line, or for a re-serialized CSV row its fields."""
    if ds.source.format == "csv" and reason != "malformed":
        return tuple(next(csv.reader([raw], delimiter=ds.source.csv_delimiter)))
    return raw


@dataclass
class HourResult:
    tag: str
    rows_in: int
    latest: int | float | None
    expiry_point: int | float | None
    rows: dict[str, Counter] = field(default_factory=dict)
    stats: Counter = field(default_factory=Counter)  # what the hour exercised (for coverage)


@dataclass
class _Entry:
    tag: str
    v: int | float | None
    fp: tuple


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


class Reference:
    """Runs the loads of one dataset hour by hour, keeping its own key index."""

    def __init__(self, ds: DatasetConfig):
        self.ds = ds
        self.latest: int | float | None = None
        self.index: dict[tuple, list[_Entry]] = {}
        self.results: dict[str, HourResult] = {}

    def _src(self, rec: Record) -> tuple:
        return tuple(rec.values[c] for c in self.ds.source.schema)

    def _fp(self, rec: Record) -> tuple:
        return tuple(rec.values[c] for c in self.ds.fingerprint)

    def _order(self, rec: Record) -> tuple:
        parts: list[Any] = []
        if self.ds.order_by:
            o = rec.values[self.ds.order_by]
            parts += [(1, 0) if o is None else (0, o)]  # earliest first, nulls last
        if self.ds.expiry is not None:
            parts.append(rec.v)
        return (*parts, rec.path, rec.pos)

    def _expiry_point_value(self, x: int | float) -> Any:
        exp = self.ds.expiry
        assert exp is not None
        if exp.categories is not None:
            i = int(x)
            return exp.categories[i] if 0 <= i < len(exp.categories) else None
        return x

    def load(self, hour: datetime) -> HourResult:
        ds = self.ds
        tag = f"{hour:%Y-%m-%d-%H}"
        assert all(t < tag for t in self.results), "hours must be loaded in order"
        recs = read_hour(ds, hour)
        out: dict[str, Counter] = {o: Counter() for o in OUTPUTS}
        stats: Counter = Counter()
        rejected = [r for r in recs if r.reason is not None]
        valid = [r for r in recs if r.reason is None]
        for r in rejected:
            out["rejected"][(r.basename, r.reason, normalise_raw_from_record(ds, r))] += 1
            stats[f"rejected:{r.reason.split(':')[0]}"] += 1
            if r.faults > 1:
                stats[f"precedence:{r.reason.split(':')[0]}"] += 1

        # R6: latest point and expiry point
        x: int | float | None = None
        if ds.expiry is not None:
            if ds.expiry.basis == "processing":
                self.latest = micros(hour + HOUR)
            else:
                vs = [r.v for r in valid if r.v is not None]
                cands = [c for c in (self.latest, max(vs) if vs else None) if c is not None]
                self.latest = max(cands) if cands else None
            if self.latest is not None:
                x = _num(self.latest - ds.expiry.period)
        live = []
        for r in valid:
            if x is not None and r.v is not None and r.v < x:
                out["expired"][(*self._src(r), r.basename, self._expiry_point_value(x))] += 1
                stats["expired"] += 1
            else:
                if x is not None and r.v == x:
                    stats["kept_at_expiry_point"] += 1
                live.append(r)

        # R3: in-batch order per key; R4: earlier unique rows still live; R5: fingerprint
        groups: dict[tuple, list[Record]] = {}
        for r in live:
            groups.setdefault(tuple(r.values[k] for k in ds.key), []).append(r)
        for key, group in groups.items():
            group.sort(key=self._order)
            hits = [e for e in self.index.get(key, [])
                    if e.tag < tag and (x is None or (e.v is not None and e.v >= x))]
            if hits:
                kept = min(hits, key=lambda e: e.tag)
                first_tag, kept_fp, dups = kept.tag, kept.fp, group
                stats["cross_batch_duplicates"] += len(group)
                stats["cross_batch_other_expiry_value"] += sum(r.v != kept.v for r in group)
            else:
                head = group[0]
                out["unique"][(*self._src(head), head.basename)] += 1
                self.index.setdefault(key, []).append(_Entry(tag, head.v, self._fp(head)))
                first_tag, kept_fp, dups = tag, self._fp(head), group[1:]
                stats["in_batch_duplicates"] += len(dups)
                if self.index.get(key) and len(self.index[key]) > 1:
                    stats["unique_again_after_expiry"] += 1
            for d in dups:
                kind = "natural" if not ds.fingerprint or self._fp(d) == kept_fp else "conflict"
                out["duplicates"][(*self._src(d), d.basename, kind, first_tag)] += 1
                stats[kind] += 1
            if len(group) > 1 and ds.order_by:
                heads = [self._order(r)[0] for r in group]
                if heads.count(heads[0]) > 1:
                    stats["order_by_ties"] += 1
                if any(h[0] == 1 for h in heads):
                    stats["order_by_nulls_in_group"] += 1
        res = HourResult(tag, len(recs), self.latest, x, out, stats)
        self.results[tag] = res
        return res

    def run(self, start: datetime, hours: int) -> dict[str, HourResult]:
        for i in range(hours):
            self.load(start + i * HOUR)
        return self.results


def normalise_raw_from_record(ds: DatasetConfig, rec: Record) -> Any:
    """The comparable `_raw` of a rejected record (see `normalise_raw`)."""
    assert rec.reason is not None
    if ds.source.format == "csv" and rec.reason != "malformed":
        assert rec.fields is not None
        return tuple("" if f is None else f for f in rec.fields)
    return rec.raw
