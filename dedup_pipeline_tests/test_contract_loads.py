"""The dataset contract end to end, on real local Spark and Dagster (docs/design.md, "The dataset
contract"): a breaking config change is refused by every path before anything is written; an
evolvable one is recorded and read back across hours by Spark and pyarrow; `migrate` re-keys the
history so that later loads are exact under the new key (the reference model agrees per record
id), and refuses a narrowed key whose history holds duplicates. Crashes of a migration are in
test_crash.py; the check's cost is in test_benchmarks.py."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from dedup_pipeline.cli import main
from dedup_pipeline.config import DatasetConfig, PipelineConfig
from dedup_pipeline.engine.contract import ContractError
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours, rebuild_index
from dedup_pipeline.engine.migrate import MigrationRefusedError, migrate
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.runner import run_range
from dedup_pipeline_tests.conftest import (
    CLICKS_SCHEMA,
    dataset_raw,
    output_table,
    pipeline_config,
    source_raw,
    write_hour,
)
from dedup_pipeline_tests.reference import Reference, _Entry

H = [f"2026-11-01-0{i}:00" for i in range(4)]
SCHEMA = {**CLICKS_SCHEMA, "rid": "string"}


def _raw(**fields: Any) -> dict[str, Any]:
    fields.setdefault("source", source_raw(schema=SCHEMA))
    return dataset_raw(start=H[0], fingerprint=["url"], **fields)


def _ev(rid: str, key: str, user: str = "u1", url: str = "/a", **extra: Any) -> dict[str, Any]:
    return {"rid": rid, "event_id": key, "user_id": user, "url": url,
            "event_time": f"2026-11-01T00:{len(rid):02d}:00Z", **extra}


def _tree(root: str) -> dict[str, tuple[int, int]]:
    """Every file below the output root with its size and mtime: what 'nothing written' means."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


def _record(ds: DatasetConfig, hour: str) -> commits.CommitRecord:
    rec = commits.read_commit(Storage(ds.output), hour[:13])
    assert rec is not None
    return rec


def _where(ds: DatasetConfig, hour: str) -> dict[str, Any]:
    """rid -> output (and kind, first hour for duplicates) of one loaded hour."""
    out: dict[str, Any] = {}
    for name in ("unique", "duplicates", "expired", "rejected"):
        t = output_table(ds, name, hour[:13])
        for r in t.to_pylist() if t is not None else []:
            out[r.get("rid")] = (name, r["_duplicate_kind"], r["_first_load_hour"][:13]) \
                if name == "duplicates" else name
    return out


def _history(tmp: Path) -> tuple[PipelineConfig, DatasetConfig]:
    cfg = pipeline_config(tmp, _raw())
    ds = cfg.datasets[0]
    write_hour(ds, H[0], [_ev("a", "k1"), _ev("b", "k2"), _ev("c", "k2", user="u2")])
    write_hour(ds, H[1], [_ev("d", "k1"), _ev("e", "k3")])
    return cfg, ds


def test_breaking_change_is_refused_before_anything_is_written_and_a_new_column_evolves(
        spark: SparkSession, tmp_path: Path) -> None:
    cfg, ds = _history(tmp_path)
    load_hours(spark, ds, H[:2])
    contract_dir = Path(ds.output) / "_contract"
    assert [p.name for p in contract_dir.iterdir()] == ["v0001.json"]
    v1 = json.loads((contract_dir / "v0001.json").read_text())
    assert v1["effective_from"] == H[0] and v1["terms"]["key"] == ["event_id"]
    assert [_record(ds, h).contract_version for h in H[:2]] == [1, 1]

    # a breaking change (the key): load, rebuild and verify refuse, and nothing is written
    rekeyed = pipeline_config(tmp_path, _raw(key=["event_id", "user_id"])).datasets[0]
    write_hour(ds, H[2], [_ev("f", "k1", country="de"), _ev("g", "k4", country="fr")])
    before = _tree(ds.output)
    line = ("contract error: dataset 'clicks': key changed from [event_id] to [event_id, user_id] "
            "since 2026-11-01-00:00 (contract v1); revert the change, or to re-key the history "
            f"run: dedup-pipeline migrate --config {tmp_path / 'dedup.yaml'} --dataset clicks")
    for refused in (lambda: load_hours(spark, rekeyed, [H[2]]),
                    lambda: rebuild_index(spark, rekeyed),
                    lambda: verify_dataset(spark, rekeyed)):
        with pytest.raises(ContractError) as e:
            refused()
        assert str(e.value) == line
    assert _tree(ds.output) == before
    # ...and a removed column the same way, naming it
    dropped = pipeline_config(tmp_path, _raw(source=source_raw(schema={
        k: v for k, v in SCHEMA.items() if k != "user_id"}))).datasets[0]
    with pytest.raises(ContractError, match="dataset 'clicks': source.schema changed from "
                       "user_id: string to absent \\(column 'user_id' removed or renamed\\)"):
        load_hours(spark, dropped, [H[2]])
    assert _tree(ds.output) == before

    # an evolvable change: a new column at the end; recorded as v2 from the hour it first loads
    evolved = pipeline_config(tmp_path, _raw(source=source_raw(
        schema={**SCHEMA, "country": "string"}))).datasets[0]
    said: list[str] = []
    load_hours(spark, evolved, [H[2]], said.append)
    v2 = json.loads((contract_dir / "v0002.json").read_text())
    assert v2["effective_from"] == H[2] and v2["changes"] == [
        "source.schema: absent -> country: string"]
    assert any("contract v2 recorded, effective from 2026-11-01-02:00" in m for m in said)
    assert [_record(ds, h).contract_version for h in H[:3]] == [1, 1, 2]
    assert _where(ds, H[2]) == {"f": ("duplicates", "natural", H[0][:13]), "g": "unique"}

    # readers see all hours together, the new column null in the older ones
    unique = Path(ds.output) / "unique"
    want = {"a": None, "b": None, "e": None, "g": "fr"}
    rows = spark.read.option("mergeSchema", "true").parquet(str(unique)).collect()
    assert {r["rid"]: r["country"] for r in rows} == want
    files = sorted(unique.rglob("*.parquet"))
    schema = pa.unify_schemas([pq.read_schema(f) for f in files])
    table = pads.dataset(str(unique), schema=schema.append(pa.field("load_hour", pa.string())),
                         format="parquet", partitioning="hive").to_table()
    assert dict(zip(table["rid"].to_pylist(), table["country"].to_pylist(), strict=True)) == want

    # a rerun of an hour loaded under v1 (with the later hours, R11a) uses the contract in force
    # now, and says so
    said.clear()
    load_hours(spark, evolved, H[1:3], said.append)
    assert any("rerun of an hour loaded under contract v1; it is reloaded under contract v2" in m
               for m in said)
    assert _record(ds, H[1]).contract_version == 2
    assert "country" in output_table(ds, "unique", H[1][:13]).schema.names

    rep = verify_dataset(spark, evolved)
    assert rep.ok, rep.violations
    assert rep.contracts == {"v1": [H[0][:13]], "v2": [H[1][:13], H[2][:13]]}


def test_migrate_rekeys_the_history_and_later_loads_agree_with_the_reference(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    cfg, ds = _history(tmp_path)
    load_hours(spark, ds, H[:2])
    rekeyed_cfg = pipeline_config(tmp_path, _raw(key=["event_id", "user_id"]))
    new = rekeyed_cfg.datasets[0]
    write_hour(ds, H[2], [_ev("f", "k1"), _ev("g", "k2", user="u2"), _ev("h", "k3", user="u2"),
                          _ev("i", "k3"), _ev("j", "k5")])

    runner = CliRunner()
    r = runner.invoke(main, ["run", "--config", str(tmp_path / "dedup.yaml"), "--from", H[2],
                             "--to", H[2]])
    assert r.exit_code == 1
    assert r.output.strip().splitlines()[-1].startswith(
        "error: contract error: dataset 'clicks': key changed from [event_id] to [event_id, "
        "user_id] since 2026-11-01-00:00")
    r = runner.invoke(main, ["migrate", "--config", str(tmp_path / "dedup.yaml")])
    assert r.exit_code == 0, r.output
    assert "done: 'clicks' is under contract v2" in r.output
    mig = json.loads((Path(ds.output) / "_contract" / "v0002.json").read_text())
    assert mig["migration"] == {"from_version": 1,
                                "changes": ["key changed from [event_id] to [event_id, user_id]"],
                                "latest_points": None}  # no expiry
    assert (Path(ds.output) / "_contract" / "v0002.done").exists()
    r = runner.invoke(main, ["migrate", "--config", str(tmp_path / "dedup.yaml")])
    assert r.exit_code == 0 and "nothing to migrate" in r.output  # idempotent

    (result,) = load_hours(spark, new, [H[2]])
    assert result.contract_version == 2

    # the reference: hours 00-01 under the old key, its index re-keyed from its unique rows, 02
    ref = Reference(ds)
    ref.load(ref_hour(H[0]))
    ref.load(ref_hour(H[1]))
    ref.ds = new
    ref.index = {}
    for tag, out, rec in ref.placed:
        if out == "unique":
            ref.index.setdefault(tuple(rec.values[k] for k in new.key), []).append(
                _Entry(tag, rec.v, ref._fp(rec)))
    ref.load(ref_hour(H[2]))
    expected = {}
    for tag, out, rec in ref.placed:
        if tag == H[2][:13]:
            expected[rec.values["rid"]] = out
    got = {rid: (o if isinstance(o, str) else o[0]) for rid, o in _where(ds, H[2]).items()}
    assert got == expected
    assert got == {"f": "duplicates", "g": "unique", "h": "unique", "i": "duplicates",
                   "j": "unique"}
    rep = verify_dataset(spark, new)
    assert rep.ok, rep.violations


def ref_hour(key: str) -> Any:
    from dedup_pipeline.hours import parse_hour

    return parse_hour(key)


def test_migrate_refuses_a_narrowed_key_whose_history_has_duplicates(
        spark: SparkSession, tmp_path: Path) -> None:
    ds = pipeline_config(tmp_path, _raw(key=["event_id", "user_id"])).datasets[0]
    write_hour(ds, H[0], [_ev("a", "k1"), _ev("b", "k1", user="u2"), _ev("c", "k2")])
    write_hour(ds, H[1], [_ev("d", "k2", user="u3")])
    load_hours(spark, ds, H[:2])
    narrowed = pipeline_config(tmp_path, _raw()).datasets[0]
    before = _tree(ds.output)
    with pytest.raises(MigrationRefusedError) as e:
        migrate(spark, narrowed)
    msg = str(e.value)
    assert msg.startswith("migrate refused: dataset 'clicks': 2 row(s) of unique are duplicates "
                          "of earlier unique rows under the new contract (key changed from "
                          "[event_id, user_id] to [event_id])")
    assert "event_id='k1' unique in 2026-11-01-00:00 and 2026-11-01-00:00" in msg
    assert "event_id='k2' unique in 2026-11-01-00:00 and 2026-11-01-01:00" in msg
    assert "nothing was written" in msg
    assert _tree(ds.output) == before


def test_dagster_fails_the_run_with_the_line_definitions_load_sensor_skips(
        spark: SparkSession, tmp_path: Path) -> None:
    cfg, ds = _history(tmp_path)
    load_hours(spark, ds, H[:2])
    write_hour(ds, H[2], [_ev("f", "k1")])
    (Path(ds.source.path) / "date=2026-11-01" / "hour=02" / "_SUCCESS").write_text("")
    bad = pipeline_config(tmp_path, _raw(key=["event_id", "user_id"]))
    defs = build_definitions(bad)  # the code location loads: no contract check at load time
    defs.resolve_job_def("clicks_index_rebuild")
    before = _tree(ds.output)
    with dg.instance_for_test() as inst:
        run = run_range(bad, "clicks", H[2], H[2], inst)
        assert not run.success
        assert "key changed from [event_id] to [event_id, user_id] since 2026-11-01-00:00" \
            in run.error
        sensor = defs.resolve_sensor_def("clicks_landing_sensor")
        with dg.build_sensor_context(instance=inst, definitions=defs) as ctx:
            res = sensor(ctx)
        # the first tick reports the two hours loaded outside this instance, as the daemon
        # stores them; the next tick skips with the contract error
        assert {e.partition for e in res.asset_events} == set(H[:2])
        for event in res.asset_events:
            inst.report_runless_asset_event(event)
        with dg.build_sensor_context(instance=inst, definitions=defs) as ctx:
            res = sensor(ctx)
        assert not res.run_requests
        assert res.skip_reason is not None
        assert res.skip_reason.skip_message.startswith(
            "not loading 2026-11-01-02:00: contract error: dataset 'clicks': key changed")
        hourly = defs.resolve_schedule_def("clicks_hourly_schedule")
        with dg.build_schedule_context(instance=inst, scheduled_execution_time=datetime(
                2026, 11, 1, 3, 20, tzinfo=UTC)) as ctx:
            tick = hourly.evaluate_tick(ctx)
        assert not tick.run_requests
        assert (tick.skip_message or "").startswith(
            "not loading 2026-11-01-02:00: contract error: dataset 'clicks': key changed")
    assert _tree(ds.output) == before


def test_files_of_another_format_are_refused_in_one_line_and_the_named_fix_works(
        spark: SparkSession, tmp_path: Path) -> None:
    """A contract or a commit record of another format is refused with one line naming the file,
    the format found, format 1 and the command; `migrate` replaces such a contract."""
    cfg, ds = _history(tmp_path)
    config = str(tmp_path / "dedup.yaml")
    load_hours(spark, ds, H[:1])
    v1 = Path(ds.output) / "_contract" / "v0001.json"
    assert json.loads(v1.read_text())["format"] == 1
    v1.write_text(json.dumps({**json.loads(v1.read_text()), "format": 2}))
    runner = CliRunner()
    r = runner.invoke(main, ["run", "--config", config, "--from", H[1], "--to", H[1]])
    assert r.exit_code == 1
    line = (f"contract error: {v1} is of format 2, expected format 1; migrate the dataset: "
            "dedup-pipeline migrate --config <file> --dataset <name>")
    assert r.output.splitlines() == [f"error: {line}"]  # one line
    r = runner.invoke(main, ["migrate", "--config", config])
    assert r.exit_code == 0, r.output
    pinned = json.loads(v1.read_text())
    assert pinned["format"] == 1 and pinned["migration"]["from_version"] is None
    (rec1,) = load_hours(spark, ds, [H[1]])
    assert rec1.contract_version == 1

    path = Path(ds.output) / "_commits" / f"load_hour={H[0][:13]}.json"
    doc = json.loads(path.read_text())
    assert doc["format"] == 1
    del doc["format"]
    path.write_text(json.dumps(doc))
    before = _tree(ds.output)
    with pytest.raises(Exception) as ei:
        load_hours(spark, ds, [H[2]])
    assert str(ei.value).endswith(
        f"{path} is of no format, expected format 1; the dataset was loaded by another version: "
        "move its output aside and load it again from its start (dedup-pipeline run --config "
        "<file> --dataset <name> --from <start> --to <latest hour>)")
    assert "\n" not in str(ei.value)
    assert _tree(ds.output) == before  # nothing written


def test_a_longer_period_is_recorded_and_verify_checks_each_hour_under_its_own(
        spark: SparkSession, tmp_path: Path) -> None:
    """Period 30m for hours 00-01, then 2h (slice span set, so the layout stays; nothing deleted
    by retention, so the index holds the longer window): k1 is unique again in 01 under 30m, a
    duplicate in 02 under 2h, and verify accepts hour 01 because it checks it under 30m (under
    2h it would be a violation)."""
    expiry = {"column": "event_time", "period": "30m"}
    ds = pipeline_config(tmp_path, _raw(expiry=expiry, index={"slice_span": "30m"})).datasets[0]

    def at(rid: str, key: str, hhmm: str) -> dict[str, Any]:
        return {**_ev(rid, key), "event_time": f"2026-11-01T{hhmm}:00Z"}

    write_hour(ds, H[0], [at("a", "k1", "00:10")])
    write_hour(ds, H[1], [at("c", "k1", "01:20")])  # a expired by then (X = 00:50): unique
    write_hour(ds, H[2], [at("d", "k1", "02:00"), at("e", "k9", "02:40")])
    load_hours(spark, ds, H[:2])
    assert _where(ds, H[1]) == {"c": "unique"}
    longer = pipeline_config(tmp_path, _raw(expiry={**expiry, "period": "2h"},
                                            index={"slice_span": "30m"})).datasets[0]
    said: list[str] = []
    load_hours(spark, longer, [H[2]], said.append)
    assert any("expiry.period: 30m -> 2h" in m for m in said)
    # L = 02:40, X = 00:40 under 2h: c (01:20) is live, d duplicates it
    assert _where(ds, H[2]) == {"d": ("duplicates", "natural", H[1][:13]), "e": "unique"}
    assert _record(ds, H[2]).contract_version == 2
    rep = verify_dataset(spark, longer)
    assert rep.ok, rep.violations
    assert rep.contracts == {"v1": [H[0][:13], H[1][:13]], "v2": [H[2][:13]]}
