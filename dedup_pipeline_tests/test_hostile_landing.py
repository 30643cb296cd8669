"""A hostile landing corpus beyond test_landing_files.py: odd lines, in-progress names, every
codec Hadoop picks by extension, links that lead nowhere, Parquet types Spark cannot read,
numbers and booleans in text, dates with offsets, double keys `-0.0`/`0.0`/NaN, an output root
full of glob characters.

One Spark load per dataset reads many hostile files per hour; the pure-Python reference model
(`reference.py`, written from docs/design.md "Reading landing files") decides where every record
id (`rid`) belongs, and a few rules are also written down here directly. `verify` must agree.
"""

from __future__ import annotations

import base64
import bz2
import datetime as dt
import gzip
import json
import os
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.index.compaction import list_compacted
from dedup_pipeline.engine.core.index.rebuild import rebuild_index
from dedup_pipeline.engine.core.parse import (
    failed_file,
    is_data_name,
    list_input_files,
    plan_batch,
    read_text_batch,
    spark_skips,
)
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline.hours import parse_hour
from dedup_pipeline_tests.conftest import dataset_config, output_table, source_raw
from dedup_pipeline_tests.reference import OUTPUTS, Reference
from dedup_pipeline_tests.test_reference import read_engine

H0, H1 = "2026-11-01-00:00", "2026-11-01-01:00"
TAGS = ("2026-11-01-00", "2026-11-01-01")
SCHEMA = {"rid": "long", "k": "string", "n": "long", "s": "string", "b": "boolean", "d": "date"}
# an output root holding every character a file name may and a glob may not
ODD_ROOT = "out [x] {a,b} ?* é"


def obj(rid: int, k: Any = "same", **extra: Any) -> str:
    o: dict[str, Any] = {"rid": rid, "k": f"k{rid}" if k == "same" else k}
    o.update(extra)
    return json.dumps(o, ensure_ascii=False)


def lines(*items: str) -> bytes:
    return "".join(i + "\n" for i in items).encode()


def hour_dir(root: Path, hour: int) -> Path:
    d = root / "date=2026-11-01" / f"hour={hour:02d}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_jsonl_hours(root: Path) -> None:
    """Hour 00 and hour 01 of the JSONL dataset: 40+ kinds of odd line, name and file."""
    d = hour_dir(root, 0)
    (d / "odd-lines.jsonl").write_bytes(lines(
        obj(101) + obj(102),  # two objects on one line: malformed, not a silent loss of 102
        obj(103) + " " + obj(104),  # two objects with a space
        obj(105) + " trailing words",
        obj(106) + "]",  # a `]` would close a wrapping array early
        obj(107) + "] }",
        obj(108) + ",1],[",
        obj(109) + ",",
        obj(110) + "\t  ",  # trailing JSON whitespace: fine
        "   " + obj(111),  # leading spaces: fine
        obj(117) + "{",
        obj(118) + "//comment",
        obj(115, "]x[", s="a]"),  # brackets inside strings: fine
        obj(116, s=[1, 2]),  # an array for a string column: its JSON text
        "null",  # not an object
        "{}",  # no key
        obj(157, None),
        obj(158, ""),  # the empty string is a key, not a null
        "\t", " \t ", "\r\t", "",  # only JSON whitespace: blank lines, not records
    ))
    # `cat a.jsonl b.jsonl` of two files with a byte-order mark: one mid-file
    (d / "cat.jsonl").write_bytes(b"\xef\xbb\xbf" + lines(obj(112)) + b"\xef\xbb\xbf"
                                  + lines(obj(113)))
    (d / "bom-two.jsonl").write_bytes(b"\xef\xbb\xbf" + lines(obj(114) + obj(119)))
    (d / "numbers.jsonl").write_bytes(lines(
        obj(120, 1027), obj(121, "1027"),  # one key
        obj(122, 0.10), obj(123, "0.1"), obj(124, "0.10"),  # 0.10 is spelled 0.1
        obj(125, 1e2), obj(126, "100.0"),
        obj(155, True), obj(156, "true"),
        obj(159, -0.0), obj(160, 0.0),  # a string key: two spellings, two keys
        obj(153, n="12"), obj(154, n=1.0),
        obj(164, 1e-5), obj(165, 12345678.0), obj(166, 123456789012345678901234567890),
        obj(167, 1.5e300), obj(168, False),
    ))
    (d / "bools-dates.jsonl").write_bytes(lines(
        obj(127, b=1), obj(128, b=0), obj(129, b="yes"), obj(130, b="NO"), obj(131, b=2),
        obj(132, b="maybe"), obj(133, b=1.0), obj(139, b="t"),
        obj(134, d="2026-11-01T23:30:00-05:00"),  # the date as written, not the UTC date
        obj(135, d="2026-11-01"), obj(136, d="2026"), obj(137, d="2026-11-01Tjunk"),
        obj(138, d="2026-11-01 03:04:05"), obj(161, d="2026-11-1"),
    ))
    # in-progress and hidden names: never read (Spark itself skips `._COPYING_`)
    for name, rid in {"part-9.jsonl.tmp": 140, "part-5.jsonl._COPYING_": 141,
                      "x.jsonl.inprogress": 142, "x.jsonl.partial": 143, "Y.JSONL.TMP": 144,
                      "_a=b.jsonl": 145, "z.jsonl.part": 162}.items():
        (d / name).write_bytes(lines(obj(rid)))
    # codecs Hadoop picks by extension
    (d / "good.jsonl.deflate").write_bytes(zlib.compress(lines(obj(146)))
                                           + zlib.compress(lines(obj(147))))
    (d / "good.jsonl.zst").write_bytes(pa.compress(lines(obj(148)), "zstd", asbytes=True))
    (d / "good.jsonl.bz2").write_bytes(bz2.compress(lines(obj(163))))
    (d / "bad.jsonl.zst").write_bytes(lines(obj(170)))
    (d / "bad.jsonl.deflate").write_bytes(lines(obj(171)))
    (d / "tail.jsonl.deflate").write_bytes(zlib.compress(lines(obj(172))) + b"garbage")
    (d / "cli.jsonl.lz4").write_bytes(pa.compress(lines(obj(173)), "lz4", asbytes=True))
    (d / "text.jsonl.snappy").write_bytes(lines(obj(174)))
    (d / "x.jsonl.xz").write_bytes(b"\xfd7zXZ\x00\x00" + lines(obj(175)))
    (d / "upper.jsonl.GZ").write_bytes(gzip.compress(lines(obj(176))))
    (d / "a.jsonl.zip").write_bytes(b"PK\x03\x04" + lines(obj(177)))
    (d / "empty.jsonl.lz4").write_bytes(b"")  # empty: zero records, whatever its name
    # links that lead nowhere, and a directory named like a data file
    os.symlink(d / "no-such-file.jsonl", d / "dangling.jsonl")
    os.symlink(d / "loop-b.jsonl", d / "loop-a.jsonl")
    os.symlink(d / "loop-a.jsonl", d / "loop-b.jsonl")
    (d / "dir.jsonl").mkdir()
    (d / "dir.jsonl" / "inside.jsonl").write_bytes(lines(obj(178)))

    d1 = hour_dir(root, 1)
    (d1 / "late.jsonl").write_bytes(lines(
        obj(201, "1027"),  # the key of 120 (a number then): a duplicate across hours
        obj(202, "0.1"), obj(203, "k203"), obj(204, ""),
    ) + b"\xef\xbb\xbf" + lines(obj(205, "k112")))


def rid_of(row: dict[str, Any]) -> str:
    """A row's record id: its `rid`, the first `rid` in its original text, or FILE:<name>."""
    reason = row.get("_reject_reason")
    if reason is None:
        return str(row["rid"])
    if reason == "unreadable_file":
        return "FILE:" + row["_source_file"].rsplit("/", 1)[-1]
    raw = base64.b64decode(row["_raw"]) if reason == "bad_encoding" else row["_raw"].encode()
    m = re.search(rb'"rid"\s*:\s*(\d+)', raw)
    return m.group(1).decode() if m else "RAW:" + raw.decode(errors="replace")


def engine_placement(ds: DatasetConfig, tag: str) -> dict[str, tuple[str, str | None]]:
    """Where the engine put each record of hour `tag`, as a reader of the tables sees it (a
    rerun's replaced files stay on disk until a vacuum)."""
    seen: dict[str, tuple[str, str | None]] = {}
    for name in OUTPUTS:
        table = output_table(ds, name, tag)
        for row in table.to_pylist() if table is not None else []:
            rid = rid_of(row)
            assert rid not in seen, f"{rid} is in {seen[rid][0]} and in {name}"
            seen[rid] = (name, row.get("_reject_reason"))
    return seen


def reference_placement(ref: Reference, tag: str) -> dict[str, tuple[str, str | None]]:
    seen: dict[str, tuple[str, str | None]] = {}
    for t, out, rec in ref.placed:
        if t != tag:
            continue
        row = {"_reject_reason": rec.reason, "_raw": rec.raw, "_source_file": rec.path,
               "rid": rec.values.get("rid")}
        rid = rid_of(row)
        assert rid not in seen, f"reference: {rid} placed twice"
        seen[rid] = (out, rec.reason)
    return seen


def make(tmp: Path, name: str, fmt: str, schema: dict[str, str], key: list[str],
         output: str, **extra: Any) -> DatasetConfig:
    return dataset_config(tmp, name=name, start=H0, key=key,
                          source=source_raw(str(tmp / name / "landing"), fmt, schema),
                          output=str(tmp / name / output), **extra)


def load_and_compare(spark: SparkSession, ds: DatasetConfig, hours: list[str],
                     rows: bool = True) -> dict[str, dict[str, tuple[str, str | None]]]:
    """Load `hours` with the engine and the reference; the same place for every rid, the same
    rows in (R8 conservation), and (`rows`) the same typed rows; then `verify` is clean."""
    ref = Reference(ds)
    results = load_hours(spark, ds, hours)
    st = Storage(ds.output)
    out = {}
    for h, got in zip(hours, results, strict=True):
        tag = f"{parse_hour(h):%Y-%m-%d-%H}"
        res = ref.load(parse_hour(h))
        engine = engine_placement(ds, tag)
        assert engine == reference_placement(ref, tag), tag
        rec = commits.read_commit(st, tag)
        assert rec is not None and rec.inputs is not None
        listed = {f.path.rsplit("/", 1)[-1] for f in rec.inputs}
        read = {p.rsplit("/", 1)[-1] for p in _source_files(ds, tag)}
        assert read <= listed  # every row comes from a listed file (empty files have no rows)
        assert got.rows_in == res.rows_in == len(engine)
        if rows:
            for o in OUTPUTS:
                assert read_engine(ds, o, tag) == res.rows[o], (tag, o)
        out[tag] = engine
    rep = verify_dataset(spark, ds)
    assert rep.ok, rep.violations
    assert rep.rows_in == rep.rows_out == sum(len(p) for p in out.values())
    return out


def _source_files(ds: DatasetConfig, tag: str) -> set[str]:
    files: set[str] = set()
    for name in OUTPUTS:
        for f in (Path(ds.output) / name / f"load_hour={tag}").glob("*.parquet"):
            files |= set(pq.read_table(f, columns=["_source_file"]).column(0).to_pylist())
    return files


U, D = ("unique", None), ("duplicates", None)


def M(reason: str = "malformed") -> tuple[str, str]:
    return ("rejected", reason)


@pytest.mark.slow
def test_hostile_jsonl_corpus_agrees_with_the_reference(spark: SparkSession,
                                                        tmp_path: Path) -> None:
    # index compaction after two loads: merged, rebuilt and rerun under the odd output root too
    ds = make(tmp_path, "hostile", "jsonl", SCHEMA, ["k"], ODD_ROOT, index={"compact_after": 2})
    write_jsonl_hours(Path(ds.source.path))
    got = load_and_compare(spark, ds, [H0, H1])
    h0, h1 = got[TAGS[0]], got[TAGS[1]]
    # the rules, written down directly (docs/design.md "Reading landing files")
    expect0 = {
        **{str(r): M() for r in (101, 103, 105, 106, 107, 108, 109, 117, 118, 114)},
        **{str(r): U for r in (110, 111, 112, 113, 115, 116, 158)},
        "120": U, "121": D, "122": U, "123": D, "124": U, "125": U, "126": D, "155": U,
        "156": D, "159": U, "160": U, "153": U, "154": M("bad_value:n"),
        **{str(r): U for r in (164, 165, 166, 167, 168)},
        **{str(r): U for r in (127, 128, 129, 130, 139, 134, 135, 138)},
        **{str(r): M("bad_value:b") for r in (131, 132, 133)},
        **{str(r): M("bad_value:d") for r in (136, 137, 161)},
        "157": M("null_key"),
        **{str(r): U for r in (146, 147, 148, 163)},
        **{f"FILE:{n}": M("unreadable_file") for n in (
            "bad.jsonl.zst", "bad.jsonl.deflate", "tail.jsonl.deflate", "cli.jsonl.lz4",
            "text.jsonl.snappy", "x.jsonl.xz", "upper.jsonl.GZ", "a.jsonl.zip",
            "dangling.jsonl", "loop-a.jsonl", "loop-b.jsonl")},
    }
    assert {k: v for k, v in h0.items() if not k.startswith("RAW:")} == expect0
    assert sorted(k for k in h0 if k.startswith("RAW:")) == ["RAW:null", "RAW:{}"]
    assert h1 == {"201": D, "202": D, "203": U, "204": D, "205": D}
    # one list: what the commit record names is what was read; in-progress names are not listed
    rec = commits.read_commit(Storage(ds.output), TAGS[0])
    assert rec is not None and rec.inputs is not None
    names = {f.path.rsplit("/", 1)[-1] for f in rec.inputs}
    assert not names & {"part-9.jsonl.tmp", "part-5.jsonl._COPYING_", "x.jsonl.inprogress",
                        "x.jsonl.partial", "Y.JSONL.TMP", "_a=b.jsonl", "z.jsonl.part"}
    assert {"dangling.jsonl", "loop-a.jsonl", "empty.jsonl.lz4"} <= names
    # the date of a timestamp with an offset is the date as written
    uniq = [r for f in (Path(ds.output) / "unique" / f"load_hour={TAGS[0]}").glob("*.parquet")
            for r in pq.read_table(f).to_pylist()]
    by_rid = {r["rid"]: r for r in uniq}
    assert by_rid[134]["d"] == dt.date(2026, 11, 1)
    assert [by_rid[r]["k"] for r in (122, 125, 159, 164, 165, 166, 168)] == [
        "0.1", "100.0", "-0.0", "1.0E-5", "1.2345678E7", "123456789012345678901234567890",
        "false"]
    assert [by_rid[r]["b"] for r in (127, 128, 129, 130, 139)] == [True, False, True, False, True]
    # the output root holds `[ ] { } ? *`, a space and unicode: the index under it is compacted,
    # rebuilt, and a rerun takes its hour out of the compacted index
    st = Storage(ds.output)
    assert list_compacted(st)
    rebuild_index(spark, ds)
    load_hours(spark, ds, [H1])
    assert engine_placement(ds, TAGS[1]) == h1
    rep = verify_dataset(spark, ds)
    assert rep.ok, rep.violations


@pytest.mark.slow
def test_double_keys_and_parquet_types(spark: SparkSession, tmp_path: Path) -> None:
    # keys: -0.0 is 0.0, every NaN is one key, in the load, across hours (the index) and verify
    dk = make(tmp_path, "dk", "jsonl", {"rid": "long", "x": "double"}, ["x"], "out")
    root = Path(dk.source.path)
    (hour_dir(root, 0) / "a.jsonl").write_bytes(lines(
        '{"rid":301,"x":0.0}', '{"rid":302,"x":-0.0}', '{"rid":303,"x":"NaN"}',
        '{"rid":304,"x":NaN}', '{"rid":308,"x":"-0"}', '{"rid":309,"x":1.5}'))
    (hour_dir(root, 1) / "b.jsonl").write_bytes(lines(
        '{"rid":305,"x":0.0}', '{"rid":306,"x":-0.0}', '{"rid":307,"x":"nan"}',
        '{"rid":310,"x":1.50}'))
    got = load_and_compare(spark, dk, [H0, H1], rows=False)  # NaN rows never compare equal
    # (a bare NaN token is not JSON: no number)
    assert got[TAGS[0]] == {"301": U, "302": D, "303": U, "304": M("bad_value:x"), "308": D,
                            "309": U}
    assert got[TAGS[1]] == {"305": D, "306": D, "307": D, "310": D}

    # Parquet: INT96 timestamps read; columns outside the schema ignored whatever their type;
    # a declared column of a type Spark cannot read makes the file unreadable
    pqs = make(tmp_path, "pq", "parquet", {"rid": "long", "k": "string", "ts": "timestamp"},
               ["k"], "out")
    d = hour_dir(Path(pqs.source.path), 0)
    when = dt.datetime(2026, 11, 1, 3, 4, 5, 123456)

    def write(name: str, cols: dict[str, pa.Array], **kw: Any) -> None:
        pq.write_table(pa.table(cols), d / name, **kw)

    def base(rid: int) -> dict[str, pa.Array]:
        return {"rid": pa.array([rid]), "k": pa.array([f"k{rid}"])}

    write("int96.parquet", {**base(401), "ts": pa.array([when], pa.timestamp("ns"))},
          use_deprecated_int96_timestamps=True)
    write("f16.parquet", {**base(402), "h": pa.array([np.float16(1.5)], pa.float16())})
    write("t32.parquet", {**base(403), "t": pa.array([dt.time(1, 2, 3)], pa.time32("s"))})
    write("t64.parquet", {**base(404), "t": pa.array([dt.time(1, 2, 3)], pa.time64("us"))})
    write("nested.parquet", {**base(405), "m": pa.array([[("a", 1)]], pa.map_(pa.string(),
                                                                                pa.int64())),
                             "l": pa.array([[1, 2]]), "dur": pa.array([5], pa.duration("s"))})
    write("ntz.parquet", {**base(406), "ts": pa.array([when], pa.timestamp("ms"))})
    write("decl16.parquet", {"rid": pa.array([np.float16(407)], pa.float16()),
                             "k": pa.array(["k407"])})
    write("only-extra.parquet", {"other": pa.array([1], pa.int8())})  # no declared column
    # an all-null column (pandas' None column) is nulls; a value of another kind is bad_value
    write("allnull.parquet", {**base(408), "ts": pa.array([None], pa.null())})
    write("struct.parquet", {**base(409), "ts": pa.array([{"a": 1}], pa.struct([("a", pa.int8())]))})
    write("float-key.parquet", {"rid": pa.array([410]), "k": pa.array([1.5])})
    (d / "part-1.parquet.tmp").write_bytes(b"not yet")
    got = load_and_compare(spark, pqs, [H0])
    assert got[TAGS[0]] == {"401": U, "402": U, "403": U, "404": U, "405": U, "406": U,
                            "408": U, "409": M("bad_value:ts"), "410": M("bad_value:k"),
                            "FILE:decl16.parquet": M("unreadable_file"),
                            "RAW:{}": M("null_key")}  # the row of only-extra.parquet
    rej = [r for f in (Path(pqs.output) / "rejected" / f"load_hour={TAGS[0]}").glob("*.parquet")
           for r in pq.read_table(f).to_pylist()]
    assert sorted(r["_source_file"].rsplit("/", 1)[-1] for r in rej) == [
        "decl16.parquet", "float-key.parquet", "only-extra.parquet", "struct.parquet"]
    why = {r["_source_file"].rsplit("/", 1)[-1]: r["_raw"] for r in rej}
    assert json.loads(why["struct.parquet"]) == {"rid": 409, "k": "k409", "ts": {"a": 1}}
    assert why["decl16.parquet"].startswith("Spark cannot read column 'rid': its Parquet type is "
                                            "halffloat (declared long)")


@pytest.mark.slow
def test_a_file_that_vanishes_is_one_unreadable_row(spark: SparkSession, tmp_path: Path) -> None:
    """Gone between listing and checking, or between checking and Spark's read: one row each."""
    ds = make(tmp_path, "gone", "jsonl", SCHEMA, ["k"], "out")
    d = hour_dir(Path(ds.source.path), 0)
    for i in range(3):
        (d / f"f{i}.jsonl").write_bytes(lines(obj(500 + i)))
    files = list_input_files(ds, parse_hour(H0))
    (d / "f0.jsonl").unlink()  # after listing
    plan = plan_batch(ds, files)
    assert [u.path.rsplit("/", 1)[-1] for u in plan.unreadable] == ["f0.jsonl"]
    assert "does not exist" in plan.unreadable[0].error
    (d / "f1.jsonl").unlink()  # after checking: Spark's read names it
    with pytest.raises(Exception) as e:
        read_text_batch(spark, ds, plan).count()
    bad = failed_file(e.value, plan)
    assert bad is not None and bad.path.endswith("/f1.jsonl")
    rows = read_text_batch(spark, ds, plan.without(bad)).collect()
    assert sorted((r["_source_file"].rsplit("/", 1)[-1], r["_read_reason"]) for r in rows) == [
        ("f0.jsonl", "unreadable_file"), ("f1.jsonl", "unreadable_file"), ("f2.jsonl", None)]


@pytest.mark.fast
def test_listed_names_are_names_spark_reads() -> None:
    names = ["part-5.jsonl._COPYING_", "a.tmp", "A.TMP", "x.inprogress", "_x=1.jsonl",
             "_metadata", "_common_metadata", ".crc", "part-1.jsonl", "a=b.jsonl",
             "x._COPYING_.gz", "x.temp", "x.partial", "ok.jsonl.gz", "tmp.jsonl", "_SUCCESS"]
    listed = [n for n in names if is_data_name(n)]
    assert listed == ["part-1.jsonl", "a=b.jsonl", "x._COPYING_.gz", "ok.jsonl.gz", "tmp.jsonl"]
    assert not any(spark_skips(n) for n in listed)


@pytest.mark.fast
def test_unreadable_files_name_their_reason(tmp_path: Path) -> None:
    """The driver-side check (no Spark): each unreadable file is set aside with its reason."""
    ds = make(tmp_path, "why", "jsonl", SCHEMA, ["k"], "out")
    d = hour_dir(Path(ds.source.path), 0)
    (d / "a.jsonl.lz4").write_bytes(b"\x04\x22\x4d\x18garbage")
    (d / "b.jsonl.GZ").write_bytes(gzip.compress(b"{}\n"))
    (d / "c.jsonl.deflate").write_bytes(zlib.compress(b"{}\n")[:-3])
    (d / "d.jsonl.zst").write_bytes(pa.compress(b"{}\n", "zstd", asbytes=True) + b"x")
    (d / "e.jsonl.deflate").write_bytes(zlib.compress(b"{}\n") + zlib.compress(b"{}\n"))
    (d / "f.jsonl.zst").write_bytes(pa.compress(b"{}\n", "zstd", asbytes=True) * 2)
    os.symlink(d / "nowhere", d / "g.jsonl")
    plan = plan_batch(ds, list_input_files(ds, parse_hour(H0)))
    why = {u.path.rsplit("/", 1)[-1]: u.error for u in plan.unreadable}
    assert sorted(why) == ["a.jsonl.lz4", "b.jsonl.GZ", "c.jsonl.deflate", "d.jsonl.zst",
                           "g.jsonl"]
    assert ".lz4 compression is not supported" in why["a.jsonl.lz4"]
    assert "rename it to *.gz" in why["b.jsonl.GZ"]
    assert "dangling symbolic link" in why["g.jsonl"]
    assert sorted(p.rsplit("/", 1)[-1] for p in plan.paths) == ["e.jsonl.deflate", "f.jsonl.zst"]
