"""A pure-Python reference implementation of docs/design.md R1-R9a: the independent oracle of test_reference
and of the hostile landing corpus (test_landing_files).

No Spark, nothing from `dedup_pipeline.engine`: the rules are implemented directly from design.md,
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
`normalise_raw` (which also covers bad_encoding, Parquet rows and unreadable files).

Which files are read and how (R9a, docs/design.md "Reading landing files"):
- Data files are the regular files directly in the hour's directory whose names do not start
  with `.` or `_` nor end with an in-progress suffix (`.tmp`, `._COPYING_`, ...); subdirectories
  are not read; an empty file is zero records; a link that leads nowhere is unreadable. Files are
  read by their listed path, so any name is one file.
- `.gz` / `.bz2` / `.zst` / `.deflate` (exactly these, lower case) are decompressed; any other
  compression extension, a file that does not decompress, a `.parquet` that pyarrow cannot read
  or whose declared column has a type Spark cannot read, is ONE rejected row `unreadable_file`
  (its `_raw` is an error message).
- JSONL: a line must hold exactly one JSON object (`json.loads` refuses trailing content); a BOM
  before any line is ignored; a bare NaN/Infinity token is no number.
- Keys compare as Spark compares them: `-0.0` is `0.0`, every NaN is one key.
- Input is UTF-8: a JSONL line or CSV record whose bytes are not valid UTF-8 is `bad_encoding`
  (before any other reason), `_raw` the base64 of its bytes.
- Parquet: each file on its own against the declared schema; integers widen to long/double,
  floats to double, text is cast like text; any other value (1.5 for a long, a boolean for a
  long, ...) is `bad_value:<col>`; a column the file lacks is null for its rows.

Interpretations of design.md made here (the engine agrees):
- JSONL: a line that is empty or only spaces is not a record; any other line that is not a JSON
  object is `malformed`; a field that is absent or JSON null is null; a JSON scalar given for a
  string column is taken as its JSON text.
- CSV (RFC 4180): records are split where a newline stands outside quotes (so a record may
  span lines), fields by the `csv` module; the first record of each file is the header; empty
  records are not records; a row with the wrong number of fields is `malformed`; an empty field is null.
- A value for a non-string column that is empty (or only spaces) is null, not a bad value.
- Types accept the plain spellings only (integers, decimals, ISO-8601 timestamps with optional
  fraction and zone, `true`/`false`-like booleans); anything else does not cast.
"""

from __future__ import annotations

import base64
import bz2
import gzip
import json
import math
import re
import zlib
from collections import Counter
from collections.abc import Callable
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
        special = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "infinity": math.inf,
                   "+infinity": math.inf, "-inf": -math.inf, "-infinity": -math.inf}
        if t.lower() in special:  # Spark's spellings, any case
            return special[t.lower()]
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
    if typ == "date":  # YYYY-MM-DD, or a timestamp: its date as written (before its offset)
        if not _DATE_RE.match(t):
            if not (_DATE_RE.match(t[:10]) and t[10:11] in ("T", " ")):
                raise BadCast(text)
            cast_text(t, "timestamp")  # the whole text must be a timestamp
            t = t[:10]
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
        return java_double(value)
    return json.dumps(value, separators=(",", ":"))


def java_double(x: float) -> str:
    """A double as Java's `Double.toString` spells it (how Spark writes a JSON number it reads
    for a string column): `0.1`, `100.0`, `1.0E-5`, `1.0E10` (shortest digits, as `repr`)."""
    if math.isnan(x) or math.isinf(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if x == 0:
        return "-0.0" if math.copysign(1, x) < 0 else "0.0"
    exp10 = int(f"{abs(x):.17e}".split("e")[1])
    mant = repr(abs(x)).split("e")[0].replace(".", "").strip("0") or "0"  # shortest digits
    sign = "-" if x < 0 else ""
    if 1e-3 <= abs(x) < 1e7:  # plain notation, at least one digit after the point
        if exp10 >= 0:
            whole, frac = mant[:exp10 + 1].ljust(exp10 + 1, "0"), mant[exp10 + 1:]
        else:
            whole, frac = "0", "0" * (-exp10 - 1) + mant
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{mant[0]}.{mant[1:] or '0'}E{exp10}"


@dataclass
class Record:
    """One record of a landing file, parsed and typed."""

    path: str  # absolute path of its file
    pos: int  # position of the record in its file
    raw: str  # the original text (base64 of the bytes for bad_encoding; the error if unreadable)
    fields: list[str | None] | None = None  # CSV: the row's fields (None = null)
    values: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    v: int | float | None = None  # expiry value
    faults: int = 0  # how many reasons applied (the first one wins, by precedence)

    @property
    def basename(self) -> str:
        return Path(self.path).name


# A record as read, before typing: its raw text, a way to get each column's typed value (None
# when the record did not parse: malformed), its CSV fields, and a reason decided while reading.
Getter = Callable[[str, str], Any]  # (column, declared type) -> value; raises BadCast


@dataclass
class Item:
    raw: str
    get: Getter | None
    fields: list[str | None] | None = None
    pre: str | None = None  # bad_encoding


class Unreadable(Exception):
    """The file cannot be read as its format (R9a): one `unreadable_file` row."""


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


_UNSUPPORTED = (".lz4", ".snappy", ".xz", ".lzma", ".zip", ".7z", ".br", ".lzo", ".z", ".zstd",
                ".lz", ".sz", ".tgz")


def _zlib_streams(data: bytes) -> bytes:
    """`.deflate`: zlib streams one after another, nothing after the last."""
    out = []
    while data:
        z = zlib.decompressobj()
        out.append(z.decompress(data))
        if not z.eof:
            raise EOFError("truncated zlib stream")
        data = z.unused_data
    return b"".join(out)


def _zstd(data: bytes) -> bytes:
    import pyarrow as pa

    return pa.CompressedInputStream(pa.BufferReader(data), "zstd").read()


_CODECS: dict[str, Callable[[bytes], bytes]] = {
    ".gz": gzip.decompress, ".bz2": bz2.decompress, ".zst": _zstd, ".deflate": _zlib_streams}


def _file_bytes(path: Path) -> bytes:
    """The file's content, decompressed by its extension (exactly `.gz`, `.bz2`, `.zst`,
    `.deflate`); Unreadable if it cannot be, or if it is compressed otherwise."""
    name = path.name
    for ext in (*_CODECS, *_UNSUPPORTED):
        if name.lower().endswith(ext) and not name.endswith(ext if ext in _CODECS else "\0"):
            raise Unreadable(f"compression of {name} is not read")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise Unreadable(f"{type(e).__name__}: {e}") from None
    try:
        for ext, decompress in _CODECS.items():
            if name.endswith(ext):
                return decompress(data)
    except Exception as e:  # noqa: BLE001 - whatever the codec library raises
        raise Unreadable(f"{type(e).__name__}: {e}") from None
    return data


def _text_getter(texts: dict[str, str | None]) -> Getter:
    return lambda col, typ: cast_text(texts.get(col), typ)


# a `\uD800`-`\uDFFF` escape (odd run of backslashes before the `u`) that is not half of a pair
_ESC = r"(?<!\\)(?:\\\\)*"
_LONE_SURROGATE = re.compile(
    _ESC + r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|"
    + _ESC + r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _parse_jsonl(data: bytes) -> list[Item]:
    """Lines end at `\n` (a `\r` before it belongs to the line ending); a line that is not valid
    UTF-8, or whose JSON escapes name a lone surrogate (not a character), is `bad_encoding`; a
    byte-order mark before the JSON is not part of it."""
    out: list[Item] = []
    # the file's own byte-order mark is not part of its first line; one before a later line
    # (`cat a.jsonl b.jsonl`) is kept in that line's text, and ignored by its JSON
    for bline in data.removeprefix(b"\xef\xbb\xbf").split(b"\n"):
        bline = bline.removesuffix(b"\r")
        if bline.strip(b" \t\r") == b"":  # only JSON whitespace: a blank line
            continue
        line = _utf8(bline)
        if line is None or _LONE_SURROGATE.search(line):
            out.append(Item(_b64(bline), None, pre="bad_encoding"))
            continue
        try:
            # JSON has no NaN/Infinity: such a token's text is quoted (Jackson's), so it is no number
            obj = json.loads(line.removeprefix("\ufeff"), parse_constant=lambda c: f'"{c}"')
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            out.append(Item(line, None))
            continue
        out.append(Item(line, _text_getter({k: _json_text(v) for k, v in obj.items()})))
    return out


def csv_records(text: str) -> list[str]:
    """RFC 4180: the file's records, each its whole text (a quoted field may span lines)."""
    records, start, quoted = [], 0, False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted  # a doubled quote toggles twice
        elif ch == "\n" and not quoted:
            records.append(text[start:i])
            start = i + 1
    if start < len(text):
        records.append(text[start:])
    return records


def csv_fields(record: str, delimiter: str) -> list[str]:
    """RFC 4180 fields of one record: only quotes are special (a lone `\r` is data)."""
    fields: list[str] = []
    cur: list[str] = []
    quoted = started = False
    i = 0
    while i < len(record):
        ch = record[i]
        if quoted:
            if ch == '"' and record[i + 1:i + 2] == '"':
                cur.append('"')
                i += 1
            elif ch == '"':
                quoted = False
            else:
                cur.append(ch)
        elif ch == delimiter:
            fields.append("".join(cur))
            cur, started = [], False
            i += 1
            continue
        elif ch == '"' and not started:
            quoted = True
        else:
            cur.append(ch)
        started = True
        i += 1
    fields.append("".join(cur))
    return fields


def _parse_csv(data: bytes, ds: DatasetConfig) -> list[Item]:
    """Records split on the bytes (as ISO-8859-1, one char per byte), then checked for UTF-8."""
    names = list(ds.source.schema)
    records = csv_records(data.decode("latin-1"))
    if ds.source.csv.header and records:
        records = records[1:]
    out: list[Item] = []
    for rec in records:
        if rec == "":
            continue
        text = _utf8(rec.encode("latin-1"))
        if text is None:
            out.append(Item(_b64(rec.encode("latin-1")), None, pre="bad_encoding"))
            continue
        row = csv_fields(text, ds.source.csv.delimiter)
        if len(row) != len(names):
            out.append(Item(text, None))
            continue
        fields: list[str | None] = [f if f != "" else None for f in row]
        out.append(Item(text, _text_getter(dict(zip(names, fields, strict=True))), fields))
    return out


def _parquet_value(value: Any, arrow_type: Any, typ: str) -> Any:
    """A Parquet value as the declared type. Parquet values are typed: text (strings, binary) and
    decimals are cast like text; integers widen to long/double and are their digits for a
    string; floats widen to double; a boolean is itself or `true`/`false` for a string; a
    timestamp (any unit) fits a timestamp and a date a date. Any other value (a float for a
    string or long, a timestamp for a date, a struct, list, map or duration for anything) is a
    BadCast."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_dictionary(arrow_type):  # dictionary-encoded: its values' type
        arrow_type = arrow_type.value_type
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return cast_text(value, typ)
    if pa.types.is_decimal(arrow_type):  # its digits, as written
        return cast_text(format(value, "f"), typ)
    if isinstance(value, bytes):  # binary: its bytes as UTF-8 text (valid UTF-8 only here)
        return cast_text(value.decode(), typ)
    if pa.types.is_integer(arrow_type) and typ in ("string", "long", "double"):
        if typ == "string":
            return str(value)
        if typ == "long" and not -(2**63) <= value < 2**63:
            raise BadCast(repr(value))
        return value if typ == "long" else float(value)
    if typ == "string" and pa.types.is_boolean(arrow_type):
        return "true" if value else "false"
    if typ == "double" and pa.types.is_floating(arrow_type):
        return float(value)
    if typ == "boolean" and pa.types.is_boolean(arrow_type):
        return value
    if typ == "timestamp" and pa.types.is_timestamp(arrow_type):
        return micros(value if value.tzinfo else value.replace(tzinfo=UTC))
    if typ == "date" and pa.types.is_date(arrow_type):
        return (value - date(1970, 1, 1)).days
    raise BadCast(repr(value))


def _spark_reads(t: Any) -> bool:
    """Can Spark's Parquet reader read a column of Arrow type `t` (nested ones: every leaf)?"""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_struct(t):
        return t.num_fields > 0 and all(_spark_reads(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _spark_reads(t.key_type) and _spark_reads(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _spark_reads(t.value_type)
    if pa.types.is_decimal(t):
        return t.precision <= 38
    return any(test(t) for test in (
        pa.types.is_null, pa.types.is_integer, pa.types.is_float32, pa.types.is_float64,
        pa.types.is_boolean, pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
        pa.types.is_large_binary, pa.types.is_fixed_size_binary, pa.types.is_date,
        pa.types.is_timestamp, pa.types.is_duration))


def _jsonable(value: Any) -> Any:
    """A Parquet value as its JSON form in `_raw` (a map as an object)."""
    if isinstance(value, list) and value and all(isinstance(x, tuple) and len(x) == 2
                                                 for x in value):
        return {str(k): _jsonable(v) for k, v in value}
    if isinstance(value, list):
        return [_jsonable(x) for x in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _parse_parquet(path: Path, ds: DatasetConfig) -> list[Item]:
    """Each file against the declared schema, on its own (a column it lacks, or of Arrow's null
    type, is null here only); column names match case-insensitively, as Spark matches them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)  # INT96 timestamps are read as timestamp[ns]
    except Exception as e:  # noqa: BLE001 - any failure to read the file makes it unreadable
        raise Unreadable(f"{type(e).__name__}: {e}") from None
    lower = [f.name.lower() for f in table.schema]
    if len(set(lower)) < len(lower):
        raise Unreadable("columns whose names differ only in case")
    for i, f in enumerate(table.schema):  # nanoseconds: floored to the microsecond
        if pa.types.is_timestamp(f.type) and f.type.unit == "ns":
            ns = table.column(i).cast(pa.int64()).to_pylist()
            us = pa.array([None if x is None else x // 1000 for x in ns], pa.int64())
            table = table.set_column(i, f.name, us.cast(pa.timestamp("us", f.type.tz)))
    types = {f.name.lower(): (f.name, f.type) for f in table.schema
             if f.name.lower() in {c.lower() for c in ds.source.schema}}
    for name, arrow_type in types.values():
        if not _spark_reads(arrow_type):
            raise Unreadable(f"column {name} has type {arrow_type}")
    out: list[Item] = []
    for row in table.to_pylist():
        raw = json.dumps({k: _jsonable(v) for k, v in row.items()
                          if v is not None and k.lower() in types}, default=str)

        def get(col: str, typ: str, row: dict[str, Any] = row) -> Any:
            if col.lower() not in types:
                return None
            name, arrow_type = types[col.lower()]
            return _parquet_value(row[name], arrow_type, typ)

        out.append(Item(raw, get))
    return out


def parse_file(ds: DatasetConfig, path: Path) -> list[Record]:
    """Every record of one landing file, typed, with its reject reason (R1, R6, R9, R9a)."""
    schema = ds.source.schema
    exp = ds.expiry
    if path.stat().st_size == 0:
        return []  # an empty file is zero records, whatever its format
    try:
        if ds.source.format == "parquet":
            items = _parse_parquet(path, ds)
        else:
            data = _file_bytes(path)
            items = _parse_jsonl(data) if ds.source.format == "jsonl" else _parse_csv(data, ds)
    except Unreadable as e:
        return [Record(str(path), 0, str(e), reason="unreadable_file", faults=1)]
    records = []
    for pos, item in enumerate(items):
        rec = Record(str(path), pos, item.raw, item.fields)
        records.append(rec)
        if item.pre is not None or item.get is None:
            rec.reason = item.pre or "malformed"
            continue
        bad_value = None
        exp_bad = False
        for col, typ in schema.items():
            try:
                rec.values[col] = item.get(col, typ)
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


IN_PROGRESS = ("._copying_", ".tmp", ".temp", ".inprogress", ".in-progress", ".partial", ".part",
               ".filepart", ".crdownload", ".uploading")


def is_data_name(name: str) -> bool:
    """Not a marker, hidden or temporary name, nor one a writer gives a file it has not finished."""
    return not name.startswith(("_", ".")) and not name.lower().endswith(IN_PROGRESS)


def read_hour(ds: DatasetConfig, hour: datetime) -> list[Record]:
    """The hour's data files: regular files directly in its directory with a data name; a link
    that leads nowhere (dangling, a loop) is an unreadable file."""
    d = hour_dir(ds, hour)
    if not d.is_dir():
        return []
    out: list[Record] = []
    for p in sorted((p for p in d.iterdir() if is_data_name(p.name)), key=str):
        if p.is_symlink() and not p.exists():
            out.append(Record(str(p), 0, "a link to nothing", reason="unreadable_file", faults=1))
        elif p.is_file():
            out.extend(parse_file(ds, p))
    return out


def normalise_raw(ds: DatasetConfig, reason: str, raw: str) -> Any:
    """The comparable form of `_raw`.

    The line / record text; for a CSV row that parsed into the right number of fields and was
    rejected for its values, its fields (the engine re-serializes such a row); for bad_encoding
    the original bytes (base64 in `_raw`), as fields likewise for such a CSV row; for a Parquet
    row, its non-null values (the engine writes them as JSON); nothing for an unreadable file
    (`_raw` is an error message).
    """
    if reason == "unreadable_file":
        return None
    if ds.source.format == "parquet":
        obj = json.loads(raw)
        return json.dumps({k: v for k, v in obj.items() if v is not None}, sort_keys=True)
    if reason == "bad_encoding":
        data = base64.b64decode(raw)
        if ds.source.format == "csv":
            row = csv_fields(data.decode("latin-1"), ds.source.csv.delimiter)
            if len(row) == len(ds.source.schema):
                return tuple(f.encode("latin-1") for f in row)
        return data
    if ds.source.format == "csv" and reason != "malformed":
        return tuple(csv_fields(raw, ds.source.csv.delimiter))
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


def format_tag(rec: Record, key: list[str]) -> tuple:
    """A record's key as keys compare (R2): `-0.0` equals `0.0` (as in Python), every NaN is one
    value."""
    return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v
                 for v in (rec.values[k] for k in key))


def _num(x: float) -> int | float:
    if isinstance(x, int):
        return x
    return int(x) if float(x).is_integer() else x


class Reference:
    """Runs the loads of one dataset hour by hour, keeping its own key index."""

    def __init__(self, ds: DatasetConfig):
        self.ds = ds
        self.latest: int | float | None = None
        self.index: dict[tuple, list[_Entry]] = {}
        self.results: dict[str, HourResult] = {}
        self.placed: list[tuple[str, str, Record]] = []  # (tag, output, record), every record
        # id(record) -> (_duplicate_kind, _first_load_hour) of every duplicate (explain's tests)
        self.duplicate_of: dict[int, tuple[str, str]] = {}

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
            self.placed.append((tag, "rejected", r))
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
                x = _num(_num(self.latest) - _num(ds.expiry_period))  # exact whole numbers
        live = []
        for r in valid:
            if x is not None and r.v is not None and r.v < x:
                out["expired"][(*self._src(r), r.basename, self._expiry_point_value(x))] += 1
                self.placed.append((tag, "expired", r))
                stats["expired"] += 1
            else:
                if x is not None and r.v == x:
                    stats["kept_at_expiry_point"] += 1
                live.append(r)

        # R3: in-batch order per key; R4: earlier unique rows still live; R5: fingerprint
        groups: dict[tuple, list[Record]] = {}
        for r in live:
            groups.setdefault(format_tag(r, ds.key), []).append(r)
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
                self.placed.append((tag, "unique", head))
                self.index.setdefault(key, []).append(_Entry(tag, head.v, self._fp(head)))
                first_tag, kept_fp, dups = tag, self._fp(head), group[1:]
                stats["in_batch_duplicates"] += len(dups)
                if self.index.get(key) and len(self.index[key]) > 1:
                    stats["unique_again_after_expiry"] += 1
            for d in dups:
                kind = "natural" if not ds.fingerprint or self._fp(d) == kept_fp else "conflict"
                out["duplicates"][(*self._src(d), d.basename, kind, first_tag)] += 1
                self.placed.append((tag, "duplicates", d))
                self.duplicate_of[id(d)] = (kind, first_tag)
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

    def migrate(self, ds: DatasetConfig, cast: dict[str, Any] | None = None,
                renames: dict[str, str] | None = None) -> None:
        """`dedup-pipeline migrate` by the rules (design.md, "Migrate"): every loaded row keeps its
        hour and output; a renamed column keeps its values under the new name (`renames`: old ->
        new), a column the old schema lacked is null, a retyped column's values are cast (`cast`:
        column -> function, as Spark casts); each non-rejected row's expiry value is taken under
        the new expiry terms and L re-derived as their running max (basis event); the index is
        re-keyed from the unique rows."""
        for _tag, out, rec in self.placed:
            if out == "rejected":
                continue
            for o, n in (renames or {}).items():
                rec.values[n] = rec.values.pop(o, None)
            for col in ds.source.schema:
                rec.values.setdefault(col, None)
            for col, f in (cast or {}).items():
                if rec.values.get(col) is not None:
                    rec.values[col] = f(rec.values[col])
            exp = ds.expiry
            if exp is not None:
                value = rec.values.get(exp.column)
                rec.v = (exp.categories.index(value) if exp.categories is not None
                         and value in exp.categories else None if exp.categories is not None
                         else value)
        self.ds = ds
        if ds.expiry is not None and ds.expiry.basis == "event":
            vs = [r.v for _t, o, r in self.placed if o != "rejected" and r.v is not None]
            self.latest = max(vs) if vs else None
        self.index = {}
        for tag, out, rec in self.placed:
            if out == "unique":
                self.index.setdefault(format_tag(rec, ds.key), []).append(
                    _Entry(tag, rec.v, self._fp(rec)))

    def run(self, start: datetime, hours: int) -> dict[str, HourResult]:
        for i in range(hours):
            self.load(start + i * HOUR)
        return self.results


def normalise_raw_from_record(ds: DatasetConfig, rec: Record) -> Any:
    """The comparable `_raw` of a rejected record (see `normalise_raw`)."""
    assert rec.reason is not None
    return normalise_raw(ds, rec.reason, rec.raw)
