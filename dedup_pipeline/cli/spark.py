"""Which Spark a command uses, and `spark-server`: a warm Spark Connect server (design.md N5)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from dedup_pipeline.cli.common import fail
from dedup_pipeline.config import PipelineConfig
from dedup_pipeline.engine.connect_auth import (
    CONNECT_PORT,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    ConnectTokenError,
    default_token_file,
    server_token,
)
from dedup_pipeline.engine.connect_host import LOG4J2, LOG_LEVEL_ENV, die_with_parent
from dedup_pipeline.engine.session import (
    DEFAULT_MASTER,
    SparkSettings,
    server_command,
)
from dedup_pipeline.redaction import redact_url

SPARK_NOISE = "Spark is starting (10-20 s the first time)..."


def spark_note(cfg: PipelineConfig | None) -> str:
    """Which Spark the command uses: the Connect server the environment or the config names, or
    local Spark starting (and how to use a warm server instead)."""
    sp = cfg.spark if cfg is not None else None
    s = SparkSettings(sp.master if sp else None, sp.remote if sp else None,
                      dict(sp.conf) if sp else {}).resolved()
    if s.remote:
        src = "SPARK_REMOTE" if os.environ.get("SPARK_REMOTE") else "spark.remote of the config"
        return f"Spark: the Connect server at {redact_url(s.remote)} ({src})"
    return (f"{SPARK_NOISE} (local Spark; with `dedup-pipeline spark-server` running, export "
            "SPARK_REMOTE=sc://127.0.0.1:15002 to use its warm Spark instead)")


@click.command("spark-server")
@click.option("--port", default=None, type=click.IntRange(1, 65535),
              help="gRPC port  [default: 15002]")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on (0.0.0.0: every interface; clients elsewhere send the "
              "token over TLS only: put a TLS proxy in front, docs/operations.md \"Security\")")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"the file holding the token clients must send (owner-only; created with a "
              f"new token if missing)  [default: {TOKEN_ENV}, else the file {TOKEN_FILE_ENV} "
              f"names, else {default_token_file()}]")
@click.option("--master", default=None, help="where the server's jobs run: local[*], "
              "spark://host:7077, k8s://…  [default: SPARK_MASTER_URL, else local[*]]")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE",
              help="a Spark setting for the server (repeatable), e.g. spark.driver.memory=4g")
@click.option("--log-level", default="WARN", show_default=True,
              type=click.Choice(["ERROR", "WARN", "INFO", "DEBUG"], case_sensitive=False),
              help="Spark's log level; a line per client session started or ended is printed "
                   "at any level")
def spark_server(port: int | None, host: str, token_file: Path | None, master: str | None,
                 confs: tuple[str, ...], log_level: str) -> None:
    """Run a warm Spark Connect server in the foreground, with this package's start-up settings;
    point runs at it with SPARK_REMOTE (printed when it is ready). Every client must send its
    token (design.md N6). Ctrl-C stops it."""
    port = port or CONNECT_PORT
    conf = {}
    for c in confs:
        k, sep, v = c.partition("=")
        if not sep or not k.strip():
            fail(f"--conf {c!r}: expected KEY=VALUE")
        conf[k.strip()] = v
    master = master or os.environ.get("SPARK_MASTER_URL") or DEFAULT_MASTER
    probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host

    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection((probe, port), timeout=1):
            return True
        return False

    if listening():
        fail(f"{probe}:{port} is already in use (another Spark Connect server?); "
              f"pick another --port")
    if any(k.lower() == "spark.connect.authenticate.token" for k in conf):
        fail(f"--conf spark.connect.authenticate.token would show the token to every user of "
             f"this host (`ps`): use --token-file or {TOKEN_ENV}")
    try:
        token, source = server_token(token_file)
    except ConnectTokenError as e:
        fail(str(e))
    log_dir = Path(tempfile.mkdtemp(prefix="dedup-spark-server-"))  # 0700
    cmd = server_command(master, host, port, conf, secrets_dir=log_dir)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE")}
    env["SPARK_CONNECT_MODE"] = "0"  # start a classic JVM server, not a client of one
    env[TOKEN_ENV] = token  # the server reads it here: never on a command line
    # spark-submit runs the server's driver program (engine/connect_host.py) with this Python
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # the server's driver is spark-submit's own JVM (client mode): SPARK_SUBMIT_OPTS reach it
    log_conf = log_dir / "log4j2.properties"
    log_conf.write_text(LOG4J2.format(level=log_level.lower()))
    env["SPARK_SUBMIT_OPTS"] = (env.get("SPARK_SUBMIT_OPTS", "") +
                                f" -Dlog4j2.configurationFile=file:{log_conf}").strip()
    env[LOG_LEVEL_ENV] = log_level.upper()
    click.echo(f"starting a Spark Connect server on {host}:{port}, master {master}, Spark log "
               f"level {log_level.upper()} (10-30 s)...")
    # Same process group as this command, so a supervisor that kills the group (or a terminal's
    # Ctrl-C) reaches the JVM too; it also gets SIGTERM if this process dies (Linux).
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)  # also when started with SIGINT ignored (`cmd &`)
    signal.signal(signal.SIGTERM, stop)
    loopback = probe in ("127.0.0.1", "::1", "localhost")
    url = f"sc://{probe}:{port}"
    click.echo(f"clients must send the token from {source}" + (
        f"; clients on this host read {default_token_file()}" if token_file is None
        and source.startswith(str(default_token_file())) else
        f"; give it to clients as {TOKEN_ENV} or a file named by {TOKEN_FILE_ENV}"))
    if not loopback:
        click.echo(f"listening on {host}: clients on other hosts send the token over TLS only; "
                   "reach this server through a TLS proxy (docs/operations.md, \"Security\")")
    try:
        while proc.poll() is None and not listening():
            time.sleep(0.5)
        if proc.poll() is None:
            click.echo(f"Spark Connect server ready. Point runs (and `dg dev`) at it:\n"
                       f"  export SPARK_REMOTE={url}\n(Ctrl-C stops it)")
        rc = proc.wait()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan the JVM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        click.echo("stopping the Spark Connect server...")
        proc.terminate()  # the JVM (spark-submit execs it): its shutdown hooks stop Spark
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(log_dir, ignore_errors=True)
        click.echo("stopped")
        return
    shutil.rmtree(log_dir, ignore_errors=True)
    fail(f"the Spark Connect server {url} exited with code {rc} (its log is above)")
