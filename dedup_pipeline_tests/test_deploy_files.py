"""deploy/ checked statically (Docker cannot run here; test_service.py runs the same dagster.yaml
and workspace.yaml with real processes): the compose file, the Dockerfiles, the Helm values and
the Dagster files parse, name the services and variables a deployment needs, build their images
from this repository, and agree with each other. No Spark, no network.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config
from dagster._core.storage.config import pg_config
from dagster._core.workspace.config_schema import process_workspace_config

from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML
from dedup_pipeline.redaction import is_secret_setting

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROXY_CONF = DEPLOY / "tls" / "spark-connect-proxy.conf"
PG_VARS = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD",
           "DAGSTER_PG_DB")
CODE_SERVER_VARS = ("DAGSTER_CODE_SERVER_HOST", "DAGSTER_CODE_SERVER_PORT")
# ${VAR}, ${VAR:-default}, ${VAR:?error}; $${VAR} is a literal for the container's shell
VAR_RE = re.compile(r"(?<!\$)\$\{([A-Z0-9_]+)(?::?[-?][^}]*)?\}")


def _yaml(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml("docker-compose.yml")


def _command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def _env(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def _role(services: dict[str, Any], needle: str) -> list[str]:
    return [name for name, svc in services.items() if needle in " ".join(_command(svc))]


def _one(services: dict[str, Any], needle: str) -> str:
    found = _role(services, needle)
    assert len(found) == 1, f"expected one service running {needle!r}, found {found}"
    return found[0]


def _dockerfile(build: dict[str, Any] | str) -> Path:
    if isinstance(build, str):
        build = {"context": build}
    context = (DEPLOY / build.get("context", ".")).resolve()
    return context / build.get("dockerfile", "Dockerfile")


def test_compose_has_every_service_and_builds_images_from_this_repo(compose: dict[str, Any]) -> None:
    services = compose["services"]
    master = _one(services, "org.apache.spark.deploy.master.Master")
    workers = _role(services, "org.apache.spark.deploy.worker.Worker")
    assert workers, "no Spark worker service"
    user_code = _one(services, "code-server")
    connect = _one(services, "spark-server")
    webserver = _one(services, "dagster-webserver")
    daemon = _one(services, "dagster-daemon")
    postgres = [n for n, s in services.items() if str(s.get("image", "")).startswith("postgres:")]
    assert len(postgres) == 1
    # the lake's S3-compatible store (conditional writes: SeaweedFS >= 4.18), reached only inside
    stores = [n for n, s in services.items()
              if str(s.get("image", "")).startswith("chrislusf/seaweedfs:")]
    assert len(stores) == 1 and not services[stores[0]].get("ports")
    for name in (user_code, connect, *workers):
        env = services[name]["environment"]
        assert env["AWS_ENDPOINT_URL"] == "http://s3:8333", name
        assert env["AWS_SECRET_ACCESS_KEY"].startswith("${DEDUP_S3_SECRET_KEY:?"), name

    built: dict[str, Path] = {}
    for name, svc in services.items():
        if "build" in svc:
            dockerfile = _dockerfile(svc["build"])
            assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
            assert REPO in dockerfile.parents, f"{name}: builds from outside the repo"
            built[str(svc["image"]).split(":")[0]] = dockerfile
    # the Connect server's TLS proxy: stock nginx with deploy/tls/'s configuration
    proxies = [n for n, s in services.items() if str(s.get("image", "")).startswith("nginx:")]
    assert len(proxies) == 1 and not services[proxies[0]].get("ports")
    for name, svc in services.items():
        if name in postgres or name in stores or name in proxies:
            continue
        image = str(svc.get("image", "")).split(":")[0]
        assert image in built, f"{name}: image {image!r} is not built from a Dockerfile in this repo"
    # one image for the driver (run processes of the code server) and the executors
    uc_image = services[user_code]["image"]
    assert services[master]["image"] == uc_image
    assert all(services[w]["image"] == uc_image for w in workers)
    assert services[connect]["image"] == uc_image
    assert built[uc_image.split(":")[0]].name == "Dockerfile.user-code"
    assert built[services[webserver]["image"].split(":")[0]].name == "Dockerfile.dagster"
    assert services[daemon]["image"] == services[webserver]["image"]


def test_compose_environment_wires_postgres_spark_and_the_code_server(compose: dict[str, Any]) -> None:
    services = compose["services"]
    master = _one(services, "org.apache.spark.deploy.master.Master")
    user_code = _one(services, "code-server")
    pg = next(n for n, s in services.items() if str(s.get("image", "")).startswith("postgres:"))
    for role in ("code-server", "dagster-webserver", "dagster-daemon"):
        name = _one(services, role)
        env = _env(services[name])
        missing = [v for v in (*PG_VARS, "DAGSTER_HOME") if v not in env]
        assert not missing, f"{name}: missing {missing}"
        assert env["DAGSTER_PG_HOST"] == pg
        # secrets only from the environment: the password is a ${...} reference, never a literal
        assert VAR_RE.fullmatch(env["DAGSTER_PG_PASSWORD"]), env["DAGSTER_PG_PASSWORD"]
        if role != "code-server":
            assert env["DAGSTER_CODE_SERVER_HOST"] == user_code
            cmd = _command(services[user_code])
            assert env["DAGSTER_CODE_SERVER_PORT"] == cmd[cmd.index("-p") + 1]
    pg_env = _env(services[pg])
    assert VAR_RE.match(pg_env["POSTGRES_PASSWORD"]).group(1) == "DAGSTER_PG_PASSWORD"

    uc = _env(services[user_code])
    cmd = _command(services[master])
    master_url = f"spark://{cmd[cmd.index('--host') + 1]}:{cmd[cmd.index('--port') + 1]}"
    assert "DEDUP_CONFIG" in uc
    for w in _role(services, "org.apache.spark.deploy.worker.Worker"):
        assert _command(services[w])[2] == master_url


def _confs(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, c in enumerate(cmd) if c == "--conf")


def test_compose_runs_are_clients_of_the_warm_spark_connect_server(compose: dict[str, Any]) -> None:
    """design.md N5: the code server's runs use one warm Connect server (SPARK_REMOTE), started by
    `dedup-pipeline spark-server` (the package's start-up settings, no copy of them here), which
    is the driver of the standalone cluster: executors reach it by its hostname."""
    services = compose["services"]
    master = _one(services, "org.apache.spark.deploy.master.Master")
    connect = _one(services, "spark-server")
    user_code = _one(services, "code-server")
    cmd = _command(services[connect])
    assert cmd[:2] == ["dedup-pipeline", "spark-server"]
    mcmd = _command(services[master])
    assert cmd[cmd.index("--master") + 1] == \
        f"spark://{mcmd[mcmd.index('--host') + 1]}:{mcmd[mcmd.index('--port') + 1]}"
    # the server on its loopback; the TLS proxy in its network namespace is the only way in
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    port = cmd[cmd.index("--port") + 1]
    hostname = services[connect].get("hostname", connect)
    conf = _confs(cmd)
    assert conf["spark.driver.host"] in (connect, hostname)
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"
    # the start-up settings come from engine/session.py through the command, not copied here
    from dedup_pipeline.engine.session import BASE_CONF
    assert not set(conf) & set(BASE_CONF), set(conf) & set(BASE_CONF)
    assert not [k for k in conf if is_secret_setting(k)], "a secret on a command line"
    proxy = next(n for n, s in services.items() if str(s.get("image", "")).startswith("nginx:"))
    assert services[proxy]["network_mode"] == f"service:{connect}"
    listen, upstream = _proxy_ports()
    assert upstream == f"127.0.0.1:{port}"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services[proxy]["volumes"]}
    assert (DEPLOY / mounts["/etc/nginx/conf.d/default.conf"]).resolve() == PROXY_CONF

    uc = _env(services[user_code])
    assert uc["SPARK_REMOTE"] == f"sc://{hostname}:{listen}/;use_ssl=true"
    ca = uc["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"]
    assert any(v.endswith(f":{ca}:ro") and "tls/certs/ca.pem" in v
               for v in services[user_code]["volumes"])
    # the token: the same ${...} secret for the server and its clients, never a literal
    token = _env(services[connect])["SPARK_CONNECT_AUTHENTICATE_TOKEN"]
    assert VAR_RE.fullmatch(token) and uc["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == token
    # one topology at a time: no client-mode driver settings on a Connect client
    assert not [k for k in uc if k == "SPARK_MASTER_URL" or k.startswith("DEDUP_SPARK_CONF_")]
    assert services[user_code]["depends_on"][connect]["condition"] == "service_healthy"
    assert port in " ".join(_command({"command": services[connect]["healthcheck"]["test"]}))
    assert not services[connect].get("ports"), "the Connect port is reached through TLS only"


def _proxy_ports() -> tuple[str, str]:
    """The TLS proxy's listening port and the address it passes gRPC calls on to."""
    text = PROXY_CONF.read_text()
    listen = re.search(r"^\s*listen\s+(\d+)\s+ssl", text, re.M)
    upstream = re.search(r"^\s*grpc_pass\s+grpc://([^;]+);", text, re.M)
    assert listen and upstream, text
    return listen.group(1), upstream.group(1)


def test_compose_spark_daemons_and_driver_share_the_authenticate_secret(
        compose: dict[str, Any]) -> None:
    """spark.authenticate on the master, every worker and the Connect server's driver, from one
    ${...} secret; the daemons get it in a spark-defaults.conf written at start, the driver in its
    environment (a properties file, not its command line: engine/session.server_command)."""
    services = compose["services"]
    refs = set()
    for name in (_one(services, "org.apache.spark.deploy.master.Master"),
                 *_role(services, "org.apache.spark.deploy.worker.Worker")):
        svc = services[name]
        script = " ".join(svc["entrypoint"])
        assert "spark.authenticate true" in script and "SPARK_CONF_DIR=" in script, name
        assert "umask 077" in script, name
        refs.add(VAR_RE.fullmatch(_env(svc)["SPARK_AUTH_SECRET"]).group(1))
    env = _env(services[_one(services, "spark-server")])
    assert env["DEDUP_SPARK_CONF_spark__authenticate"] == "true"
    refs.add(VAR_RE.fullmatch(env["DEDUP_SPARK_CONF_spark__authenticate__secret"]).group(1))
    assert refs == {"DEDUP_SPARK_AUTH_SECRET"}


def test_helm_runs_use_the_warm_spark_connect_server() -> None:
    values = _yaml("helm/values.yaml")
    docs = list(yaml.safe_load_all((DEPLOY / "helm" / "spark-connect.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    service = next(d for d in docs if d["kind"] == "Service")
    container, tls = deployment["spec"]["template"]["spec"]["containers"]
    args = [str(a) for a in container["args"]]
    assert args[:2] == ["dedup-pipeline", "spark-server"]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    listen, upstream = _proxy_ports()
    assert upstream == f"127.0.0.1:{args[args.index('--port') + 1]}"
    assert tls["image"].startswith("nginx:")
    assert [p["containerPort"] for p in tls["ports"]] == [int(listen)]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [int(listen)]
    (dep,) = values["dagster-user-deployments"]["deployments"]
    env = {e["name"]: e.get("value") for e in dep["env"]}
    name = service["metadata"]["name"]
    assert re.fullmatch(rf"sc://{name}(\.[a-z0-9-]+)*:{listen}/;use_ssl=true",
                        env["SPARK_REMOTE"]), env
    assert env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"].startswith(
        next(m["mountPath"] for m in dep["volumeMounts"] if m["name"] == "spark-connect-ca"))
    assert container["image"].split(":")[0] == dep["image"]["repository"]
    assert _confs(args)["spark.driver.host"] == "$(POD_IP)"
    cenv = {e["name"]: e for e in container["env"]}
    assert cenv["SPARK_CONNECT_AUTHENTICATE_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert "secretKeyRef" in cenv["DEDUP_SPARK_CONF_spark__authenticate__secret"]["valueFrom"]


def test_compose_shares_storage_and_publishes_only_on_loopback(compose: dict[str, Any]) -> None:
    services = compose["services"]
    user_code = _one(services, "code-server")

    def mounts(name: str) -> dict[str, str]:
        return {v.split(":")[1]: v.split(":")[0] for v in services[name].get("volumes", [])}

    lake = mounts(user_code)
    assert "/data" in lake and lake["/data"] in compose["volumes"]
    for w in [*_role(services, "org.apache.spark.deploy.worker.Worker"),
              _one(services, "spark-server")]:
        assert mounts(w).get("/data") == lake["/data"], f"{w} does not see the driver's /data"
    example = yaml.safe_load((DEPLOY / "config" / "dedup.yaml").read_text())
    for ds in example["datasets"]:
        assert ds["source"]["path"].startswith("/data/") and ds["output"].startswith("/data/")
    for name, svc in services.items():
        for p in svc.get("ports", []):
            assert str(p).startswith("127.0.0.1:"), f"{name} publishes {p} beyond loopback"


def test_env_example_lists_every_compose_variable(compose: dict[str, Any]) -> None:
    used = set(VAR_RE.findall((DEPLOY / "docker-compose.yml").read_text()))
    example = (DEPLOY / ".env.example").read_text()
    listed = {line.split("=", 1)[0] for line in example.splitlines()
              if line and not line.startswith("#") and "=" in line}
    assert used <= listed, f"not in .env.example: {sorted(used - listed)}"
    assert re.search(r"^DAGSTER_PG_PASSWORD=$", example, re.M), "no default password may ship"
    assert ".env" in (DEPLOY / ".gitignore").read_text().split()


def test_dockerfiles_install_java_17_and_copy_only_repo_files() -> None:
    uc = (DEPLOY / "Dockerfile.user-code").read_text()
    assert re.search(r"apt-get install[^\n]*openjdk-17-jre-headless", uc)
    assert "SPARK_HOME" in uc and "PYSPARK_PYTHON" in uc
    # runs are Spark Connect clients (grpcio, pandas): the image installs the `connect` extra
    extras = re.search(r'pip install [^\n]*"\.\[([a-z0-9,]+)\]"', uc).group(1).split(",")
    assert "connect" in extras, extras
    for name in ("Dockerfile.user-code", "Dockerfile.dagster"):
        text = (DEPLOY / name).read_text()
        assert re.search(r"^USER \S+", text, re.M), f"{name} runs as root"
        assert re.search(r"^FROM python:3\.1[1-3]", text, re.M)
        ignore = (DEPLOY / f"{name}.dockerignore").read_text().splitlines()
        for line in re.findall(r"^COPY (.+)$", text, re.M):
            for src in line.split()[:-1]:
                assert (REPO / src).exists(), f"{name}: COPY {src}: not in the repo"
                assert f"!{src}" in ignore or f"!{src}/" in ignore, f"{name}: {src} is .dockerignored"
    # the Dagster version of the images is the one the package pins
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    dagster_pin = next(p for p in pins if p.startswith("dagster>="))
    version = re.search(r"ARG DAGSTER_VERSION=(\S+)", uc).group(1)
    assert version.startswith(re.search(r">=(\d+\.\d+)", dagster_pin).group(1) + ".")


def test_dagster_yaml_is_valid_and_reads_postgres_from_env(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    raw = _yaml("dagster.yaml")
    db = raw["storage"]["postgres"]["postgres_db"]
    for field, var in (("hostname", "DAGSTER_PG_HOST"), ("port", "DAGSTER_PG_PORT"),
                       ("username", "DAGSTER_PG_USER"), ("password", "DAGSTER_PG_PASSWORD"),
                       ("db_name", "DAGSTER_PG_DB")):
        assert db[field] == {"env": var}
    for var, value in zip(PG_VARS, ("db.internal", "5433", "u", "p", "d"), strict=True):
        monkeypatch.setenv(var, value)
    (tmp_path / "dagster.yaml").write_text((DEPLOY / "dagster.yaml").read_text())
    config, _ = dagster_instance_config(str(tmp_path))  # Dagster's own schema validation
    pg = process_config(pg_config(), config["storage"]["postgres"])  # env: references resolved
    assert pg.success, pg.errors
    assert pg.value["postgres_db"]["port"] == 5433
    assert pg.value["postgres_db"]["hostname"] == "db.internal"
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    runs = config["concurrency"]["runs"]
    assert runs["max_concurrent_runs"] >= 1
    # one concurrency mechanism, the per-dataset pool, in the demo's instance (written by
    # `dedup-pipeline demo`) too
    assert "tag_concurrency_limits" not in runs
    demo = yaml.safe_load(DEMO_INSTANCE_YAML)["concurrency"]
    assert "tag_concurrency_limits" not in demo["runs"]
    assert config["concurrency"]["pools"] == demo["pools"] == {"default_limit": 1, "granularity": "run"}
    assert config["run_retries"]["enabled"] and config["run_retries"]["max_retries"] >= 1
    assert config["telemetry"]["enabled"] is False


def test_workspace_yaml_points_at_the_code_server_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _yaml("workspace.yaml")
    (entry,) = raw["load_from"]
    grpc = entry["grpc_server"]
    assert grpc["host"] == {"env": "DAGSTER_CODE_SERVER_HOST"}
    assert grpc["port"] == {"env": "DAGSTER_CODE_SERVER_PORT"}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert grpc["location_name"] == pyproject["tool"]["dg"]["project"]["code_location_name"]
    monkeypatch.setenv("DAGSTER_CODE_SERVER_HOST", "user-code")
    monkeypatch.setenv("DAGSTER_CODE_SERVER_PORT", "4000")
    result = process_workspace_config(raw)
    assert result.success, result.errors
    assert result.value["load_from"][0]["grpc_server"]["port"] == 4000


def test_helm_values_match_the_instance_and_the_images() -> None:
    values = _yaml("helm/values.yaml")
    instance = _yaml("dagster.yaml")
    compose = _yaml("docker-compose.yml")["services"]

    ud = values["dagster-user-deployments"]
    assert ud["enabled"]
    (dep,) = ud["deployments"]
    uc_image = next(s["image"] for s in compose.values() if "code-server" in " ".join(_command(s)))
    assert dep["image"]["repository"].rsplit("/", 1)[-1] == uc_image.split(":")[0]
    assert dep["image"]["tag"] not in ("", "latest")
    args = dep["codeServerArgs"]
    assert args[args.index("-m") + 1] == "dedup_pipeline.definitions"
    env = {e["name"]: e for e in dep["env"]}
    assert {"DEDUP_CONFIG", "SPARK_REMOTE"} <= set(env)

    pg = values["postgresql"]
    assert pg["enabled"] is False and pg["postgresqlHost"] and pg["postgresqlUsername"]
    assert pg["postgresqlDatabase"] and "postgresqlPassword" not in pg  # from a Secret
    assert values["generatePostgresqlPasswordSecret"] is False
    assert pg["postgresqlScheme"] == instance["storage"]["postgres"]["postgres_db"]["scheme"]

    daemon = values["dagsterDaemon"]
    assert daemon["runCoordinator"]["enabled"]
    assert daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"
    retries = daemon["runRetries"]
    assert (retries["enabled"], retries["maxRetries"], retries["retryOnAssetOrOpFailure"]) == (
        instance["run_retries"]["enabled"], instance["run_retries"]["max_retries"],
        instance["run_retries"]["retry_on_asset_or_op_failure"])
    conc, inst_conc = values["concurrency"], instance["concurrency"]
    assert conc["enabled"]
    assert conc["runs"]["maxConcurrentRuns"] == inst_conc["runs"]["max_concurrent_runs"]
    assert "tagConcurrencyLimits" not in conc["runs"]
    assert (conc["pools"]["defaultLimit"], conc["pools"]["granularity"]) == (
        inst_conc["pools"]["default_limit"], inst_conc["pools"]["granularity"])

    launcher = values["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher"
    # run pods are Connect clients: no client-mode driver settings
    run_env = launcher["config"]["k8sRunLauncher"]["runK8sConfig"]["containerConfig"].get("env", [])
    assert not [e for e in run_env if e["name"].startswith("DEDUP_SPARK_CONF_spark__driver")]
    assert values["dagsterWebserver"]["service"]["type"] == "ClusterIP"


def test_readme_documents_variables_storage_and_security() -> None:
    text = (DEPLOY / "README.md").read_text()
    for var in (*PG_VARS, *CODE_SERVER_VARS, "DAGSTER_HOME", "DEDUP_CONFIG", "SPARK_MASTER_URL",
                "SPARK_REMOTE", "DEDUP_SPARK_CONF_", "spark__driver__host", "PYSPARK_PYTHON"):
        assert var in text, var
    for topic in ("## Where data lives", "## What to secure", "no authentication", "hdfs://",
                  "s3a://", "L3", "docker compose", "helm upgrade"):
        assert topic in text, topic
    root_readme = (REPO / "README.md").read_text()
    assert "deploy/README.md" in root_readme
