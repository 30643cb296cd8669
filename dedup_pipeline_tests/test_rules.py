"""The semantics (design.md R1, R3-R6, R8, R9, R11) on small hand-written batches through `load_hours`.

Every expectation below is derived by hand from the rule it tests, never from the engine's output.
Every landing line carries a `rid` (row id) so that each output row can be traced back to the
line it came from; conservation (R8) is checked for every load against the files on disk.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import dedup_pipeline.engine.core.batch as batch_mod
from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.commits import CommitRecord, LaterHoursLoadedError, LoadOrderError
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline_tests.conftest import dataset_config, output_table, source_raw, write_hour

OUTPUTS = ("unique", "duplicates", "expired", "rejected")
BASE_SCHEMA = {"event_id": "string", "user_id": "string", "event_time": "timestamp",
               "url": "string", "rid": "string"}
H0, H1, H2, H3 = (f"2026-11-01-0{i}:00" for i in range(4))


# --- helpers ---------------------------------------------------------------------------------
def us(text: str) -> int:
    """ISO time (UTC) -> microseconds since the epoch."""
    dt = datetime.fromisoformat(text).replace(tzinfo=UTC)
    return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def ev(rid: str, event_id: Any = "", t: str | None = None, **extra: Any) -> str:
    """One JSON line; `event_id=None` writes a JSON null, omitted fields are absent."""
    row: dict[str, Any] = {"rid": rid}
    if event_id != "":
        row["event_id"] = event_id
    if t is not None:
        row["event_time"] = t
    row.update(extra)
    return json.dumps(row, ensure_ascii=False)


def make_ds(tmp: Path, schema_extra: dict[str, str] | None = None, fmt: str = "jsonl",
            **overrides: Any) -> DatasetConfig:
    overrides.setdefault("source", source_raw(fmt=fmt, schema={**BASE_SCHEMA, **(schema_extra or {})}))
    return dataset_config(tmp, **overrides)


def read(ds: DatasetConfig, output: str, hour: str) -> list[dict[str, Any]]:
    """Rows of one output partition, read with pyarrow (L1: no Spark needed); timestamps as epoch
    microseconds, so no time-zone conversion can blur a one-microsecond boundary."""
    table = output_table(ds, output, hour[:13])
    if table is None:
        return []
    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type):
            micros = table.column(i).cast(pa.timestamp("us", tz=f.type.tz)).cast(pa.int64())
            table = table.set_column(i, f.name, micros)
    return table.to_pylist()


def landing_lines(ds: DatasetConfig, hour: str) -> list[str]:
    d = Path(ds.source.path) / f"date={hour[:10]}" / f"hour={hour[11:13]}"
    lines: list[str] = []
    for f in sorted(d.glob("*")) if d.exists() else []:
        ls = f.read_text(encoding="utf-8").splitlines()
        if ds.source.format == "csv" and ds.source.csv.header:
            ls = ls[1:]
        lines += [line for line in ls if line.strip()]
    return lines


def rid_of(ds: DatasetConfig, line: str) -> str:
    if ds.source.format == "csv":
        return line.split(ds.source.csv.delimiter)[list(ds.source.schema).index("rid")]
    return json.loads(line)["rid"]


Outputs = dict[str, list[dict[str, Any]]]


def assert_conserved(ds: DatasetConfig, hour: str, result: CommitRecord) -> Outputs:
    """R8 from the landing files: every line is in exactly one output, nothing else is."""
    lines = landing_lines(ds, hour)
    outs = {o: read(ds, o, hour) for o in OUTPUTS}
    assert sum(len(v) for v in outs.values()) == len(lines) == result.rows_in
    assert [result.unique, result.duplicates, result.expired, result.rejected] == [
        len(outs[o]) for o in OUTPUTS]
    rejected_raw = Counter(r["_raw"] for r in outs["rejected"])
    rest = Counter(lines) - rejected_raw
    assert sum(rest.values()) == len(lines) - len(outs["rejected"]), "a _raw is not a landing line"
    typed = Counter(r["rid"] for o in ("unique", "duplicates", "expired") for r in outs[o])
    assert typed == Counter(rid_of(ds, line) for line in rest.elements())
    return outs


def load(spark: SparkSession, ds: DatasetConfig, hour: str) -> Outputs:
    """Load one hour and return its four outputs, after checking conservation."""
    (result,) = load_hours(spark, ds, [hour])
    assert result.load_hour == hour[:13]
    return assert_conserved(ds, hour, result)


def rids(rows: list[dict[str, Any]]) -> set[str]:
    return {r["rid"] for r in rows}


def dups(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """rid -> (_duplicate_kind, _first_load_hour)."""
    return {r["rid"]: (r["_duplicate_kind"], r["_first_load_hour"]) for r in rows}


def rejects(rows: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(r["_reject_reason"], r["_raw"]) for r in rows}


def _constant_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every key collide on the digest: only `store_keys` can still tell keys apart."""
    zero = F.lit(0).cast("long")
    from dedup_pipeline.engine.core import checks as checks_mod
    from dedup_pipeline.engine.core.index import rebuild as rebuild_mod

    for mod in (batch_mod, checks_mod, rebuild_mod):  # everywhere a digest is computed
        monkeypatch.setattr(mod, "digest_columns", lambda cols, schema: (zero, zero))


# --- R1, R9: key exactness, null keys, bad input ---------------------------------------------
@pytest.mark.fast
def test_exact_keys_null_keys_and_bad_input(spark: SparkSession, tmp_path: Path) -> None:
    ds = make_ds(tmp_path, {"n": "long"})
    composed, decomposed = "\u00e9", "e\u0301"  # é as one code point vs e + combining accent
    lines = [
        ev("r1", "A"), ev("r2", "a"), ev("r3", " a"), ev("r4", "a "), ev("r5", composed),
        ev("r6", decomposed), ev("r7", "a", n=7),
        ev("r8", "e", n=5),                     # a JSON number for a long: fine
        ev("r9"),                               # key missing
        ev("r10", None),                        # key is JSON null
        "this is not json",
        '{"event_id": "b", "rid": "r12"',       # truncated
        "[1, 2]",                               # JSON, but not an object
        ev("r14", "c", n="abc"),                # does not cast to long
        ev("r15", "d", "yesterday"),            # does not cast to timestamp
        ev("r16", "f", "2026-11-01T00:10:00Z", n="12"),  # a numeric string casts
    ]
    write_hour(ds, H0, lines)
    out = load(spark, ds, H0)
    assert {r["event_id"]: r["rid"] for r in out["unique"]} == {
        "A": "r1", "a": "r2", " a": "r3", "a ": "r4", composed: "r5", decomposed: "r6",
        "e": "r8", "f": "r16"}
    assert {r["n"] for r in out["unique"] if r["rid"] in ("r8", "r16")} == {5, 12}
    assert dups(out["duplicates"]) == {"r7": ("natural", "2026-11-01-00")}
    assert rejects(out["rejected"]) == {
        ("null_key", lines[8]), ("null_key", lines[9]),
        ("malformed", lines[10]), ("malformed", lines[11]), ("malformed", lines[12]),
        ("bad_value:n", lines[13]), ("bad_value:event_time", lines[14])}
    assert out["expired"] == []
    src = {r["_source_file"] for o in OUTPUTS for r in out[o]}
    assert len(src) == 1 and src.pop().endswith("hour=00/part-0.jsonl")


@pytest.mark.fast
def test_csv_rows_with_wrong_field_count_and_bad_values(spark: SparkSession,
                                                        tmp_path: Path) -> None:
    ds = make_ds(tmp_path, source={"path": "landing", "format": "csv",
                         "schema": {"event_id": "string", "n": "long", "event_time": "timestamp",
                                    "rid": "string"}})
    rows = [
        "a,1,2026-11-01T00:10:00Z,c1",
        "b,2",                                  # too few fields
        "c,3,2026-11-01T00:10:00Z,c3,extra",    # too many fields
        "d,xyz,2026-11-01T00:10:00Z,c4",        # n does not cast
        ",5,2026-11-01T00:10:00Z,c5",           # empty key
        "a,6,2026-11-01T00:11:00Z,c6",          # same key as c1, later in the file
        "e,7,2026-11-01T00:12:00Z,c7",
    ]
    write_hour(ds, H0, rows, name="part-0.csv", header="event_id,n,event_time,rid")
    out = load(spark, ds, H0)
    assert {(r["event_id"], r["rid"], r["n"], r["event_time"]) for r in out["unique"]} == {
        ("a", "c1", 1, us("2026-11-01T00:10:00")), ("e", "c7", 7, us("2026-11-01T00:12:00"))}
    assert dups(out["duplicates"]) == {"c6": ("natural", "2026-11-01-00")}
    assert rejects(out["rejected"]) == {
        ("malformed", rows[1]), ("malformed", rows[2]), ("bad_value:n", rows[3]),
        ("null_key", rows[4])}


# --- R3: in-batch order ----------------------------------------------------------------------
@pytest.mark.fast
def test_in_batch_winner_order(spark: SparkSession, tmp_path: Path) -> None:
    """order_by (nulls last), then expiry value, then source file, then position in the file."""
    ds = make_ds(tmp_path, {"seq": "long"}, order_by="event_time",
                 expiry={"column": "seq", "period": 1_000_000})

    def t(m: int) -> str:
        return f"2026-11-01T00:{m:02d}:00Z"

    part0 = [
        ev("k2-null-time", "k2", None, seq=1),        # loses: null order_by sorts last
        ev("k1-late", "k1", t(20), seq=1),
        ev("k1-win", "k1", t(10), seq=9),             # earliest event_time wins, whatever seq
        ev("k6-win", "k6", t(50), seq=6),
        ev("k3-big-seq", "k3", t(30), seq=5),
        ev("k6-later-line", "k6", t(50), seq=6),      # same everything, later line: loses
        ev("k4-win", "k4", t(40), seq=4),             # last line of part-0 beats part-1's first
    ]
    part1 = [
        ev("k4-file-1", "k4", t(40), seq=4),
        ev("k1-mid", "k1", t(15), seq=0),
        ev("k5-win", "k5", t(45), seq=7),
        ev("k2-win", "k2", t(55), seq=5),
        ev("k3-win", "k3", t(30), seq=3),             # same time, smaller expiry value wins
        ev("k5-second", "k5", t(45), seq=7),
        ev("k5-third", "k5", t(45), seq=7),
    ]
    write_hour(ds, H0, part1, name="part-1.jsonl")
    write_hour(ds, H0, part0, name="part-0.jsonl")
    # Tiny splits: each file is read in many blocks, as on a big cluster; the order must hold.
    old = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "120")
    try:
        out = load(spark, ds, H0)
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", old)
    assert rids(out["unique"]) == {"k1-win", "k2-win", "k3-win", "k4-win", "k5-win", "k6-win"}
    losers = {"k2-null-time", "k1-late", "k6-later-line", "k3-big-seq", "k4-file-1", "k1-mid",
              "k5-second", "k5-third"}
    assert dups(out["duplicates"]) == {r: ("natural", "2026-11-01-00") for r in losers}
    unique_files = {r["rid"]: r["_source_file"].rsplit("/", 1)[-1] for r in out["unique"]}
    assert unique_files["k4-win"] == "part-0.jsonl" and unique_files["k3-win"] == "part-1.jsonl"


# --- R4, R5, R11: cross-batch, fingerprints, load order, empty hours -------------------------
@pytest.mark.parametrize("variant", [pytest.param("fingerprint", marks=pytest.mark.fast),
                                     "no_fingerprint_store_keys_colliding"])
def test_cross_batch_fingerprint_order_and_empty_hour(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    with_fp = variant == "fingerprint"
    extra: dict[str, Any] = {"fingerprint": ["user_id", "url"]} if with_fp else {
        "index": {"store_keys": True}}
    if not with_fp:
        _constant_digest(monkeypatch)
    ds = make_ds(tmp_path, order_by="event_time", **extra)

    def e(rid: str, key: str, user: str, url: str, t: str) -> str:
        return ev(rid, key, t, user_id=user, url=url)

    write_hour(ds, H0, [
        e("r01", "e1", "u1", "/a", "2026-11-01T00:10:00Z"),
        e("r03", "e2", "u1", "/b", "2026-11-01T00:25:00Z"),
        e("r02", "e2", "u1", "/b", "2026-11-01T00:20:00Z"),
        e("r04", "e3", "u1", "/c", "2026-11-01T00:30:00Z"),
        e("r05", "e3", "u2", "/c", "2026-11-01T00:35:00Z"),
        e("r06", "e7", "u1", "/e", "soon"),
    ])
    write_hour(ds, H1, [
        e("r11", "e1", "u1", "/a", "2026-11-01T01:10:00Z"),
        e("r12", "e2", "u1", "/x", "2026-11-01T01:05:00Z"),
        e("r13", "e2", "u1", "/b", "2026-11-01T01:06:00Z"),
        e("r14", "e3", "u1", "/c", "2026-10-31T10:00:00Z"),  # older event, later load: duplicate
        e("r15", "e4", "u1", "/d", "2026-11-01T01:20:00Z"),
        e("r16", "e4", "u1", "/d", "2026-11-01T01:30:00Z"),
        e("r17", "e7", "u1", "/e", "2026-11-01T01:00:00Z"),  # its earlier record was rejected
    ])
    # H2 has no input directory at all
    write_hour(ds, H3, [
        e("r31", "e1", "u9", "/z", "2026-11-01T03:00:00Z"),
        e("r32", "e4", "u1", "/d", "2026-11-01T03:01:00Z"),
        e("r34", "e5", "u1", "/g", "2026-11-01T03:20:00Z"),
        e("r33", "e5", "u1", "/f", "2026-11-01T03:10:00Z"),
        e("r35", "e6", "u3", "/h", "2026-11-01T03:05:00Z"),
    ])

    commits_dir = Path(ds.output) / "_commits"
    with pytest.raises(LoadOrderError) as ei:
        load_hours(spark, ds, [H1])
    assert "2026-11-01-00:00" in str(ei.value)
    assert not any(commits_dir.glob("*.json"))

    out0 = load(spark, ds, H0)
    unique0_before = sorted(json.dumps(r, sort_keys=True) for r in out0["unique"])
    out1 = load(spark, ds, H1)
    with pytest.raises(LoadOrderError) as ei:
        load_hours(spark, ds, [H3])
    msg = str(ei.value)
    assert "2026-11-01-02:00" in msg
    assert "2026-11-01-00:00" not in msg and "2026-11-01-01:00" not in msg
    out2 = load(spark, ds, H2)
    out3 = load(spark, ds, H3)

    def kind(natural: bool) -> str:
        return "natural" if natural or not with_fp else "conflict"

    assert rids(out0["unique"]) == {"r01", "r02", "r04"}
    assert dups(out0["duplicates"]) == {"r03": (kind(True), "2026-11-01-00"),
                                        "r05": (kind(False), "2026-11-01-00")}
    assert rejects(out0["rejected"]) == {("bad_value:event_time", landing_lines(ds, H0)[5])}
    assert rids(out1["unique"]) == {"r15", "r17"}
    assert dups(out1["duplicates"]) == {
        "r11": (kind(True), "2026-11-01-00"), "r12": (kind(False), "2026-11-01-00"),
        "r13": (kind(True), "2026-11-01-00"), "r14": (kind(True), "2026-11-01-00"),
        "r16": (kind(True), "2026-11-01-01")}
    assert all(out2[o] == [] for o in OUTPUTS)
    assert (commits_dir / "load_hour=2026-11-01-02.json").exists()
    assert rids(out3["unique"]) == {"r33", "r35"}
    assert dups(out3["duplicates"]) == {
        "r31": (kind(False), "2026-11-01-00"), "r32": (kind(True), "2026-11-01-01"),
        "r34": (kind(False), "2026-11-01-03")}
    for out in (out0, out1, out3):
        assert out["expired"] == []
    # nothing already in unique is ever changed by a later load
    unique0_after = sorted(json.dumps(r, sort_keys=True) for r in read(ds, "unique", H0))
    assert unique0_after == unique0_before


# --- R6: expiry ------------------------------------------------------------------------------
@pytest.mark.parametrize("store_keys", [False, True], ids=["digest", "store_keys"])
def test_expiry_timestamps_event_basis(spark: SparkSession, tmp_path: Path,
                                       store_keys: bool) -> None:
    ds = make_ds(tmp_path, expiry={"column": "event_time", "period": "1h", "basis": "event"},
                 index={"store_keys": store_keys})
    write_hour(ds, H0, [
        ev("d01", "kmax0", "2026-11-01T00:50:00Z"),             # L0 = 00:50, X0 = 23:50
        ev("d02", "kx", "2026-10-31T23:50:00Z"),                # v = X0: kept
        ev("d03", "ky", "2026-10-31T23:49:59.999999Z"),         # 1 us before X0: expired
        ev("d04", "ky", "2026-11-01T00:30:00Z"),                # not compared with the expired one
        ev("d05", "kz", "2026-11-01T00:40:00Z"),
        ev("d06", "kw", "2026-11-01T00:45:00Z"),
        ev("d07", "kb1", "not a time"),
        ev("d08", "kb2"),
        ev("d09", None, "2030-01-01T00:00:00Z"),                # rejected: must not move L
    ])
    write_hour(ds, H1, [
        ev("d11", "kmax1", "2026-11-01T01:20:00Z"),             # L1 = 01:20, X1 = 00:20
        ev("d12", "kz", "2026-11-01T01:05:00Z"),                # H0's kz (00:40) still live
        ev("d13", "kw", "2026-11-01T00:25:00Z"),                # older than H0's kw, still a dup
        ev("d14", "kx", "2026-11-01T00:30:00Z"),                # H0's kx (23:50) has expired
        ev("d15", "kb", "2026-11-01T00:20:00Z"),                # v = X1: kept
        ev("d16", "kc", "2026-11-01T00:19:59.999999Z"),         # expired
    ])
    write_hour(ds, H2, [
        ev("d21", "kq", "2026-11-01T00:25:00Z"),                # late batch: L2 stays 01:20
        ev("d22", "kr", "2026-11-01T00:19:00Z"),                # expired against X2 = 00:20
        ev("d23", "kz", "2026-11-01T00:41:00Z"),                # dup of H0's kz
        ev("d24", "kx", "2026-11-01T00:20:00Z"),                # dup of H1's kx
    ])
    out0 = load(spark, ds, H0)
    out1 = load(spark, ds, H1)
    out2 = load(spark, ds, H2)

    assert rids(out0["unique"]) == {"d01", "d02", "d04", "d05", "d06"}
    assert out0["duplicates"] == []
    assert {(r["rid"], r["_expiry_point"]) for r in out0["expired"]} == {
        ("d03", us("2026-10-31T23:50:00"))}
    lines0 = landing_lines(ds, H0)
    assert rejects(out0["rejected"]) == {("bad_expiry_value", lines0[6]),
                                         ("bad_expiry_value", lines0[7]),
                                         ("null_key", lines0[8])}
    assert rids(out1["unique"]) == {"d11", "d14", "d15"}
    assert dups(out1["duplicates"]) == {"d12": ("natural", "2026-11-01-00"),
                                        "d13": ("natural", "2026-11-01-00")}
    assert {(r["rid"], r["_expiry_point"]) for r in out1["expired"]} == {
        ("d16", us("2026-11-01T00:20:00"))}
    assert rids(out2["unique"]) == {"d21"}
    assert dups(out2["duplicates"]) == {"d23": ("natural", "2026-11-01-00"),
                                        "d24": ("natural", "2026-11-01-01")}
    assert {(r["rid"], r["_expiry_point"]) for r in out2["expired"]} == {
        ("d22", us("2026-11-01T00:20:00"))}


@pytest.mark.fast
def test_expiry_ordered_numbers(spark: SparkSession, tmp_path: Path) -> None:
    ds = make_ds(tmp_path, {"seq": "long"}, expiry={"column": "seq", "period": 10})
    lines = [
        ev("n1", "a", seq=100),          # L = 100, X = 90
        ev("n2", "b", seq=90),           # kept
        ev("n3", "c", seq=89),           # expired
        ev("n4", "d", seq="abc"),        # bad expiry value
        ev("n5", "e"),                   # null expiry value
        ev("n6", "f", seq=95),
        ev("n7", None, seq=1000),        # rejected (null key): does not move L
        ev("n8", "b", seq=91),           # same key, higher v: loses to n2 (expiry value order)
    ]
    write_hour(ds, H0, lines)
    out = load(spark, ds, H0)
    assert rids(out["unique"]) == {"n1", "n2", "n6"}
    assert dups(out["duplicates"]) == {"n8": ("natural", "2026-11-01-00")}
    assert {(r["rid"], r["_expiry_point"]) for r in out["expired"]} == {("n3", 90)}
    assert rejects(out["rejected"]) == {("bad_expiry_value", lines[3]),
                                        ("bad_expiry_value", lines[4]), ("null_key", lines[6])}


def test_expiry_dates_across_loads(spark: SparkSession, tmp_path: Path) -> None:
    """A date expiry: v in days, `_expiry_point` a date; an index entry behind X_H is no hit."""
    from datetime import date

    ds = make_ds(tmp_path, {"day": "date"}, expiry={"column": "day", "period": "2d"})
    write_hour(ds, H0, [
        ev("t1", "a", day="2026-11-10"),     # L0 = 11-10, X0 = 11-08
        ev("t2", "b", day="2026-11-08"),     # v = X0: kept
        ev("t3", "c", day="2026-11-07"),     # expired
    ])
    write_hour(ds, H1, [
        ev("t4", "b", day="2026-11-09"),     # H0's b (11-08) is behind X1: unique again
        ev("t5", "a", day="2026-11-11"),     # L1 = 11-11, X1 = 11-09; H0's a (11-10) is live
        ev("t6", "d", day="2026-11-08"),     # expired
    ])
    out0, out1 = load(spark, ds, H0), load(spark, ds, H1)
    assert rids(out0["unique"]) == {"t1", "t2"}
    assert {(r["rid"], r["_expiry_point"]) for r in out0["expired"]} == {("t3", date(2026, 11, 8))}
    assert rids(out1["unique"]) == {"t4"}
    assert dups(out1["duplicates"]) == {"t5": ("natural", "2026-11-01-00")}
    assert {(r["rid"], r["_expiry_point"]) for r in out1["expired"]} == {("t6", date(2026, 11, 9))}


def test_expiry_doubles_across_loads(spark: SparkSession, tmp_path: Path) -> None:
    """A double expiry: fractional and whole expiry points alike, `_expiry_point` a double."""
    ds = make_ds(tmp_path, {"score": "double"}, expiry={"column": "score", "period": 1.5})
    write_hour(ds, H0, [
        ev("s1", "a", score=10.0),           # L0 = 10, X0 = 8.5
        ev("s2", "b", score=8.5),            # v = X0: kept
        ev("s3", "c", score=8.25),           # expired
    ])
    write_hour(ds, H1, [
        ev("s4", "a", score=10.5),           # L1 = 10.5, X1 = 9 (whole); H0's a (10) is live
        ev("s5", "b", score=9.75),           # H0's b (8.5) is behind X1: unique again
        ev("s6", "e", score=8.75),           # expired
    ])
    out0, out1 = load(spark, ds, H0), load(spark, ds, H1)
    assert rids(out0["unique"]) == {"s1", "s2"}
    assert {(r["rid"], r["_expiry_point"]) for r in out0["expired"]} == {("s3", 8.5)}
    assert rids(out1["unique"]) == {"s5"}
    assert dups(out1["duplicates"]) == {"s4": ("natural", "2026-11-01-00")}
    assert {(r["rid"], r["_expiry_point"]) for r in out1["expired"]} == {("s6", 9.0)}


@pytest.mark.fast
def test_expiry_categories(spark: SparkSession, tmp_path: Path) -> None:
    ds = make_ds(tmp_path, {"region": "string"},
                 expiry={"column": "region", "period": 1, "categories": ["a", "b", "c", "d"]})
    lines = [
        ev("c1", "k1", region="d"),      # position 3: L = 3, X = 2 ('c')
        ev("c2", "k2", region="c"),      # kept
        ev("c3", "k3", region="b"),      # expired
        ev("c4", "k4", region="a"),      # expired
        ev("c5", "k5", region="e"),      # not a declared category
        ev("c6", "k6", region="D"),      # categories compare exactly
        ev("c7", "k7"),                  # null expiry value
        ev("c8", "k2", region="d"),      # same key as c2, later category: duplicate
    ]
    write_hour(ds, H0, lines)
    out = load(spark, ds, H0)
    assert rids(out["unique"]) == {"c1", "c2"}
    assert dups(out["duplicates"]) == {"c8": ("natural", "2026-11-01-00")}
    assert {(r["rid"], r["_expiry_point"]) for r in out["expired"]} == {("c3", "c"), ("c4", "c")}
    assert rejects(out["rejected"]) == {("unknown_category", lines[4]),
                                        ("unknown_category", lines[5]),
                                        ("bad_expiry_value", lines[6])}


@pytest.mark.fast
def test_expiry_processing_basis_uses_the_partition_not_the_clock(spark: SparkSession,
                                                                   tmp_path: Path) -> None:
    hour = "2020-01-01-00:00"  # years ago: with the wall clock everything would be expired
    ds = make_ds(tmp_path, start=hour,
                 expiry={"column": "event_time", "period": "1h", "basis": "processing"})
    # L = end of the hour = 2020-01-01T01:00, X = 2020-01-01T00:00
    write_hour(ds, hour, [
        ev("p1", "g1", "2020-01-01T00:00:00Z"),                 # v = X: kept
        ev("p2", "g2", "2019-12-31T23:59:59.999999Z"),          # expired
        ev("p3", "g3", "2030-06-01T00:00:00Z"),                 # future: kept, and L is not max v
        ev("p4", "g4", "2020-01-01T00:59:59Z"),
        ev("p5", "g5", "2019-12-31T12:00:00Z"),                 # expired
        ev("p6", "g1", "2020-01-01T00:30:00Z"),                 # later v of g1: duplicate
    ])
    out = load(spark, ds, hour)
    assert rids(out["unique"]) == {"p1", "p3", "p4"}
    assert dups(out["duplicates"]) == {"p6": ("natural", "2020-01-01-00")}
    assert {(r["rid"], r["_expiry_point"]) for r in out["expired"]} == {
        ("p2", us("2020-01-01T00:00:00")), ("p5", us("2020-01-01T00:00:00"))}
    assert out["rejected"] == []


# --- R7, R10, R12 on small data (the fast tier's own: the other tests of these rules are slow) --
def index_entries(ds: DatasetConfig) -> list[str]:
    """Every entry of the persisted index, as sorted JSON rows (whatever the files' layout)."""
    root = Path(ds.output) / "index"
    return sorted(json.dumps(r, sort_keys=True, default=str) for f in sorted(root.rglob("*.parquet"))
                  if "_staging" not in f.parts for r in pq.read_table(f).to_pylist())


def all_outputs(ds: DatasetConfig, hours: list[str]) -> dict[tuple[str, str], list[str]]:
    """(output, hour) -> its rows as sorted JSON, `_source_file` cut to the hour's own path."""
    snap = {}
    for o in OUTPUTS:
        for h in hours:
            rows = [{**r, "_source_file": r["_source_file"].rsplit("/", 3)[-3:]} for r in read(ds, o, h)]
            snap[(o, h)] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return snap


@pytest.mark.fast
def test_retention_deletes_expired_slices_and_never_changes_a_result(spark: SparkSession,
                                                                     tmp_path: Path) -> None:
    """R7: with retention right after each load (lag 0), the slices wholly behind X_H are deleted
    and every load still gives exactly the rule's results (expected values by hand from R4, R6)."""
    ds = make_ds(tmp_path, {"seq": "long"}, expiry={"column": "seq", "period": 10},
                 index={"slice_span": 5, "retention_lag_hours": 0})
    write_hour(ds, H0, [ev("a0", "a", seq=100), ev("b0", "b", seq=91),  # L0 = 100, X0 = 90
                        ev("c0", "c", seq=95)])
    write_hour(ds, H1, [ev("d1", "d", seq=120),   # L1 = 120, X1 = 110
                        ev("a1", "a", seq=115),   # H0's a (100) is behind X1: unique again
                        ev("e1", "e", seq=111)])
    write_hour(ds, H2, [ev("f2", "f", seq=125),   # L2 = 125, X2 = 115
                        ev("a2", "a", seq=119),   # H1's a (115 = X2) is live: a duplicate
                        ev("b2", "b", seq=116),   # H0's b (91) expired long ago: unique
                        ev("g2", "g", seq=114)])  # behind X2: expired
    out0, out1 = load(spark, ds, H0), load(spark, ds, H1)
    # after H1 the slices wholly below X1 = 110 are gone: floor(v / 5) < 22, i.e. a0, b0, c0
    assert all(json.loads(e)["_v"] >= 110 for e in index_entries(ds))
    (r2,) = load_hours(spark, ds, [H2])
    out2 = assert_conserved(ds, H2, r2)
    assert r2.index_slices_deleted > 0  # X2 = 115: e1 (111, slice 22) goes too
    assert sorted(json.loads(e)["_v"] for e in index_entries(ds)) == [115, 116, 120, 125]
    assert rids(out0["unique"]) == {"a0", "b0", "c0"}
    assert rids(out1["unique"]) == {"d1", "a1", "e1"} and out1["duplicates"] == []
    assert rids(out2["unique"]) == {"f2", "b2"}
    assert dups(out2["duplicates"]) == {"a2": ("natural", "2026-11-01-01")}
    assert {(r["rid"], r["_expiry_point"]) for r in out2["expired"]} == {("g2", 115)}


@pytest.mark.fast
def test_rerun_of_loaded_hours_changes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """R10: running H1 (the latest loaded hour), then H0 through H1, again after success gives
    the same rows in every output of every hour and the same index entries, as if each had run
    once. H0 alone is refused while H1 is loaded (R11: later hours are reloaded with it)."""
    ds = make_ds(tmp_path, fingerprint=["user_id", "url"],
                 expiry={"column": "event_time", "period": "2h"})
    write_hour(ds, H0, [ev("r1", "k1", "2026-11-01T00:10:00Z", user_id="u", url="/a"),
                        ev("r2", "k1", "2026-11-01T00:20:00Z", user_id="u", url="/b"),
                        ev("r3", None, "2026-11-01T00:20:00Z"), "not json"])
    write_hour(ds, H1, [ev("r4", "k1", "2026-11-01T01:00:00Z", user_id="u", url="/a"),
                        ev("r5", "k2", "2026-10-31T20:00:00Z"),
                        ev("r6", "k3", "2026-11-01T01:30:00Z")])
    load_hours(spark, ds, [H0, H1])
    before, entries = all_outputs(ds, [H0, H1]), index_entries(ds)
    assert rids(read(ds, "unique", H0)) == {"r1"} and rids(read(ds, "unique", H1)) == {"r6"}
    assert dups(read(ds, "duplicates", H1)) == {"r4": ("natural", "2026-11-01-00")}
    assert rids(read(ds, "expired", H1)) == {"r5"}
    load(spark, ds, H1)  # conservation holds on the rerun too
    assert all_outputs(ds, [H0, H1]) == before
    assert index_entries(ds) == entries
    with pytest.raises(LaterHoursLoadedError, match="2026-11-01-01:00"):
        load_hours(spark, ds, [H0])
    for result in load_hours(spark, ds, [H0, H1]):
        assert_conserved(ds, result.partition_key, result)
    assert all_outputs(ds, [H0, H1]) == before
    assert index_entries(ds) == entries


def _snapshot(ds: DatasetConfig) -> dict[str, bytes]:
    """Every file of the dataset's output tree (commit records included), by relative path."""
    root = Path(ds.output)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "_trash" not in p.parts and p.name != "_lock"}


@pytest.mark.fast
def test_rerun_of_an_earlier_hour_never_leaves_later_hours_stale(spark: SparkSession,
                                                                 tmp_path: Path) -> None:
    """R10, R11: hours 00-01 loaded; a file with key k6 (first loaded in 01) lands late in 00 and
    another file of 00 is removed. Reloading 00 alone would make k6 unique in 00 and in 01: it is
    refused, naming the later hours and the command, and changes nothing. Reloading 00 through
    the latest loaded hour gives what a first load with 00's new files gives (R3, R4)."""
    ds = make_ds(tmp_path)
    write_hour(ds, H0, [ev("r1", "k1"), ev("r2", "k2")])
    gone = write_hour(ds, H0, [ev("r3", "k3")], name="part-1.jsonl")
    write_hour(ds, H1, [ev("r4", "k1"), ev("r6", "k6")])
    write_hour(ds, H2, [ev("r7", "k6"), ev("r8", "k8")])
    load_hours(spark, ds, [H0, H1])
    write_hour(ds, H0, [ev("r5", "k6")], name="part-2.jsonl")  # late
    gone.unlink()
    before = _snapshot(ds)
    with pytest.raises(LaterHoursLoadedError) as ei:
        load_hours(spark, ds, [H0])
    assert str(ei.value) == (
        "dataset 'clicks': cannot load 2026-11-01-00:00 without the later hours already loaded "
        "after it (2026-11-01-01:00): they were classified against the keys of 2026-11-01-00:00 "
        "as loaded then, and reloading it alone would leave them stale (a key unique twice, a "
        "duplicate pointing at a first load that is gone). Reload 2026-11-01-00:00 through the "
        "latest loaded hour in one run: dedup-pipeline run --config <file> --dataset clicks "
        "--from 2026-11-01-00:00 --to 2026-11-01-01:00 (or add --cascade), or in the UI a "
        "backfill of 2026-11-01-00:00...2026-11-01-01:00. Nothing was written.")
    assert _snapshot(ds) == before
    with pytest.raises(LaterHoursLoadedError):  # a range that stops short of 01 too
        load_hours(spark, ds, [H0, H2])
    assert _snapshot(ds) == before
    # the new hour alone, the latest loaded hour alone: no later hour is left out, both load
    out1 = load(spark, ds, H1)
    assert rids(out1["unique"]) == {"r6"}
    results = load_hours(spark, ds, [H0, H1, H2])  # the whole range, and on into a new hour
    outs = [assert_conserved(ds, r.partition_key, r) for r in results]
    assert rids(outs[0]["unique"]) == {"r1", "r2", "r5"} and not outs[0]["duplicates"]
    assert not outs[1]["unique"]
    assert dups(outs[1]["duplicates"]) == {"r4": ("natural", "2026-11-01-00"),
                                           "r6": ("natural", "2026-11-01-00")}
    assert rids(outs[2]["unique"]) == {"r8"}
    assert dups(outs[2]["duplicates"]) == {"r7": ("natural", "2026-11-01-00")}


@pytest.mark.fast
def test_lost_index_is_refused_then_rebuilt_and_later_loads_are_exact(spark: SparkSession,
                                                                      tmp_path: Path) -> None:
    """R12: with its index deleted, a load refuses to run and commits nothing; rebuilt from
    unique (`on_damaged_index: rebuild`), the next loads find every earlier key."""
    ds = make_ds(tmp_path)
    write_hour(ds, H0, [ev("r1", "k1"), ev("r2", "k2"), ev("r3", "k3")])
    write_hour(ds, H1, [ev("r4", "k2"), ev("r5", "k4")])
    write_hour(ds, H2, [ev("r6", "k1"), ev("r7", "k4"), ev("r8", "k5")])
    write_hour(ds, H3, [ev("r9", "k3"), ev("r10", "k5"), ev("r11", "k6")])
    load_hours(spark, ds, [H0, H1])
    shutil.rmtree(Path(ds.output) / "index")
    with pytest.raises(Exception, match="index is damaged.*rebuild-index"):
        load_hours(spark, ds, [H2])
    assert not (Path(ds.output) / "_commits" / "load_hour=2026-11-01-02.json").exists()
    healing = make_ds(tmp_path, on_damaged_index="rebuild")
    out2, out3 = load(spark, healing, H2), load(spark, healing, H3)
    assert rids(out2["unique"]) == {"r8"}
    assert dups(out2["duplicates"]) == {"r6": ("natural", "2026-11-01-00"),
                                        "r7": ("natural", "2026-11-01-01")}
    assert rids(out3["unique"]) == {"r11"}
    assert dups(out3["duplicates"]) == {"r9": ("natural", "2026-11-01-00"),
                                        "r10": ("natural", "2026-11-01-02")}
