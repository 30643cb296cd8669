"""Partition status is the truth about the data, after every refused, failed or cancelled run.

Dagster derives an asset partition's "Failed" from its latest planned-or-materialized event: the
creation of a run logs ASSET_MATERIALIZATION_PLANNED for every partition it targets, and a run that
then fails with no materialization after that event paints the partition Failed in every
partition bar, the Partitions tab and the "Failed and missing" preset, even when an earlier load
committed it and nothing changed. The load restates the committed hours of a run it did not load
(`hour_events.restate`). Asserted here through the webserver's own GraphQL schema (in process:
`assetNodes { assetPartitionStatuses partitionStats }` and each check's `partitionStatuses`, the
queries behind the partition bar, the Partitions and the Checks tabs) on a SQLite and a PostgreSQL
instance, after each kind of refusal or failure: later hours loaded, a broken contract, the
dataset lock, a run without a partition, a load that fails in Spark (a rerun, whose failing hour
is then uncommitted, and a new hour), a cancelled run and a run that failed before its step. Only
an hour whose load failed and left it uncommitted shows Failed. The refusal's printed command is
run as printed, through the CLI.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster_graphql.test.utils import execute_dagster_graphql

from dedup_pipeline import cli
from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML
from dedup_pipeline.config import PipelineConfig
from dedup_pipeline.engine.core import write as engine_write
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.lock import Lock
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import format_hour, format_tag, hour_range
from dedup_pipeline.orchestration import runs
from dedup_pipeline.orchestration.checks import CHECKS
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.names import (
    PARTITION,
    WRITTEN,
    load_job_name,
)
from dedup_pipeline.orchestration.recovery import build_run_end_sensor
from dedup_pipeline.orchestration.runner import run_range
from dedup_pipeline_tests.conftest import SensorTicks, dataset_raw, pipeline_config, write_hour
from dedup_pipeline_tests.test_dagster import _cfg, _ev
from dedup_pipeline_tests.test_service import postgres  # noqa: F401 - the PostgreSQL fixture

pytestmark = pytest.mark.slow

H = [f"2026-11-01-{h:02d}:00" for h in range(6)]

ASSET_STATUS = """
query { assetNodes { assetKey { path }
  assetPartitionStatuses { __typename ... on TimePartitionStatuses { ranges { startKey endKey status } } }
  partitionStats { numMaterialized numFailed numMaterializing }
  assetChecksOrError { ... on AssetChecks { checks { name partitionStatuses {
    __typename ... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } } } } } } } }
"""


def _keys(ranges: list[dict[str, str]], status: str) -> set[str]:
    return {format_hour(h) for r in ranges if r["status"] == status
            for h in hour_range(r["startKey"], r["endKey"])}


class UI:
    """The instance as the webserver reads it (its GraphQL schema, in process)."""

    def __init__(self, inst: dg.DagsterInstance, root: Path, cfg: PipelineConfig) -> None:
        self.inst, self.cfg = inst, cfg
        code = root / "ui_defs.py"
        code.write_text("from dedup_pipeline.config import load_config\n"
                        "from dedup_pipeline.orchestration.definitions import build_definitions\n"
                        f"defs = build_definitions(load_config({str(cfg.config_file)!r}))\n")
        self.origin = InProcessCodeLocationOrigin(
            LoadableTargetOrigin(python_file=str(code), working_directory=str(root)),
            location_name="dedup_pipeline")

    def status(self) -> dict[str, Any]:
        with WorkspaceProcessContext(self.inst, InProcessWorkspaceLoadTarget(self.origin)) as pc:
            res = execute_dagster_graphql(pc.create_request_context(), ASSET_STATUS)
        assert not res.errors, res.errors
        out: dict[str, Any] = {"assets": {}, "checks": {}}
        for node in res.data["assetNodes"]:
            path = node["assetKey"]["path"]
            if path[-1] not in WRITTEN:
                continue
            ranges = node["assetPartitionStatuses"]["ranges"]
            out["assets"][path[-1]] = {
                "materialized": _keys(ranges, "MATERIALIZED"), "failed": _keys(ranges, "FAILED"),
                "stats": node["partitionStats"]}
            for c in node["assetChecksOrError"].get("checks") or []:
                cr = c["partitionStatuses"]["ranges"]
                out["checks"][c["name"]] = {s: _keys(cr, s) for s in {r["status"] for r in cr}}
        return out

    def assert_truth(self, label: str, failed: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Every committed hour materialized with every check Passed; only `failed` (hours whose
        load failed, uncommitted) Failed; nothing else."""
        ds = self.cfg.datasets[0]
        committed = {format_tag(t) for t in CommitLog(Storage(ds.output)).committed()}
        st = self.status()
        assert set(st["assets"]) == set(WRITTEN), st
        for asset, s in st["assets"].items():
            assert s["materialized"] == committed, (label, asset, s)
            assert s["failed"] == set(failed), (label, asset, s)
            assert s["stats"]["numFailed"] == len(failed), (label, asset, s)
            assert s["stats"]["numMaterialized"] == len(committed), (label, asset, s)
        assert set(st["checks"]) == set(CHECKS)
        for name, by_status in st["checks"].items():
            assert by_status.get("SUCCEEDED", set()) == committed, (label, name, by_status)
            bad = set().union(*(v for k, v in by_status.items() if k != "SUCCEEDED"))
            assert not bad & committed, (label, name, by_status)


@pytest.fixture(params=["sqlite", "postgres"])
def instance(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, dg.DagsterInstance]]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    text = DEMO_INSTANCE_YAML
    if request.param == "postgres":
        import psycopg2

        pg = request.getfixturevalue("postgres")
        db = f"status_{tmp_path.name.lower().replace('-', '_')[-40:]}"
        conn = psycopg2.connect(host=pg["DAGSTER_PG_HOST"], port=pg["DAGSTER_PG_PORT"],
                                user=pg["DAGSTER_PG_USER"], password=pg["DAGSTER_PG_PASSWORD"],
                                dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {db}")
        conn.close()
        text += (f"storage:\n  postgres:\n    postgres_db:\n      hostname: {pg['DAGSTER_PG_HOST']}\n"
                 f"      port: {pg['DAGSTER_PG_PORT']}\n      username: {pg['DAGSTER_PG_USER']}\n"
                 f"      password: {pg['DAGSTER_PG_PASSWORD']}\n      db_name: {db}\n"
                 "      scheme: postgresql+psycopg2\n")
    (home / "dagster.yaml").write_text(text)
    with dg.DagsterInstance.from_config(str(home)) as inst:
        yield home, inst


def _spark_fails_at(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    """The load of hour `key` fails in Spark (a real Spark error, raised by a Spark job) after its
    outputs are written and before its commit."""
    orig = engine_write.verify_written

    def failing(spark: Any, ds: Any, p: Any, *a: Any, **k: Any) -> Any:
        if format_hour(p.hour) == key:
            spark.sql("select raise_error('injected failure of the Spark job')").collect()
        return orig(spark, ds, p, *a, **k)

    monkeypatch.setattr(engine_write, "verify_written", failing)


def _run_end_sensor(inst: dg.DagsterInstance, cfg: PipelineConfig) -> SensorTicks:
    """The dataset's run-end sensor, its first tick taken (it then sees every later run end)."""
    ticks = SensorTicks(build_run_end_sensor(cfg.datasets[0]), inst)
    ticks.tick()
    return ticks


def _failure_text(inst: dg.DagsterInstance, run_id: str) -> str:
    [ev] = [e.dagster_event for e in inst.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)]
    return ev.step_failure_data.error.message


def test_partition_status_is_the_commit_records_after_every_refusal_and_failure(
        instance: tuple[Path, dg.DagsterInstance], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        spark: Any) -> None:
    home, inst = instance
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    for h in range(5):
        write_hour(ds, H[h], [_ev(10 * h + 1, h), _ev(10 * h + 2, h), _ev(10 * h + 2, h)])
    ui = UI(inst, tmp_path, cfg)
    ends = _run_end_sensor(inst, cfg)
    assert run_range(cfg, ds.name, H[0], H[3], inst).success
    ui.assert_truth("loaded")

    # later hours loaded: refused, H1 stays materialized; the fix names H1..H3 in order
    res = run_range(cfg, ds.name, H[1], H[1], inst)
    assert not res.success and "LaterHoursLoadedError" in (res.error or "")
    ui.assert_truth("later hours loaded")
    text = _failure_text(inst, res.run_id)
    assert f"select {H[1]}..{H[3]} and Launch backfill" in text, text
    # the error's own fix and the summary's way to rerun name the same command
    [cmd] = set(re.findall(r"dedup-pipeline run --config \S+ --dataset \S+ --from \S+ --to [0-9:-]+",
                           text))
    assert cmd.endswith(f"--from {H[1]} --to {H[3]}"), cmd
    # the printed command, run as printed (the CLI on this instance)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DEDUP_CONFIG", str(cfg.config_file))
    out = CliRunner().invoke(cli.main, shlex.split(cmd)[1:], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    ui.assert_truth("the printed command")

    # the dataset lock held by another writer
    with Lock(Storage(ds.output), owner="another run"):
        res = run_range(cfg, ds.name, H[2], H[3], inst)
    assert not res.success and "DatasetLockedError" in (res.error or "")
    ui.assert_truth("lock")

    # a breaking config change (another key): refused by the contract
    broken = pipeline_config(tmp_path, dataset_raw(fingerprint=["url"], key=["event_id", "user_id"],
                                                   expiry={"column": "event_time", "period": "24h"}),
                             name="broken.yaml")
    res = run_range(broken, ds.name, H[3], H[3], inst)
    assert not res.success and "ContractError" in (res.error or ""), res.error
    ui.assert_truth("contract")

    # the launchpad's run without a partition
    job = build_definitions(cfg).resolve_job_def(load_job_name(ds.name))
    assert not job.execute_in_process(instance=inst, raise_on_error=False).success
    ui.assert_truth("no partition")

    # a cancelled run (queued for H2, cancelled before it ran): the run-end sensor restates H2
    run = inst.create_run_for_job(job, tags={PARTITION: H[2]})
    inst.report_run_canceled(run)
    ends.tick()
    ui.assert_truth("cancelled")

    # a run that failed before its step ran (here: the run worker died): the run-end sensor
    run = inst.create_run_for_job(job, tags={PARTITION: H[3]})
    inst.report_run_failed(run, "the run worker died")
    ends.tick()
    ui.assert_truth("failed before its step")

    # a rerun of H2..H3 that fails in Spark at H2: the rerun withdrew H2's old commit record
    # before writing (a rerun replaces it), so H2 is uncommitted and Failed; H3, not reached,
    # keeps its committed load
    with monkeypatch.context() as m:
        _spark_fails_at(m, H[2])
        res = run_range(cfg, ds.name, H[2], H[3], inst)
    assert not res.success and "injected failure" in (res.error or ""), res.error
    assert "2026-11-01-02:00" not in {format_tag(t) for t in CommitLog(Storage(ds.output)).committed()}
    ui.assert_truth("Spark failure of a rerun", failed={H[2]})
    assert run_range(cfg, ds.name, H[2], H[3], inst).success  # the fix: load them again
    ui.assert_truth("H2..H3 loaded again")

    # a new hour whose load fails in Spark: uncommitted, and the only Failed hour
    with monkeypatch.context() as m:
        _spark_fails_at(m, H[4])
        res = run_range(cfg, ds.name, H[4], H[4], inst)
    assert not res.success
    ui.assert_truth("Spark failure of a new hour", failed={H[4]})
    assert runs.run_error(inst, res.run_id) is not None

    # loaded after all: nothing Failed any more
    assert run_range(cfg, ds.name, H[4], H[4], inst).success
    ui.assert_truth("H4 loaded")

    # each hour's latest materialization names the table version that committed the hour
    from deltalake import DeltaTable

    for h in H[:5]:
        [rec] = inst.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey([ds.name, "unique"]), asset_partitions=[h]), limit=1).records
        md = rec.asset_materialization.metadata
        commits = {c["version"]: c for c in DeltaTable(md["table_path"].value).history()}
        made = commits[md["delta_version"].value]
        assert made["dedup_pipeline.load_hour"] == h, (h, md["delta_version"], made)
