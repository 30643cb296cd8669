"""The Dagster surface (design.md D1, D5, D6, D7, R11) with real materializations on local Spark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow.dataset as pads
import pytest

from dedup_pipeline.config import PipelineConfig
from dedup_pipeline.orchestration import names
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.names import INDEX, RANGE_END, RANGE_START, RAW, load_job_name
from dedup_pipeline.orchestration.runner import run_range
from dedup_pipeline_tests.conftest import dataset_raw, pipeline_config, read_output, write_hour

REPO = Path(__file__).resolve().parents[1]
OUTPUT_NAMES = names.WRITTEN


def _cfg(tmp: Path) -> PipelineConfig:
    return pipeline_config(tmp, dataset_raw(fingerprint=["url"],
                                            expiry={"column": "event_time", "period": "24h"}))


def _ev(i: int, hour: int, url: str = "/a") -> dict:
    return {"event_id": f"e{i}", "user_id": "u", "event_time": f"2026-11-01T{hour:02d}:10:00Z",
            "url": url}


@pytest.fixture
def landing(tmp_path: Path):
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    write_hour(ds, "2026-11-01-00:00", [_ev(1, 0), _ev(2, 0), _ev(2, 0), "{oops"])
    write_hour(ds, "2026-11-01-01:00", [_ev(2, 1, "/b"), _ev(3, 1)])
    write_hour(ds, "2026-11-01-02:00", [_ev(4, 2), _ev(1, 2)])
    return cfg


@pytest.mark.slow  # `dagster definitions validate` in subprocesses
def test_definitions_load_without_spark_and_validate(tmp_path: Path) -> None:
    _cfg(tmp_path)
    env = {**os.environ, "DEDUP_CONFIG": str(tmp_path / "dedup.yaml")}
    code = ("import dedup_pipeline.definitions as d, dagster as dg\n"
            "from pyspark import SparkContext\n"
            "dg.Definitions.validate_loadable(d.defs)\n"
            "assert SparkContext._active_spark_context is None, 'Spark started at load'\n"
            "assert SparkContext._gateway is None, 'a JVM was started at load'\n"
            "print(sorted(k.to_user_string() for k in d.defs.resolve_asset_graph().get_all_asset_keys()))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in (*OUTPUT_NAMES, RAW):
        assert f"clicks/{name}" in out.stdout
    dagster = str(Path(sys.executable).parent / "dagster")
    for args in ([], ["-w", "workspace.yaml"]):
        res = subprocess.run([dagster, "definitions", "validate", *args], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow  # `dg check defs` in a subprocess
def test_dg_check_defs_loads_the_project(tmp_path: Path) -> None:
    """`[tool.dg]` is real: `dg` (dagster-dg-cli, in the dev extra) finds the code location the
    pyproject names and loads its definitions."""
    _cfg(tmp_path)
    env = {**os.environ, "DEDUP_CONFIG": str(tmp_path / "dedup.yaml"),
           "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    dg_cli = str(Path(sys.executable).parent / "dg")
    res = subprocess.run([dg_cli, "check", "defs"], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "All definitions loaded successfully" in res.stdout + res.stderr


def test_bad_config_fails_definitions_with_named_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets:\n  - name: clicks\n    start: '2026-11-01-00:00'\n"
                   "    source: {path: l, format: jsonl, schema: {id: strng}}\n"
                   "    key: [id]\n    output: o\n")
    env = {**os.environ, "DEDUP_CONFIG": str(bad)}
    res = subprocess.run([sys.executable, "-c", "import dedup_pipeline.definitions"], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert str(bad) in res.stderr and "'clicks'" in res.stderr and "source.schema.id" in res.stderr


@pytest.mark.fast
def test_asset_graph_shape(landing) -> None:
    defs = build_definitions(landing)
    graph = defs.resolve_asset_graph()
    index_key = dg.AssetKey(["clicks", INDEX])
    raw_key = dg.AssetKey(["clicks", RAW])
    node = graph.get(index_key)
    assert index_key in node.parent_keys and raw_key in node.parent_keys
    mapping = graph.get_partition_mapping(index_key, index_key)
    assert isinstance(mapping, dg.TimeWindowPartitionMapping)
    assert (mapping.start_offset, mapping.end_offset) == (-1, -1)
    for name in ("unique", "duplicates", "expired", "rejected"):
        assert raw_key in graph.get(dg.AssetKey(["clicks", name])).parent_keys
    assets_def = graph.get(index_key).assets_def
    assert assets_def.backfill_policy == dg.BackfillPolicy.single_run()
    pdef = assets_def.partitions_def
    assert isinstance(pdef, dg.HourlyPartitionsDefinition)
    assert pdef.get_first_partition_key() == "2026-11-01-00:00"
    assert not graph.get(raw_key).is_materializable


def test_names_are_spelled_once_here_as_the_ui_and_deploy_files_see_them(landing) -> None:
    """Names are an interface (the UI, deploy/dagster.yaml's limits, run configs): the other tests
    import them from orchestration/names.py; this one pins their spelling."""
    defs = build_definitions(landing)
    load = defs.resolve_job_def("clicks_hourly_load")
    rebuild = defs.resolve_job_def("clicks_index_rebuild")
    assert load.tags["dedup_pipeline/dataset"] == rebuild.tags["dedup_pipeline/dataset"] == "clicks"
    assert {n.name: n.definition.pool for n in (*load.nodes, *rebuild.nodes)} == {
        "clicks_load": "dedup_clicks", "clicks_rebuild_index": "dedup_clicks"}
    for sensor in ("clicks_landing_sensor", "clicks_index_recovery_sensor", "clicks_run_end"):
        defs.resolve_sensor_def(sensor)
    for schedule in ("clicks_hourly_schedule", "clicks_reconcile_schedule",
                     "clicks_table_upkeep_schedule"):
        defs.resolve_schedule_def(schedule)
    upkeep = defs.resolve_job_def("clicks_table_upkeep")
    assert {n.name: n.definition.pool for n in upkeep.nodes} == {"clicks_vacuum_tables": "dedup_clicks"}
    assert {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()} == {
        "clicks/raw_batch", "clicks/unique", "clicks/duplicates", "clicks/expired",
        "clicks/rejected", "clicks/index"}
    assert (names.RANGE_START, names.RANGE_END, names.PARTITION) == (
        "dagster/asset_partition_range_start", "dagster/asset_partition_range_end",
        "dagster/partition")


@pytest.mark.fast
def test_single_hour_materialization_metadata(spark, landing) -> None:
    job = build_definitions(landing).resolve_job_def(load_job_name("clicks"))
    with dg.instance_for_test() as inst:
        res = job.execute_in_process(partition_key="2026-11-01-00:00", instance=inst)
        assert res.success
        unique = read_output(spark, landing.datasets[0], "unique", "2026-11-01-00")
        for name in OUTPUT_NAMES:
            ev = inst.get_latest_materialization_event(dg.AssetKey(["clicks", name]))
            assert ev is not None and ev.asset_materialization.partition == "2026-11-01-00:00"
            md = ev.asset_materialization.metadata
            for field in ("rows_in", "duplicate_rate", "conflicts", "expiry_point",
                          "latest_point", "seconds_classify", "index_keys_written"):
                assert isinstance(md[field].value, int | float), field
        md = inst.get_latest_materialization_event(
            dg.AssetKey(["clicks", "unique"])).asset_materialization.metadata
        assert md["dagster/row_count"].value == len(unique) == 2
        assert md["rows_in"].value == 4 and md["rejected"].value == 1
        # where a downstream asset reads the hour: the Delta table, a version, the hour's files
        from deltalake import DeltaTable

        dt = DeltaTable(md["table_path"].value, version=md["delta_version"].value)
        in_hour = pads.field("load_hour") == "2026-11-01-00"  # the partition filter
        assert dt.to_pyarrow_dataset().count_rows(filter=in_hour) == 2
        files = list(dt.to_pyarrow_dataset().get_fragments(filter=in_hour))
        assert md["table_files"].value == len(files) >= 1


def test_ranged_run_is_one_run_in_order_with_per_partition_figures(spark, landing) -> None:
    ds = landing.datasets[0]
    job = build_definitions(landing).resolve_job_def(load_job_name("clicks"))
    with dg.instance_for_test() as inst:
        res = job.execute_in_process(
            instance=inst, tags={RANGE_START: "2026-11-01-00:00", RANGE_END: "2026-11-01-02:00"})
        assert res.success
        assert len(inst.get_run_records()) == 1
        key = dg.AssetKey(["clicks", "unique"])
        assert inst.get_materialized_partitions(key) == {
            "2026-11-01-00:00", "2026-11-01-01:00", "2026-11-01-02:00"}
        obs = [e for e in res.all_events if e.event_type_value == "ASSET_OBSERVATION"]
        per_part = {}
        for h in inst.get_materialized_partitions(key):  # each partition's latest materialization
            [rec] = inst.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[h]), limit=1).records
            per_part[h] = rec.asset_materialization.metadata["dagster/row_count"].value
        expected = {h: len(read_output(spark, ds, "unique", h[:13])) for h in per_part}
        assert per_part == expected and len(per_part) == 3
        # hour 1: e2 is a conflict of hour 0's e2; hour 2: e1 replays hour 0
        dups = read_output(spark, ds, "duplicates", "2026-11-01-01")
        assert [(d["event_id"], d["_duplicate_kind"], d["_first_load_hour"]) for d in dups] == [
            ("e2", "conflict", "2026-11-01-00")]
        raw_obs = [e.event_specific_data.asset_observation for e in obs
                   if e.event_specific_data.asset_observation.asset_key
                   == dg.AssetKey(["clicks", RAW])]
        assert {o.partition: o.metadata["rows"].value for o in raw_obs} == {
            "2026-11-01-00:00": 4, "2026-11-01-01:00": 2, "2026-11-01-02:00": 2}


@pytest.mark.fast
def test_out_of_order_load_fails_naming_missing_hours(spark, landing) -> None:
    with dg.instance_for_test() as inst:
        run = run_range(landing, "clicks", "2026-11-01-02:00", "2026-11-01-02:00", inst)
        assert not run.success
        assert "LoadOrderError" in run.error
        assert "2026-11-01-00:00..2026-11-01-01:00" in run.error
        assert not (Path(landing.datasets[0].output) / "unique").exists()
