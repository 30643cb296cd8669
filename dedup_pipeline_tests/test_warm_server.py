"""The warm Spark topology (design.md N5): one Spark Connect server started by
`dedup-pipeline spark-server`, fresh `dedup-pipeline run` processes as its clients.

One server is started for the module with the command users run (its own process group, killed
at the end, also on failure). Against it: the server carries the package's start-up settings;
two runs of different datasets at the same time give exactly the rows, index and commit figures
of local-mode loads of the same data; a server restart in the middle of a run fails that run with
one line naming the server, and the rerun is exact (R10). The restart test goes last: it replaces
the module's server with a new one on the same port.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from dedup_pipeline.config import load_config
from dedup_pipeline.engine.connect_host import CONNECT_PLUGIN, SCRIPT
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.session import BASE_CONF, PARALLEL_GC, SERVER_CONF, server_command
from dedup_pipeline.hours import HOUR, format_hour, hour_range, parse_hour
from dedup_pipeline.sample.generate import generate_landing
from dedup_pipeline_tests.conftest import generated_config
from dedup_pipeline_tests.spark_services import (
    LOOPBACK,
    VENV_BIN,
    Service,
    _group_alive,
    assert_same_loads,
    clean_env,
    free_port,
    snapshot,
    start,
    wait_until,
)

pytestmark = pytest.mark.slow

FIRST = "2026-11-01-00:00"
# (dataset name, seed, hours, rows per hour) of the landing zones the tests load
CONCURRENT = (("clicks", 21, 2, 300), ("views", 22, 2, 300))
RESTART = ("orders", 23, 3, 2000)
# a setting of the test server: small shuffles for small batches (the runs set 4 as well)
SERVER_TEST_CONF = ("spark.ui.enabled=false", "spark.sql.shuffle.partitions=4")


class WarmServer:
    """`dedup-pipeline spark-server` on a fixed port; can be replaced by a new one (restart)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.service: Service | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self.starts += 1
        # INFO: the tests count the server's executions in its log (`executions`)
        cmd = [str(VENV_BIN / "dedup-pipeline"), "spark-server", "--port", str(self.port),
               "--master", "local[2]", "--log-level", "INFO"]
        for c in SERVER_TEST_CONF:
            cmd += ["--conf", c]
        self.service = start("dedup-pipeline spark-server", cmd,
                             self.root / f"server-{self.starts}.log", env=clean_env(), cwd=self.root)

    def wait_ready(self, timeout: float = 180) -> None:
        assert self.service is not None
        svc = self.service
        ready = f"export SPARK_REMOTE={self.url}"
        # the line is near the top of the log; the server's INFO lines follow it
        wait_until(f"`dedup-pipeline spark-server` on port {self.port}",
                   lambda: ready in svc.log.read_text(errors="replace"), timeout, [svc])

    def kill(self) -> None:
        """The server dies at once (SIGKILL to its process group: no shutdown hooks)."""
        if self.service is not None:
            self.service.stop(timeout=0.1)

    def client(self, code: str) -> str:
        """`code` in a new client process with `s`, its Connect session to this server; its
        stdout."""
        script = ("from pyspark.sql import SparkSession\n"  # the token: connect_auth.client_url
                  "from dedup_pipeline.engine.connect_auth import client_url\n"
                  f"s = SparkSession.builder.remote(client_url({self.url!r})).getOrCreate()\n"
                  f"{code}")
        out = subprocess.run([str(VENV_BIN / "python"), "-c", script], env=clean_env(),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    def serve_a_client(self) -> None:
        """One query from a client process: the server is fully up (its port opens while the
        SparkContext is still starting, before Spark registers its shutdown hook)."""
        self.client("assert s.range(3).count() == 3\n")

    def executions(self) -> int:
        assert self.service is not None
        return self.service.tail(10**8).count("ExecuteHolder ExecuteKey(")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmServer]:
    srv = WarmServer(tmp_path_factory.mktemp("warm_server"))
    try:
        srv.start()
        yield srv
    finally:
        srv.kill()


def make_landing(root: Path, name: str, seed: int, hours: int, rows: int) -> Path:
    """A generated landing zone whose dataset is called `name`."""
    generate_landing(root, hours=hours, rows_per_hour=rows, seed=seed, start=FIRST)
    raw = yaml.safe_load((root / "dedup.yaml").read_text())
    raw["datasets"][0]["name"] = name
    (root / "dedup.yaml").write_text(yaml.safe_dump(raw))
    return root


def write_config(root: Path, label: str) -> Path:
    """The landing zone's config with absolute paths and its own output directory."""
    return generated_config(root, label)


def local_reference(spark: SparkSession, root: Path, hours: int) -> dict[str, Any]:
    """A local-mode load of every hour of the landing zone, in this process."""
    ds = load_config(write_config(root, "local")).datasets[0]
    load_hours(spark, ds, [format_hour(h) for h in hour_range(FIRST, last_hour(hours))])
    return snapshot(ds.output)


def last_hour(hours: int) -> str:
    return format_hour(parse_hour(FIRST) + (hours - 1) * HOUR)


def start_run(root: Path, label: str, hours: int, remote: str,
              log: str | None = None) -> tuple[Service, Path]:
    """A fresh `dedup-pipeline run` process over every hour, a client of the server."""
    config = write_config(root, label)
    env = clean_env(SPARK_REMOTE=remote, DEDUP_SPARK_CONF_spark__sql__shuffle__partitions="4")
    svc = start(f"dedup-pipeline run ({label})",
                [str(VENV_BIN / "dedup-pipeline"), "run", "--config", str(config),
                 "--from", FIRST, "--to", last_hour(hours)],
                root / f"{log or label}.log", env=env, cwd=root)
    return svc, config


def finish(svc: Service, timeout: float = 600) -> tuple[int, str]:
    rc = svc.finish(timeout)
    return rc, svc.tail(10**7)


def test_spark_server_command_serves_clients_with_the_start_up_settings(
        server: WarmServer) -> None:
    """The command prints the SPARK_REMOTE to export; a client process reads through it the
    settings only the server can take; the server's JVM runs the Parallel collector and the
    Connect plugin with per-session artifact isolation off."""
    server.wait_ready()
    probe = (
        "import json\n"
        "keys = ['spark.sql.codegen.cache.maxEntries', 'spark.sql.session.timeZone',\n"
        "        'spark.connect.session.manager.defaultSessionTimeout',\n"
        "        'spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs',\n"
        "        'spark.driver.extraJavaOptions', 'spark.sql.shuffle.partitions',\n"
        "        'spark.sql.artifact.isolation.enabled']\n"
        "print(json.dumps({k: s.conf.get(k) for k in keys} | {'n': s.range(10).count()}))\n"
    )
    got = json.loads(server.client(probe).strip().splitlines()[-1])
    java_options = got.pop("spark.driver.extraJavaOptions")  # Spark adds its own to ours
    assert PARALLEL_GC in java_options.split(), java_options
    assert got == {
        "spark.sql.codegen.cache.maxEntries": BASE_CONF["spark.sql.codegen.cache.maxEntries"],
        "spark.sql.session.timeZone": "UTC",
        "spark.connect.session.manager.defaultSessionTimeout":
            SERVER_CONF["spark.connect.session.manager.defaultSessionTimeout"],
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        "spark.sql.shuffle.partitions": "4",  # --conf wins over BASE_CONF
        "spark.sql.artifact.isolation.enabled": "false",
        "n": 10,
    }
    # the JVM (a child in the command's process group) was started with the collector
    assert server.service is not None
    jvm_args = subprocess.run(["ps", "-ww", "-o", "args=", "-g", str(server.service.proc.pid)],
                              capture_output=True, text=True).stdout
    assert CONNECT_PLUGIN in jvm_args and PARALLEL_GC in jvm_args


def _confs(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--conf")


def test_server_command_adds_the_connect_plugin_and_keeps_a_users_choices() -> None:
    """The server is the driver program with the Connect plugin and isolation off; a user's own
    plugins stay and the Connect plugin is appended; a user may turn isolation back on."""
    cmd = server_command("local[2]", "127.0.0.1", 15002)
    assert Path(cmd[-1]) == SCRIPT and SCRIPT.is_file()
    assert cmd[cmd.index("--master") + 1] == "local[2]"
    conf = _confs(cmd)
    assert conf["spark.plugins"] == CONNECT_PLUGIN
    assert conf["spark.sql.artifact.isolation.enabled"] == "false"
    assert conf["spark.connect.grpc.binding.port"] == "15002"
    mine = _confs(server_command("local[2]", "0.0.0.0", 15003, {
        "spark.plugins": "com.example.Mine", "spark.sql.artifact.isolation.enabled": "true"}))
    assert mine["spark.plugins"] == f"com.example.Mine,{CONNECT_PLUGIN}"
    assert mine["spark.sql.artifact.isolation.enabled"] == "true"
    again = _confs(server_command("local[2]", "0.0.0.0", 15003, {"spark.plugins": CONNECT_PLUGIN}))
    assert again["spark.plugins"] == CONNECT_PLUGIN


def test_a_new_session_reuses_the_code_an_earlier_run_generated(server: WarmServer) -> None:
    """Every run is a new Connect session. The second of two client processes running the same
    query compiles no class: the server's generated-code cache serves every session (with
    per-session isolation each session had a class loader of its own and compiled everything
    again, ~1.5 s of a 1e5-row load; T8)."""
    server.wait_ready()
    factor = random.randrange(10**6, 10**7)  # a constant no earlier query compiled
    query = (
        "from pyspark.sql import functions as F\n"
        f"df = s.range(5000).select((F.col('id') % 7).alias('k'), (F.col('id') * {factor}).alias('v'))\n"
        "print(df.groupBy('k').agg(F.sum('v')).orderBy('k').collect()[0])\n"
    )

    def compiled() -> int:
        assert server.service is not None
        return server.service.tail(10**8).count("Code generated in")

    counts = [compiled()]
    for _ in range(2):
        server.client(query)
        time.sleep(1)  # the server's log lines of the query
        counts.append(compiled())
    assert counts[1] > counts[0], "the first client's query compiled nothing (log level?)"
    assert counts[2] == counts[1], f"the second client compiled {counts[2] - counts[1]} classes"


def test_spark_server_refuses_a_port_in_use(server: WarmServer, tmp_path: Path) -> None:
    server.wait_ready()
    out = subprocess.run([str(VENV_BIN / "dedup-pipeline"), "spark-server", "--port",
                          str(server.port)], env=clean_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == (f"error: {LOOPBACK}:{server.port} is already in use (another "
                                  "Spark Connect server?); pick another --port")


def test_concurrent_runs_of_two_datasets_on_one_server_equal_local_mode(
        spark: SparkSession, server: WarmServer, tmp_path_factory: pytest.TempPathFactory) -> None:
    roots = {name: make_landing(tmp_path_factory.mktemp(name), name, seed, hours, rows)
             for name, seed, hours, rows in CONCURRENT}
    references = {name: local_reference(spark, roots[name], hours)
                  for name, _, hours, _ in CONCURRENT}
    server.wait_ready()
    before = server.executions()
    t0 = time.monotonic()
    runs = {name: start_run(roots[name], "warm", hours, server.url)
            for name, _, hours, _ in CONCURRENT}
    # both run processes are alive at the same time, each loading through the server
    wait_until("both runs to be running together",
               lambda: all(svc.alive() for svc, _ in runs.values()), 30)
    outcomes = {name: finish(svc) for name, (svc, _) in runs.items()}
    print(f"two concurrent runs of 2 hours each: {time.monotonic() - t0:.1f}s")
    for name, (rc, out) in outcomes.items():
        assert rc == 0, f"the run of {name} failed ({rc}):\n{out[-6000:]}"
        ds = load_config(runs[name][1]).datasets[0]
        assert ds.name == name
        assert_same_loads(snapshot(ds.output), references[name],
                          f"the {name} run against the warm server")
    assert references["clicks"]["unique"] != references["views"]["unique"]
    assert server.executions() - before > 2 * 10 * 2  # the plans ran on the server


def test_server_restart_mid_run_fails_the_run_and_the_rerun_is_exact(
        spark: SparkSession, server: WarmServer, tmp_path_factory: pytest.TempPathFactory) -> None:
    name, seed, hours, rows = RESTART
    root = make_landing(tmp_path_factory.mktemp(name), name, seed, hours, rows)
    reference = local_reference(spark, root, hours)
    server.wait_ready()
    run, config = start_run(root, "warm", hours, server.url, log="interrupted")
    ds = load_config(config).datasets[0]
    commits = Path(ds.output) / "_commits"
    # restart the server while the run is between its first and last committed hour
    wait_until("the run's first committed hour",
               lambda: len(list(commits.glob("*.json"))) >= 1, 300, [run])
    server.kill()
    committed_at_kill = len(list(commits.glob("*.json")))
    server.start()
    rc, out = finish(run)
    assert committed_at_kill < hours, "the run finished before the server was killed"
    assert rc == 1, out[-6000:]
    error = out.strip().splitlines()[-1]
    assert error.startswith("error: run ") and f"Spark Connect server {server.url}" in error, error
    assert "\n" not in error and len(error) < 400, error
    print(f"the interrupted run ({committed_at_kill} of {hours} hours committed): {error}")

    server.wait_ready()
    rerun, _ = start_run(root, "warm", hours, server.url)
    rc, out = finish(rerun)
    assert rc == 0, out[-6000:]
    assert_same_loads(snapshot(ds.output), reference,
                      "the rerun after a server restart (R10)")


def test_whatever_a_restarted_server_raised_names_the_server(server: WarmServer) -> None:
    """A server killed mid-query can raise anything its half-stopped driver throws (CI saw a
    NullPointerException from a plan whose session was gone): after an error the run asks the
    server whether it still serves the session. A healthy server's query error surfaces as it
    is; once the server was replaced, any error names the server in one line."""
    server.wait_ready()
    code = (
        "import sys\n"
        "from pyspark.errors.exceptions.connect import AnalysisException, SparkConnectException\n"
        "from dedup_pipeline.engine.session import SparkServerError, connect_errors\n"
        f"url = {server.url!r}\n"
        "assert s.range(3).count() == 3\n"
        "try:\n"
        "    with connect_errors(url, s):\n"
        "        s.sql('select no_such_column').collect()\n"
        "except AnalysisException:\n"
        "    print('healthy: query error as it is', flush=True)\n"
        "sys.stdin.readline()  # the server is replaced meanwhile\n"
        "npe = SparkConnectException('(java.lang.NullPointerException) Cannot invoke '\n"
        "    '\"org.apache.spark.sql.classic.SparkSession.sparkContext()\"')\n"
        "try:\n"
        "    with connect_errors(url, s):\n"
        "        raise npe\n"
        "except SparkServerError as e:\n"
        "    print('replaced:', e, flush=True)\n")
    script = ("from pyspark.sql import SparkSession\n"
              "from dedup_pipeline.engine.connect_auth import client_url\n"
              f"s = SparkSession.builder.remote(client_url({server.url!r})).getOrCreate()\n"
              f"{code}")
    proc = subprocess.Popen([str(VENV_BIN / "python"), "-c", script], env=clean_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "healthy: query error as it is"
        server.kill()
        server.start()
        server.wait_ready()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    line = out.strip()
    assert line.startswith(f"replaced: Spark Connect server {server.url} was restarted"), line
    assert "\n" not in line, line


def test_a_server_lost_for_good_fails_the_run_within_five_minutes(
        server: WarmServer, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The server dies mid-run and nothing takes its place: the run gives up after its client's
    few retries (CONNECT_RETRIES, ~1 minute a round; 86 s measured) with the one-line error, not
    after the Connect client's default 10+ minutes a round, STARTED all along."""
    from dedup_pipeline.engine.session import CONNECT_RETRIES

    name, seed, hours, rows = RESTART
    root = make_landing(tmp_path_factory.mktemp(f"{name}_lost"), name, seed, hours, rows)
    server.wait_ready()
    run, config = start_run(root, "lost", hours, server.url)
    commits = Path(load_config(config).datasets[0].output) / "_commits"
    wait_until("the run's first committed hour",
               lambda: len(list(commits.glob("*.json"))) >= 1, 300, [run])
    server.kill()
    killed = time.monotonic()
    committed_at_kill = len(list(commits.glob("*.json")))
    try:
        rc, out = finish(run, timeout=300)  # 20+ minutes with the client's default retries
        waited = time.monotonic() - killed
        assert committed_at_kill < hours, "the run finished before the server was killed"
        assert rc == 1, out[-6000:]
        error = out.strip().splitlines()[-1]
        assert error.startswith("error: run ") and f"Spark Connect server {server.url}" in error
        assert "\n" not in error and len(error) < 400, error
        print(f"the run failed {waited:.0f} s after the server died ({CONNECT_RETRIES} retries): "
              f"{error}")
    finally:
        server.start()  # for the tests after this one


def test_spark_server_stops_cleanly_on_ctrl_c(server: WarmServer) -> None:
    """SIGINT to the command alone (what Ctrl-C delivers to it) stops the JVM through its
    shutdown hooks: the command exits 0 and nothing of its process group is left."""
    server.wait_ready()
    # answer a client first, as a user's server has: right after start-up a Ctrl-C can precede
    # Spark's shutdown hook (seen in CI after a restart)
    server.serve_a_client()
    assert server.service is not None
    svc = server.service
    os.kill(svc.proc.pid, signal.SIGINT)
    rc = svc.proc.wait(timeout=60)
    log = svc.log.read_text(errors="replace")
    assert rc == 0, log[-3000:]
    assert "Successfully stopped SparkContext" in log
    assert log.rstrip().endswith("stopped")
    wait_until("the server's process group to be gone", lambda: not _group_alive(svc.proc.pid), 30)


def test_only_a_lost_server_becomes_a_spark_server_error() -> None:
    """A query or storage error surfaces as it is, even if its text looks like a network error;
    only the Connect client's own errors about the server are turned into SparkServerError."""
    from pyspark.errors.exceptions.connect import AnalysisException, SparkConnectException

    from dedup_pipeline.engine.session import SparkServerError, connect_errors, lost_server_reason

    assert lost_server_reason(OSError("Connection reset by peer")) is None
    assert lost_server_reason(AnalysisException("[UNRESOLVED_COLUMN] x")) is None
    closed = SparkConnectException(errorClass="NO_ACTIVE_SESSION", messageParameters={})
    assert "NO_ACTIVE_SESSION" in (lost_server_reason(closed) or "")
    with pytest.raises(SparkServerError) as err, connect_errors("sc://h:1"):
        raise closed
    assert str(err.value).startswith("Spark Connect server sc://h:1 was restarted")
    # a server killed mid-query may answer it while its SparkContext stops
    stopping = SparkConnectException(
        "(java.lang.IllegalStateException) Cannot call methods on a stopped SparkContext.")
    assert "shutting down" in (lost_server_reason(stopping) or "")
    with pytest.raises(SparkConnectException), connect_errors(None):  # local mode: untouched
        raise closed
    with pytest.raises(OSError), connect_errors("sc://h:1"):
        raise OSError("Connection refused")


def test_a_failed_load_releases_its_cache_until_the_first_release_fails() -> None:
    """Each release through a lost server waits out a round of client retries (~68 s): after a
    failed load the cache stops at the first release that fails, and the load's own error is the
    one raised; after a load that succeeded, a failing release is raised."""
    from dedup_pipeline.engine.core.batch import Persisted

    tried = []

    class Frame:  # a cached frame whose session is gone
        def unpersist(self) -> None:
            tried.append(self)
            raise ConnectionError("the server is gone")

    cache = Persisted()
    cache.frames = [Frame(), Frame(), Frame()]
    with pytest.raises(KeyError), cache:
        raise KeyError("the load's own error")
    assert len(tried) == 1 and cache.frames == []
    cache.frames = [Frame()]
    with pytest.raises(ConnectionError):
        cache.release()


def test_a_run_against_no_server_fails_at_once_naming_it() -> None:
    """Nothing listens at SPARK_REMOTE: the session is refused in one line within seconds (the
    Connect client alone would retry for ~10 minutes, a run stuck in STARTED)."""
    from dedup_pipeline.engine.session import (
        SparkServerError,
        SparkSettings,
        connect_address,
        get_session,
    )

    assert connect_address("sc://h:7/;session_id=x") == ("h", 7)
    assert connect_address("sc://h") == ("h", 15002)
    remote = f"sc://{LOOPBACK}:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(SparkServerError) as err:
        get_session(SparkSettings(remote=remote))
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    assert remote in msg and "dedup-pipeline spark-server" in msg and "\n" not in msg


def test_a_stream_reset_by_a_dying_server_counts_as_a_lost_server() -> None:
    """The text CI saw when the server was killed while it streamed a result (CANCELLED,
    RST_STREAM); an ordinary error is not a lost server."""
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    from dedup_pipeline.engine.session import lost_server_reason

    reset = SparkConnectGrpcException(
        "<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.CANCELLED\n\t"
        'details = "Stream removed (RST_STREAM (Received RST_STREAM with error code 8))"')
    assert lost_server_reason(reset) == "became unreachable (Stream removed)"
    assert lost_server_reason(ValueError("Stream removed")) is None


def test_spark_server_logs_one_line_per_session_and_every_run_releases_its_session(
        tmp_path: Path) -> None:
    """The terminal the README asks users to keep open: Spark at WARN, plus one line when a client
    session starts and one when it ends. A run opens one Connect session and releases it when it
    ends, whether it succeeded or was refused: the server's open sessions (its "session started"
    lines minus its "session ended" lines) are back to 0 after every run, not after the server's
    idle timeout; a refused run may open none. One server (default log level) for both."""
    srv = WarmServer(tmp_path)
    cmd = [str(VENV_BIN / "dedup-pipeline"), "spark-server", "--port", str(srv.port),
           "--master", "local[1]", "--conf", "spark.ui.enabled=false"]
    srv.service = start("dedup-pipeline spark-server", cmd, tmp_path / "server.log", env=clean_env(),
                        cwd=tmp_path)
    root = make_landing(tmp_path / "land", "sessions", seed=5, hours=2, rows=50)
    env = clean_env(SPARK_REMOTE=srv.url, DAGSTER_HOME=str(tmp_path / "dagster_home"))
    h0, h1 = FIRST, format_hour(parse_hour(FIRST) + HOUR)

    def sessions() -> tuple[int, int]:
        log = srv.service.tail(10**8) if srv.service else ""
        return log.count("session started:"), log.count("session ended:")

    def run(first: str, last: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(VENV_BIN / "dedup-pipeline"), "run", "--config",
                               str(root / "dedup.yaml"), "--from", first, "--to", last], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)

    try:
        srv.wait_ready()
        srv.client("assert s.range(3).count() == 3\ns.stop()\n")
        wait_until("the session's end line", lambda: sessions() == (1, 1) or None, 30,
                   [srv.service])
        log = srv.service.tail(10**7)
        started = [line for line in log.splitlines() if "session started:" in line]
        ended = [line for line in log.splitlines() if "session ended:" in line]
        print(started[0], ended[0], sep="\n")
        for n, (first, last, ok) in enumerate([(h0, h1, True), (h0, h0, False)], start=1):
            before = sessions()[0]
            out = run(first, last)
            assert (out.returncode == 0) == ok, out.stdout[-3000:] + out.stderr[-3000:]
            assert "Spark: the Connect server at" in out.stdout, out.stdout[-2000:]
            # every session a run opened has ended (a refused run may open none: its refusal and
            # the hours it restates need no Spark)
            wait_until(f"run {n}'s sessions to end",
                       lambda: (sessions()[0] == sessions()[1]) or None, 30, [srv.service])
            assert sessions()[0] > before or not ok, sessions()  # a load opens its session
            print(f"run {n} ({first}..{last}, {'ok' if ok else 'refused'}): sessions "
                  f"started/ended {sessions()}")
        log = srv.service.tail(10**8)
    finally:
        srv.kill()
    assert "Spark log level WARN" in log
    assert not [line for line in log.splitlines() if " INFO " in line], log[-3000:]
