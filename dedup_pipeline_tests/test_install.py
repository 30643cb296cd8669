"""Installed as users install it: the wheel with no extras is enough to load an hour.

The README's commands install the `dev` extra, which pulls in pandas and numpy through other
packages; a team adding the package to its own Dagster deployment installs `dedup_pipeline`
alone. So a clean venv gets the built wheel with no extras and runs the demo there, and every
import of the package is checked against `[project.dependencies]`. The same venv then serves a
team's `dg` project that adds datasets with the `DedupDataset` component (design.md D8), driven
by the `dg` command as a user drives it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# import name -> the declared distribution that provides it (py4j: pyspark's own bridge)
DISTRIBUTION = {"yaml": "pyyaml", "pydantic_core": "pydantic", "py4j": "pyspark"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.fast
def test_every_import_of_the_package_is_a_declared_dependency() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}
    third_party = set()
    for path in (REPO / "dedup_pipeline").rglob("*.py"):
        for name in _imports(path):
            if name in sys.stdlib_module_names or name in ("dedup_pipeline", "__future__"):
                continue
            third_party.add(name)
    missing = {n for n in third_party
               if DISTRIBUTION.get(n, n).lower().replace("_", "-") not in declared}
    assert not missing, f"imported but not in [project.dependencies]: {sorted(missing)}"


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the built wheel and no extras (minutes: the suite pays it once)."""
    tmp = tmp_path_factory.mktemp("install")
    # without PYTHONPATH: a checkout on it would look installed to the venv's pip (its egg-info)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                    str(REPO)], check=True, cwd=tmp, timeout=600, env=env)
    (wheel,) = wheels.glob("dedup_pipeline-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=900,
                   env=env)
    return venv


def _env(venv: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SPARK_REMOTE", "VIRTUAL_ENV", "PYSPARK_PYTHON", "DEDUP_CONFIG")}
    home.mkdir(parents=True, exist_ok=True)
    env.update(DAGSTER_HOME=str(home), SPARK_MASTER_URL="local[1]",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return env


@pytest.mark.slow
@pytest.mark.spark
def test_the_wheel_with_no_extras_runs_the_demo_in_a_clean_venv(clean_venv: Path, tmp_path: Path
                                                                 ) -> None:
    venv = clean_venv
    py = venv / "bin" / "python"
    # nothing of the dev extra came along
    probe = subprocess.run([str(py), "-c", "import importlib.util as u; "
                            "print([m for m in ('pandas', 'pytest', 'dagster_webserver') "
                            "if u.find_spec(m)])"], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]", probe.stdout
    env = _env(venv, tmp_path / "dh")
    out = subprocess.run([str(venv / "bin" / "dedup-pipeline"), "demo", "--dir",
                          str(tmp_path / "demo"), "--hours", "2", "--rows-per-hour", "40"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "total" in out.stdout
    commits = sorted(p.name for p in (tmp_path / "demo").rglob("_commits/load_hour=*.json"))
    assert len(commits) == 2, commits  # and its newest, third hour for the user
    defs_yaml = tmp_path / "demo" / "dedup_demo" / "defs" / "clicks" / "defs.yaml"
    v = subprocess.run([str(venv / "bin" / "dedup-pipeline"), "verify", "--config",
                        str(defs_yaml)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=600)
    assert v.returncode == 0 and "OK" in v.stdout, v.stdout + v.stderr


# The team's asset after clicks/unique, built with `dedup_pipeline.dataset_assets` (keys, partitions
# and the loaded-hour guard from the dataset's defs.yaml), and the automation sensor that runs it
# (on from the start, as code declares it; Dagster's default sensor starts off). `eager()` alone
# requests only the latest hour; a history loaded hour by hour wants every hour, hence without
# `in_latest_time_window` (docs/operations.md).
TEAM_ASSET = """\
from pathlib import Path

import dagster as dg
import dedup_pipeline

clicks = dedup_pipeline.dataset_assets(Path(__file__).parent / "clicks" / "defs.yaml")


@dg.asset(deps=[clicks.asset_key("unique")], partitions_def=clicks.partitions_def,
          automation_condition=dg.AutomationCondition.eager().without(
              dg.AutomationCondition.in_latest_time_window()))
def clicks_report(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    loaded = clicks.require_loaded(context.partition_key)
    return dg.MaterializeResult(metadata={"load_hour": loaded, "table": clicks.table_path()})


team_automation = dg.AutomationConditionSensorDefinition(
    "team_automation", target=dg.AssetSelection.assets(clicks_report),
    default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=5)
"""
# The team's own `spark` resource, beside the component's `dedup_spark`
TEAM_SPARK = """\
import dagster as dg


@dg.definitions
def team() -> dg.Definitions:
    return dg.Definitions(resources={"spark": dg.ResourceDefinition.hardcoded_resource("team's")})
"""
WARNING_LINE = re.compile(r"\b\w*Warning: ")  # how Python prints a warning (not the JVM's WARNING:)


def _materialized_by(instance: Any, key: Any, partition: str) -> dict[str, str] | None:
    """The tags of the run that materialized `partition` of `key`, if one has."""
    from dagster import AssetRecordsFilter

    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1).records
    if not records:
        return None
    run = instance.get_run_by_id(records[0].run_id)
    return dict(run.tags) if run is not None else {}


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: int = 900) -> str:
    return _run_all(args, env, cwd, timeout)[0]


def _run_all(args: list[str], env: dict[str, str], cwd: Path, timeout: int = 900
             ) -> tuple[str, str]:
    out = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert out.returncode == 0, f"{args}: " + out.stdout[-4000:] + out.stderr[-4000:]
    return out.stdout, out.stderr


def _launch(dg_cmd: str, job: str, partition: str, env: dict[str, str], root: Path) -> None:
    """`dg launch` of one hour, as the scaffold's comment spells it: no warning printed."""
    out, err = _run_all([dg_cmd, "launch", "--job", job, "--partition", partition], env, root)
    warned = [t for t in (out + err).splitlines() if WARNING_LINE.search(t)]
    assert warned == [], "\n".join(warned)


@pytest.mark.slow
@pytest.mark.spark
def test_a_dg_project_adds_datasets_with_the_component_and_loads_an_hour(clean_venv: Path,
                                                                         tmp_path: Path) -> None:
    import dagster as dg
    from dagster._core.scheduler.instigation import TickStatus
    from deltalake import DeltaTable

    from dedup_pipeline.engine.core import commits
    from dedup_pipeline.engine.core.storage import Storage
    from dedup_pipeline.hours import format_hour, parse_hour
    from dedup_pipeline.orchestration.component import parse_attributes
    from dedup_pipeline_tests.daemon_walk import instigator_ticks
    from dedup_pipeline_tests.reference import Reference
    from dedup_pipeline_tests.spark_services import start as start_service
    from dedup_pipeline_tests.spark_services import wait_until
    from dedup_pipeline_tests.test_component import write_project

    venv = clean_venv
    py = str(venv / "bin" / "python")
    # `dg` is the team's tool, beside the product (installed with no extras)
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([py, "-m", "pip", "install", "-q", "dagster-dg-cli>=1.13,<1.14"], plain, tmp_path)
    root = tmp_path / "teamproj"
    defs_dir = write_project(root, "teamproj")
    (root / ".venv").symlink_to(venv)  # the project's environment, where dg looks for it
    env = _env(venv, tmp_path / "dh")
    env.update(VIRTUAL_ENV=str(root / ".venv"), PYTHONPATH=str(root / "src"))
    dg_cmd = str(venv / "bin" / "dg")

    listed = _run([dg_cmd, "list", "components", "--json"], env, root)
    [line] = [t for t in listed.splitlines() if t.startswith('{"items"')]
    entries = {e["key"]: e for e in json.loads(line)["items"]}
    assert entries["dedup_pipeline.DedupDataset"]["summary"].startswith(
        "A deduplicated hourly dataset on Spark")
    _run([dg_cmd, "scaffold", "defs", "dedup_pipeline.DedupDataset", "clicks"], env, root)
    # a second dataset of another format with a composite key, as a team scaffolds it
    _run([dg_cmd, "scaffold", "defs", "dedup_pipeline.DedupDataset", "orders", "--source-format",
          "csv", "--key", "event_id", "--key", "user_id"], env, root)
    defs_yaml = defs_dir / "clicks" / "defs.yaml"
    orders_yaml = defs_dir / "orders" / "defs.yaml"
    start = yaml.safe_load(defs_yaml.read_text())["attributes"]["start"]
    orders_start = yaml.safe_load(orders_yaml.read_text())["attributes"]["start"]
    (defs_dir / "report.py").write_text(TEAM_ASSET)
    (defs_dir / "team.py").write_text(TEAM_SPARK)
    _run([dg_cmd, "check", "yaml"], env, root)
    _run([dg_cmd, "check", "defs"], env, root)

    # sample data where the scaffolded examples read it, by the commands their comments give
    # (fewer hours), without markers: the datasets' landing sensors, on in the daemon, would load
    # complete hours themselves (this test loads with `dg launch`; a load beside it is refused by
    # the dataset's lock); they now wait for them
    for path in (defs_yaml, orders_yaml):
        [line] = [t for t in path.read_text().splitlines() if "dedup-pipeline generate" in t]
        args = shlex.split(line.lstrip("# "))
        args[args.index("--hours") + 1], args[args.index("--rows-per-hour") + 1] = "2", "300"
        _run([str(venv / "bin" / args[0]), *args[1:]], env, root)
    assert not (root / "data" / "dedup.yaml").exists()  # the defs.yaml is the one config
    assert sorted(p.name for p in (root / "data" / "landing").iterdir()) == ["clicks", "orders"]
    assert list((root / "data" / "landing" / "orders").rglob("*.csv"))
    for marker in (root / "data" / "landing").rglob("_SUCCESS"):
        marker.unlink()
    # the team's automation sensor running in a real daemon, its first tick before the hour loads
    daemon = start_service("dagster-daemon", [str(venv / "bin" / "dagster-daemon"), "run", "-m",
                                              "teamproj.definitions"],
                           tmp_path / "daemon.log", env=env, cwd=root)
    try:
        with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as instance:
            wait_until("the automation sensor's first finished tick", lambda: any(
                t.status != TickStatus.STARTED
                for t in instigator_ticks(instance, "team_automation", limit=5)), 180, [daemon])
            _launch(dg_cmd, "clicks_hourly_load", start, env, root)
            # launched, then seen: the hour is materialized in the instance the UI reads
            loaded = _materialized_by(instance, dg.AssetKey(["clicks", "unique"]), start)
            assert loaded is not None and loaded["dagster/partition"] == start, loaded
            # the team's asset downstream: the daemon materializes it for the loaded hour
            report = dg.AssetKey("clicks_report")
            tags = wait_until("the daemon to materialize clicks_report",
                              lambda: _materialized_by(instance, report, start), 240, [daemon])
            assert tags["dagster/sensor_name"] == "team_automation", tags
            other = format_hour(parse_hour(start) + timedelta(hours=1))
            assert _materialized_by(instance, report, other) is None  # not loaded: not requested
    finally:
        daemon.stop()
    assert not (root / "data" / "warehouse" / "orders").exists()  # the other dataset untouched
    _launch(dg_cmd, "orders_hourly_load", orders_start, env, root)
    with dg.DagsterInstance.from_config(str(tmp_path / "dh")) as instance:
        assert _materialized_by(instance, dg.AssetKey(["orders", "unique"]), orders_start)

    # the commit records and the Delta tables, against the reference model
    for path, first in ((defs_yaml, start), (orders_yaml, orders_start)):
        tag = first[:13]
        attrs = yaml.safe_load(path.read_text().replace("{{ context.project_root }}", str(root)))
        ds, _ = parse_attributes(attrs["attributes"], str(path), path.parent)
        expected = Reference(ds).run(parse_hour(first), 1)[tag]
        record = commits.read_commit(Storage(ds.output), tag)
        assert record is not None, ds.name
        assert (record.rows_in, record.unique) == (
            expected.rows_in, sum(expected.rows["unique"].values())), ds.name
        key_at = [list(ds.source.schema).index(k) for k in ds.key]
        for output in ("unique", "duplicates", "expired"):
            got = DeltaTable(str(root / "data" / "warehouse" / ds.name / output)).to_pyarrow_table()
            assert set(got.column("load_hour").to_pylist()) <= {tag}, (ds.name, output)
            assert sorted(zip(*(got.column(k).to_pylist() for k in ds.key), strict=True)) == sorted(
                tuple(row[i] for i in key_at) for row in expected.rows[output].elements()), (
                ds.name, output)
