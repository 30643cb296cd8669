"""Idempotent, crash-safe loads (design.md R10, L3): kill the process at each fault point, rerun, compare.

The test's fault (`DEDUP_FAULT=<point>`, installed through the engine's hooks by faults.py) makes
the process `os._exit(137)` at a named point of a load. A subprocess loads the last hour with the
fault set; it must die, leave that hour without a commit record, and a rerun (here, in the test's
Spark session) must leave every output of every hour and the index exactly as a clean run of the
same landing data into another output directory left them.

To keep Spark start-ups down, the state before the crashing load (hours 0-1 committed, or hours
0-2 committed for a crash during a rerun) is a copy of the clean run's directory at that point,
and the dying process is a Spark Connect client of one warm server for the module (a run process
of the recommended topology); at LOCAL_POINT it is a driver of its own (local[1]), whose JVM dies
with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import lake
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline_tests.conftest import (
    CLICKS_SCHEMA,
    dataset_raw,
    output_table,
    pipeline_config,
    source_raw,
    table_readers,
    write_hour,
)
from dedup_pipeline_tests.spark_services import start_connect_server

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = ("unique", "duplicates", "expired", "rejected")
HOURS = ["2026-11-01-00:00", "2026-11-01-01:00", "2026-11-01-02:00"]
TAGS = [h[:13] for h in HOURS]
LAST = HOURS[-1]
NEXT = "2026-11-01-03:00"  # loaded only by the tests of a crash while publishing: "the next run"

SCRIPT = textwrap.dedent("""
    import os
    import sys
    from dedup_pipeline.config import load_config
    from dedup_pipeline.engine.load import load_hours
    from dedup_pipeline_tests.faults import install_from_env
    from dedup_pipeline.engine.session import SparkSettings, get_session

    ds = load_config(sys.argv[1]).datasets[0]
    spark = get_session(SparkSettings(master="local[1]", conf={
        "spark.sql.shuffle.partitions": "2", **({} if os.environ.get("SPARK_REMOTE") else {
            "spark.ui.enabled": "false",
            # a short-lived driver: C1-only JIT and the serial GC start ~30% faster
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"})}))
    if not os.environ.get("SPARK_REMOTE"):
        spark.sparkContext.setLogLevel("ERROR")
    install_from_env()
    load_hours(spark, ds, sys.argv[2].split(","))
    print("LOADED", flush=True)
""")


def _ev(rid: str, key: str, t: str, user: str = "u1", url: str = "/a") -> str:
    return json.dumps({"event_id": key, "user_id": user, "event_time": t, "url": url, "rid": rid})


def _write_config(root: Path, landing: Path, output: Path) -> DatasetConfig:
    raw = dataset_raw(start=HOURS[0],
                      source=source_raw(str(landing), schema={**CLICKS_SCHEMA, "rid": "string"}),
                      fingerprint=["user_id", "url"], order_by="event_time",
                      expiry={"column": "event_time", "period": "24h"}, output=str(output))
    return pipeline_config(root, raw, name=f"{output.name}.yaml").datasets[0]


def _config_path(ds: DatasetConfig, root: Path) -> Path:
    return root / f"{Path(ds.output).name}.yaml"


def _rows(table: pa.Table) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def snapshot(ds: DatasetConfig) -> dict[str, Any]:
    """Everything observable: rows of each output per hour, index entries, committed hours."""
    out: dict[str, Any] = {}
    root = Path(ds.output)
    for name in OUTPUTS:
        for tag in TAGS:
            t = output_table(ds, name, tag)
            out[f"{name}/{tag}"] = _rows(t) if t is not None else None
    # the index as any reader sees it: hidden and _-prefixed paths (staging) are not part of it
    idx = pads.dataset(root / "index", format="parquet", partitioning="hive").to_table()
    out["index"] = _rows(idx)
    idx = idx.to_pylist()
    out["index_keys"] = {(r["_h1"], r["_h2"], r["_load_hour"]) for r in idx}
    out["commits"] = sorted(p.name for p in (root / "_commits").glob("*.json"))
    return out


@pytest.fixture(scope="module")
def crash_env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("crash")
    server = start_connect_server(root / "spark", master="local[1]")  # starts while we load
    try:
        landing = root / "landing"
        clean = _write_config(root, landing, root / "clean")
        write_hour(clean, HOURS[0], [
            _ev("a", "k1", "2026-11-01T00:10:00Z"),
            _ev("b", "k2", "2026-11-01T00:20:00Z"),
            _ev("c", "k2", "2026-11-01T00:25:00Z"),
            _ev("d", "k3", "2026-10-30T00:00:00Z"),          # expired
            "{broken",
        ])
        write_hour(clean, HOURS[1], [
            _ev("e", "k1", "2026-11-01T01:00:00Z", url="/b"),  # conflict with hour 0
            _ev("f", "k4", "2026-11-01T01:10:00Z"),
        ])
        write_hour(clean, HOURS[2], [
            _ev("g", "k2", "2026-11-01T02:00:00Z"),          # natural duplicate of hour 0
            _ev("h", "k5", "2026-11-01T02:10:00Z"),
            _ev("i", "k5", "2026-11-01T02:15:00Z", user="u2"),
            _ev("j", "k6", "2026-10-31T00:00:00Z"),          # expired
            _ev("k", "k7", "2026-11-01T02:20:00Z"),
        ], name="part-0.jsonl")
        write_hour(clean, HOURS[2], [
            _ev("l", "k4", "2026-11-01T02:30:00Z"),
            _ev("m", "k8", "2026-11-01T02:40:00Z"),
            '{"event_id": null, "rid": "n"}',
        ], name="part-1.jsonl")
        write_hour(clean, NEXT, [_ev("o", "k9", "2026-11-01T03:00:00Z")])
        load_hours(spark, clean, HOURS[:2])
        shutil.copytree(clean.output, root / "base01")
        load_hours(spark, clean, [LAST])
        shutil.copytree(clean.output, root / "base012")
        snap = snapshot(clean)
        assert snap["commits"] == [f"load_hour={t}.json" for t in TAGS]
        assert all(snap[f"{o}/{t}"] is not None for o in OUTPUTS for t in TAGS)
        assert len(snap["index_keys"]) == sum(sum(snap[f"unique/{t}"].values()) for t in TAGS)
        script = root / "load.py"
        script.write_text(SCRIPT)
        server.wait_ready()
        yield {"root": root, "landing": landing, "clean": snap, "script": script,
               "remote": server.url}
    finally:
        server.stop()


def _child_env(crash_env: dict[str, Any], point: str, local: bool = False) -> dict[str, str]:
    """The dying process's environment: the fault, and the warm server unless `local`."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_MASTER_URL")}
    env.update(DEDUP_FAULT=point, PYSPARK_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if not local:
        env["SPARK_REMOTE"] = crash_env["remote"]
    return env


def _prepare(env: dict[str, Any], name: str, base: str) -> DatasetConfig:
    out = env["root"] / name
    shutil.copytree(env["root"] / base, out)
    return _write_config(env["root"], env["landing"], out)


POINTS = [
    ("after_output:unique", "base01"),
    ("after_output:duplicates", "base01"),
    ("after_outputs", "base01"),
    ("after_index_staged", "base012"),  # the crash hits a rerun of an already committed hour
    ("before_commit", "base01"),
]
LOCAL_POINT = "after_output:unique"  # the process dies with its own driver JVM


def _killed_at(crash_env: dict[str, Any], ds: DatasetConfig, point: str
               ) -> subprocess.CompletedProcess[str]:
    """Load the last hour of `ds` in a process that SIGKILLs itself at fault `point`."""
    env = _child_env(crash_env, point, local=point == LOCAL_POINT)
    proc = subprocess.run(
        [sys.executable, str(crash_env["script"]), str(_config_path(ds, crash_env["root"])), LAST],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 137, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.parametrize(("point", "base"), POINTS, ids=[p for p, _ in POINTS])
def test_crash_then_rerun_equals_clean_run(spark: SparkSession, crash_env: dict[str, Any],
                                           point: str, base: str) -> None:
    ds = _prepare(crash_env, f"crash_{point.replace(':', '_')}", base)
    proc = _killed_at(crash_env, ds, point)
    assert "LOADED" not in proc.stdout
    commits = Path(ds.output) / "_commits"
    assert not (commits / f"load_hour={TAGS[-1]}.json").exists()
    assert (commits / f"load_hour={TAGS[-2]}.json").exists()
    if point == "after_output:unique":  # the crash really was mid-way through the outputs
        assert (Path(ds.output) / "unique" / f"load_hour={TAGS[-1]}").exists()
        assert not (Path(ds.output) / "duplicates" / f"load_hour={TAGS[-1]}").exists()
    # what the dead run wrote is on disk but in no table: a half-written hour is invisible to
    # the tables' readers, a crashed rerun leaves the hour's previous version in place
    uniq = table_readers(ds, "unique", "rid")
    shown = TAGS if base == "base012" else TAGS[:-1]
    want = Counter((t, json.loads(r)["rid"]) for t in shown
                   for r in crash_env["clean"][f"unique/{t}"].elements())
    for reader in ("deltalake", "duckdb", "polars"):
        assert uniq[reader] == want, reader
    if point in ("after_outputs", "after_index_staged"):
        assert uniq["directory"] - want  # a plain directory read sees the dead run's rows

    (result,) = load_hours(spark, ds, [LAST])  # the rerun (takes over the dead run's lock)
    assert result.rows_in == 8
    assert snapshot(ds) == crash_env["clean"]


PUBLISH_POINTS = ["before_publish", *[f"after_publish:{o}" for o in OUTPUTS]]


@pytest.mark.parametrize("point", PUBLISH_POINTS)
def test_crash_while_publishing_is_rolled_forward_by_the_next_load(
        spark: SparkSession, crash_env: dict[str, Any], point: str) -> None:
    """Killed after the commit record, with 0-4 of the 4 tables published: the hour is committed
    (the record is the truth); the next load rolls every table forward to the records."""
    ds = _prepare(crash_env, f"publish_{point.replace(':', '_')}", "base01")
    _killed_at(crash_env, ds, point)
    st = Storage(ds.output)
    assert (Path(ds.output) / "_commits" / f"load_hour={TAGS[-1]}.json").exists()
    done = 0 if point == "before_publish" else OUTPUTS.index(point.split(":")[1]) + 1
    for i, name in enumerate(OUTPUTS):  # the crash really left the tables split
        dt = lake.open_table(st, name)
        assert dt is not None
        assert (TAGS[-1] in lake.files_by_hour(dt)) == (i < done), name
    assert lake.pending(st) == [TAGS[-1]]

    load_hours(spark, ds, [NEXT])  # the next run

    snap = snapshot(ds)
    for name in OUTPUTS:
        for tag in TAGS:
            assert snap[f"{name}/{tag}"] == crash_env["clean"][f"{name}/{tag}"], (name, tag)
    records = {t: commits.read_commit(st, t) for t in commits.committed_tags(st)}
    assert lake.drift(st, records) == []
    assert lake.pending(st) == []


def test_rerun_after_success_is_identical(spark: SparkSession, crash_env: dict[str, Any]) -> None:
    ds = _prepare(crash_env, "rerun", "base012")
    load_hours(spark, ds, HOURS[1:])  # hours 1 and 2 again, in order
    load_hours(spark, ds, [LAST])     # and the last one once more
    assert snapshot(ds) == crash_env["clean"]


# --- a migration to a new contract (engine/migrate.py): one committed step ---------------------

MIGRATE_SCRIPT = textwrap.dedent("""
    import os
    import sys
    from dedup_pipeline.config import load_config
    from dedup_pipeline.engine.migrate import migrate
    from dedup_pipeline_tests.faults import install_from_env
    from dedup_pipeline.engine.session import SparkSettings, get_session

    ds = load_config(sys.argv[1]).datasets[0]
    spark = get_session(SparkSettings(master="local[1]", conf={"spark.sql.shuffle.partitions": "2"}))
    install_from_env()
    migrate(spark, ds)
    print("MIGRATED", flush=True)
""")


def _rekeyed(env: dict[str, Any], name: str) -> tuple[DatasetConfig, DatasetConfig]:
    """A copy of the three committed hours, with its config and the re-keyed config."""
    old = _prepare(env, name, "base012")
    raw = dataset_raw(start=HOURS[0], key=["event_id", "user_id"],
                      source=source_raw(str(env["landing"]), schema={**CLICKS_SCHEMA, "rid": "string"}),
                      fingerprint=["user_id", "url"], order_by="event_time",
                      expiry={"column": "event_time", "period": "24h"}, output=old.output)
    new = pipeline_config(env["root"], raw, name=f"{name}_rekeyed.yaml").datasets[0]
    return old, new


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and p.name != "_lock":
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def migrated_clean(spark: SparkSession, crash_env: dict[str, Any]) -> dict[str, Any]:
    """What a migration that never crashed leaves (the index under the new key)."""
    from dedup_pipeline.engine.migrate import migrate

    _old, new = _rekeyed(crash_env, "migrated_clean")
    res = migrate(spark, new)
    assert res.to_version == 2 and res.loads == 3
    return snapshot(new)


@pytest.mark.parametrize("point", ["migrate_before_contract", "migrate_after_contract",
                                   "migrate_before_done"])
def test_migration_killed_at_any_point_is_fully_old_or_finishes_to_fully_new(
        spark: SparkSession, crash_env: dict[str, Any], migrated_clean: dict[str, Any],
        point: str) -> None:
    from dedup_pipeline.engine.contract import ContractError
    from dedup_pipeline.engine.migrate import migrate

    old, new = _rekeyed(crash_env, f"mig_{point}")
    before = _files(old.output)
    script = crash_env["root"] / "migrate.py"
    script.write_text(MIGRATE_SCRIPT)
    env = _child_env(crash_env, point)
    proc = subprocess.run(
        [sys.executable, str(script), str(crash_env["root"] / f"mig_{point}_rekeyed.yaml")],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 137, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "MIGRATED" not in proc.stdout
    if point == "migrate_before_contract":
        # fully old: not a byte changed, the old config loads, the new one is refused
        assert _files(old.output) == before
        with pytest.raises(ContractError, match="key changed from"):
            load_hours(spark, new, [LAST])
        load_hours(spark, old, [LAST])
        assert snapshot(old) == crash_env["clean"]
        return
    # the new contract is committed: every path refuses until the migration is finished
    for ds in (old, new):
        with pytest.raises(ContractError, match="the migration to contract v2 .* did not finish; "
                           "finish it: dedup-pipeline migrate"):
            load_hours(spark, ds, [LAST])
    res = migrate(spark, new)  # finishes it
    assert res.to_version == 2
    assert snapshot(new) == migrated_clean
    load_hours(spark, new, [LAST])  # a rerun under the new key: (k5, u2) is a key of its own now

    def rids(snap: dict[str, Any]) -> set[str]:
        return {json.loads(r)["rid"] for r in snap["unique/" + TAGS[-1]]}

    assert rids(snapshot(new)) == rids(crash_env["clean"]) | {"i"}


def test_load_killed_after_recording_a_new_contract_version_leaves_it_tentative(
        spark: SparkSession, crash_env: dict[str, Any]) -> None:
    """A load that recorded contract v2 (a new column) and died before its commit record leaves
    no contract that no hour obeys: the old config still loads, and its result is the clean one."""
    ds = _prepare(crash_env, "crash_contract", "base01")
    raw = dataset_raw(start=HOURS[0], source=source_raw(
        str(crash_env["landing"]), schema={**CLICKS_SCHEMA, "rid": "string", "country": "string"}),
        fingerprint=["user_id", "url"], order_by="event_time",
        expiry={"column": "event_time", "period": "24h"}, output=ds.output)
    pipeline_config(crash_env["root"], raw, name="crash_contract_evolved.yaml")
    env = _child_env(crash_env, "after_contract")
    proc = subprocess.run(
        [sys.executable, str(crash_env["script"]),
         str(crash_env["root"] / "crash_contract_evolved.yaml"), LAST],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 137, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (Path(ds.output) / "_contract" / "v0002.json").exists()
    assert not (Path(ds.output) / "_commits" / f"load_hour={TAGS[-1]}.json").exists()
    (result,) = load_hours(spark, ds, [LAST])  # the old config: v1 is the contract in force
    assert result.contract_version == 1
    assert snapshot(ds) == crash_env["clean"]
