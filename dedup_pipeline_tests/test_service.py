"""Dagster as a service on PostgreSQL (design.md D6, R10, N3; deploy/dagster.yaml, deploy/workspace.yaml).

Real processes on loopback: a PostgreSQL server from Debian's packages (initdb into a temp dir,
password auth), `dagster code-server start` serving the code location, `dagster-webserver` and
`dagster-daemon run`, all reading the shipped deploy/dagster.yaml (copied into a temp
DAGSTER_HOME; connection settings from DAGSTER_PG_* env vars) and deploy/workspace.yaml (the
code server's address from env vars). A backfill of three hours is launched through the
webserver's GraphQL API; the daemon submits it (one run: single-run backfill policy), the queued
run coordinator starts it as a subprocess of the code server, and it loads the hours on local
Spark. Checked: the backfill and its one run succeed, the dataset's commit records and outputs,
and the materializations of every asset and hour as recorded in PostgreSQL (read with SQL and
through a DagsterInstance built from the same dagster.yaml).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest

from dedup_pipeline.hours import format_hour, hour_range, parse_hour, to_tag
from dedup_pipeline.orchestration.names import RANGE_END, RANGE_START, pool_name
from dedup_pipeline.sample.generate import generate_landing
from dedup_pipeline_tests.conftest import generated_config
from dedup_pipeline_tests.postgres_service import running_postgres
from dedup_pipeline_tests.spark_services import (
    FAST_JVM,
    LOOPBACK,
    OUTPUTS,
    REPO,
    VENV_BIN,
    Service,
    backfill_finished,
    clean_env,
    free_port,
    launch_backfill,
    loaded_location,
    port_open,
    start,
    stop_all,
    wait_until,
)

pytestmark = pytest.mark.slow

DEPLOY = REPO / "deploy"
FIRST, LAST = "2026-11-01-00:00", "2026-11-01-02:00"
HOURS = [format_hour(h) for h in hour_range(FIRST, LAST)]
ROWS_PER_HOUR = 300
ASSETS = [["clicks", n] for n in (*OUTPUTS, "index")]
LOCATION = "dedup_pipeline"
PG_USER, PG_DB = "dagster", "dagster_service_test"


# ---------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="module")
def postgres() -> Iterator[dict[str, str]]:
    with running_postgres(PG_DB) as settings:
        yield settings


# ---------------------------------------------------------------- Dagster services


@pytest.fixture(scope="module")
def service_env(tmp_path_factory: pytest.TempPathFactory, postgres: dict[str, str]) -> dict[str, Any]:
    """DAGSTER_HOME with the shipped dagster.yaml, a generated dataset, and the environment every
    Dagster process of the deployment gets."""
    root = tmp_path_factory.mktemp("service")
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    generate_landing(root, hours=len(HOURS), rows_per_hour=ROWS_PER_HOUR, seed=5, start=FIRST)
    # No _SUCCESS markers: the landing sensor (running by default) then waits instead of
    # requesting these hours itself; the backfill is the only thing that loads them.
    for marker in (root / "landing").rglob("_SUCCESS"):
        marker.unlink()
    generated_config(root, "clicks", name="dedup.yaml")
    env = clean_env(
        DAGSTER_HOME=str(home),
        DEDUP_CONFIG=str(root / "dedup.yaml"),
        DAGSTER_CODE_SERVER_HOST=LOOPBACK,
        DAGSTER_CODE_SERVER_PORT=str(free_port()),
        # the run's Spark: local mode, small and quick to start
        SPARK_MASTER_URL="local[2]",
        DEDUP_SPARK_CONF_spark__ui__enabled="false",
        DEDUP_SPARK_CONF_spark__sql__shuffle__partitions="2",
        DEDUP_SPARK_CONF_spark__driver__extraJavaOptions=FAST_JVM,
        **postgres,
    )
    return {"root": root, "home": home, "env": env, "output": root / "warehouse" / "clicks"}


@pytest.fixture(scope="module")
def backfill(service_env: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Start the code server, webserver and daemon; launch the backfill through GraphQL; wait
    until it is finished. Everything is stopped at the end, also on failure."""
    root, env = service_env["root"], service_env["env"]
    logs = root / "logs"
    code_port, web_port = int(env["DAGSTER_CODE_SERVER_PORT"]), free_port()
    url = f"http://{LOOPBACK}:{web_port}"
    workspace = str(DEPLOY / "workspace.yaml")
    services: list[Service] = []
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        code = start("dagster code-server",
                     [str(VENV_BIN / "dagster"), "code-server", "start", "-m",
                      "dedup_pipeline.definitions", "-h", LOOPBACK, "-p", str(code_port),
                      "--location-name", LOCATION],
                     logs / "code-server.log", env=env, cwd=root)
        services.append(code)
        web = start("dagster-webserver",
                    [str(VENV_BIN / "dagster-webserver"), "-h", LOOPBACK, "-p", str(web_port),
                     "-w", workspace],
                    logs / "webserver.log", env=env, cwd=root)
        services.append(web)
        wait_until("the code server's port", lambda: port_open(code_port), 120, services)
        timings["code_server"] = time.monotonic() - t0
        entry = wait_until("the webserver to load the code location over gRPC",
                           lambda: loaded_location(url, LOCATION, reload_unreachable=True), 180,
                           services)
        loaded = entry["locationOrLoadError"]
        assert loaded["__typename"] == "RepositoryLocation", f"{loaded}\n{code.tail()}"
        timings["webserver"] = time.monotonic() - t0

        backfill_id = launch_backfill(url, {
            "assetSelection": [{"path": p} for p in ASSETS],
            "partitionNames": HOURS,
            "title": "service test backfill",
        })

        # The daemon starts after the launch so its first backfill iteration picks it up (the
        # backfill loop otherwise sleeps 30 s between iterations).
        t1 = time.monotonic()
        daemon = start("dagster-daemon", [str(VENV_BIN / "dagster-daemon"), "run", "-w", workspace],
                       logs / "daemon.log", env=env, cwd=root)
        services.append(daemon)

        result = wait_until(f"backfill {backfill_id} to finish",
                            lambda: backfill_finished(url, backfill_id), 420, services, interval=2)
        timings["backfill"] = time.monotonic() - t1
        print("service timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
        yield {"backfill": result, "id": backfill_id, "url": url, "services": services,
               "logs": logs}
    finally:
        stop_all(services)


def test_backfill_through_graphql_loads_every_hour(service_env: dict[str, Any],
                                                   backfill: dict[str, Any]) -> None:
    b = backfill["backfill"]
    logs = "\n".join(f"--- {s.name}:\n{s.tail(3000)}" for s in backfill["services"])
    assert b["status"] in ("COMPLETED_SUCCESS", "COMPLETED"), f"{b}\n{logs}"
    assert b["numPartitions"] == len(HOURS)
    # single-run backfill policy: the whole range in one run, hours in order (R11)
    assert len(b["runs"]) == 1, b["runs"]
    run = b["runs"][0]
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert run["status"] == "SUCCESS", f"{run}\n{logs}"
    assert tags["dagster/backfill"] == backfill["id"]
    assert (tags[RANGE_START], tags[RANGE_END]) == (FIRST, LAST)

    out: Path = service_env["output"]
    for key in HOURS:
        tag = to_tag(parse_hour(key))
        rec = json.loads((out / "_commits" / f"load_hour={tag}.json").read_text())
        assert rec["rows_in"] == ROWS_PER_HOUR
        written = {o: pq.read_table(out / o / f"load_hour={tag}").num_rows for o in OUTPUTS}
        assert written == {o: rec[o] for o in OUTPUTS}
        assert sum(written.values()) == ROWS_PER_HOUR  # R8
    assert sum(json.loads((out / "_commits" / f"load_hour={to_tag(parse_hour(h))}.json").read_text())
               ["duplicates"] for h in HOURS[1:]) > 0


def test_materializations_are_recorded_in_postgres(service_env: dict[str, Any],
                                                   backfill: dict[str, Any],
                                                   postgres: dict[str, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg2

    conn = psycopg2.connect(host=postgres["DAGSTER_PG_HOST"], port=int(postgres["DAGSTER_PG_PORT"]),
                            user=postgres["DAGSTER_PG_USER"], password=postgres["DAGSTER_PG_PASSWORD"],
                            dbname=postgres["DAGSTER_PG_DB"])
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT asset_key, partition FROM event_logs "
                        "WHERE dagster_event_type = 'ASSET_MATERIALIZATION'")
            rows = cur.fetchall()
            cur.execute("SELECT asset_key, check_name, partition, execution_status FROM "
                        "asset_check_executions")
            check_rows = cur.fetchall()
            cur.execute("SELECT status FROM runs")
            statuses = [r[0] for r in cur.fetchall()]
    finally:
        conn.close()
    expected = {(dg.AssetKey(a).to_string(), h) for a in ASSETS for h in HOURS}
    # a ranged run: Dagster's output event per hour (no metadata), then the hour's own
    # materialization with its figures, so each asset and hour exactly twice
    assert Counter(rows) == dict.fromkeys(expected, 2), rows
    assert statuses == ["SUCCESS"]
    # every check of every hour: its planned row filled by a passing evaluation (one row per
    # run and partition), plus the ranged run's summary result per check (no partition)
    per_hour = Counter((c, p) for _, c, p, st in check_rows if p is not None and st == "SUCCEEDED")
    assert per_hour == {(c, h): 1 for c in {r[1] for r in check_rows} for h in HOURS}, check_rows
    assert len({r[1] for r in check_rows}) == 7
    assert all(st == "SUCCEEDED" for *_, st in check_rows), check_rows

    # The same facts through Dagster's API on an instance built from the shipped dagster.yaml.
    for k, v in postgres.items():
        monkeypatch.setenv(k, v)
    with dg.DagsterInstance.from_config(str(service_env["home"])) as inst:
        assert type(inst.run_storage).__name__ == "PostgresRunStorage"
        assert type(inst.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(inst.schedule_storage).__name__ == "PostgresScheduleStorage"
        for a in ASSETS:
            assert inst.get_materialized_partitions(dg.AssetKey(a)) == set(HOURS)
            for h in HOURS:  # the latest materialization of each hour carries its own figures
                (latest,) = inst.fetch_materializations(dg.AssetRecordsFilter(
                    asset_key=dg.AssetKey(a), asset_partitions=[h]), limit=1).records
                md = latest.asset_materialization.metadata
                assert md["rows_in"].value == ROWS_PER_HOUR, (a, h, md)
        # the instance settings of deploy/dagster.yaml, as Dagster read them
        assert type(inst.run_coordinator).__name__ == "QueuedRunCoordinator"
        queue = inst.get_concurrency_config().run_queue_config
        assert queue is not None and queue.max_concurrent_runs == 4
        assert not queue.tag_concurrency_limits  # one mechanism: the pool below
        assert inst.run_retries_enabled and inst.run_retries_max_retries == 2
        # the run's pool got the default limit of 1, stored in PostgreSQL
        assert inst.event_log_storage.get_concurrency_info(pool_name("clicks")).slot_count == 1
