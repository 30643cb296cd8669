"""Parsers that cannot throw, proven by a fuzzer (docs/design.md R9, R9a).

Hypothesis writes landing files of each format — JSON Lines and CSV lines drawn from an alphabet
weighted toward the hard bytes (whitespace of every kind, brackets, quotes, backslashes, `\\u`
escapes, byte-order marks, NUL, invalid UTF-8, very long lines, numbers at the type edges), and
Parquet files whose declared columns take a random Arrow type each (null, struct, list, map,
dictionary, large strings, decimals, every timestamp unit, durations, float16, times) — and for
each example loads the hour with the engine and asserts: the load commits, rows in = rows out
(R8), and the pure-Python reference model places every record exactly as the engine did.

CI runs a bounded, seeded number of examples (`DEDUP_FUZZ_EXAMPLES`, default 12 per format);
`scripts/fuzz.sh --minutes N` runs it with fresh seeds for as long as asked and prints Hypothesis's
shrunk reproduction of any failure (the falsifying bytes, and the hour's files kept on disk).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.hours import parse_hour
from dedup_pipeline_tests.conftest import dataset_config, source_raw
from dedup_pipeline_tests.reference import OUTPUTS, Reference
from dedup_pipeline_tests.test_hostile_landing import engine_placement, reference_placement
from dedup_pipeline_tests.test_reference import read_engine

HOUR = "2026-11-01-00:00"
TAG = "2026-11-01-00"
EXAMPLES = int(os.environ.get("DEDUP_FUZZ_EXAMPLES", "12"))
# CI: seeded (derandomized), no example database; scripts/fuzz.sh: random seeds, a database
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="DEDUP_FUZZ_RANDOM" not in os.environ,
                database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
KEEP = os.environ.get("DEDUP_FUZZ_KEEP")  # a directory: the last failing hour is copied there

TEXT_SCHEMA = {"k": "string", "n": "long", "x": "double", "b": "boolean", "t": "timestamp",
               "d": "date"}
PARQUET_SCHEMA = {"rid": "long", **TEXT_SCHEMA}

# --- the hard bytes -------------------------------------------------------------------------
EDGE_NUMBERS = [b"0", b"-0", b"-0.0", b"1e309", b"-1e309", b"1.5", b"9223372036854775807",
                b"9223372036854775808", b"-9223372036854775808", b"-9223372036854775809",
                b"4.9e-324", b"1.7976931348623157e308", b"NaN", b"Infinity", b"-Infinity",
                b"1E2", b"0x10", b"01", b"+1", b".5", b"1.", b"12345678901234567890123"]
EDGE_TEXTS = [b"2026-11-01T00:30:00Z", b"0001-01-01", b"9999-12-31T23:59:59.999999Z",
              b"2026-02-30", b"2026-11-01 00:00:00+14:00", b"-290308-12-21T19:59:05Z",
              b"true", b"false", b"yes", b"t", b"null", b"", b" ", b"k1", b"k2", b"K1"]
TOKENS = [b" ", b"\t", b"\r", b"\r\n", b"\n", b"\x0b", b"\x0c", b"\xc2\xa0", b"{", b"}", b"[",
          b"]", b'"', b"'", b"\\", b"\\u", b"\\ud800", b"\\udc00", b"\\u0000", b"\\n", b":", b",",
          b"\xef\xbb\xbf", b"\x00", b"\xff", b"\xfe", b"\xc3", b"\xc3\xa9", b"\xed\xa0\x80",
          b"\xf4\x90\x80\x80", b"\xe2\x82", b"\\\\", b"//", b"#", b";", b"|", b"=",
          *[b'"' + c + b'"' for c in (b"k", b"n", b"x", b"b", b"t", b"d")], *EDGE_NUMBERS,
          *EDGE_TEXTS]
token = st.sampled_from(TOKENS) | st.binary(max_size=3)
junk = st.lists(token, max_size=14).map(b"".join)
long_line = st.sampled_from([b"a", b" ", b"\\u00e9", b"{"]).map(lambda b: b * 70_000)


def _json_value(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["num", "text", "junk", "json", "nested"]))
    if kind == "num":
        return draw(st.sampled_from(EDGE_NUMBERS))
    if kind == "text":
        return b'"' + draw(st.sampled_from(EDGE_TEXTS + [b"\\ud800", b"\\u00e9", b"a\\\"b",
                                                         b"\xff", b"\t"])) + b'"'
    if kind == "json":
        return json.dumps(draw(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                         st.text(max_size=4)))).encode()
    if kind == "nested":
        return draw(st.sampled_from([b"[]", b"{}", b'[1,"a"]', b'{"a":{"b":[null]}}']))
    return draw(junk)


@st.composite
def json_line(draw: st.DrawFn) -> bytes:
    """Mostly objects with the schema's fields (so keys collide and rows load), the rest junk."""
    shape = draw(st.sampled_from(["object", "object", "object", "junk", "long", "whitespace"]))
    if shape == "junk":
        return draw(junk)
    if shape == "long":
        return draw(long_line)
    if shape == "whitespace":
        return draw(st.lists(st.sampled_from([b" ", b"\t", b"\r"]), min_size=1, max_size=5)
                    .map(b"".join))
    fields = draw(st.lists(st.sampled_from(list(TEXT_SCHEMA) + ["K", "other"]), max_size=7))
    if draw(st.booleans()):
        fields = ["k", *fields]
    ws = draw(st.sampled_from([b"", b" ", b"\t", b"\r", b" \t "]))
    parts = []
    for f in fields:
        value = (b'"' + draw(st.sampled_from([b"k1", b"k2", b"k3", b""])) + b'"'
                 if f == "k" and draw(st.booleans()) else _json_value(draw))
        parts.append(b'"' + f.encode() + b'"' + ws + b":" + ws + value)
    body = b"{" + ws + (b"," + ws).join(parts) + ws + b"}"
    return draw(st.sampled_from([b"", b"\xef\xbb\xbf", b" "])) + body + draw(
        st.sampled_from([b"", b"", b" ", b"\t", b"\r", b"}", b"]", b",", b"{}"]))


def _csv_field(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["edge", "edge", "junk", "quoted"]))
    if kind == "edge":
        return draw(st.sampled_from(EDGE_NUMBERS + EDGE_TEXTS))
    if kind == "quoted":
        return draw(csv_quoted)
    return draw(csv_junk)


# CSV fields hold no `\r` and quote only as RFC 4180 quotes (a whole field, inner quotes doubled):
# how Spark's parser reads a `\r` (it picks the file's line ending from its first line) or a quote
# inside an unquoted field is a known limit (docs/notes.md), not a rule the reference model states
csv_junk = st.lists(token.map(lambda b: b.replace(b"\r", b"").replace(b'"', b"")),
                    max_size=14).map(b"".join)
csv_quoted = st.lists(token.map(lambda b: b.replace(b"\r", b"")), max_size=14).map(
    lambda parts: b'"' + b"".join(parts).replace(b'"', b'""') + b'"')


@st.composite
def csv_line(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(csv_junk | long_line)
    n = draw(st.sampled_from([len(TEXT_SCHEMA)] * 4 + [0, 1, len(TEXT_SCHEMA) + 1]))
    fields = [draw(st.sampled_from([b"k1", b"k2", b"k3"])) if i == 0 and draw(st.booleans())
              else _csv_field(draw) for i in range(n)]
    return b",".join(fields)


@st.composite
def text_file(draw: st.DrawFn, line: st.SearchStrategy[bytes], header: bytes = b"",
              crlf: bool = True) -> bytes:
    lines = draw(st.lists(line, max_size=12))
    sep = draw(st.sampled_from([b"\n", b"\n", b"\r\n"] if crlf else [b"\n"]))
    body = sep.join(([header] if header else []) + lines)
    if draw(st.booleans()):
        body += sep
    return draw(st.sampled_from([b"", b"", b"\xef\xbb\xbf"])) + body


# --- Parquet: a random Arrow type per declared column -----------------------------------------
def _ts(unit: str, tz: str | None) -> Any:
    lo, hi = (dt.datetime(1678, 1, 1), dt.datetime(2261, 12, 31)) if unit == "ns" else (
        dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59))
    return (pa.timestamp(unit, tz), st.datetimes(lo, hi).map(
        lambda d: d.replace(microsecond=0) if unit in ("s", "ms") else d))


PARQUET_TYPES: dict[str, Any] = {
    "null": (pa.null(), st.none()),
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "float32": (pa.float32(), st.floats(width=32)),
    "float64": (pa.float64(), st.floats()),
    "float16": (pa.float16(), st.floats(width=16).map(np.float16)),
    "bool": (pa.bool_(), st.booleans()),
    "string": (pa.string(), st.sampled_from(["k1", "k2", "1", "2.5", "true", "2026-11-01",
                                             "2026-11-01T00:00:00Z", "", " ", "é\t"])),
    "large_string": (pa.large_string(), st.sampled_from(["k1", "k3", "-0", "NaN", "0001-01-01"])),
    "dict": ("dict", st.sampled_from(["k1", "k2", "7", "false"])),
    "decimal": (pa.decimal128(9, 2), st.decimals(-9_999_999, 9_999_999, places=2,
                                                 allow_nan=False, allow_infinity=False)),
    "decimal0": (pa.decimal128(20, 0), st.integers(-(10**19), 10**19).map(decimal.Decimal)),
    "date": (pa.date32(), st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31))),
    "ts_s": _ts("s", None), "ts_ms": _ts("ms", "UTC"), "ts_us": _ts("us", None),
    "ts_us_tz": _ts("us", "+05:30"), "ts_ns": _ts("ns", None),
    "struct": (pa.struct([("a", pa.int64())]), st.builds(dict, a=st.integers(0, 9))),
    "list": (pa.list_(pa.int64()), st.lists(st.integers(0, 9), max_size=2)),
    "map": (pa.map_(pa.string(), pa.int64()),
            st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 9)), max_size=2)),
    "duration": (pa.duration("s"), st.integers(0, 10**6).map(lambda s: dt.timedelta(seconds=s))),
    "time": (pa.time64("us"), st.times()),
}


@st.composite
def parquet_file(draw: st.DrawFn, first_rid: int) -> tuple[pa.Table, int]:
    n = draw(st.integers(0, 5))
    cols: dict[str, pa.Array] = {"rid": pa.array(range(first_rid, first_rid + n), pa.int64())}
    for c in TEXT_SCHEMA:
        choice = draw(st.sampled_from([None, *PARQUET_TYPES]))
        if choice is None:
            continue  # the file lacks the column
        typ, values = PARQUET_TYPES[choice]
        if c == "k" and draw(st.booleans()):  # colliding keys, so rows are duplicates
            typ, values = pa.string(), st.sampled_from(["k1", "k2"])
        data = [draw(st.none() | values) for _ in range(n)]
        name = c.upper() if draw(st.integers(0, 9)) == 0 else c  # names match case-insensitively
        if typ == "dict":
            cols[name] = pa.array(data, pa.string()).dictionary_encode()
        else:
            cols[name] = pa.array(data, typ)
    return pa.table(cols), first_rid + n


@st.composite
def parquet_hour(draw: st.DrawFn) -> list[pa.Table]:
    tables, rid = [], 1
    for _ in range(draw(st.integers(1, 3))):
        t, rid = draw(parquet_file(rid))
        tables.append(t)
    return tables


# --- one example: one hour, loaded by the engine and by the reference --------------------------
def _dataset(root: Path, fmt: str) -> DatasetConfig:
    schema = PARQUET_SCHEMA if fmt == "parquet" else TEXT_SCHEMA
    expiry = {"jsonl": {"column": "n", "period": "1000"}, "csv": {"column": "t", "period": "1h"},
              "parquet": {"column": "x", "period": "10"}}[fmt]
    return dataset_config(root, name=f"fuzz_{fmt}", start=HOUR, key=["k"], fingerprint="all",
                          source=source_raw(str(root / "landing"), fmt, schema),
                          output=str(root / "out"), expiry=expiry)


def _comparable(rows: Counter) -> Counter:
    """NaN is never equal to itself: compared as a marker."""
    def fix(v: Any) -> Any:
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    return Counter({tuple(fix(v) for v in row): n for row, n in rows.items()})


def _load_and_compare(spark: SparkSession, root: Path, fmt: str, by_rid: bool) -> None:
    ds = _dataset(root, fmt)
    if fmt == "csv":  # docs/notes.md, Known limits: the CSV parser may drop a NUL
        for f in Path(ds.source.path).rglob("*.csv"):
            f.write_bytes(f.read_bytes().replace(b"\x00", b""))
    try:
        (got,) = load_hours(spark, ds, [HOUR])
        rec = commits.read_commit(Storage(ds.output), TAG)
        assert rec is not None, "the hour did not commit"
        ref = Reference(ds)
        res = ref.load(parse_hour(HOUR))
        assert got.rows_in == res.rows_in, (got.rows_in, res.rows_in)
        if by_rid:  # Parquet: every row has its rid; where each went, and why
            engine = engine_placement(ds, TAG)
            assert engine == reference_placement(ref, TAG)
            assert len(engine) == got.rows_in
        else:
            for o in OUTPUTS:
                assert _comparable(read_engine(ds, o, TAG)) == _comparable(res.rows[o]), o
    except BaseException:
        if KEEP:
            shutil.copytree(root / "landing", Path(KEEP) / f"{fmt}-landing", dirs_exist_ok=True)
        raise


def _hour_dir(root: Path) -> Path:
    d = root / "landing" / "date=2026-11-01" / "hour=00"
    d.mkdir(parents=True)
    return d


@pytest.mark.slow
@FUZZ
@given(files=st.lists(text_file(json_line()), min_size=1, max_size=2))
# found by the fuzzer: a NaN token on a line holding `]` was malformed, without one bad_value
@example(files=[b'{"k":0,"n":0,"n":NaN,"n":[]}\n{"k":"k1","x":NaN}\n{"k":"k2","x":NaN,"d":[]}\n'])
@example(files=[b"\t\n \t \r\n\r\n{\"k\":\"k1\"}\n\xef\xbb\xbf\n"])  # whitespace-only lines
def test_fuzzed_json_lines_always_load_and_agree_with_the_reference(
        spark: SparkSession, files: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = _hour_dir(Path(tmp))
        for i, data in enumerate(files):
            (d / f"part-{i}.jsonl").write_bytes(data)
        _load_and_compare(spark, Path(tmp), "jsonl", by_rid=False)


@pytest.mark.slow
@FUZZ
@given(files=st.lists(text_file(csv_line(), header=b"k,n,x,b,t,d", crlf=False), min_size=1,
                      max_size=2))
@example(files=[b"k,n,x,b,t,d\n k1 , 1,x ,\t,,\n"])  # fields keep their spaces in `_raw`
def test_fuzzed_csv_always_loads_and_agrees_with_the_reference(
        spark: SparkSession, files: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = _hour_dir(Path(tmp))
        for i, data in enumerate(files):
            (d / f"part-{i}.csv").write_bytes(data)
        _load_and_compare(spark, Path(tmp), "csv", by_rid=False)


@pytest.mark.slow
@FUZZ
@given(tables=parquet_hour())
def test_fuzzed_parquet_types_always_load_and_agree_with_the_reference(
        spark: SparkSession, tables: list[pa.Table]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = _hour_dir(Path(tmp))
        for i, t in enumerate(tables):
            pq.write_table(t, d / f"part-{i}.parquet")
        _load_and_compare(spark, Path(tmp), "parquet", by_rid=True)
