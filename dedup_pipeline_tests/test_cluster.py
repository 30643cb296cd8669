"""Scale-out (design.md C3, N3): the same load on a real Spark standalone cluster and through a real
Spark Connect server gives exactly the rows of a local-mode load.

One generated landing zone (3 hours) is loaded three times into separate output directories:
in this process on the session's local Spark (the reference), by `dedup-pipeline run` (through
Dagster) with SPARK_MASTER_URL pointing at a master with two one-core workers, and by the same
command with SPARK_REMOTE pointing at a Spark Connect server, its paths given as file:// URIs.
Every output, the index and the commit figures must be identical row for row. The cluster load
must really have run on the executors: the master lists the application with both workers'
cores, and each worker's executor log shows finished tasks. The services are started once for
the module, on loopback, and killed (whole process groups) at the end, also on failure.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dedup_pipeline.config import load_config
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline.hours import format_hour, hour_range
from dedup_pipeline.sample.generate import generate_landing
from dedup_pipeline_tests.conftest import generated_config
from dedup_pipeline_tests.spark_services import (
    FAST_JVM,
    LOOPBACK,
    VENV_BIN,
    ConnectServer,
    StandaloneCluster,
    assert_same_loads,
    clean_env,
    run_logged,
    snapshot,
    start_cluster,
    start_connect_server,
    wait_until,
)

pytestmark = pytest.mark.slow

FIRST, LAST = "2026-11-01-00:00", "2026-11-01-02:00"
HOURS = 3
ROWS_PER_HOUR = 300
# A setting of the remote loads' Spark, passed the way a deployment passes them (C3).
COMMON_CONF = {"DEDUP_SPARK_CONF_spark__sql__shuffle__partitions": "4"}
# The cluster runs with spark.authenticate, as deploy/ does; a driver holds the shared secret in
# its environment (design.md N6), never in a config file or on a command line.
CLUSTER_SECRET = uuid.uuid4().hex


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cluster and the Connect server, started together (their JVMs warm up while the
    reference load runs); each test waits for the one it uses."""
    root = tmp_path_factory.mktemp("spark_services")
    t0 = time.monotonic()
    connect: ConnectServer | None = None
    cluster: StandaloneCluster | None = None
    try:
        connect = start_connect_server(root / "connect", master="local[2]")
        cluster = start_cluster(root / "cluster", workers=2, cores=1, memory="1g",
                                wait_workers=False, secret=CLUSTER_SECRET)
        yield {"cluster": cluster, "connect": connect, "t0": t0}
    finally:
        if cluster is not None:
            cluster.stop()
        if connect is not None:
            connect.stop()


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scaleout")
    generate_landing(root, hours=HOURS, rows_per_hour=ROWS_PER_HOUR, seed=11, start=FIRST)
    return root


def write_config(root: Path, name: str, uris: bool = False) -> Path:
    """The generated config with absolute paths (or file:// URIs) and its own output directory."""
    return generated_config(root, name, uris)


@pytest.fixture(scope="module")
def reference(spark: SparkSession, landing: Path, services: dict[str, Any]) -> dict[str, Any]:
    """The local-mode load of the same landing data, in this process."""
    ds = load_config(write_config(landing, "local")).datasets[0]
    results = load_hours(spark, ds, [format_hour(h) for h in hour_range(FIRST, LAST)])
    assert [r.rows_in for r in results] == [ROWS_PER_HOUR] * HOURS
    assert all(r.duplicates and r.unique for r in results[1:])  # cross-batch duplicates exist
    return snapshot(ds.output)


def run_cli(landing: Path, name: str, env: dict[str, str], uris: bool = False) -> tuple[Path, float]:
    """`dedup-pipeline run` over every hour, in a subprocess (a fresh driver process, as a
    deployment's run process would be); returns the config file and the wall time."""
    config = write_config(landing, name, uris)
    t0 = time.monotonic()
    rc, out = run_logged([str(VENV_BIN / "dedup-pipeline"), "run", "--config", str(config),
                          "--from", FIRST, "--to", LAST],
                         landing / f"{name}.log", env=env, cwd=landing, timeout=600)
    wall = time.monotonic() - t0
    assert rc == 0, f"dedup-pipeline run on {name} failed ({rc}):\n{out[-6000:]}"
    assert f"loading {HOURS} hour(s)" in out
    return config, wall


def test_standalone_cluster_load_equals_local_mode(landing: Path, services: dict[str, Any],
                                                    reference: dict[str, Any]) -> None:
    cluster: StandaloneCluster = services["cluster"]
    cluster.wait_ready()
    app_name = f"dedup-cluster-test-{uuid.uuid4().hex[:8]}"
    env = clean_env(
        SPARK_MASTER_URL=cluster.url,
        # client mode: this subprocess is the driver; executors connect back to it on loopback
        DEDUP_SPARK_CONF_spark__driver__host=LOOPBACK,
        DEDUP_SPARK_CONF_spark__driver__bindAddress=LOOPBACK,
        DEDUP_SPARK_CONF_spark__executor__memory="512m",
        DEDUP_SPARK_CONF_spark__executor__cores="1",
        DEDUP_SPARK_CONF_spark__cores__max="2",
        DEDUP_SPARK_CONF_spark__app__name=app_name,
        DEDUP_SPARK_CONF_spark__ui__enabled="false",
        DEDUP_SPARK_CONF_spark__driver__extraJavaOptions=FAST_JVM,
        DEDUP_SPARK_CONF_spark__executor__extraJavaOptions=FAST_JVM,
        DEDUP_SPARK_CONF_spark__authenticate="true",
        DEDUP_SPARK_CONF_spark__authenticate__secret=CLUSTER_SECRET,
        **COMMON_CONF,
    )
    config, wall = run_cli(landing, "cluster", env)
    log = (landing / "cluster.log").read_text(errors="replace")
    assert CLUSTER_SECRET not in log
    print(f"cluster load of {HOURS} hours: {wall:.1f}s")

    assert_same_loads(snapshot(load_config(config).datasets[0].output), reference,
                      "the standalone-cluster load")

    # It really ran on the cluster: the master granted the application both workers' cores, and
    # both executors (one per worker) finished tasks.
    app = wait_until(f"application {app_name} in the master's status",
                     lambda: cluster.app(app_name), 30, cluster.services())
    assert app["cores"] == 2, app
    assert app["memoryperexecutor"] == 512, app
    tasks = cluster.executor_tasks(app["id"])
    assert len(tasks) == 2 and all(n > 0 for n in tasks), \
        f"executors' finished tasks per worker: {tasks} (work dirs {cluster.work_dirs})"


def test_spark_connect_load_with_file_uris_equals_local_mode(
        spark: SparkSession, landing: Path, services: dict[str, Any],
        reference: dict[str, Any]) -> None:
    """Also storage URIs: this load's `source.path` and `output` are file:// URIs, so its rows
    are compared with a plain-path load, and every list/rename/delete went through fsspec from a
    client without a JVM."""
    connect: ConnectServer = services["connect"]
    connect.wait_ready()
    before = connect.executions()
    env = clean_env(SPARK_REMOTE=connect.url, **COMMON_CONF)
    config, wall = run_cli(landing, "connect", env, uris=True)
    print(f"Spark Connect load of {HOURS} hours: {wall:.1f}s")
    ds = load_config(config).datasets[0]
    assert ds.output.startswith("file:///") and ds.source.path.startswith("file:///")

    assert_same_loads(snapshot(ds.output), reference, "the Spark Connect load (file:// URIs)")
    # the plans were executed by the server (the client has no JVM)
    assert connect.executions() - before > 10 * HOURS
    # and the independent recheck reads the URI-addressed dataset too
    report = verify_dataset(spark, ds)
    assert report.ok and report.hours_checked == HOURS, report.violations


def test_connect_client_passes_only_settings_a_client_can_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """On Spark Connect the built-in defaults that are not SQL session settings stay on the
    server (the client could only warn about them); the user's own settings are all passed."""
    from dedup_pipeline.engine.session import (
        BASE_CONF,
        STATIC_CONF,
        SparkSettings,
        session_conf,
    )

    for k in [k for k in os.environ if k.startswith("DEDUP_SPARK_CONF_")
              or k in ("SPARK_REMOTE", "SPARK_MASTER_URL")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("DEDUP_SPARK_CONF_spark__executor__memory", "2g")
    local = SparkSettings(conf={"spark.sql.shuffle.partitions": "8"}).resolved()
    assert session_conf(local) == local.conf  # classic: everything goes to the builder
    assert local.master == "local[*]" and local.remote is None
    monkeypatch.setenv("SPARK_REMOTE", "sc://connect:15002")
    monkeypatch.setenv("SPARK_MASTER_URL", "spark://ignored:7077")
    remote = SparkSettings(conf={"spark.sql.shuffle.partitions": "8"}).resolved()
    assert (remote.remote, remote.master) == ("sc://connect:15002", None)
    conf = session_conf(remote)
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.executor.memory"] == "2g"  # the user's: passed, Spark reports it
    dropped = {k for k in BASE_CONF if not k.startswith("spark.sql.")} | STATIC_CONF
    assert dropped and not dropped & set(conf)
    assert set(session_conf(local)) >= STATIC_CONF  # start-up settings: only where we start Spark


def test_local_session_runs_the_throughput_collector(spark: SparkSession,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """BASE_CONF's JVM option reaches the JVM that PySpark starts (Parallel GC: 28% faster warm
    loads than G1, docs/notes.md, 2026-11-25), and a user's own java options replace it."""
    from dedup_pipeline.engine.session import PARALLEL_GC, SparkSettings

    mf = spark.sparkContext._jvm.java.lang.management.ManagementFactory  # type: ignore[union-attr]
    collectors = {b.getName() for b in mf.getGarbageCollectorMXBeans()}
    assert collectors == {"PS Scavenge", "PS MarkSweep"}, collectors
    for k in [k for k in os.environ if k.startswith("DEDUP_SPARK_CONF_")]:
        monkeypatch.delenv(k)
    mine = SparkSettings(conf={"spark.driver.extraJavaOptions": "-Xss4m"}).resolved().conf
    assert mine["spark.driver.extraJavaOptions"] == "-Xss4m"
    assert mine["spark.executor.extraJavaOptions"] == PARALLEL_GC
