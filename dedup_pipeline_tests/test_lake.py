"""The outputs as Delta tables (engine/lake.py): committed-only reads for every engine, atomic
rerun swaps that never pull files from under a reader, time travel, drift found by `verify` and
rolled forward by `--repair`, `rebuild-index` through the unique table, schema evolution.

Expected rows come from the rules: per hour, unique keeps the first copy of a key not seen in an
earlier hour (R3), duplicates the others (R4/R5), expired what fell behind the 24 h window (R6),
rejected what does not parse (R9).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import lake
from dedup_pipeline.engine.core import commits, hooks
from dedup_pipeline.engine.core.index.health import IndexDamagedError
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours, rebuild_index
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline_tests.conftest import (
    CLICKS_SCHEMA,
    dataset_raw,
    pipeline_config,
    source_raw,
    table_readers,
    write_hour,
)
from dedup_pipeline_tests.faults import injected

pytestmark = pytest.mark.slow

HOURS = ["2026-11-01-00:00", "2026-11-01-01:00", "2026-11-01-02:00"]
T0, T1, T2 = (h[:13] for h in HOURS)
OUTPUTS = ("unique", "duplicates", "expired", "rejected")


def _ev(rid: str, key: str, t: str, url: str = "/a", **extra: str) -> str:
    return json.dumps({"event_id": key, "user_id": "u1", "event_time": t, "url": url, "rid": rid,
                       **extra})


# (hour tag, rid) per output, from the rules
UNIQUE = Counter({(T0, "a"): 1, (T0, "b"): 1, (T1, "f"): 1})
DUPLICATES = Counter({(T0, "c"): 1, (T1, "e"): 1})
EXPIRED = Counter({(T0, "d"): 1})


def _config(root: Path, output: Path, extra_columns: dict[str, str] | None = None) -> DatasetConfig:
    schema = {**CLICKS_SCHEMA, "rid": "string", **(extra_columns or {})}
    raw = dataset_raw(start=HOURS[0], source=source_raw(str(root / "landing"), schema=schema),
                      fingerprint=["user_id", "url"], order_by="event_time",
                      expiry={"column": "event_time", "period": "24h"}, output=str(output))
    suffix = "_evolved" if extra_columns else ""
    return pipeline_config(root, raw, name=f"{output.name}{suffix}.yaml").datasets[0]


@pytest.fixture(scope="module")
def base(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Hours 0 and 1 loaded into Delta tables; each test works on a copy."""
    root = tmp_path_factory.mktemp("lake")
    ds = _config(root, root / "base")
    assert ds.output_format == "delta"  # the default
    write_hour(ds, HOURS[0], [
        _ev("a", "k1", "2026-11-01T00:10:00Z"),
        _ev("b", "k2", "2026-11-01T00:20:00Z"),
        _ev("c", "k2", "2026-11-01T00:25:00Z"),   # natural duplicate of b
        _ev("d", "k3", "2026-10-30T00:00:00Z"),   # expired
        "{broken",                                 # rejected
    ])
    write_hour(ds, HOURS[1], [
        _ev("e", "k1", "2026-11-01T01:00:00Z", url="/b"),  # conflict duplicate of a
        _ev("f", "k4", "2026-11-01T01:10:00Z"),
    ])
    write_hour(ds, HOURS[2], [
        _ev("g", "k4", "2026-11-01T02:00:00Z"),   # natural duplicate of f
        _ev("h", "k5", "2026-11-01T02:10:00Z", country="NL"),
    ])
    load_hours(spark, ds, HOURS[:2])
    return {"root": root, "ds": ds}


def _copy(base: dict[str, Any], name: str) -> DatasetConfig:
    out = base["root"] / name
    shutil.copytree(base["root"] / "base", out)
    return _config(base["root"], out)


def _rids(ds: DatasetConfig, output: str) -> dict[str, Counter]:
    return table_readers(ds, output, "rid")


def test_every_reader_sees_exactly_the_committed_hours(base: dict[str, Any]) -> None:
    """A stray Parquet file in a committed hour and a half-written hour (files, no record) are
    invisible to deltalake, DuckDB and Polars; a plain directory read sees them."""
    ds = _copy(base, "readers")
    out = Path(ds.output)
    # a stray file in a committed hour, and an hour written but never committed
    stray = pq.read_table(next((out / "unique" / f"load_hour={T0}").glob("*.parquet")))
    pq.write_table(stray, out / "unique" / f"load_hour={T1}" / "part-stray.parquet")
    (out / "unique" / f"load_hour={T2}").mkdir()
    pq.write_table(stray, out / "unique" / f"load_hour={T2}" / "part-00000-half.parquet")

    for name, want in (("unique", UNIQUE), ("duplicates", DUPLICATES), ("expired", EXPIRED)):
        seen = _rids(ds, name)
        for reader in ("deltalake", "duckdb", "polars"):
            assert seen[reader] == want, (name, reader)
    seen = _rids(ds, "unique")
    assert seen["directory"] == UNIQUE + Counter({(T1, "a"): 1, (T1, "b"): 1,
                                                  (T2, "a"): 1, (T2, "b"): 1})
    rejected = table_readers(ds, "rejected", "_raw")
    for reader in ("deltalake", "duckdb", "polars"):
        assert rejected[reader] == Counter({(T0, "{broken"): 1})
    # the log is one any Delta reader reads: reader 1 / writer 2, no table features
    proto = DeltaTable(str(out / "unique")).protocol()
    assert (proto.min_reader_version, proto.min_writer_version) == (1, 2)
    assert not proto.reader_features and not proto.writer_features


def test_rerun_swaps_in_one_commit_and_a_reader_of_the_old_version_reads_it_whole(
        spark: SparkSession, base: dict[str, Any]) -> None:
    ds = _copy(base, "rerun")
    st = Storage(ds.output)
    old = DeltaTable(str(Path(ds.output) / "unique"))
    v = old.version()
    old_files = lake.files_by_hour(old)[T1]
    held = old.to_pyarrow_dataset()  # a reader holding version v
    fragments = list(held.get_fragments())
    first = fragments[0].to_table(columns=["rid"]).column("rid").to_pylist()

    load_hours(spark, ds, [HOURS[1]])  # hour 1 again, while the reader is mid-way

    rest = [r for f in fragments[1:] for r in f.to_table(columns=["rid"]).column("rid").to_pylist()]
    assert Counter(first + rest) == Counter(rid for _, rid in UNIQUE.elements())
    now = DeltaTable(str(Path(ds.output) / "unique"))
    assert now.version() == v + 1  # removes and adds in one commit
    new_files = lake.files_by_hour(now)[T1]
    assert set(new_files).isdisjoint(old_files)
    assert _rids(ds, "unique")["deltalake"] == UNIQUE
    assert _rids(ds, "duplicates")["polars"] == DUPLICATES
    # the replaced files stay for readers of version v until a vacuum past the retention;
    # a plain directory read sees both versions of the hour meanwhile (docs/operations.md, "Reading
    # the tables")
    assert _rids(ds, "unique")["directory"] == UNIQUE + Counter({(T1, "f"): 1})
    assert all((Path(ds.output) / "unique" / p).exists() for p in old_files)
    assert all(u.deleted == 0 for u in lake.vacuum(st, retention_hours=1))
    with pytest.raises(ValueError, match="at least 1 h"):
        lake.vacuum(st, retention_hours=0)
    assert lake.drift(st, _records(st)) == []


def _records(st: Storage) -> dict[str, Any]:
    from dedup_pipeline.engine.core import commits

    return {t: commits.read_commit(st, t) for t in commits.committed_tags(st)}


def test_time_travel_to_an_earlier_hours_version(base: dict[str, Any]) -> None:
    ds = _copy(base, "travel")
    uri = str(Path(ds.output) / "unique")
    hist = DeltaTable(uri).history()
    (h0,) = [h for h in hist if h.get("dedup_pipeline.load_hour") == HOURS[0]]
    then = DeltaTable(uri, version=h0["version"])
    rows = then.to_pyarrow_table(columns=["load_hour", "rid"]).to_pylist()
    assert Counter((r["load_hour"], r["rid"]) for r in rows) == Counter({(T0, "a"): 1, (T0, "b"): 1})


def test_verify_reports_drift_repair_rolls_forward_and_rebuild_reads_through_the_table(
        spark: SparkSession, base: dict[str, Any]) -> None:
    ds = _copy(base, "drift")
    st = Storage(ds.output)
    assert verify_dataset(spark, ds).ok
    # drift: hour 0's files leave the unique table behind the product's back
    dt = DeltaTable(str(Path(ds.output) / "unique"))
    from deltalake.transaction import RemoveAction

    gone = sorted(lake.files_by_hour(dt)[T0].items())
    dt.create_write_transaction([RemoveAction(p, True, 0, s, {"load_hour": T0}) for p, s in gone],
                                "append", dt.schema(), partition_by=["load_hour"])
    rep = verify_dataset(spark, ds)
    assert not rep.ok
    assert any(v.startswith(f"{HOURS[0]}: the unique table holds 0 of the") for v in rep.violations)
    with pytest.raises(IndexDamagedError, match="verify --repair"):
        rebuild_index(spark, ds)
    assert lake.roll_forward(st, ds) == []  # the tokens are current: the load-time repair trusts them
    made = lake.roll_forward(st, ds, trust_tokens=False)  # verify --repair compares the files
    assert [(t, p.output) for t, p in made] == [(T0, "unique")]
    assert lake.roll_forward(st, ds) == []  # idempotent: tokens current
    assert verify_dataset(spark, ds).ok
    assert _rids(ds, "unique")["deltalake"] == UNIQUE
    before = sorted(p.name for p in (Path(ds.output) / "index").rglob("*.parquet"))
    res = rebuild_index(spark, ds)
    assert res.entries == sum(UNIQUE.values())
    assert before  # the index is there to compare with
    assert verify_dataset(spark, ds).ok


def test_an_added_column_is_a_schema_change_of_the_tables(
        spark: SparkSession, base: dict[str, Any]) -> None:
    ds = _copy(base, "evolve")
    evolved = _config(base["root"], Path(ds.output), {"country": "string"})
    (res,) = load_hours(spark, evolved, [HOURS[2]])
    assert res.contract_version == 2
    dt = DeltaTable(str(Path(ds.output) / "unique"))
    assert "country" in pa.schema(dt.schema().to_arrow()).names
    rows = dt.to_pyarrow_table(columns=["load_hour", "rid", "country"]).to_pylist()
    assert Counter((r["load_hour"], r["rid"], r["country"]) for r in rows) == Counter(
        {(T0, "a", None): 1, (T0, "b", None): 1, (T1, "f", None): 1, (T2, "h", "NL"): 1})
    assert lake.drift(Storage(ds.output), _records(Storage(ds.output))) == []


def test_parquet_format_keeps_plain_directories(spark: SparkSession, base: dict[str, Any],
                                                tmp_path: Path) -> None:
    raw = dataset_raw(start=HOURS[0], source=source_raw(str(base["root"] / "landing"),
                                                         schema={**CLICKS_SCHEMA, "rid": "string"}),
                      fingerprint=["user_id", "url"], order_by="event_time",
                      expiry={"column": "event_time", "period": "24h"},
                      output=str(tmp_path / "plain"), output_format="parquet")
    ds = pipeline_config(tmp_path, raw).datasets[0]
    load_hours(spark, ds, HOURS[:1])
    load_hours(spark, ds, HOURS[:1])  # a rerun replaces the partition directory
    assert not (tmp_path / "plain" / "unique" / "_delta_log").exists()
    got = pq.read_table(tmp_path / "plain" / "unique" / f"load_hour={T0}").column("rid").to_pylist()
    assert Counter(got) == Counter({"a": 1, "b": 1})


def test_the_upkeep_job_checkpoints_every_table_under_the_lock(base: dict[str, Any]) -> None:
    import dagster as dg

    from dedup_pipeline.orchestration.upkeep import build_upkeep

    ds = _copy(base, "upkeep")
    job, schedule = build_upkeep(ds)
    assert schedule.cron_schedule == "15 3 * * *"
    with dg.instance_for_test() as inst:
        res = job.execute_in_process(instance=inst, run_config={"ops": {
            "clicks_vacuum_tables": {"config": {"retention_hours": 1}}}})
    assert res.success
    for name in OUTPUTS:
        assert list((Path(ds.output) / name / "_delta_log").glob("*.checkpoint.parquet")), name
    assert not (Path(ds.output) / "_lock").exists()
    assert _rids(ds, "unique")["deltalake"] == UNIQUE


def test_vacuum_command_refuses_a_retention_below_one_hour_and_checkpoints(
        base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vacuum` and `verify --repair` write, so each is a run of the dataset's upkeep job in the
    instance the UI reads (design.md K7)."""
    import dagster as dg
    from click.testing import CliRunner

    from dedup_pipeline.cli import main

    ds = _copy(base, "vacuum_cli")
    cfg = str(base["root"] / "vacuum_cli.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    r = CliRunner().invoke(main, ["vacuum", "--config", cfg, "--retention-hours", "0"])
    assert r.exit_code == 2 and "0 is not in the range x>=1" in r.output
    r = CliRunner().invoke(main, ["vacuum", "--config", cfg])
    assert r.exit_code == 0, r.output
    for name in OUTPUTS:
        assert f"clicks: {name}: 0 replaced file(s) deleted, checkpoint at version" in r.output
    assert _rids(ds, "unique")["deltalake"] == UNIQUE
    r = CliRunner().invoke(main, ["verify", "--config", cfg, "--repair"])
    assert r.exit_code == 0 and "every table already agrees with the commit records" in r.output, \
        r.output
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as inst:
        runs = inst.get_runs()
    assert [(x.job_name, x.status, x.run_config["ops"]["clicks_vacuum_tables"]["config"])
            for x in reversed(runs)] == [
        ("clicks_table_upkeep", dg.DagsterRunStatus.SUCCESS, {"retention_hours": 24}),
        ("clicks_table_upkeep", dg.DagsterRunStatus.SUCCESS, {"repair": True})]


class _Crash(Exception):
    pass


def test_a_crashed_rerun_leaves_no_hole_and_no_reader_sees_replaced_files(
        spark: SparkSession, base: dict[str, Any]) -> None:
    """A rerun of hour 1 cut short after writing its files: every table still serves the hour's
    last committed rows, explain answers from them and says a rerun is under way, the next
    attempt swaps the hour in one commit (time travel: the old version, then the new one). Then
    rebuild-index, verify, explain, the checks' sample keys, index compaction, another rerun's
    written-files checks and migrate run with the replaced files still on disk, and none of them
    counts them."""
    from dedup_pipeline.engine.core.index.compaction import compact
    from dedup_pipeline.engine.explain import explain_key, sample_keys
    from dedup_pipeline.engine.migrate import migrate

    ds = _copy(base, "crashed_rerun")
    st = Storage(ds.output)
    versions = {n: DeltaTable(str(Path(ds.output) / n)).version() for n in OUTPUTS}

    class CrashAfterOutputs(hooks.Hooks):
        def at(self, point: str) -> None:
            if point == "after_outputs":
                raise _Crash(point)

    with injected(CrashAfterOutputs()), pytest.raises(_Crash):
        load_hours(spark, ds, [HOURS[1]])
    assert commits.read_commit(st, T1) is None  # the hour is not loaded...
    for name in OUTPUTS:  # ...and its tables still serve it, unchanged
        assert DeltaTable(str(Path(ds.output) / name)).version() == versions[name]
    assert _rids(ds, "unique")["deltalake"] == UNIQUE
    assert lake.drift(st, _records(st)) == []
    seen = explain_key(ds, {"event_id": "k4"})
    assert [(o.load_hour, o.output) for o in seen.occurrences] == [(T1, "unique")]
    assert any("a rerun of 2026-11-01-01:00 is in progress" in n for n in seen.notes)

    load_hours(spark, ds, [HOURS[1]])  # the next attempt
    for name in ("unique", "duplicates"):
        now = DeltaTable(str(Path(ds.output) / name)).version()
        assert now == versions[name] + 1  # one commit swapped the hour
        for v in (versions[name], now):  # time travel: the hour whole in both
            rows = DeltaTable(str(Path(ds.output) / name), version=v).to_pyarrow_table()
            got = Counter(zip(rows["load_hour"].to_pylist(), rows["rid"].to_pylist(),
                              strict=True))
            assert got == (UNIQUE if name == "unique" else DUPLICATES)
    assert lake.replaced_files(st, "unique")  # the old version's files are still on disk
    assert _rids(ds, "unique")["directory"] != UNIQUE  # a plain read would count them

    assert rebuild_index(spark, ds).entries == sum(UNIQUE.values())
    rep = verify_dataset(spark, ds)
    assert rep.ok, rep.violations
    seen = explain_key(ds, {"event_id": "k4"})
    assert [(o.load_hour, o.output) for o in seen.occurrences] == [(T1, "unique")]
    assert seen.index_agrees is True
    # the failing checks' sample keys read the files the hour's record lists
    assert sample_keys(ds, T1, conflicts_only=False) == [{"event_id": "k1"}]
    # the index compaction merges both loads' entries, and nothing else
    two = ds.model_copy(update={"index": ds.index.model_copy(update={"compact_after": 2})})
    assert compact(spark, two, st, set(commits.committed_tags(st))) >= 1
    assert verify_dataset(spark, ds).ok
    # another rerun with the replaced files beside it: its written-files checks count its own
    load_hours(spark, ds, [HOURS[1]])
    assert _rids(ds, "unique")["deltalake"] == UNIQUE
    assert _rids(ds, "duplicates")["deltalake"] == DUPLICATES
    raw = dataset_raw(start=HOURS[0], source=source_raw(str(base["root"] / "landing"), schema={
        **CLICKS_SCHEMA, "rid": "string"}), fingerprint=["user_id", "url"], order_by="event_time",
        expiry={"column": "event_time", "period": "24h"}, output=str(ds.output),
        index={"store_keys": True})
    keyed = pipeline_config(base["root"], raw, name="crashed_rerun_keys.yaml").datasets[0]
    res = migrate(spark, keyed)  # its duplicate check reads the tables' rows only
    assert res.to_version == 2 and res.entries == sum(UNIQUE.values())
    assert verify_dataset(spark, keyed).ok
