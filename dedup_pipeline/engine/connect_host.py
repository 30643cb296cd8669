"""The warm Spark Connect server's driver program (SPEC N5): `dedup-pipeline spark-server` hands
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

import sys
import time
from pathlib import Path

# the plugin that serves Connect clients from a classic Spark application, and the setting the
# server class would force the other way
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
HOST_CONF = {"spark.plugins": CONNECT_PLUGIN, "spark.sql.artifact.isolation.enabled": "false"}
SCRIPT = Path(__file__).resolve()


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
    context = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
    while True:
        time.sleep(1)
        try:
            if context.isStopped():
                return
        except Py4JError:  # the JVM is gone
            return


if __name__ == "__main__":
    main()
