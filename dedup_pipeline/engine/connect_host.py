"""The warm Spark Connect server's driver program (design.md N5): `dedup-pipeline spark-server` hands
this file to `spark-submit`, whose settings load Spark's `SparkConnectPlugin`; the program only
keeps the application alive until its JVM stops.

Why not Spark's own `SparkConnectServer` class (what `sbin/start-connect-server.sh` runs): it
forces `spark.sql.artifact.isolation.enabled=true` on the application, whatever the command line
says. With it every Connect session (every Dagster run) gets a class loader of its own, and Spark's
cache of generated code is keyed by class loader, so each run compiled its ~100 generated classes
again: a fresh run's 1e5-row load took 5.3-5.8 s against 3.7-4.0 s with isolation off (docs/notes.md,
2026-11-26). Isolation only matters to clients that upload their own jars or classes; runs of this
package upload none.

Run as a script by spark-submit (its directory is then first on `sys.path`, so it imports nothing
from this package).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# the plugin that serves Connect clients from a classic Spark application, and the setting the
# server class would force the other way
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
HOST_CONF = {"spark.plugins": CONNECT_PLUGIN, "spark.sql.artifact.isolation.enabled": "false"}
SCRIPT = Path(__file__).resolve()
LOG_LEVEL_ENV = "DEDUP_SPARK_SERVER_LOG_LEVEL"
# Spark's log of the server from its first line: the level the user chose, to stderr
LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def die_with_parent() -> None:
    """SIGTERM when this process's parent dies (Linux): the server's JVM when `spark-server`
    dies, this program when its JVM dies, so nothing is left behind."""
    import contextlib
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main() -> None:
    here = str(SCRIPT.parent)
    sys.path[:] = [p for p in sys.path if p != here]  # engine modules must not shadow others
    die_with_parent()
    from py4j.protocol import Py4JError
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()  # the plugin starts the gRPC service here
    level = os.environ.get(LOG_LEVEL_ENV)
    if level:
        spark.sparkContext.setLogLevel(level)
    context = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
    sessions = SessionLog(spark)
    while True:
        time.sleep(1)
        try:
            if context.isStopped():
                return
        except Py4JError:  # the JVM is gone
            return
        sessions.poll()


class SessionLog:
    """One line per client session started or ended (a Dagster run, a CLI load), polled once a
    second from the Connect service's session manager; Spark's own log says nothing at WARN."""

    def __init__(self, spark: object) -> None:
        self.jvm = spark._jvm  # type: ignore[attr-defined]
        self.open: dict[str, tuple[str, float]] = {}
        self.broken = False

    def _active(self) -> dict[str, str]:
        svc = getattr(self.jvm.org.apache.spark.sql.connect.service, "SparkConnectService$")
        seq = getattr(svc, "MODULE$").sessionManager().listActiveSessions()
        out = {}
        for i in range(seq.size()):
            info = seq.apply(i)
            out[str(info.sessionId())] = str(info.userId())
        return out

    def poll(self) -> None:
        if self.broken:
            return
        try:
            now = self._active()
        except Exception as err:  # an internal API: a Spark upgrade may move it
            self.broken = True
            print(f"{_stamp()} session lines unavailable: {type(err).__name__}", flush=True)
            return
        for sid, user in now.items():
            if sid not in self.open:
                self.open[sid] = (user, time.monotonic())
                print(f"{_stamp()} session started: {sid}{_user(user)}; {len(now)} open",
                      flush=True)
        for sid in [s for s in self.open if s not in now]:
            user, t0 = self.open.pop(sid)
            print(f"{_stamp()} session ended: {sid}{_user(user)} after "
                  f"{time.monotonic() - t0:.0f}s; {len(now)} open", flush=True)


def _user(user: str) -> str:
    return f" (user {user})" if user else ""


def _stamp() -> str:
    return time.strftime("%y/%m/%d %H:%M:%S")


if __name__ == "__main__":
    main()
