"""Build the SparkSession from config and environment (design.md C3), without Dagster.

Precedence: environment (SPARK_REMOTE, SPARK_MASTER_URL, DEDUP_SPARK_CONF_<KEY>) over the config
file's `spark:` section over defaults. DEDUP_SPARK_CONF_spark__sql__shuffle__partitions=8 sets
`spark.sql.shuffle.partitions` (double underscore -> dot).

Masters: `local[*]` (default), `spark://host:7077` (standalone; this process is the driver, so
executors must reach it: set `spark.driver.host`), `k8s://…`, `yarn`. With SPARK_REMOTE
(`sc://host:15002`) the session is a Spark Connect client: no JVM here, and only SQL session
settings can be set from this side; settings Spark reads at start-up (`spark.hadoop.*`,
`spark.executor.*`, `spark.ui.*`) belong on the Connect server's command line.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from dedup_pipeline.engine.connect_auth import (
    ConnectTokenError,
    check_tls,
    client_url,
    connect_address,
    is_auth_refusal,
    refusal,
    uses_tls,
)
from dedup_pipeline.engine.connect_host import CONNECT_PLUGIN, HOST_CONF, SCRIPT
from dedup_pipeline.errors import UserError
from dedup_pipeline.objectstore import COMMITTER_CLASS, S3A_CLASS, S3Settings, any_s3
from dedup_pipeline.redaction import is_secret_setting, redact_url

DEFAULT_MASTER = "local[*]"
PARALLEL_GC = "-XX:+UseParallelGC"
# Settings every load relies on; a user may override any of them.
BASE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "16",
    "spark.sql.adaptive.enabled": "true",
    # let adaptive execution coalesce the shuffle partitions of cached plans too (the batch and
    # its classification are cached): an hour's window otherwise runs as 16 tiny tasks
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
    # a load caches its batch and its classification for a few seconds: building compressed
    # column batches cost more than the parse itself (measured 1.23 s vs 0.83 s per 1e5 rows)
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # a landing Parquet file with nanosecond timestamps (pandas' default) is otherwise an
    # AnalysisException that stops the load; read as long, parse.py turns them into timestamps
    "spark.sql.legacy.parquet.nanosAsLong": "true",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # a load names its index files explicitly (a few hundred at most): list them on the driver
    # instead of starting a Spark job to list them once there are more than 32
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
    # a load runs ~50 distinct generated classes; with the default cache of 100 they evict each
    # other across the load's queries, so every load recompiled ~60 of them with Janino and the
    # JVM JIT-compiled the new classes again: measured 8-13 CPU-s of JIT per 1e5-row load on 2
    # cores (loads 9.5-12 s), against 2.5-5.5 s (loads 5-7 s) with this. Static: start-up only.
    "spark.sql.codegen.cache.maxEntries": "2000",
    # the throughput collector instead of the JVM's default G1: warm 1e5-row loads took 2.83 s
    # instead of 3.95 s (median of hours 15-29, same machine and session settings), 4.5 instead
    # of 6.5 CPU-s, and a lower resident set (docs/notes.md, 2026-11-25). A load is a batch job
    # that wants throughput; G1's short pauses buy it nothing. Start-up settings: a user's own
    # extraJavaOptions replace these (add -XX:+UseParallelGC to them to keep it).
    "spark.driver.extraJavaOptions": PARALLEL_GC,
    "spark.executor.extraJavaOptions": PARALLEL_GC,
}
# Settings Spark reads only when the session starts: a Spark Connect client cannot set them
STATIC_CONF = {"spark.sql.codegen.cache.maxEntries"}
CONF_PREFIX = "DEDUP_SPARK_CONF_"

# The warm Spark Connect server (design.md N5; `dedup-pipeline spark-server`, deploy/; its port:
# connect_auth.CONNECT_PORT). Settings only the server takes, on top of BASE_CONF (which it gets
# whole: its start-up part can be set nowhere else, its SQL part is the default of every client
# session).
SERVER_CONF = {
    # a run that dies (killed pod, restarted code server) never closes its session; its cached
    # batch stays on the server until the session expires: 15 minutes instead of Spark's 60
    "spark.connect.session.manager.defaultSessionTimeout": "15min",
}


@dataclass(frozen=True)
class SparkSettings:
    master: str | None = None
    remote: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    app_name: str = "dedup_pipeline"

    def resolved(self) -> SparkSettings:
        """Apply the environment on top of these settings."""
        conf = {**BASE_CONF, **self.conf}
        for k, v in os.environ.items():
            if k.startswith(CONF_PREFIX):
                conf[k[len(CONF_PREFIX):].replace("__", ".")] = v
        remote = os.environ.get("SPARK_REMOTE") or self.remote
        master = os.environ.get("SPARK_MASTER_URL") or self.master
        if remote:
            master = None
        elif not master:
            master = DEFAULT_MASTER
        return SparkSettings(master, remote, conf, self.app_name)


def session_conf(s: SparkSettings) -> dict[str, str]:
    """The settings to hand the builder. On Spark Connect, the built-in defaults that are not SQL
    session settings are dropped (the server owns them; setting them from a client only warns);
    a user's own settings are always passed, so a misplaced one is reported by Spark."""
    if not s.remote:
        return dict(s.conf)
    return {k: v for k, v in s.conf.items()
            if (k.startswith("spark.sql.") and k not in STATIC_CONF) or BASE_CONF.get(k) != v}


def check_server(remote: str, timeout: float = 5.0, url: str | None = None) -> None:
    """Fail in one line when nothing listens at `remote`: the Connect client would otherwise
    retry for about ten minutes, a run sitting in STARTED with no error."""
    host, port = connect_address(remote)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        raise SparkServerError(
            f"no Spark Connect server answers at {redact_url(remote)} (SPARK_REMOTE): "
            f"{e.strerror or e}; "
            "start one with `dedup-pipeline spark-server`, or unset SPARK_REMOTE to run on local "
            "Spark") from None
    if uses_tls(url or client_url(remote)):  # `url`: client_url(remote), if already made
        check_tls(remote, host, port, timeout)


def connect_session_exists() -> bool:
    """Whether this process already has a Spark Connect session (which `get_session` reuses)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # no connect extra: no Connect session either
        return False
    return (ConnectSession._get_default_session() is not None  # noqa: SLF001 - no public twin
            or ConnectSession.getActiveSession() is not None)


class S3ConnectorError(UserError, RuntimeError):
    """Spark cannot reach S3: its S3A connector is not on the classpath (design.md C4)."""

    stage = "Spark's S3 connector (hadoop-aws)"
    fix = "run scripts/fetch_jars.sh, or give Spark the jars yourself (spark.jars.packages)"


# Where scripts/fetch_jars.sh caches the S3A connector's jars, per Spark and Hadoop version.
JARS_CACHE_ENV = "DEDUP_SPARK_JARS_CACHE"


def spark_versions() -> tuple[str, str]:
    """The installed pyspark's Spark version and the Hadoop client version inside it."""
    jars = spark_home() / "jars"
    core = next(jars.glob("spark-core_*.jar"), None)
    api = next(jars.glob("hadoop-client-api-*.jar"), None)
    spark = core.stem.rsplit("-", 1)[1] if core else "unknown"
    hadoop = api.stem[len("hadoop-client-api-"):] if api else "unknown"
    return spark, hadoop


def s3_jars_dir() -> Path:
    """The cache directory of the S3A jars matching the installed pyspark."""
    base = os.environ.get(JARS_CACHE_ENV) or str(Path.home() / ".cache" / "dedup_pipeline" /
                                                   "spark-jars")
    spark, hadoop = spark_versions()
    return Path(base) / f"spark-{spark}-hadoop-{hadoop}"


def s3_jars_cached() -> bool:
    return (s3_jars_dir() / ".complete").exists()


def s3_conf(conf: Mapping[str, str], master: str | None = None) -> dict[str, str]:
    """What a session or the Connect server needs to read and write ``s3a://``: S3A's settings
    from the environment (objectstore.py; the keys as settings only for executors on other hosts:
    a `master` that is not local), then `conf` (the user's win), with the cached connector jars
    added to `spark.jars`. `S3ConnectorError` when neither the cache nor the user's own settings
    bring the connector."""
    remote_executors = master is not None and not master.startswith("local")
    out = {**S3Settings.from_env().spark_conf(credentials=remote_executors), **conf}
    jars_dir = s3_jars_dir()
    cached = sorted(str(p) for p in jars_dir.glob("*.jar")) if (jars_dir / ".complete").exists() \
        else []
    theirs = " ".join(conf.get(k, "") for k in ("spark.jars", "spark.jars.packages",
                                                 "spark.driver.extraClassPath"))
    if not cached and "hadoop-aws" not in theirs:
        spark, hadoop = spark_versions()
        raise S3ConnectorError(
            f"a dataset lives on S3, and Spark {spark} has no S3A connector: no jars in "
            f"{jars_dir}. Run scripts/fetch_jars.sh (Maven fetches hadoop-aws {hadoop}, the AWS "
            f"SDK v2 modules and spark-hadoop-cloud), or set spark.jars.packages to "
            f"org.apache.hadoop:hadoop-aws:{hadoop} and spark-hadoop-cloud yourself; on EMR, "
            "Databricks and Dataproc the connector is built in (docs/operations.md, \"Running on "
            "S3\")")
    if cached:
        out["spark.jars"] = ",".join([*cached, *[j for j in conf.get("spark.jars", "").split(",")
                                                   if j.strip()]])
    return out


def check_s3_classes(spark: SparkSession) -> None:
    """After the session starts: the connector and the committer load (a session this process
    already had may have started without them; getOrCreate ignores new jars)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return  # Spark Connect: the server's classpath, not visible from here
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j: the one way to ask the driver's JVM
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    for cls in (S3A_CLASS, COMMITTER_CLASS):
        try:
            jvm.java.lang.Class.forName(cls, False, loader)
        except Exception as e:  # noqa: BLE001 - py4j's error for a missing class
            raise S3ConnectorError(
                f"a dataset lives on S3, and this process's Spark session has no {cls} (it was "
                f"started without the S3A jars, or they do not match Spark): {str(e)[:200]}. Run "
                "scripts/fetch_jars.sh and start the run in a new process") from None


def get_session(settings: SparkSettings, roots: Iterable[str] = ()) -> SparkSession:
    """Create (or reuse) the process's session. Never called while definitions load.

    `roots`: the dataset paths the session will read and write; any ``s3://``/``s3a://`` one
    brings S3A's settings and jars (`s3_conf`), checked before any work."""
    s = settings.resolved()
    s3 = any_s3(roots)
    url = client_url(s.remote) if s.remote else None  # with its token (connect_auth.py)
    if s.remote:
        check_server(s.remote, url=url)
    conf = session_conf(s)
    if s3 and not s.remote:
        conf = s3_conf(conf, s.master)
    builder = SparkSession.builder.appName(s.app_name)
    builder = builder.remote(url) if url else builder.master(s.master or DEFAULT_MASTER)
    for k, v in conf.items():
        builder = builder.config(k, v)
    try:
        spark = builder.getOrCreate()  # a Connect client's first request: its token checked
        if s3:
            check_s3_classes(spark)
        if s.remote:
            limit_connect_retries(spark)
        for k in ("spark.sql.session.timeZone", "spark.sql.parquet.outputTimestampType",
                  "spark.sql.legacy.parquet.nanosAsLong"):
            spark.conf.set(k, s.conf[k])  # runtime settings also apply to a reused session
    except Exception as e:
        if s.remote and is_auth_refusal(e):
            raise ConnectTokenError(
                f"the Spark Connect server at {redact_url(s.remote)} refused this client: "
                f"{refusal(s.remote)}") from None
        raise
    return spark


# How often a run's Connect client retries a server it cannot reach. The client's default (15
# retries, backoff x4 up to 60 s: at least 10 minutes) only helps a server that comes back with the
# run's session, which a restarted server never has (the run then fails anyway, SparkServerError),
# so a server lost for good kept its runs STARTED for 10+ minutes. 6 retries (50 ms x4 up to 51.2 s
# apart, ~68 s in all) still ride out a network blip.
CONNECT_RETRIES = 6


def limit_connect_retries(spark: SparkSession) -> None:
    """Make the Connect client give up on an unreachable server after CONNECT_RETRIES."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark.client.set_retry_policies([DefaultPolicy(max_retries=CONNECT_RETRIES)])  # type: ignore[attr-defined]


def server_conf(host: str, port: int, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Connect server's settings: BASE_CONF, SERVER_CONF, the gRPC address, then `conf` and
    DEDUP_SPARK_CONF_* from the environment (same precedence as a run's own settings)."""
    mine = {**SERVER_CONF, "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port), **(conf or {})}
    out = SparkSettings(conf=mine).resolved().conf
    # with the S3A jars fetched, a server serves s3:// datasets too (its credentials: its own
    # environment or instance profile, never a setting on its command line)
    return s3_conf(out) if s3_jars_cached() else out


def spark_home() -> Path:
    """The Spark distribution the server starts from: SPARK_HOME, else the pyspark wheel."""
    import pyspark

    return Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).resolve().parent)


def server_command(master: str, host: str, port: int,
                   conf: Mapping[str, str] | None = None,
                   secrets_dir: Path | None = None) -> list[str]:
    """`spark-submit` of the Connect server in the foreground: `connect_host.py` as a classic
    application with Spark's Connect plugin and per-session artifact isolation off (why: that
    module's docstring), not the SparkConnectServer class that sbin/start-connect-server.sh runs.

    Secret settings (`spark.authenticate.secret`, S3A keys, …: redaction.py) go into a properties
    file in `secrets_dir` (owner-only) instead of the command line, which `ps` shows to all."""

    settings = {**HOST_CONF, **server_conf(host, port, conf)}  # a user may turn isolation on
    plugins = [p for p in settings["spark.plugins"].split(",") if p.strip()]
    settings["spark.plugins"] = ",".join(dict.fromkeys([*plugins, CONNECT_PLUGIN]))
    cmd = [str(spark_home() / "bin" / "spark-submit"),
           "--name", "Spark Connect server (dedup_pipeline)", "--master", master]
    hidden = {k: v for k, v in settings.items() if is_secret_setting(k)}
    if hidden:
        if secrets_dir is None:
            raise ValueError("secret settings need a secrets_dir")
        props = secrets_dir / "secret.properties"
        fd = os.open(props, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{k}={_escape_property(v)}\n" for k, v in hidden.items())
        cmd += ["--properties-file", str(props), "--load-spark-defaults"]
    for k, v in settings.items():
        if k not in hidden:
            cmd += ["--conf", f"{k}={v}"]
    return [*cmd, str(SCRIPT)]


def _escape_property(value: str) -> str:
    """`value` as a Java properties file reads it back."""
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return ("\\" + out) if out[:1] in (" ", "\t") else out


class SparkServerError(UserError, RuntimeError):
    """The Spark Connect server went away or was replaced while a run used it: its session (cached
    batch, settings) is gone, so the run stops instead of going on with a different server."""

    stage = "the Spark Connect server (restarted or unreachable)"
    fix = ("make sure the server is up, then rerun {hours}: hours before the failing one are "
           "committed, the failing one committed nothing (R10)")


# What a Connect client raises when the server it talks to restarted or cannot be reached.
_RESTARTED = ("INVALID_HANDLE.SESSION_CHANGED", "INVALID_HANDLE.SESSION_NOT_FOUND",
              "INVALID_HANDLE.SESSION_CLOSED", "INVALID_HANDLE.OPERATION_NOT_FOUND",
              "server side session identifier")
_UNREACHABLE = ("failed to connect to all addresses", "Connection refused", "Socket closed",
                "Connection reset",
                # the server killed while it streamed a result: HTTP/2 reset the stream (seen in CI)
                "Stream removed")
# a server killed mid-query can answer it while its context shuts down (seen in CI)
_STOPPING = ("Cannot call methods on a stopped SparkContext",)


def lost_server_reason(exc: BaseException) -> str | None:
    """Why `exc` means the Connect server was lost (restarted, unreachable), or None if it is an
    ordinary error (a bad query, a storage error) that must surface as it is."""
    fallback = None
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        # the client's own errors only: a storage error saying "Connection reset" is not ours
        if type(e).__module__.startswith(("pyspark", "grpc")):
            text = f"{getattr(e, 'getCondition', lambda: None)()} {e}"
            for t in _RESTARTED:
                if t in text:
                    return f"was restarted ({t})"
            for t in _UNREACHABLE:
                if t in text:
                    return f"became unreachable ({t})"
            for t in _STOPPING:
                if t in text:
                    return f"was shutting down ({t})"
            # on SESSION_CHANGED the client closes itself and then fails to fetch the error's
            # details: NO_ACTIVE_SESSION is all that is left (a load never closes its session)
            if "NO_ACTIVE_SESSION" in text:
                fallback = "was restarted (the client lost its session: NO_ACTIVE_SESSION)"
        e = e.__cause__ or e.__context__
    return fallback


def _session_lost(exc: BaseException, spark: SparkSession | None) -> str | None:
    """Why the server no longer serves `spark`'s session, asked of the server itself after an
    error it raised: a server killed mid-query can answer with anything its half-stopped driver
    throws (a NullPointerException from a plan whose session is gone, seen in CI), which no list
    of messages can foresee. A healthy server answers the probe at once, so a bad query still
    surfaces as it is; a lost one fails it (SESSION_CHANGED once restarted, or the client's
    retries when it stays away)."""
    if spark is None or not hasattr(spark, "client"):
        return None
    if not type(exc).__module__.startswith(("pyspark", "grpc")):
        return None  # the client's own errors only (a storage error is not the server's)
    try:
        spark.client.get_configs("spark.app.id")
    except Exception as probe:
        return (lost_server_reason(probe)
                or f"stopped serving the run's session ({type(probe).__name__} on a probe)")
    return None


@contextlib.contextmanager
def connect_errors(remote: str | None, spark: SparkSession | None = None) -> Iterator[None]:
    """Turn a lost Spark Connect server into one line naming it (SparkServerError), and close
    `spark`'s client: its exit clean-up would otherwise retry the lost server (~1 minute) after
    the run has already failed."""
    try:
        yield
    except Exception as e:
        why = remote and (lost_server_reason(e) or _session_lost(e, spark))
        if not why:
            raise
        if spark is not None and hasattr(spark, "client"):
            with contextlib.suppress(Exception):
                spark.client.close()
        raise SparkServerError(f"Spark Connect server {redact_url(remote)} {why} during the run; "
                               "rerun the hours that did not commit (loads are idempotent, R10)"
                               ) from e
