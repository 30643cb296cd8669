"""Hostile landing zones. Every data file is read exactly once whatever its name, no file
content stops a load (R9), and every record lands in exactly one output (R8).

Each record carries an id; the expected output of every id is written down here from the design.md
rules and design.md's reject reasons, never taken from what the engine printed. A rejected row
is identified by the id inside its original text (`_raw`, base64-decoded for `bad_encoding`), an
unreadable file by its name. Outputs are read with pyarrow (item 5: every output stays readable).
"""

from __future__ import annotations

import base64
import bz2
import gzip
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from dedup_pipeline.cli import main
from dedup_pipeline.config import ConfigError, DatasetConfig, load_config
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.parse import LandingMissingError, list_input_files
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline.hours import parse_hour
from dedup_pipeline_tests.conftest import dataset_config, dataset_raw, source_raw, write_config
from dedup_pipeline_tests.reference import Reference
from dedup_pipeline_tests.test_reference import read_engine

H0 = "2026-11-01-00:00"
TAG = "2026-11-01-00"
OUTPUTS = ("unique", "duplicates", "expired", "rejected")
JSONL_SCHEMA = {"id": "string", "k": "string", "n": "long", "tier": "string"}
EXPIRY = {"column": "tier", "categories": ["gold", "silver"], "period": 1}
EXPIRY_OLD = {"column": "tier", "categories": ["old", "gold", "silver"], "period": 1}


def line(rid: str, k: str | None = "same", **extra: Any) -> bytes:
    obj: dict[str, Any] = {"id": rid, "tier": "gold"}
    if k is not None:
        obj["k"] = k if k != "same" else f"key-{rid}"
    obj.update(extra)
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


# --- the JSONL corpus: names, compression, encodings and every record-level reject reason --------
NAMED = {  # file name -> the id of its one record (each must be unique: read exactly once)
    "part-1.jsonl": "u01", "part-[1].jsonl": "u02", "part-*.jsonl": "u03", "q?.jsonl": "u04",
    "x{a,b}.jsonl": "u05", "2026-03-01T00:00:00.jsonl": "u06", "a%20b.jsonl": "u07",
    "pct%.jsonl": "u08", "sp ace.jsonl": "u09", "ünï €.jsonl": "u10", "back\\slash.jsonl": "u11",
    "plus+sign.jsonl": "u12", "a1.jsonl": "u13", "a[1].jsonl": "u14",
}
NOT_DATA = {  # markers, hidden and temporary files, subdirectories: never read (design.md R9a)
    ".hidden.jsonl": "x1", "_tmp.jsonl": "x2", "_temporary/part-0.jsonl": "x3",
    ".hidden/part-0.jsonl": "x4", "sub/part-0.jsonl": "x5",
}
BAD_BYTES = {
    "e1": b'{"id":"e1","k":"z\xff","tier":"gold"}\n',
    "e2": b'{"id":"e2","k":"z\xfe","tier":"gold"}\n',  # must not merge with e1's key
    "e3": b'{"id":"e3","k":"\x00\x01\xff\xfe\x80","tier":"gold"}\n',
}


def jsonl_corpus(hour_dir: Path, expiring: bool = False) -> dict[str, tuple[str, str | None]]:
    """Write the corpus; returns id -> (output, reject reason) per the design.md rules.

    `expiring`: for EXPIRY_OLD (categories old < gold < silver, period 1), one more file whose
    `silver` record moves the latest point to silver, so the `old` record expires (R6).
    """
    hour_dir.mkdir(parents=True, exist_ok=True)
    expect: dict[str, tuple[str, str | None]] = {}
    if expiring:
        (hour_dir / "exp.jsonl").write_bytes(line("s1", tier="silver") + line("o1", tier="old"))
        expect.update({"s1": ("unique", None), "o1": ("expired", None)})
    for name, rid in NAMED.items():
        (hour_dir / name).write_bytes(line(rid))
        expect[rid] = ("unique", None)
    for name, rid in NOT_DATA.items():
        (hour_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (hour_dir / name).write_bytes(line(rid))
    (hour_dir / "_SUCCESS").write_bytes(b"")
    (hour_dir / "good.jsonl.gz").write_bytes(gzip.compress(line("u15")))
    expect["u15"] = ("unique", None)
    (hour_dir / "empty.jsonl").write_bytes(b"")  # zero records, not unreadable
    (hour_dir / "empty.jsonl.gz").write_bytes(b"")
    (hour_dir / "notgzip.jsonl.gz").write_bytes(line("y1"))  # plain text named .gz
    (hour_dir / "trunc.jsonl.gz").write_bytes(gzip.compress(line("y2") * 200)[:40])
    expect["FILE:notgzip.jsonl.gz"] = ("rejected", "unreadable_file")
    expect["FILE:trunc.jsonl.gz"] = ("rejected", "unreadable_file")
    (hour_dir / "enc.jsonl").write_bytes(b"".join(BAD_BYTES.values()) + line("u16"))
    expect.update({rid: ("rejected", "bad_encoding") for rid in BAD_BYTES})
    expect["u16"] = ("unique", None)
    (hour_dir / "rules.jsonl").write_bytes(b"".join([
        line("d1", "dk"),
        line("d2", "dk"),  # same key, later in the file: a duplicate (R3/R5 order)
        b'{"id":"m1", "k": \n',  # not JSON
        b"   \n",  # blank: not a record
        line("nk", None),
        line("bv", n="abc"),
        line("uc", tier="bronze"),
        b'{"id":"be","k":"key-be"}\n',  # no expiry value
    ]))
    expect.update({"d1": ("unique", None), "d2": ("duplicates", None),
                   "m1": ("rejected", "malformed"), "nk": ("rejected", "null_key"),
                   "bv": ("rejected", "bad_value:n"), "uc": ("rejected", "unknown_category"),
                   "be": ("rejected", "bad_expiry_value")})
    return expect


# --- reading the outputs -------------------------------------------------------------------------
def output_rows(ds: DatasetConfig, name: str) -> list[dict[str, Any]]:
    root = Path(ds.output.removeprefix("file://")) / name / f"load_hour={TAG}"
    files = sorted(root.glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def rejected_id(row: dict[str, Any]) -> str:
    reason = row["_reject_reason"]
    if reason == "unreadable_file":
        return "FILE:" + row["_source_file"].rsplit("/", 1)[-1]
    raw = row["_raw"].encode()
    if reason == "bad_encoding":
        raw = base64.b64decode(row["_raw"])
    m = re.search(rb'"?id"?\W+(\w+)', raw) or re.match(rb"(\w+)", raw)
    assert m, row
    return m.group(1).decode()


def placement(ds: DatasetConfig) -> dict[str, tuple[str, str | None]]:
    """id -> (output, reason) for every row of the hour; an id seen twice fails the test."""
    seen: dict[str, tuple[str, str | None]] = {}
    for name in OUTPUTS:
        for row in output_rows(ds, name):
            rid = rejected_id(row) if name == "rejected" else row["id"]
            assert rid not in seen, f"{rid} is in {seen[rid][0]} and in {name}"
            seen[rid] = (name, row.get("_reject_reason"))
    return seen


def assert_conserved(ds: DatasetConfig, expect: dict[str, tuple[str, str | None]]) -> None:
    rec = commits.read_commit(_storage(ds), TAG)
    assert rec is not None
    n_out = sum(len(output_rows(ds, n)) for n in OUTPUTS)
    assert rec.rows_in == n_out == len(expect)  # R8: an unreadable file is one row in


def _storage(ds: DatasetConfig) -> Any:
    from dedup_pipeline.engine.core.storage import Storage
    return Storage(ds.output)


def hostile_raw(fmt: str, schema: dict[str, str], path: str = "landing", output: str = "warehouse",
                **extra: Any) -> dict[str, Any]:
    """This file's dataset: key `k`, named "hostile"."""
    return dataset_raw(**{"name": "hostile", "start": H0, "key": ["k"],
                          "source": source_raw(path, fmt, schema), "output": output, **extra})


def make_ds(tmp: Path, fmt: str, schema: dict[str, str], root_prefix: str = "",
            **extra: Any) -> DatasetConfig:
    return dataset_config(tmp, **hostile_raw(fmt, schema, f"{root_prefix}{tmp / 'landing'}",
                                             f"{root_prefix}{tmp / 'warehouse'}", **extra))


def hour_dir(tmp: Path) -> Path:
    return tmp / "landing" / "date=2026-11-01" / "hour=00"


def load_corpus(spark: SparkSession, tmp: Path, fmt: str, schema: dict[str, str],
                corpus: Callable[[Path], dict[str, tuple[str, str | None]]]) -> DatasetConfig:
    """Write `corpus` as hour 0, load it, check where every record went and conservation (R8)."""
    expect = corpus(hour_dir(tmp))
    ds = make_ds(tmp, fmt, schema)
    load_hours(spark, ds, [H0])
    assert placement(ds) == expect
    assert_conserved(ds, expect)
    return ds


# --- 1. the JSONL corpus through the CLI (real Dagster and Spark), then verify ------------------
@pytest.mark.slow
def test_jsonl_corpus_through_the_cli(spark: SparkSession, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    expect = jsonl_corpus(hour_dir(tmp_path))
    cfg_path = write_config(tmp_path, hostile_raw("jsonl", JSONL_SCHEMA, expiry=EXPIRY))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["run", "--config", str(cfg_path), "--from", H0, "--to", H0])
    assert r.exit_code == 0, r.output
    ds = load_config(cfg_path).datasets[0]
    assert placement(ds) == expect
    assert_conserved(ds, expect)
    # `_source_file` is the listed path, exactly as the commit record's inputs name it
    rec = commits.read_commit(_storage(ds), TAG)
    assert rec is not None and rec.inputs is not None
    listed = {f.path for f in rec.inputs}
    d = str(hour_dir(tmp_path).resolve())
    assert listed == {f"{d}/{n}" for n in [*NAMED, "good.jsonl.gz", "empty.jsonl", "empty.jsonl.gz",
                                           "notgzip.jsonl.gz", "trunc.jsonl.gz", "enc.jsonl",
                                           "rules.jsonl"]}
    by_id = {row["id"]: row["_source_file"] for row in output_rows(ds, "unique")}
    for name, rid in NAMED.items():
        assert by_id[rid] == f"{d}/{name}"
    # bad_encoding keeps the record's bytes exactly (base64 of the line without its newline)
    raws = {rejected_id(r): r["_raw"] for r in output_rows(ds, "rejected")}
    for rid, data in BAD_BYTES.items():
        assert base64.b64decode(raws[rid]) == data.rstrip(b"\n")
    r = CliRunner().invoke(main, ["verify", "--config", str(cfg_path)])
    assert r.exit_code == 0, r.output
    # a file added with the next run's listing only: the late-file check sees no change
    assert list_input_files(ds, parse_hour(H0)) == [
        f for f in list_input_files(ds, parse_hour(H0))]


# --- 2. the same names under a file:// root, in-process -------------------------------------------
def test_names_under_a_file_uri_root(spark: SparkSession, tmp_path: Path) -> None:
    d = hour_dir(tmp_path)
    d.mkdir(parents=True)
    for name, rid in NAMED.items():
        (d / name).write_bytes(line(rid))
    ds = make_ds(tmp_path, "jsonl", JSONL_SCHEMA, root_prefix="file://", expiry=EXPIRY)
    load_hours(spark, ds, [H0])
    assert placement(ds) == {rid: ("unique", None) for rid in NAMED.values()}
    by_id = {row["id"]: row["_source_file"] for row in output_rows(ds, "unique")}
    assert by_id == {rid: f"{d}/{name}" for name, rid in NAMED.items()}
    assert {f.path for f in list_input_files(ds, parse_hour(H0))} == set(by_id.values())
    rep = verify_dataset(spark, ds)
    assert rep.ok and rep.rows_in == len(NAMED), rep.violations


# --- 3. CSV: RFC 4180 records over several lines, bytes kept --------------------------------------
CSV_SCHEMA = {"id": "string", "k": "string", "n": "long"}


def csv_corpus(d: Path) -> dict[str, tuple[str, str | None]]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "a.csv").write_bytes(
        b'id,k,n\n'
        b'c1,"line1\nline2",5\n'             # a quoted newline: one record
        b'c2,"a,""b""",6\n'                  # quoted delimiter and doubled quotes
        b'c3,only-two\n'                     # wrong field count: malformed
        b'c4,"m\nl",zz\n'                    # bad value in a multi-line record
        b'c5,z\xff,1\n'
        b'c6,z\xfe,1\n'                      # bad bytes: bad_encoding, never merged
        b'\n'
        b'c7,"line1\nline2",8\n'             # same key as c1: a duplicate
        b'c9,"x\ny"\n'                       # two fields over two lines: malformed, whole text
    )
    (d / "b.csv.gz").write_bytes(b"id,k,n\nc8,zz,1\n")  # not gzip
    (d / "c.csv.bz2").write_bytes(bz2.compress(b'id,k,n\nc10,"bz\n2",3\n'))
    return {"c1": ("unique", None), "c2": ("unique", None), "c3": ("rejected", "malformed"),
            "c4": ("rejected", "bad_value:n"), "c5": ("rejected", "bad_encoding"),
            "c6": ("rejected", "bad_encoding"), "c7": ("duplicates", None),
            "c9": ("rejected", "malformed"), "c10": ("unique", None),
            "FILE:b.csv.gz": ("rejected", "unreadable_file")}


def test_csv_multiline_records_and_bad_bytes(spark: SparkSession, tmp_path: Path) -> None:
    ds = load_corpus(spark, tmp_path, "csv", CSV_SCHEMA, csv_corpus)
    uniq = {r["id"]: (r["k"], r["n"]) for r in output_rows(ds, "unique")}
    assert uniq == {"c1": ("line1\nline2", 5), "c2": ('a,"b"', 6), "c10": ("bz\n2", 3)}
    raws = {rejected_id(r): r["_raw"] for r in output_rows(ds, "rejected")}
    assert raws["c3"] == "c3,only-two"
    assert raws["c9"] == 'c9,"x\ny"'  # a malformed record: its whole text, both lines
    assert raws["c4"] == 'c4,"m\nl",zz'  # the whole record, both lines
    assert base64.b64decode(raws["c5"]) == b"c5,z\xff,1"
    assert verify_dataset(spark, ds).ok


# --- 4. Parquet: per-file schemas ----------------------------------------------------------------
PQ_SCHEMA = {"id": "string", "k": "string", "n": "long", "x": "double"}


def parquet_writer(d: Path) -> Callable[[str, dict[str, pa.Array]], None]:
    """Creates the hour directory `d`; the writer puts a table of `cols` into `d/name`."""
    d.mkdir(parents=True, exist_ok=True)

    def write(name: str, cols: dict[str, pa.Array]) -> None:
        pq.write_table(pa.table(cols), d / name)

    return write


def parquet_corpus(d: Path) -> dict[str, tuple[str, str | None]]:
    write = parquet_writer(d)

    write("f1.parquet", {"id": pa.array(["p1"]), "k": pa.array(["k1"]),
                         "n": pa.array([1], pa.int32()), "x": pa.array([0.5], pa.float32())})
    write("f2.parquet", {"id": pa.array(["p2"]), "k": pa.array(["k2"]),
                         "n": pa.array([2**40], pa.int64()), "x": pa.array([1.25])})
    write("f3.parquet", {"id": pa.array(["p3", "p4"]), "k": pa.array(["k3", "k4"]),
                         "n": pa.array(["7", "abc"])})          # string where long is declared
    write("f4.parquet", {"id": pa.array(["p5"]), "k": pa.array(["k5"])})  # no n, no x
    write("f5.parquet", {"id": pa.array(["p6"]), "n": pa.array([3], pa.int64())})  # no key
    write("f6.parquet", {"id": pa.array(["p7"]), "k": pa.array(["k7"]),
                         "n": pa.array([1.5])})                 # a double does not fit a long
    write("f7.parquet", {"ID": pa.array(["p8", "p9"]), "k": pa.array(["k1", "k8"]),
                         "x": pa.array([3, 4], pa.int16())})    # same key as p1: a duplicate
    (d / "text.parquet").write_bytes(b"id,k\nq1,k\n")
    good = (d / "f1.parquet").read_bytes()
    (d / "trunc.parquet").write_bytes(good[: len(good) // 2])
    (d / "empty.parquet").write_bytes(b"")                      # zero records
    return {"p1": ("unique", None), "p2": ("unique", None), "p3": ("unique", None),
            "p4": ("rejected", "bad_value:n"), "p5": ("unique", None),
            "p6": ("rejected", "null_key"), "p7": ("rejected", "bad_value:n"),
            "p8": ("duplicates", None), "p9": ("unique", None),
            "FILE:text.parquet": ("rejected", "unreadable_file"),
            "FILE:trunc.parquet": ("rejected", "unreadable_file")}


def test_parquet_schema_drift_per_file(spark: SparkSession, tmp_path: Path) -> None:
    ds = load_corpus(spark, tmp_path, "parquet", PQ_SCHEMA, parquet_corpus)
    vals = {r["id"]: (r["n"], r["x"]) for r in output_rows(ds, "unique")}
    assert vals == {"p1": (1, 0.5), "p2": (2**40, 1.25), "p3": (7, None), "p5": (None, None),
                    "p9": (None, 4.0)}
    assert verify_dataset(spark, ds).ok


# --- 5. the reference model agrees with the engine on the whole corpus --------------------------
def reference_placement(ref: Reference) -> dict[str, tuple[str, str | None]]:
    """id -> (output, reason) from the reference's own account of every record it read."""
    seen: dict[str, tuple[str, str | None]] = {}
    for _tag, out, rec in ref.placed:
        rid = rec.values["id"] if out != "rejected" else rejected_id(
            {"_reject_reason": rec.reason, "_raw": rec.raw, "_source_file": rec.path})
        assert rid not in seen, f"reference: {rid} placed twice"
        seen[rid] = (out, rec.reason)
    return seen


# --- 5a. hostile cases (line ends, BOM, lone surrogates, links, pandas Parquet) --
def jsonl_corpus_2(d: Path) -> dict[str, tuple[str, str | None]]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "crlf.jsonl").write_bytes(  # CRLF line ends; a lone `\r` is JSON whitespace, not a line end
        b'{"id":"r1","k":"kr1","tier":"gold"}\r\n{"id":"r2",\r"k":"kr2","tier":"gold"}\r\n')
    (d / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + line("b1") + line("b2"))
    (d / "sur.jsonl").write_bytes(  # lone surrogate escapes must not become `?` (merging keys)
        b'{"id":"s1","k":"\\ud800","tier":"gold"}\n{"id":"s2","k":"?","tier":"gold"}\n'
        b'{"id":"s3","k":"\\udfff","tier":"gold"}\n{"id":"s4","k":"\\ud83d\\ude00","tier":"gold"}\n'
        b'{"id":"s5","k":"\\\\ud800","tier":"gold"}\n')  # an escaped backslash: plain text
    (d / "shapes.jsonl").write_bytes(
        b'[{"id":"a1","k":"x"}]\n42\n{"id":"a2","k":"first","k":"last","tier":"gold"}\n'
        b'{"id":"a3","k":"a\x00b","tier":"gold"}\n{"id":"a4","k":"a\\u0000b","tier":"gold"}\n')
    (d / "utf.jsonl").write_bytes(  # overlong, UTF-8-encoded surrogate, > U+10FFFF, cut at EOF
        b'{"id":"o1","k":"\xc0\xaf"}\n{"id":"o2","k":"\xed\xa0\x80"}\n'
        b'{"id":"o3","k":"\xf4\x90\x80\x80"}\n{"id":"o4","k":"\xe2\x82')
    (d / "multi.jsonl.gz").write_bytes(gzip.compress(line("g1")) + gzip.compress(line("g2")))
    (d / "trail.jsonl.gz").write_bytes(gzip.compress(line("g3")) + b"garbage")
    (d / "nothing.jsonl.gz").write_bytes(gzip.compress(b""))
    (d / "long.jsonl").write_bytes(line("L1", pad="x" * 5_000_000))
    for name, rid in {"new\nline.jsonl": "f1", "hash#.jsonl": "f2", " lead.jsonl": "f3",
                      "%41": "f4", "q?x=1&y.jsonl": "f5"}.items():
        (d / name).write_bytes(line(rid))
    outside = d.parents[2] / "elsewhere"
    (outside / "dir").mkdir(parents=True)
    (outside / "t.jsonl").write_bytes(line("l1"))
    (outside / "dir" / "in.jsonl").write_bytes(line("l2"))
    (d / "link.jsonl").symlink_to(outside / "t.jsonl")  # a link to a file is that file
    (d / "linkdir").symlink_to(outside / "dir")  # a link to a directory is not read
    u, rej = ("unique", None), "rejected"
    return {"r1": u, "r2": u, "b1": u, "b2": u, "s1": (rej, "bad_encoding"), "s2": u,
            "s3": (rej, "bad_encoding"), "s4": u, "s5": u, "a1": (rej, "malformed"),
            "42": (rej, "malformed"), "a2": u, "a3": (rej, "malformed"), "a4": u,
            **{f"o{i}": (rej, "bad_encoding") for i in range(1, 5)}, "g1": u, "g2": u,
            "FILE:trail.jsonl.gz": (rej, "unreadable_file"), "L1": u,
            **{f"f{i}": u for i in range(1, 6)}, "l1": u}


def csv_corpus_2(d: Path) -> dict[str, tuple[str, str | None]]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "bom.csv").write_bytes(b"\xef\xbb\xbfid,k,n\nb1,kb1,1\n")  # BOM on the header: skipped
    (d / "hdronly.csv").write_bytes(b"id,k,n\n")
    (d / "mlfirst.csv").write_bytes(b'id,k,n\nh1,"x\ny",1\nh2,kh2,2\n')
    (d / "lone_cr.csv").write_bytes(b"id,k,n\nr1,a\rb,1\nr2,kr2,2\n")  # a lone `\r` is data
    (d / "g.csv.gz").write_bytes(gzip.compress(b"id,k,n\ng1,kg1,1\n") + gzip.compress(b"g2,kg2,2\n"))
    (d / "nul.csv").write_bytes(b"id,k,n\nz1,a\x00b,1\n")
    (d / "utf.csv").write_bytes(b'id,k,n\no1,\xc0\xaf,1\no2,\xed\xa0\x80,1\nu1,"\xc3\xa9",1\n')
    u = ("unique", None)
    return {"b1": u, "h1": u, "h2": u, "r1": u, "r2": u, "g1": u, "g2": u, "z1": u, "u1": u,
            "o1": ("rejected", "bad_encoding"), "o2": ("rejected", "bad_encoding")}


PQ_SCHEMA_2 = {**PQ_SCHEMA, "ts": "timestamp"}


def parquet_corpus_2(d: Path) -> dict[str, tuple[str, str | None]]:
    write = parquet_writer(d)

    write("dbl.parquet", {"id": pa.array(["p1", "p2"]), "k": pa.array(["k1", "k2"]),
                          "n": pa.array([2.0, 2.5])})  # any double for a long: bad_value
    write("i64.parquet", {"id": pa.array(["p3"]), "k": pa.array([5], pa.int64())})
    write("dict.parquet", {"id": pa.array(["p4"]), "k": pa.array(["k4"]).dictionary_encode()})
    write("large.parquet", {"id": pa.array(["p5"], pa.large_string()),
                            "k": pa.array(["k5"], pa.large_string())})
    write("nested.parquet", {"id": pa.array(["p6"]), "k": pa.array(["k6"]),
                             "s": pa.array([{"a": 1, "b": "x"}])})  # not in the schema
    write("u64.parquet", {"id": pa.array(["p7"]), "k": pa.array(["k7"]),
                          "n": pa.array([2**63 + 5], pa.uint64())})  # does not fit a long
    write("ns.parquet", {"id": pa.array(["p8"]), "k": pa.array(["k8"]),  # pandas' default
                         "ts": pa.array([1_767_229_323_123_456_789], pa.timestamp("ns"))})
    write("case.parquet", {"id": pa.array(["p9"]), "k": pa.array(["k9"]), "K": pa.array(["K9"])})
    u = ("unique", None)
    return {"p1": ("rejected", "bad_value:n"), "p2": ("rejected", "bad_value:n"), "p3": u,
            "p4": u, "p5": u, "p6": u, "p7": ("rejected", "bad_value:n"), "p8": u,
            "FILE:case.parquet": ("rejected", "unreadable_file")}


CORPORA = {  # kind -> (format, schema, extra config, corpus writer)
    "jsonl": ("jsonl", JSONL_SCHEMA, {"expiry": EXPIRY_OLD},
              lambda d: jsonl_corpus(d, expiring=True)),
    "csv": ("csv", CSV_SCHEMA, {}, csv_corpus),
    "parquet": ("parquet", PQ_SCHEMA, {}, parquet_corpus),
    "jsonl-2": ("jsonl", JSONL_SCHEMA, {"expiry": EXPIRY}, jsonl_corpus_2),
    "csv-2": ("csv", CSV_SCHEMA, {}, csv_corpus_2),
    "parquet-2": ("parquet", PQ_SCHEMA_2, {}, parquet_corpus_2),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(CORPORA))
def test_reference_agrees_with_the_engine_on_the_corpus(
        spark: SparkSession, tmp_path: Path, kind: str) -> None:
    fmt, schema, extra, write = CORPORA[kind]
    expect = write(hour_dir(tmp_path))
    ds = make_ds(tmp_path, fmt, schema, **extra)
    ref = Reference(ds)
    res = ref.load(parse_hour(H0))
    [got] = load_hours(spark, ds, [H0])
    engine = placement(ds)
    # the same place for every record id (whole sets), and both as the rules say
    assert engine == reference_placement(ref)
    assert engine == expect
    # R8: the same rows in, all of them out, in the same outputs
    assert got.rows_in == res.rows_in == len(expect)
    assert (got.unique, got.duplicates, got.expired, got.rejected) == tuple(
        sum(res.rows[o].values()) for o in OUTPUTS)
    assert (got.latest_point, got.expiry_point) == (res.latest, res.expiry_point)
    # and the same rows: typed values, origin, duplicate kinds, expiry point, reasons and `_raw`
    for o in OUTPUTS:
        assert read_engine(ds, o, TAG) == res.rows[o], o


# --- 6. config and landing-root mistakes (item 6) -------------------------------------------------
def test_missing_landing_root_fails_the_load_naming_dataset_and_path(
        spark: SparkSession, tmp_path: Path) -> None:
    ds = make_ds(tmp_path, "jsonl", JSONL_SCHEMA)
    with pytest.raises(LandingMissingError, match=r"'hostile'.*landing.*does not exist"):
        load_hours(spark, ds, [H0])
    assert commits.committed_tags(_storage(ds)) == set()
    (tmp_path / "landing").mkdir()  # the root exists, the hour's directory does not: 0 rows
    load_hours(spark, ds, [H0])
    rec = commits.read_commit(_storage(ds), TAG)
    assert rec is not None and rec.rows_in == 0


def test_hour_path_that_is_a_file_fails_the_load(spark: SparkSession, tmp_path: Path) -> None:
    """`date=.../hour=00` as a file is neither an hour directory (0 rows would lose its data)
    nor a data file in one: the load stops naming it, nothing is committed."""
    d = hour_dir(tmp_path)
    d.parent.mkdir(parents=True)
    d.write_bytes(line("h1"))
    ds = make_ds(tmp_path, "jsonl", JSONL_SCHEMA)
    with pytest.raises(LandingMissingError, match=r"'hostile': hour path .*hour=00 is a file"):
        load_hours(spark, ds, [H0])
    assert commits.committed_tags(_storage(ds)) == set()


def _two(tmp: Path, out_a: str, out_b: str) -> Path:
    return write_config(tmp, hostile_raw("jsonl", {"k": "string"}, "l", out_a, name="a"),
                        hostile_raw("jsonl", {"k": "string"}, "l", out_b, name="b"), name="c.yaml")


@pytest.mark.parametrize("out_b", ["w/a/b", "w/a", "w/a/"])
def test_output_inside_or_equal_to_another_is_refused(tmp_path: Path, out_b: str) -> None:
    with pytest.raises(ConfigError, match=r"c.yaml: dataset '(a|b)', field 'output'"):
        load_config(_two(tmp_path, "w/a", out_b))


def test_output_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "w").write_text("x")
    with pytest.raises(ConfigError, match=r"dataset 'a', field 'output': .*is a file"):
        load_config(_two(tmp_path, "w", "v"))
    with pytest.raises(ConfigError, match=r"dataset 'b', field 'output': .*which is a file"):
        load_config(_two(tmp_path, "v", "w/sub"))


def test_non_utf8_config_and_duplicate_keys(tmp_path: Path) -> None:
    p = _two(tmp_path, "wa", "wb")
    p.write_bytes(p.read_bytes().replace(b"path: l", b"path: l\xe9"))
    with pytest.raises(ConfigError, match=r"c.yaml: not UTF-8 text \(byte 0xe9 on line \d+\)"):
        load_config(p)
    p.write_text("datasets:\n- name: a\n  start: 2026-11-01-00:00\n  key: [k]\n  output: w\n"
                 "  source: {path: l, format: jsonl, schema: {k: string}}\n  key: [j]\n")
    with pytest.raises(ConfigError, match=r"dataset 'a', field 'key': given twice"):
        load_config(p)


# --- 7. infrastructure errors name their cause (item 7) -------------------------------------------
def test_cause_is_found_deep_in_a_java_trace() -> None:
    from dedup_pipeline.engine.errors import infrastructure_cause

    trace = ("An error occurred while calling o6206.parquet.\n"
             ": org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed while writing "
             "rows to file:/mnt/full/warehouse/_tmp/2026-11-01-00-ab/unique.\n"
             "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.taskFailedWhileWritingRowsError\n"
             "Caused by: java.io.IOException: No space left on device\n"
             "\tat java.base/java.io.FileOutputStream.writeBytes(Native Method)\n")
    assert infrastructure_cause(trace) == \
        "No space left on device: /mnt/full/warehouse/_tmp/2026-11-01-00-ab/unique"
    assert infrastructure_cause("OSError: [Errno 30] Read-only file system: '/ro/w/_lock'") == \
        "Read-only file system: /ro/w/_lock"
    assert infrastructure_cause("ValueError: something else") is None


def _mount_tmpfs(where: Path, opts: str) -> bool:
    import subprocess
    where.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("opts,cause", [("size=64k", "No space left on device"),
                                        ("size=1m,ro", "Read-only file system")])
def test_full_or_read_only_output_is_named_in_one_line(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        opts: str, cause: str) -> None:
    import subprocess
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, opts):
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        d = hour_dir(tmp_path)
        d.mkdir(parents=True)
        (d / "big.jsonl").write_bytes(b"".join(line(f"r{i:06d}", n=i) for i in range(20000)))
        cfg_path = write_config(tmp_path, hostile_raw("jsonl", JSONL_SCHEMA,
                                                      output=str(mnt / "warehouse")))
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
        monkeypatch.chdir(tmp_path)
        r = CliRunner().invoke(main, ["run", "--config", str(cfg_path), "--from", H0, "--to", H0])
        assert r.exit_code == 1
        err = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and cause in err[0] and str(mnt) in err[0], r.output
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.slow
def test_lock_release_failure_never_masks_the_loads_error(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The output's file system turns read-only once the run holds the dataset lock: the load's
    first write fails (its own error) and so does the lock's release (the same cause, `_lock`).
    The one-line error must be the load's; the lock file left behind proves the release failed."""
    import subprocess
    import threading
    import time

    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "size=64m"):
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    lock = mnt / "warehouse" / "_lock"
    done = threading.Event()
    remounted: list[bool] = []

    def turn_read_only() -> None:  # a real second actor: the disk goes read-only mid-run
        while not done.is_set():
            try:
                json.loads(lock.read_text())
            except (OSError, ValueError):
                time.sleep(0.005)
                continue
            r = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True)
            if r.returncode == 0:
                remounted.append(True)
                return
            time.sleep(0.005)  # EBUSY while a file is open for writing: try again

    try:
        d = hour_dir(tmp_path)
        d.mkdir(parents=True)
        (d / "part-0.jsonl").write_bytes(b"".join(line(f"r{i}") for i in range(100)))
        cfg_path = write_config(tmp_path, hostile_raw("jsonl", JSONL_SCHEMA,
                                                      output=str(mnt / "warehouse")))
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
        monkeypatch.chdir(tmp_path)
        watcher = threading.Thread(target=turn_read_only, daemon=True)
        watcher.start()
        r = CliRunner().invoke(main, ["run", "--config", str(cfg_path), "--from", H0, "--to", H0])
        done.set()
        watcher.join(10)
        assert remounted, "the file system never turned read-only while the run held the lock"
        assert r.exit_code == 1, r.output
        err = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
        assert len(err) == 1, r.output
        assert "Read-only file system" in err[0] and str(mnt / "warehouse") in err[0], err[0]
        assert str(lock) not in err[0], err[0]  # the load's error (a write), not the release's
        assert lock.exists()  # the release did fail (read-only), and was not what was reported
    finally:
        done.set()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
