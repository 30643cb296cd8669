"""A PostgreSQL server from Debian's packages for the service tests: initdb into a temp dir,
password authentication, on 127.0.0.1; yields the DAGSTER_PG_* settings deploy/dagster.yaml reads.
PostgreSQL refuses to run as root: as root it runs as the `postgres` OS user."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dedup_pipeline_tests.apt import apt_install
from dedup_pipeline_tests.spark_services import LOOPBACK, Service, free_port, start, stop_all, wait_until

PG_USER = "dagster"


def _pg_bin() -> Path | None:
    """The directory of initdb/postgres: Debian's versioned dir, else PATH."""
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                    if p.parent.name.isdigit() else 0, reverse=True):
        if (d / "initdb").exists() and (d / "postgres").exists():
            return d
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


@contextlib.contextmanager
def running_postgres(db: str) -> Iterator[dict[str, str]]:
    """A fresh cluster with database `db`; skips the test when no server can be installed."""
    bindir = _pg_bin()
    if bindir is None:
        why = apt_install("postgresql")
        bindir = _pg_bin()
        if bindir is None:
            pytest.skip(f"PostgreSQL server binaries not found and could not be installed ({why})")
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            pytest.fail("PostgreSQL refuses to run as root and there is no 'postgres' OS user "
                        "(Debian's postgresql package creates it)")
    # pytest's tmp dirs are private to root; the server's user must own its data directory
    base = Path(tempfile.mkdtemp(prefix="dedup-pg-"))
    data, pwfile = base / "data", base / "pw"
    password = secrets.token_hex(12)
    pwfile.write_text(password + "\n")
    if user is not None:
        shutil.chown(base, user)
        shutil.chown(pwfile, user)
    run_as = ["runuser", "-u", user, "--"] if user else []
    svc: Service | None = None
    try:
        t0 = time.monotonic()
        subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-U", PG_USER,
                        f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, text=True, timeout=120)
        port = free_port()
        svc = start("postgres", [str(bindir / "postgres"), "-D", str(data), "-h", LOOPBACK,
                                 "-p", str(port), "-k", "", "-c", "fsync=off",
                                 "-c", "synchronous_commit=off"],
                    base / "postgres.log", user=user)
        import psycopg2

        def connect(dbname: str = "postgres") -> Any:
            return psycopg2.connect(host=LOOPBACK, port=port, user=PG_USER, password=password,
                                    dbname=dbname, connect_timeout=3)

        conn = wait_until("PostgreSQL to accept connections", connect, 60, [svc])
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {db}")
        conn.close()
        print(f"PostgreSQL up in {time.monotonic() - t0:.1f}s")
        yield {"DAGSTER_PG_HOST": LOOPBACK, "DAGSTER_PG_PORT": str(port),
               "DAGSTER_PG_USER": PG_USER, "DAGSTER_PG_PASSWORD": password,
               "DAGSTER_PG_DB": db}
    finally:
        stop_all([svc])
        shutil.rmtree(base, ignore_errors=True)
