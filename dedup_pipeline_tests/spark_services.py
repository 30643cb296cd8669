"""Real processes for the scale-out tests: a Spark standalone cluster and a Spark Connect server
from the pip pyspark wheel, plus what test_service.py needs to run PostgreSQL and Dagster.

Every process is started in a new session (its own process group) and stopped by killing the
group, so the JVMs and Python children it started go with it, also when a test fails. Everything
binds to 127.0.0.1 on free ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pyspark

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]
PYSPARK_HOME = Path(pyspark.__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
# Short-lived JVMs start faster with the C1 JIT only and the serial GC (~30%, see test_crash.py).
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
OUTPUTS = ("unique", "duplicates", "expired", "rejected")
# Figures of a commit record that must not depend on where the load ran (no timings, no file names).
COMMIT_FIGURES = ("rows_in", "unique", "duplicates", "expired", "rejected", "conflicts",
                  "latest_point", "expiry_point", "files_in", "index_rows_written",
                  "index_rows_read", "index_slices_written", "index_checksum", "inputs")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def http_json(url: str, timeout: float = 5, data: Any = None) -> Any:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


# ---------------------------------------------------------------- Dagster's GraphQL API
# What the webserver's pages and buttons send; shared by test_service.py and test_ui_server.py.


def graphql(url: str, query: str, variables: dict[str, Any] | None = None,
            timeout: float = 60) -> dict[str, Any]:
    """One request to the webserver at `url`; a GraphQL error fails the test."""
    resp = http_json(f"{url}/graphql", timeout=timeout, data={"query": query, "variables": variables or {}})
    assert "errors" not in resp, resp["errors"]
    return resp["data"]


WORKSPACE = """
query { workspaceOrError { __typename ... on Workspace { locationEntries {
  name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }
"""

RELOAD_LOCATION = """
mutation Reload($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) { __typename } }
"""

LAUNCH_BACKFILL = """
mutation LaunchBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on UnauthorizedError { message }
    ... on PartitionSetNotFoundError { message }
    ... on InvalidSubsetError { message }
  }
}
"""

BACKFILL_STATUS = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      status numPartitions
      error { message }
      runs(limit: 10) { runId status tags { key value } }
    }
    ... on PythonError { message }
  }
}
"""


def loaded_location(url: str, name: str, reload_unreachable: bool = False) -> dict[str, Any] | None:
    """The code location's workspace entry once it finished loading (or failed to), else None.
    With `reload_unreachable`, a location whose code server was not serving yet when the webserver
    asked ("unreachable") is reloaded, as a user would in the UI, and None returned meanwhile."""
    for entry in graphql(url, WORKSPACE)["workspaceOrError"].get("locationEntries", []):
        if entry["name"] == name and entry["loadStatus"] == "LOADED":
            error = entry["locationOrLoadError"].get("message") or ""
            if reload_unreachable and "DagsterUserCodeUnreachableError" in error:
                graphql(url, RELOAD_LOCATION, {"name": name})
                return None
            return entry
    return None


# The asset job's launch of one partition, as the UI's "Materialize" button sends it.
LAUNCH_RUN = """
mutation LaunchRun($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""


def launch_partition_run(url: str, dataset: str, assets: Iterable[str], checks: dict[str, str],
                         partition: str, location: str = "dedup_pipeline") -> dict[str, Any]:
    """What the UI sends for "Materialize" of one partition of `dataset`'s `assets` with their
    `checks` (check name -> asset name); returns the `launchRun` answer."""
    return dict(graphql(url, LAUNCH_RUN, {"executionParams": {
        "mode": "default",
        "runConfigData": {},
        "selector": {
            "repositoryLocationName": location,
            "repositoryName": "__repository__",
            "pipelineName": "__ASSET_JOB",
            "assetSelection": [{"path": [dataset, a]} for a in assets],
            "assetCheckSelection": [{"assetKey": {"path": [dataset, a]}, "name": c}
                                    for c, a in checks.items()],
        },
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]},
    }})["launchRun"])


def launch_backfill(url: str, params: dict[str, Any]) -> str:
    """Launch a partition backfill as the UI's dialog does; returns its id."""
    res = graphql(url, LAUNCH_BACKFILL, {"backfillParams": params})["launchPartitionBackfill"]
    assert res["__typename"] == "LaunchBackfillSuccess", res
    return res["backfillId"]


def backfill_finished(url: str, backfill_id: str) -> dict[str, Any] | None:
    """The backfill once it stopped running, else None (for `wait_until`)."""
    b = graphql(url, BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"]
    assert b["__typename"] == "PartitionBackfill", b
    return b if b["status"] not in ("REQUESTED", "CANCELING", "FAILING") else None


@dataclass
class Service:
    """One background process group and its log file."""

    name: str
    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM to the whole group, then SIGKILL to whatever is left of it (a launcher script
        may have exited before the JVM it started, which stays in the group)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout
            while _group_alive(self.proc.pid) and time.monotonic() < deadline:
                self.proc.poll()  # reap the leader so it does not linger as a zombie
                time.sleep(0.2)
            if not _group_alive(self.proc.pid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def finish(self, timeout: float = 600) -> int:
        """Wait for the process to exit, then stop its group; its exit code (-1 on a timeout)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return -1
        finally:
            self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies still count for killpg(0); look for a live member
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def start(name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None, user: str | None = None) -> Service:
    """Start `cmd` in a new session, stdout and stderr to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
    return Service(name, proc, log)


def stop_all(services: Iterable[Service | None], timeout: float = 20) -> None:
    """`Service.stop` for all of them at once: SIGTERM to every group, then SIGKILL to whatever is
    left of any after `timeout` (a teardown waits for the slowest, not for the sum)."""
    every = [s for s in services if s is not None]
    live = every
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for s in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.proc.pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for s in live:
                s.proc.poll()  # reap the leaders so they do not linger as zombies
            live = [s for s in live if _group_alive(s.proc.pid)]
            if not live:
                break
            time.sleep(0.2)
        if not live:
            break
    for s in every:
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(timeout=5)


class ServiceFailed(AssertionError):
    """A service exited or did not come up in time. An AssertionError, so a test reports it as
    a failure; plain Python, so `benchmarks/ui.py` can use these helpers without pytest."""


def wait_until(what: str, fn: Callable[[], Any], timeout: float,
               watch: Iterable[Service] = (), interval: float = 0.5) -> Any:
    """Poll `fn` until it returns something truthy; fail with the logs of `watch` if one of them
    exits first or time runs out."""
    watch = list(watch)
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = fn()
        except Exception:  # not up yet (connection refused, partial JSON, ...)
            value = None
        if value:
            return value
        for s in watch:
            if not s.alive():
                raise ServiceFailed(f"{s.name} exited ({s.proc.returncode}) while waiting for "
                                    f"{what}:\n{s.tail()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {s.name} ({s.log}):\n{s.tail(2000)}" for s in watch)
            raise ServiceFailed(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")
        time.sleep(interval)


def run_logged(cmd: list[str], log: Path, env: dict[str, str], cwd: Path,
               timeout: float = 600) -> tuple[int, str]:
    """Run a command to completion in its own process group (killed on timeout or error);
    returns (exit code, output)."""
    svc = start(Path(cmd[0]).name, cmd, log, env=env, cwd=cwd)
    rc = svc.finish(timeout)
    return rc, log.read_text(errors="replace")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without anything that would pick a Spark or a Dagster
    instance for a child, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_MASTER_URL", "SPARK_REMOTE", "DAGSTER_HOME", "DEDUP_CONFIG",
                        "SPARK_HOME", "PYSPARK_SUBMIT_ARGS", "SPARK_CONNECT_MODE_ENABLED")
           and not k.startswith("DEDUP_SPARK_CONF_")}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP=LOOPBACK,
               PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}")
    env.update(extra)
    return env


def connect_client_env(env: dict[str, str], remote: str) -> dict[str, str]:
    """`env` for processes that are Spark Connect clients of `remote` (one warm server saves a
    Spark start-up per run): no local master, and no start-up settings (`spark.ui.*`,
    `spark.driver.*`: the server's, set on its command line)."""
    out = {k: v for k, v in env.items() if k != "SPARK_MASTER_URL" and not k.startswith(
        ("DEDUP_SPARK_CONF_spark__ui", "DEDUP_SPARK_CONF_spark__driver"))}
    out["SPARK_REMOTE"] = remote
    return out


# ---------------------------------------------------------------- Spark standalone cluster


@dataclass
class StandaloneCluster:
    """A master and workers started from the wheel's `spark-class`, all on loopback."""

    master: Service
    workers: list[Service]
    work_dirs: list[Path]
    url: str
    webui: str

    def state(self) -> dict[str, Any]:
        return http_json(f"{self.webui}/json/")

    def ready(self) -> bool:
        st = self.state()
        return st.get("status") == "ALIVE" and st.get("aliveworkers") == len(self.workers)

    def wait_ready(self, timeout: float = 120) -> None:
        wait_until(f"{len(self.workers)} workers to register with {self.url}", self.ready,
                   timeout, [self.master, *self.workers])

    def app(self, name: str) -> dict[str, Any] | None:
        st = self.state()
        for a in [*st.get("completedapps", []), *st.get("activeapps", [])]:
            if a.get("name") == name:
                return a
        return None

    def executor_tasks(self, app_id: str) -> list[int]:
        """Tasks finished by each executor of `app_id`, per worker, from the executors' logs
        in the workers' work directories (one executor per worker here)."""
        out = []
        for d in self.work_dirs:
            n = 0
            for err in (d / app_id).glob("*/stderr"):
                n += err.read_text(errors="replace").count("Finished task")
            out.append(n)
        return out

    def services(self) -> list[Service]:
        return [self.master, *self.workers]

    def stop(self) -> None:
        stop_all(self.services())


def spark_daemon_env(root: Path) -> dict[str, str]:
    return clean_env(SPARK_HOME=str(PYSPARK_HOME), SPARK_LOG_DIR=str(root / "logs"),
                     SPARK_PID_DIR=str(root / "pids"), SPARK_DAEMON_JAVA_OPTS=FAST_JVM,
                     SPARK_DAEMON_MEMORY="512m", SPARK_NO_DAEMONIZE="1")


def start_cluster(root: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
                  wait_workers: bool = True, secret: str | None = None) -> StandaloneCluster:
    """Start a master, wait for it, then start `workers` workers (each `cores` cores). With
    `secret`, as deploy/ runs it: `spark.authenticate` on, the shared secret in the daemons'
    spark-defaults.conf (owner-only), so only drivers holding it can use the cluster."""
    spark_class = str(PYSPARK_HOME / "bin" / "spark-class")
    env = spark_daemon_env(root)
    if secret is not None:
        conf_dir = root / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        defaults = conf_dir / "spark-defaults.conf"
        fd = os.open(defaults, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"spark.authenticate true\nspark.authenticate.secret {secret}\n")
        env["SPARK_CONF_DIR"] = str(conf_dir)
    port, ui = free_port(), free_port()
    master = start("spark-master", [spark_class, "org.apache.spark.deploy.master.Master",
                                    "--host", LOOPBACK, "--port", str(port), "--webui-port", str(ui)],
                   root / "master.log", env=env, cwd=root)
    cluster = StandaloneCluster(master, [], [], f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{ui}")
    try:
        wait_until("the Spark master", lambda: cluster.state().get("status") == "ALIVE", 120, [master])
        for i in range(workers):
            work = root / f"worker{i}"
            work.mkdir(parents=True, exist_ok=True)
            cluster.work_dirs.append(work)
            cluster.workers.append(start(
                f"spark-worker-{i}",
                [spark_class, "org.apache.spark.deploy.worker.Worker", cluster.url,
                 "--host", LOOPBACK, "--cores", str(cores), "--memory", memory,
                 "--webui-port", str(free_port()), "--work-dir", str(work)],
                root / f"worker{i}.log", env=env, cwd=root))
        if wait_workers:
            cluster.wait_ready()
    except BaseException:
        cluster.stop()
        raise
    return cluster


# ---------------------------------------------------------------- Spark Connect server


@dataclass
class ConnectServer:
    service: Service
    port: int

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def ready(self) -> bool:
        return port_open(self.port) and "Spark Connect server started" in self.service.tail(20000)

    def wait_ready(self, timeout: float = 180) -> None:
        wait_until(f"the Spark Connect server on port {self.port}", self.ready, timeout,
                   [self.service])

    def executions(self) -> int:
        """Plans the server has executed for clients so far (from its INFO log)."""
        return self.service.log.read_text(errors="replace").count("ExecuteHolder ExecuteKey(")

    def stop(self) -> None:
        self.service.stop()


def start_connect_server(root: Path, master: str = "local[2]",
                         conf: dict[str, str] | None = None) -> ConnectServer:
    """The wheel's `sbin/start-connect-server.sh --wait` (foreground, so its group can be killed).

    Settings Spark reads at start-up belong here, not in the client (see engine/session.py)."""
    script = PYSPARK_HOME / "sbin" / "start-connect-server.sh"
    jars = list((PYSPARK_HOME / "jars").glob("spark-connect_*.jar"))
    assert jars, f"no Spark Connect server jar in {PYSPARK_HOME / 'jars'}"
    port = free_port()
    settings = {
        "spark.connect.grpc.binding.address": LOOPBACK,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        "spark.driver.extraJavaOptions": FAST_JVM,
        **(conf or {}),
    }
    cmd = [str(script), "--wait", "--master", master]
    for k, v in settings.items():
        cmd += ["--conf", f"{k}={v}"]
    env = spark_daemon_env(root)
    svc = start("spark-connect-server", cmd, root / "connect-server.log", env=env, cwd=root)
    return ConnectServer(svc, port)


# ---------------------------------------------------------------- comparing loads


def _rows(table: Any) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def snapshot(output: str | Path) -> dict[str, Any]:
    """Everything a reader sees of a dataset's outputs: the rows of each output and of the index
    (hive partition columns included, so load hour and slice count), and the commit figures."""
    root = Path(str(output).removeprefix("file://"))
    out: dict[str, Any] = {}
    for name in (*OUTPUTS, "index"):
        d = root / name
        if (d / "_delta_log").is_dir():  # through the table: a rerun's replaced files stay on
            from deltalake import DeltaTable  # disk until a vacuum

            out[name] = _rows(DeltaTable(str(d)).to_pyarrow_table())
            continue
        out[name] = _rows(pads.dataset(d, format="parquet", partitioning="hive").to_table()) \
            if d.exists() else None
    commits = {}
    for p in sorted((root / "_commits").glob("*.json")):
        rec = json.loads(p.read_text())
        commits[p.name] = {k: rec.get(k) for k in COMMIT_FIGURES}
    out["commits"] = commits
    return out


def assert_same_loads(actual: dict[str, Any], expected: dict[str, Any], label: str) -> None:
    """Row-for-row equality of two snapshots, with a readable difference on failure."""
    assert expected["commits"], "the reference load committed nothing"
    problems = []
    for key in expected:
        a, e = actual.get(key), expected[key]
        if a == e:
            continue
        if isinstance(a, Counter) and isinstance(e, Counter):
            missing, extra = e - a, a - e
            problems.append(f"{key}: {sum(e.values())} rows expected, {sum(a.values())} found; "
                            f"missing e.g. {list(missing)[:2]}, unexpected e.g. {list(extra)[:2]}")
        else:
            problems.append(f"{key}: expected {str(e)[:600]}\n   found {str(a)[:600]}")
    assert not problems, f"{label} differs from the local-mode load:\n" + "\n".join(problems)
