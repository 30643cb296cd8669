"""No open doors, no leaked secret (design.md N6; docs/operations.md, "Security").

The path a deployment uses, with real parts on loopback: `dedup-pipeline spark-server` with a
token file (created by the command, owner-only), the S3A jars and the S3 store's keys in its
environment; nginx (Debian's) in front of it with deploy/tls/spark-connect-proxy.conf and the
certificates deploy/tls/make-certs.sh writes; a Dagster instance on PostgreSQL (password auth)
from deploy/dagster.yaml; a dataset whose landing zone and outputs live on SeaweedFS. Runs are
`dedup-pipeline run` processes, Spark Connect clients over TLS with the token.

Checked: a client with the token loads hours exactly as the reference model says; one with no
token, a wrong token or a CA it does not trust is refused in one line naming the fix; the
command refuses a token file others can read and a token on its command line; no process's
command line holds a secret; and after runs that succeeded, failed and were refused, no secret's
value (the Connect token, the PostgreSQL password, the S3 secret key) is in any log file, CLI
output, event of the instance (metadata, run config, tags), commit record, contract file, Delta
log or other object the product wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from dedup_pipeline.config import load_config
from dedup_pipeline.engine.session import s3_jars_cached
from dedup_pipeline.hours import parse_hour
from dedup_pipeline_tests.apt import apt_install
from dedup_pipeline_tests.postgres_service import running_postgres
from dedup_pipeline_tests.reference import Reference
from dedup_pipeline_tests.spark_services import (
    LOOPBACK,
    REPO,
    VENV_BIN,
    clean_env,
    free_port,
    port_open,
    start,
    stop_all,
    wait_until,
)
from dedup_pipeline_tests.test_s3_loads import engine_rows, generated_on_s3

pytestmark = pytest.mark.slow

DEPLOY = REPO / "deploy"
HOURS = ["2026-11-01-00:00", "2026-11-01-01:00", "2026-11-01-02:00"]
CLI = str(VENV_BIN / "dedup-pipeline")


def _nginx() -> str:
    """Debian's nginx (installed if missing; root's PATH may lack /usr/sbin)."""
    def find() -> str | None:
        return shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin")

    if find() is None:
        why = apt_install("nginx-light")
        if find() is None:
            pytest.skip(f"nginx not found and could not be installed ({why})")
    return str(find())


def _proxy_conf(root: Path, listen: int, upstream: int, certs: Path) -> Path:
    """deploy/tls/spark-connect-proxy.conf with this test's ports and certificate paths, inside
    the main configuration the nginx image would give it."""
    server = (DEPLOY / "tls" / "spark-connect-proxy.conf").read_text()
    for old, new in (("listen 15002 ", f"listen {LOOPBACK}:{listen} "),
                     ("grpc://127.0.0.1:15003", f"grpc://127.0.0.1:{upstream}"),
                     ("/etc/nginx/certs/", f"{certs}/")):
        assert old in server, old
        server = server.replace(old, new)
    (root / "server.conf").write_text(server)
    main = root / "nginx.conf"
    main.write_text(
        f"daemon off;\nworker_processes 1;\npid {root}/nginx.pid;\nerror_log {root}/error.log;\n"
        f"events {{}}\nhttp {{\n  client_body_temp_path {root}/body;\n"
        f"  include {root}/server.conf;\n}}\n")
    return main


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def stack(s3_store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not s3_jars_cached():
        pytest.skip("no S3A connector jars cached: run scripts/fetch_jars.sh")
    nginx = _nginx()
    root = tmp_path_factory.mktemp("security")
    cfg_home = root / "xdg"  # no default token file: clients get the token only as told
    certs = root / "certs"
    made = subprocess.run([str(DEPLOY / "tls" / "make-certs.sh"), str(certs), "localhost"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert oct((certs / "server.key").stat().st_mode & 0o777) == "0o600"
    token_file = root / "connect-token"
    outputs: list[str] = []
    services = []
    with running_postgres("dagster_security_test") as pg:
        try:
            home = root / "dagster_home"
            home.mkdir()
            shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
            port, tls_port = free_port(), free_port()
            server_env = clean_env(**s3_store.env, XDG_CONFIG_HOME=str(cfg_home))
            server = start("spark-server", [
                CLI, "spark-server", "--port", str(port), "--token-file", str(token_file),
                "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                "--conf", "spark.sql.shuffle.partitions=2"], root / "server.log", env=server_env)
            services.append(server)
            proxy = start("nginx", [nginx, "-c", str(_proxy_conf(root, tls_port, port, certs)),
                                    "-e", str(root / "error.log")], root / "nginx.log")
            services.append(proxy)

            tmp = root / "data"
            lake = f"s3://{s3_store.bucket('security')}"
            cfg = generated_on_s3(s3_store, tmp, lake, len(HOURS) + 1, 300, root / "dedup.yaml")
            wait_until("`spark-server` to be ready",
                       lambda: "Spark Connect server ready" in server.tail(20000), 240, [server])
            wait_until("nginx to listen", lambda: port_open(tls_port), 30, [proxy])
            client = clean_env(
                **s3_store.env, **pg, DAGSTER_HOME=str(home), XDG_CONFIG_HOME=str(cfg_home),
                SPARK_REMOTE=f"sc://{LOOPBACK}:{tls_port}/;use_ssl=true",
                GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(certs / "ca.pem"),
                DEDUP_SPARK_CONNECT_TOKEN_FILE=str(token_file))
            yield {"root": root, "home": home, "cfg": cfg, "local": tmp / "dedup.yaml",
                   "client": client, "server": server, "token_file": token_file, "pg": pg,
                   "store": s3_store, "lake": lake, "outputs": outputs, "certs": certs,
                   "secrets": {"the Connect token": token_file.read_text().strip(),
                               "the PostgreSQL password": pg["DAGSTER_PG_PASSWORD"],
                               "the S3 secret key": s3_store.secret_key}}
        finally:
            stop_all(services)


@contextlib.contextmanager
def _instance(stack: dict[str, Any]) -> Iterator[dg.DagsterInstance]:
    """The runs' instance (deploy/dagster.yaml on PostgreSQL; its settings from the environment)."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in stack["pg"].items():
            mp.setenv(k, v)
        with dg.DagsterInstance.from_config(str(stack["home"])) as inst:
            yield inst


def _run(stack: dict[str, Any], env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    r = cli(env, *args)
    stack["outputs"].append(r.stdout + r.stderr)
    return r


def test_the_token_file_is_created_owner_only_and_no_command_line_holds_a_secret(
        stack: dict[str, Any]) -> None:
    assert oct(stack["token_file"].stat().st_mode & 0o777) == "0o600"
    assert len(stack["secrets"]["the Connect token"]) >= 32
    log = stack["server"].tail(50000)
    assert f"clients must send the token from {stack['token_file']} (created)" in log
    hits = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        hits += [f"{cmdline.parent.name}: {name}" for name, value in stack["secrets"].items()
                 if value in text]
    assert hits == []


def test_a_run_over_tls_with_the_token_loads_hours_exactly(
        stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    r = _run(stack, stack["client"], "run", "--config", str(stack["cfg"]), "--from", HOURS[0],
             "--to", HOURS[1])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Spark: the Connect server at sc://127.0.0.1" in r.stdout + r.stderr
    ds = load_config(str(stack["cfg"])).datasets[0]
    ref = Reference(load_config(str(stack["local"])).datasets[0])
    for k, v in stack["store"].env.items():  # read the tables as a user's script would
        monkeypatch.setenv(k, v)
    for h in HOURS[:2]:
        expected = ref.load(parse_hour(h)).rows
        for name in ("unique", "duplicates", "expired", "rejected"):
            assert engine_rows(ds, name, h[:13]) == expected[name], (h, name)
    with _instance(stack) as inst:
        assert [r.status for r in inst.get_runs()] == [dg.DagsterRunStatus.SUCCESS]


@pytest.mark.parametrize("case", ["no token", "a wrong token", "an untrusted CA"])
def test_a_client_without_the_right_token_or_trust_is_refused_in_one_line(
        stack: dict[str, Any], case: str) -> None:
    env = dict(stack["client"])
    expect = {
        "no token": "refused this client: no token sent",
        "a wrong token": "refused this client: a wrong token in SPARK_CONNECT_AUTHENTICATE_TOKEN",
        "an untrusted CA": "presents a certificate this client does not trust",
    }[case]
    if case != "a wrong token":
        del env["DEDUP_SPARK_CONNECT_TOKEN_FILE"]
    if case == "a wrong token":
        del env["DEDUP_SPARK_CONNECT_TOKEN_FILE"]
        env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = "not-the-token"
    if case == "an untrusted CA":
        env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = stack["secrets"]["the Connect token"]
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(stack["certs"] / "server.pem")  # not a CA
    r = _run(stack, env, "run", "--config", str(stack["cfg"]), "--from", HOURS[2], "--to",
             HOURS[2])
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expect in errors[0], r.stdout[-3000:] + r.stderr[-3000:]


def test_spark_server_refuses_a_token_others_can_read_or_on_its_command_line(
        stack: dict[str, Any], tmp_path: Path) -> None:
    loose = tmp_path / "token"
    loose.write_text("a-token-others-can-read\n")
    loose.chmod(0o640)
    env = clean_env(XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    r = cli(env, "spark-server", "--port", str(free_port()), "--token-file", str(loose))
    assert r.returncode == 1 and f"chmod 600 {loose}" in r.stdout + r.stderr
    r = cli(env, "spark-server", "--port", str(free_port()), "--conf",
            "spark.connect.authenticate.token=abc")
    assert r.returncode == 1 and "use --token-file" in r.stdout + r.stderr
    assert not (tmp_path / "xdg").exists()  # refused before any token file was made


def test_no_secret_in_logs_events_records_or_tables(stack: dict[str, Any]) -> None:
    """After runs that succeeded, were refused (above) and failed (a key changed: a contract
    error naming the config), every place the product and Dagster wrote is searched for each
    secret's value."""
    raw = yaml.safe_load(stack["cfg"].read_text())
    raw["datasets"][0]["key"] = ["event_id", "user_id"]
    bad = stack["root"] / "changed.yaml"
    bad.write_text(yaml.safe_dump(raw, sort_keys=False))
    r = _run(stack, stack["client"], "run", "--config", str(bad), "--from", HOURS[2], "--to",
             HOURS[2])
    assert r.returncode == 1 and "key changed" in r.stdout + r.stderr, r.stdout[-2000:]
    for args in (["verify", "--config", str(stack["cfg"])],
                 ["explain", "--config", str(stack["cfg"]), "--dataset", "clicks", "--key",
                  "event_id=no-such-key"]):
        _run(stack, stack["client"], *args)

    places: dict[str, bytes] = {}
    for i, out in enumerate(stack["outputs"]):
        places[f"CLI output {i}"] = out.encode()
    for f in stack["root"].rglob("*"):
        if f.is_file() and f.name not in ("connect-token", "server.key") and \
                f.parent.name != "xdg":
            places[str(f)] = f.read_bytes()
    with _instance(stack) as inst:
        runs = inst.get_runs()
        assert {r.status for r in runs} >= {dg.DagsterRunStatus.SUCCESS,
                                            dg.DagsterRunStatus.FAILURE}
        for run in runs:
            places[f"run {run.run_id}"] = json.dumps(
                {"config": run.run_config, "tags": run.tags}, default=str).encode()
            places[f"events of {run.run_id}"] = "\n".join(
                dg.serialize_value(e) for e in inst.all_logs(run.run_id)).encode()
    store, bucket = stack["store"], stack["lake"].removeprefix("s3://")
    c = store.client()
    keys = store.keys(bucket)
    assert any("_commits/" in k for k in keys) and any("_delta_log/" in k for k in keys)
    assert any("_contract/" in k for k in keys)
    for k in keys:
        places[f"s3://{bucket}/{k}"] = c.get_object(Bucket=bucket, Key=k)["Body"].read()
    hits = [f"{name} in {where}" for where, data in places.items()
            for name, value in stack["secrets"].items() if value.encode() in data]
    assert len(places) > 50 and hits == []
