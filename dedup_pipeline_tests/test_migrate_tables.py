"""`migrate` ends in exact, readable Delta tables, and a load never commits an hour it cannot
publish (docs/design.md, "Migrate", L1a). Every expected row comes from the reference model:
its `migrate` re-derives the expiry values, the running maximum and the index under the new terms.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from dedup_pipeline.cli import main
from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract, lake
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.migrate import migrate
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline.hours import parse_hour
from dedup_pipeline_tests.conftest import CLICKS_SCHEMA, dataset_raw, pipeline_config, source_raw, write_hour
from dedup_pipeline_tests.reference import Reference, java_double, micros

pytestmark = pytest.mark.slow

H = [f"2026-11-01-0{i}:00" for i in range(4)]
TAGS = [h[:13] for h in H]
OUTPUTS = ("unique", "duplicates", "expired", "rejected")


def _ev(rid: int, key: str, t: str = "2026-11-01T00:10:00Z", **extra: Any) -> dict[str, Any]:
    return {"rid": rid, "event_id": key, "user_id": "u1", "url": "/a", "event_time": t, **extra}


def _ds(tmp: Path, schema: dict[str, str], expiry: dict[str, Any]) -> DatasetConfig:
    raw = dataset_raw(start=H[0], source=source_raw(schema=schema), fingerprint=["url"],
                      expiry=expiry)
    return pipeline_config(tmp, raw).datasets[0]


def _tables(ds: DatasetConfig, column: str | None = None) -> Counter:
    """(output, hour, rid[, column]) of every row the four tables hold, read with deltalake."""
    got: Counter = Counter()
    for name in OUTPUTS:
        t = DeltaTable(str(Path(ds.output) / name)).to_pyarrow_table().to_pylist()
        for r in t:
            rid = r.get("rid") if name != "rejected" else r["_raw"]
            got[(name, r["load_hour"], rid) + ((r.get(column),) if column else ())] += 1
    return got


def _expected(ref: Reference, column: str | None = None) -> Counter:
    want: Counter = Counter()
    for tag, out, rec in ref.placed:
        rid = rec.values.get("rid") if out != "rejected" else rec.raw
        want[(out, tag, rid) + ((rec.values.get(column) if out != "rejected" else None,)
                                if column else ())] += 1
    return want


def _type(dt: DeltaTable, column: str) -> str:
    return str(pa.schema(dt.schema().to_arrow()).field(column).type)


def _record(ds: DatasetConfig, tag: str) -> commits.CommitRecord:
    rec = commits.read_commit(Storage(ds.output), tag)
    assert rec is not None
    return rec


def test_migrating_the_expiry_column_to_another_type_rederives_l_and_the_expired_table(
        spark: SparkSession, tmp_path: Path) -> None:
    schema = {**CLICKS_SCHEMA, "rid": "long"}
    old = _ds(tmp_path, schema, {"column": "event_time", "period": "24h"})
    write_hour(old, H[0], [_ev(1, "k1"), _ev(2, "k2"), _ev(3, "k2"),
                           _ev(50, "k3", "2026-10-30T00:00:00Z")])
    write_hour(old, H[1], [_ev(5, "k1"), _ev(60, "k4")])
    write_hour(old, H[2], [_ev(55, "k1"), _ev(58, "k4"), _ev(40, "k5")])
    write_hour(old, H[3], [_ev(70, "k4"), _ev(65, "k2"), _ev(59, "k6"), "{broken"])
    load_hours(spark, old, H[:2])
    ref = Reference(old)
    for h in H[:2]:
        ref.load(parse_hour(h))

    new = _ds(tmp_path, schema, {"column": "rid", "period": 10})
    res = migrate(spark, new)
    assert res.to_version == 2
    mig = contract.read_history(Storage(new.output), TAGS[1]).version(2)
    assert mig is not None and mig.migration is not None
    assert mig.migration.latest_points == {TAGS[0]: 50, TAGS[1]: 60}
    ref.migrate(new)
    load_hours(spark, new, H[2:])
    for h in H[2:]:
        ref.load(parse_hour(h))

    assert _tables(new) == _expected(ref)
    for tag in TAGS[2:]:
        rec = _record(new, tag)
        assert (rec.latest_point, rec.expiry_point) == (ref.results[tag].latest,
                                                        ref.results[tag].expiry_point)
    # the expired table's `_expiry_point` is the new column's type; older hours keep their number
    dt = DeltaTable(str(Path(new.output) / "expired"))
    assert _type(dt, "_expiry_point") == "int64"
    points = {(r["load_hour"], r["rid"]): r["_expiry_point"]
              for r in dt.to_pyarrow_table().to_pylist()}
    assert points == {(tag, rec.values["rid"]): ref.results[tag].expiry_point
                      for tag, out, rec in ref.placed if out == "expired"}
    # time travel: the version before the migration reads the old schema whole
    assert lake.drift(Storage(new.output), {t: _record(new, t) for t in TAGS}) == []
    rep = verify_dataset(spark, new)
    assert rep.ok, rep.violations


def test_a_retyped_column_is_migrated_by_one_overwrite_and_every_hour_stays_readable(
        spark: SparkSession, tmp_path: Path) -> None:
    schema = {**CLICKS_SCHEMA, "rid": "long", "amount": "double"}
    exp = {"column": "event_time", "period": "24h"}
    old = _ds(tmp_path, schema, exp)
    write_hour(old, H[0], [_ev(1, "k1", amount=12.5), _ev(2, "k2", amount=100.0),
                           _ev(3, "k2", amount=0.1)])
    write_hour(old, H[1], [_ev(4, "k1", amount=1e20), _ev(5, "k3", amount=None)])
    write_hour(old, H[2], [_ev(6, "k1", amount="x"), _ev(7, "k4", amount=2.5)])
    write_hour(old, H[3], [_ev(8, "k4", amount="2.50"), _ev(9, "k5", amount=7)])
    load_hours(spark, old, H[:2])
    ref = Reference(old)
    for h in H[:2]:
        ref.load(parse_hour(h))
    before = DeltaTable(str(Path(old.output) / "unique")).version()

    new = _ds(tmp_path, {**schema, "amount": "string"}, exp)
    r = CliRunner().invoke(main, ["migrate", "--config", str(tmp_path / "dedup.yaml")])
    assert r.exit_code == 0, r.output
    ref.migrate(new, {"amount": java_double})
    for name in ("unique", "duplicates"):  # one overwrite commit, the old version intact
        dt = DeltaTable(str(Path(new.output) / name))
        assert _type(dt, "amount") == "string"
        old_rows = DeltaTable(str(Path(new.output) / name), version=before).to_pyarrow_table()
        assert all(isinstance(a, float) or a is None for a in old_rows["amount"].to_pylist())
    assert DeltaTable(str(Path(new.output) / "unique")).version() == before + 1

    load_hours(spark, new, H[2:])
    for h in H[2:]:
        ref.load(parse_hour(h))
    assert _tables(new, "amount") == _expected(ref, "amount")
    rep = verify_dataset(spark, new)
    assert rep.ok, rep.violations
    r = CliRunner().invoke(main, ["verify", "--config", str(tmp_path / "dedup.yaml")])
    assert r.exit_code == 0, r.output


def test_a_load_whose_files_its_tables_cannot_take_commits_nothing(
        spark: SparkSession, tmp_path: Path) -> None:
    """A dataset migrated before outputs were rewritten (its contract says string, its tables
    double): the load is refused before its record, the tables keep every committed hour, and
    `migrate` then rewrites the outputs so that the load commits."""
    schema = {**CLICKS_SCHEMA, "rid": "long", "amount": "double"}
    exp = {"column": "event_time", "period": "24h"}
    old = _ds(tmp_path, schema, exp)
    write_hour(old, H[0], [_ev(1, "k1", amount=12.5), _ev(2, "k2", amount=3.0)])
    write_hour(old, H[1], [_ev(3, "k1", amount=4.0), _ev(4, "k3", amount=1.5)])
    load_hours(spark, old, H[:1])
    out = Path(old.output)
    # what a migration that rewrote only the index left: a v2 contract, marked done
    new = _ds(tmp_path, {**schema, "amount": "string"}, exp)
    v1 = json.loads((out / "_contract" / "v0001.json").read_text())
    v2 = {**v1, "version": 2, "effective_from": H[1],
          "migration": {"from_version": 1, "changes": ["amount retyped"]},
          "terms": contract.Terms.of(new).model_dump(mode="json", by_alias=True)}
    (out / "_contract" / "v0002.json").write_text(json.dumps(v2))
    (out / "_contract" / "v0002.done").write_text("{}")
    shutil.copytree(out, tmp_path / "snapshot")
    with pytest.raises(lake.PublishRefusedError, match="not committed: the unique table's column "
                       "'amount' is double in the table and string in the contract"):
        load_hours(spark, new, H[1:2])
    assert commits.read_commit(Storage(new.output), TAGS[1]) is None
    assert not list((out / "_publish").glob("*")) if (out / "_publish").exists() else True
    seen = {r["rid"] for r in DeltaTable(str(out / "unique")).to_pyarrow_table().to_pylist()}
    assert seen == {1, 2}
    res = migrate(spark, new)
    assert res.rewritten >= 1 and "written again" in res.summary()
    load_hours(spark, new, H[1:2])
    rows = {r["rid"]: r["amount"] for r in
            DeltaTable(str(out / "unique")).to_pyarrow_table().to_pylist()}
    assert rows == {1: "12.5", 2: "3.0", 4: "1.5"}
    rep = verify_dataset(spark, new)
    assert rep.ok, rep.violations


# --- every edit migrate accepts -------------------------------------------------------------------

BASE_SCHEMA = {"event_id": "string", "user_id": "string", "event_time": "timestamp",
               "url": "string", "rid": "long", "seen": "timestamp"}
BASE: dict[str, Any] = {"key": ["event_id"], "fingerprint": ["url"],
                        "expiry": {"column": "event_time", "period": "24h"}}
# edit -> (the old config's fields, the new config's fields, renames old -> new)
EDITS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, str]]] = {
    "key widened": ({}, {"key": ["event_id", "user_id"]}, {}),
    "key narrowed": ({"key": ["event_id", "user_id"]}, {}, {}),
    "column renamed": ({}, {"schema": {**{("user" if c == "user_id" else c): t
                                          for c, t in BASE_SCHEMA.items()}}}, {"user_id": "user"}),
    "columns reordered": ({}, {"schema": {"rid": "long", **{c: t for c, t in BASE_SCHEMA.items()
                                                            if c != "rid"}}}, {}),
    "column added in the middle": ({}, {"schema": {"event_id": "string", "region": "string",
                                                   **{c: t for c, t in BASE_SCHEMA.items()
                                                      if c != "event_id"}}}, {}),
    "fingerprint": ({}, {"fingerprint": ["url", "user_id"]}, {}),
    "order_by": ({}, {"order_by": "seen"}, {}),
    "expiry column of the same type": ({}, {"expiry": {"column": "seen", "period": "24h"}}, {}),
    "expiry basis": ({}, {"expiry": {"column": "event_time", "period": "24h",
                                     "basis": "processing"}}, {}),
    "index.store_keys": ({}, {"index": {"store_keys": True}}, {}),
}


def _edit_ds(tmp: Path, fields: dict[str, Any]) -> DatasetConfig:
    f = {**BASE, **fields}
    schema = f.pop("schema", BASE_SCHEMA)
    return pipeline_config(tmp, dataset_raw(start=H[0], source=source_raw(schema=schema),
                                            **f)).datasets[0]


def _row(rid: int, key: str, user: str, url: str, t: str, seen: str,
         user_col: str = "user_id") -> dict[str, Any]:
    return {"rid": rid, "event_id": key, user_col: user, "url": url,
            "event_time": f"2026-11-01T{t}Z" if "-" not in t else t,
            "seen": f"2026-11-01T{seen}Z" if "-" not in seen else seen, "region": "eu"}


def _landing(user_col: str) -> list[list[Any]]:
    """Three hours: the first loaded under the old contract, the next two under the new one.
    Each output and each decision the edits change has rows (in-batch and cross-batch
    duplicates, a conflict, an order the `seen` column reverses, expired rows, a key shared by
    two users, a malformed line)."""
    def r(*a: Any) -> dict[str, Any]:
        return _row(*a, user_col="user_id")

    def n(*a: Any) -> dict[str, Any]:
        return _row(*a, user_col=user_col)
    return [
        [r(1, "k1", "u1", "/a", "00:10:00", "00:20:00"), r(2, "k2", "u1", "/a", "00:20:00",
         "00:05:00"), r(3, "k2", "u1", "/b", "00:30:00", "00:01:00"),
         r(4, "k3", "u1", "/a", "2026-10-30T00:00:00Z", "00:00:00"), "{broken"],
        [n(5, "k1", "u2", "/a", "01:10:00", "01:10:00"), n(6, "k4", "u1", "/c", "01:20:00",
         "01:50:00"), n(7, "k4", "u1", "/d", "01:30:00", "01:00:00"),
         n(8, "k2", "u1", "/a", "01:40:00", "2026-10-30T00:00:00Z"),
         n(9, "k5", "u1", "/a", "2026-10-31T00:30:00Z", "01:00:00")],
        [n(10, "k3", "u1", "/a", "02:10:00", "02:10:00"), n(11, "k1", "u1", "/e", "02:20:00",
         "02:20:00"), n(12, "k6", "u3", "/a", "2026-10-29T00:00:00Z", "02:00:00"),
         n(13, "k6", "u3", "/a", "02:30:00", "2026-10-29T00:00:00Z"), "[1,2]"],
    ]


def _value(v: Any) -> Any:
    return micros(v) if isinstance(v, datetime) else v


def _whole_tables(ds: DatasetConfig) -> Counter:
    """Every row of the four tables read with deltalake: its output, hour and values in the
    schema's columns (duplicates: and its kind and first hour; rejected: its line)."""
    got: Counter = Counter()
    for name in OUTPUTS:
        for r in DeltaTable(str(Path(ds.output) / name)).to_pyarrow_table().to_pylist():
            if name == "rejected":
                got[(name, r["load_hour"], r["_raw"])] += 1
                continue
            vals = tuple(_value(r[c]) for c in ds.source.schema)
            extra = (r["_duplicate_kind"], r["_first_load_hour"]) if name == "duplicates" else ()
            got[(name, r["load_hour"], vals) + extra] += 1
    return got


def _whole_expected(ref: Reference) -> Counter:
    want: Counter = Counter()
    for tag, out, rec in ref.placed:
        if out == "rejected":
            want[(out, tag, rec.raw)] += 1
            continue
        vals = tuple(rec.values.get(c) for c in ref.ds.source.schema)
        extra = ref.duplicate_of[id(rec)] if out == "duplicates" else ()
        want[(out, tag, vals) + tuple(extra)] += 1
    return want


@pytest.mark.parametrize("edit", list(EDITS))
def test_every_edit_migrate_accepts_ends_in_exact_tables(
        spark: SparkSession, tmp_path: Path, edit: str) -> None:
    old_fields, new_fields, renames = EDITS[edit]
    old = _edit_ds(tmp_path, old_fields)
    landing = _landing(next(iter(renames.values()), "user_id"))
    for h, rows in zip(H, landing, strict=False):
        write_hour(old, h, rows)
    load_hours(spark, old, H[:1])
    ref = Reference(old)
    ref.load(parse_hour(H[0]))

    new = _edit_ds(tmp_path, new_fields)
    r = CliRunner().invoke(main, ["migrate", "--config", str(tmp_path / "dedup.yaml")])
    assert r.exit_code == 0, r.output
    ref.migrate(new, renames=renames)
    load_hours(spark, new, H[1:3])
    for h in H[1:3]:
        ref.load(parse_hour(h))

    assert _whole_tables(new) == _whole_expected(ref)
    for tag in TAGS[1:3]:
        rec = _record(new, tag)
        assert (rec.latest_point, rec.expiry_point) == (ref.results[tag].latest,
                                                        ref.results[tag].expiry_point)
    r = CliRunner().invoke(main, ["verify", "--config", str(tmp_path / "dedup.yaml")])
    assert r.exit_code == 0, r.output
