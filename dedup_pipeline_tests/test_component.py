"""The `DedupDataset` component (design.md D8) in a team's `dg` project, loaded in this process:
scaffolded `defs.yaml` files, two datasets beside the team's own asset in one code location, the
config's messages located in the `defs.yaml`, the schema `dg check yaml` reads. The installed
wheel in a fresh project driven by the `dg` command: test_install.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import dagster as dg
import jsonschema
import pytest
import yaml
from dagster.components.core.snapshot import get_package_entry_snap
from dagster.components.scaffold.scaffold import ScaffoldRequest
from dagster_shared.serdes.objects import EnvRegistryKey
from hypothesis import given, settings
from hypothesis import strategies as st

import dedup_pipeline
from dedup_pipeline.cli.demo import DEFINITIONS_PY, PROJECT_TOML
from dedup_pipeline.config import (
    ConfigError,
    DatasetConfig,
    PipelineConfig,
    load_config,
    parse_config,
)
from dedup_pipeline.config.models import Where
from dedup_pipeline.orchestration import runs
from dedup_pipeline.orchestration.component import DedupDataset, DedupDatasetScaffolder
from dedup_pipeline.orchestration.names import SPARK_RESOURCE, WRITTEN
from dedup_pipeline.sample.generate import generate_landing

# the team's own asset: hourly, after each loaded hour of clicks/unique (declarative automation)
REPORT_PY = """\
import dagster as dg

@dg.asset(deps=[dg.AssetKey(["clicks", "unique"])],
          partitions_def=dg.HourlyPartitionsDefinition(start_date="{start}"),
          automation_condition=dg.AutomationCondition.eager())
def clicks_report() -> None:
    pass
"""
DATASET_ASSETS = {"raw_batch", *WRITTEN}


def write_project(root: Path, pkg: str) -> Path:
    """A `dg` project as `dg scaffold project` lays it out (src/<pkg>/defs/), written offline."""
    (root / "src" / pkg / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PROJECT_TOML.format(pkg=pkg))
    (root / "src" / pkg / "__init__.py").write_text("")
    (root / "src" / pkg / "defs" / "__init__.py").write_text("")
    (root / "src" / pkg / "definitions.py").write_text(DEFINITIONS_PY)
    return root / "src" / pkg / "defs"


def scaffold(defs: Path, name: str, project: Path) -> Path:
    DedupDatasetScaffolder().scaffold(ScaffoldRequest(
        type_name="dedup_pipeline.DedupDataset", target_path=defs / name, scaffold_format="yaml",
        project_root=project, params=None))
    return defs / name / "defs.yaml"


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A project `teamproj` with clicks and orders scaffolded and the team's report asset."""
    root = tmp_path / "teamproj"
    defs = write_project(root, "teamproj")
    clicks = scaffold(defs, "clicks", root)
    scaffold(defs, "orders", root)
    start = yaml.safe_load(clicks.read_text())["attributes"]["start"]
    (defs / "report.py").write_text(REPORT_PY.format(start=start))
    sys.path.insert(0, str(root / "src"))
    try:
        yield root, defs
    finally:
        sys.path.remove(str(root / "src"))
        for mod in [m for m in sys.modules if m == "teamproj" or m.startswith("teamproj.")]:
            del sys.modules[mod]


def _load(root: Path) -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=root)


def test_the_package_exports_the_component_dg_discovers() -> None:
    assert dedup_pipeline.DedupDataset is DedupDataset
    assert "DedupDataset" in dir(dedup_pipeline)
    snap = get_package_entry_snap(EnvRegistryKey(name="DedupDataset", namespace="dedup_pipeline"),
                                  DedupDataset)
    assert snap.summary == "A deduplicated hourly dataset on Spark: unique, duplicates, expired and " \
                           "rejected Delta tables."
    [schema] = [d.schema for d in snap.feature_data if hasattr(d, "schema") and d.schema
                and "properties" in d.schema and "source" in d.schema["properties"]]
    # the config's own fields (config/models.py DatasetConfig) and the Spark section, nothing else
    assert set(schema["properties"]) == {
        "name", "start", "source", "key", "fingerprint", "order_by", "expiry", "output", "index",
        "landing", "checks", "on_damaged_index", "output_format", "asset_key_prefix", "spark",
        "sensors", "group_name"}
    assert set(schema["required"]) == {"name", "start", "source", "key", "output"}
    assert schema["additionalProperties"] is False


def test_two_scaffolded_datasets_and_a_team_asset_load_in_one_code_location(project) -> None:
    root, defs_dir = project
    defs = _load(root)
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == ({f"{ds}/{a}" for ds in ("clicks", "orders") for a in DATASET_ASSETS}
                    | {"clicks_report"})
    assert repo.asset_graph.get(dg.AssetKey("clicks_report")).parent_keys == {
        dg.AssetKey(["clicks", "unique"])}
    per_dataset = {"{}_landing_sensor", "{}_index_recovery_sensor", "{}_run_end"}
    assert {s.name for s in repo.sensor_defs} == (
        {n.format(ds) for n in per_dataset for ds in ("clicks", "orders")}
        | {"default_automation_condition_sensor"})
    jobs = {j.name for j in repo.get_all_jobs()} - {"__ASSET_JOB"}
    assert jobs == {f"{ds}_{j}" for ds in ("clicks", "orders") for j in (
        "hourly_load", "index_rebuild", "explain", "input_check", "table_upkeep")}
    # the scaffolded paths: under the project's data/, the template rendered
    assert _landing(defs, "clicks") == str(root / "data" / "landing" / "clicks")
    assert defs.resolve_job_def("clicks_hourly_load").tags["dedup_pipeline/dataset"] == "clicks"
    dg.Definitions.validate_loadable(defs)


def _landing(defs: dg.Definitions, ds: str) -> str:
    [spec] = [s for s in defs.resolve_all_asset_specs() if s.key == dg.AssetKey([ds, "raw_batch"])]
    return str(spec.metadata["path"])


def test_scaffolded_attributes_are_the_demo_dataset_and_satisfy_the_schema(project) -> None:
    root, defs_dir = project
    doc = yaml.safe_load((defs_dir / "clicks" / "defs.yaml").read_text())
    assert doc["type"] == "dedup_pipeline.DedupDataset"
    attrs = doc["attributes"]
    jsonschema.validate(attrs, DedupDataset.get_model_cls().model_json_schema())
    assert attrs["source"]["path"] == "{{ context.project_root }}/data/landing/clicks"
    # the same dataset as the generator's config (sample/demo.py), paths aside
    from dedup_pipeline.sample.demo import demo_dataset
    same = demo_dataset(attrs["start"])
    for k in ("name", "start", "key", "fingerprint", "order_by", "expiry"):
        assert attrs[k] == same[k], k
    assert attrs["source"]["schema"] == same["source"]["schema"]


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def _config_error(root: Path) -> ConfigError:
    with pytest.raises(Exception) as raised:
        _load(root)
    err = raised.value
    while not isinstance(err, ConfigError):
        err = err.__cause__ or err.__context__
        assert err is not None, raised.value
    return err


def _bad(defs_dir: Path, old: str, new: str) -> tuple[Path, str]:
    path = defs_dir / "orders" / "defs.yaml"
    _edit(path, old, new)
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if new in t)
    return path, f"{path}:{line}"


@pytest.mark.parametrize(("old", "new", "fld"), [
    # a bad value
    ("period: 24h", "period: 24x", "expiry.period"),
    ("output_format: delta", "output_format: iceberg", "output_format"),
    # a cross-field rule: a column the schema does not have
    ("key: [event_id]", "key: [event_ide]", "key"),
    ("order_by: event_time", "order_by: event_tim", "order_by"),
    # an unknown key, at its own line (not at `attributes:`), also inside a section
    ("fingerprint: [user_id, url]", "fingerprnt: [user_id, url]", "fingerprnt"),
    ("period: 24h", "perod: 24h", "expiry.perod"),
], ids=["bad value", "bad choice", "key not in schema", "order_by not in schema",
        "unknown key", "unknown key in a section"])
def test_a_bad_defs_yaml_fails_with_the_config_files_message_at_its_line(project, old, new, fld):
    root, defs_dir = project
    path, where = _bad(defs_dir, old, new)
    err = _config_error(root)
    # the message a config file with this dataset gets, located at the line in the defs.yaml
    attrs = yaml.safe_load(path.read_text())["attributes"]
    attrs["source"]["path"], attrs["output"] = "landing", "warehouse"
    with pytest.raises(ConfigError) as from_file:
        parse_config({"datasets": [attrs]}, "dedup.yaml", path.parent)
    assert str(err) == str(from_file.value).replace("config error in dedup.yaml:",
                                                    f"config error in {where}:")
    assert f"dataset 'orders', field '{fld}'" in str(err)
    # the command line reads the defs.yaml as a config file of its one dataset: the same message
    with pytest.raises(ConfigError) as from_cli:
        load_config(path)
    assert str(from_cli.value) == str(err)


def test_the_command_line_reads_a_defs_yaml_as_the_component_does(
        project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command takes a defs.yaml as --config (design.md D8): the dataset the component
    loads, templates rendered; a template only Dagster renders, or another type, is refused."""
    root, defs_dir = project
    path = defs_dir / "clicks" / "defs.yaml"
    defs = _load(root)
    by_component = {"clicks": _landing(defs, "clicks")}
    cfg = load_config(path)
    assert cfg.config_file == str(path) and [d.name for d in cfg.datasets] == ["clicks"]
    assert cfg.datasets[0].source.path == by_component["clicks"] == str(
        root / "data" / "landing" / "clicks")
    text = path.read_text()
    monkeypatch.setenv("DEDUP_TEST_OUT", str(root / "elsewhere"))
    path.write_text(text.replace('"{{ context.project_root }}/data/warehouse/clicks"',
                                 '"{{ env.DEDUP_TEST_OUT }}/clicks"'))
    assert load_config(path).datasets[0].output == str(root / "elsewhere" / "clicks")
    path.write_text(text.replace("{{ context.project_root }}/data/warehouse",
                                 "{{ context.load_component('x') }}"))
    with pytest.raises(ConfigError, match=r"\{\{ context.load_component\('x'\) \}\}: the "
                       r"command line renders only"):
        load_config(path)
    path.write_text(text.replace("type: dedup_pipeline.DedupDataset", "type: other.Thing"))
    with pytest.raises(ConfigError, match="the command line reads those of "
                       "dedup_pipeline.DedupDataset"):
        load_config(path)


def test_relative_paths_resolve_against_the_defs_yaml(project) -> None:
    root, defs_dir = project
    path = defs_dir / "orders" / "defs.yaml"
    path.write_text(path.read_text().replace(
        '"{{ context.project_root }}/data/landing/orders"', "landing"))
    assert _landing(_load(root), "orders") == str(defs_dir / "orders" / "landing")
    # built in Python, with no file: against the working directory
    attrs = {**yaml.safe_load(path.read_text())["attributes"], "output": str(root / "o")}
    component = DedupDataset.from_attributes_dict(attributes=attrs)
    assert component.dataset.source.path == str(Path.cwd() / "landing")


@pytest.mark.parametrize(("old", "new", "fld", "problem"), [
    ("data/warehouse/orders", "data/warehouse/clicks", "output",
     "{root}/data/warehouse/clicks is also the output of dataset 'clicks' (in {clicks})"),
    ("data/warehouse/orders", "data/warehouse/clicks/o", "output",
     "{root}/data/warehouse/clicks/o lies inside the output of dataset 'clicks' "
     "({root}/data/warehouse/clicks, in {clicks}); each dataset needs its own directory"),
    ("data/warehouse/orders", "data", "output",
     "{root}/data holds the output of dataset 'clicks' ({root}/data/warehouse/clicks, in "
     "{clicks}); each dataset needs its own directory"),
    ("name: orders", "name: clicks", "name", "two datasets share this name (in {clicks})"),
], ids=["same output", "output inside", "output around", "same name"])
def test_two_defs_yaml_that_cannot_live_side_by_side_are_refused_at_the_line(
        project, old: str, new: str, fld: str, problem: str) -> None:
    """C2 holds across the components of a code location as across the datasets of a file: one
    output tree is never written by two datasets, whichever defs.yaml declares them."""
    root, defs_dir = project
    clicks, orders = defs_dir / "clicks" / "defs.yaml", defs_dir / "orders" / "defs.yaml"
    _edit(orders, old, new)
    line = next(i for i, t in enumerate(orders.read_text().splitlines(), 1) if f"{fld}:" in t)
    name = "clicks" if fld == "name" else "orders"
    assert str(_config_error(root)) == (
        f"config error in {orders}:{line}: dataset {name!r}, field {fld!r}: "
        + problem.format(root=root, clicks=clicks))
    # the same two datasets in one config file: the same rule, the same dataset and field
    both = [yaml.safe_load(p.read_text().replace("{{ context.project_root }}", str(root)))[
        "attributes"] for p in (clicks, orders)]
    with pytest.raises(ConfigError) as from_file:
        parse_config({"datasets": both}, "dedup.yaml", root)
    assert str(from_file.value) == (f"config error in dedup.yaml: dataset {name!r}, field {fld!r}: "
                                    + problem.format(root=root, clicks=clicks).replace(
                                        f" (in {clicks})", "").replace(f", in {clicks}", ""))


def test_one_spark_section_serves_every_dataset_and_two_different_ones_are_refused(
        project) -> None:
    """A run has one Spark session: a `spark:` given in one defs.yaml is every dataset's; two
    different ones are a config error at the second's line, not Dagster's resource clash."""
    root, defs_dir = project
    clicks, orders = defs_dir / "clicks" / "defs.yaml", defs_dir / "orders" / "defs.yaml"
    commented = '# spark: {master: "local[*]"}'
    _edit(orders, commented, 'spark: {master: "local[2]", conf: {spark.sql.shuffle.partitions: 4}}')
    spark = _load(root).resources[SPARK_RESOURCE]
    assert (spark.master, spark.remote, spark.conf) == (
        "local[2]", None, {"spark.sql.shuffle.partitions": "4"})
    _edit(clicks, commented, 'spark: {master: "local[*]"}')
    line = next(i for i, t in enumerate(orders.read_text().splitlines(), 1) if "spark:" in t)
    assert str(_config_error(root)) == (
        f"config error in {orders}:{line}: dataset 'orders', field 'spark': differs from the "
        f"spark: of dataset 'clicks' (in {clicks}); a code location runs one Spark session: give "
        "the same settings, or give them in one defs.yaml only (the others take them)")


# (path in the attributes, value): a numeric expiry column takes a number period
_DOUBLE = {"source": {"schema": {"event_id": "string", "n": "double"}}, "order_by": None,
         "fingerprint": None, "expiry": {"column": "n", "period": "5", "basis": "event"}}
_SHAPES = [
    (("name",), "clicks_2"), (("start",), "2026-1-2-3:00"), (("start",), "{{ env.START }}"),
    (("expiry", "period"), " 90 s "), (("expiry", "period"), "7d"),
    (("landing", "grace"), "15m"), (("landing", "check_every"), "1.5m"),
    (("index", "slice_span"), "6h"),
]
_DOUBLE_SHAPES = [(("expiry", "period"), v) for v in ("5", "1e3", "+2", " 0.5 ", 3, 2.5)]
_BAD = [
    (("name",), "Clicks!"), (("start",), "2026-11-01T00:00"), (("start",), "2026-11-01-00:30"),
    (("expiry", "period"), "24x"), (("expiry", "period"), "a day"), (("landing", "grace"), "900"),
    (("landing", "check_every"), 30), (("index", "slice_span"), "6 hours"),
]


def _attrs(at: tuple[str, ...], value: object, base: dict | None = None) -> dict:
    from dedup_pipeline.sample.demo import demo_dataset
    attrs = {**demo_dataset("2026-11-01-00:00"), "output": "/tmp/o", **(base or {})}
    attrs["source"] = {**demo_dataset("2026-11-01-00:00")["source"], **attrs["source"]}
    node = attrs
    for k in at[:-1]:
        node[k] = dict(node.get(k) or {})
        node = node[k]
    node[at[-1]] = value
    return {k: v for k, v in attrs.items() if v is not None}


def _id(v: object) -> str:
    return ".".join(v) if isinstance(v, tuple) else "double" if isinstance(v, dict) else repr(v)


def _schema_errors(attrs: dict) -> list[str]:
    v = jsonschema.Draft202012Validator(DedupDataset.get_model_cls().model_json_schema())
    return [e.message for e in v.iter_errors(attrs)]


@pytest.mark.parametrize(("at", "value", "base"), [(*s, None) for s in _SHAPES]
                         + [(*s, _DOUBLE) for s in _DOUBLE_SHAPES], ids=_id)
def test_the_schema_dg_check_yaml_reads_accepts_what_the_config_accepts(at, value, base) -> None:
    attrs = _attrs(at, value, base)
    assert _schema_errors(attrs) == []
    if "{{" not in str(value):
        parse_config({"datasets": [attrs]}, "dedup.yaml", Path("/tmp"))


@pytest.mark.parametrize(("at", "value"), _BAD, ids=_id)
def test_dg_check_yaml_refuses_a_misspelt_name_hour_or_duration_by_the_schema(at, value) -> None:
    """`dg check yaml` validates with the JSON schema alone: the single-field rules it can state
    (names, hours, durations) are in it, so a typo is reported at its line before anything runs;
    the config refuses the same value with its own message."""
    attrs = _attrs(at, value)
    assert _schema_errors(attrs), (at, value)
    with pytest.raises(ConfigError, match=f"field '{'.'.join(at)}'"):
        parse_config({"datasets": [attrs]}, "dedup.yaml", Path("/tmp"))


_FIELDS = [(("start",), None), (("expiry", "period"), None), (("expiry", "period"), _DOUBLE),
           (("landing", "grace"), None), (("index", "slice_span"), None)]


@settings(max_examples=1000, deadline=None)
@given(field=st.sampled_from(_FIELDS), text=st.one_of(
    st.text(alphabet="0123456789 .:-+e_hmsdwu\t", max_size=16),
    st.from_regex(r" ?[-+]?[0-9_]{0,3}\.?[0-9]{0,2}([eE][-+]?[0-9])? ?(us|ms|s|m|h|d|w)? ?",
                  fullmatch=True),
    st.builds(lambda t, fmt: t.strftime(fmt), st.datetimes(datetime(1000, 1, 1)),
              st.sampled_from(["%Y-%m-%d-%H:00", "%Y-%-m-%-d-%-H:0", "%Y-%m-%d-%H:%M"]))))
def test_the_schema_never_refuses_a_value_the_config_accepts(field, text: str) -> None:
    """The schema is no stricter than the config (fuzzed): `dg check yaml` never fails a
    `defs.yaml` that loads."""
    at, base = field
    attrs = _attrs(at, text, base)
    try:
        parse_config({"datasets": [attrs]}, "dedup.yaml", Path("/tmp"))
    except ConfigError:
        return
    assert _schema_errors(attrs) == [], (at, text)


def test_the_ui_documents_every_field_and_its_example_is_a_dataset() -> None:
    """The component's page in the UI (Components, from the code location's snapshot) shows each
    field's description and an example `defs.yaml` drawn from the schema: every field has one, and
    the example, less the fields no one dataset holds together, is a dataset that loads."""
    from dagster_shared.yaml_utils.sample_yaml import generate_sample_yaml

    schema = DedupDataset.get_model_cls().model_json_schema()
    models = [("attributes", schema), *schema["$defs"].items()]
    assert [(m, f) for m, node in models for f, prop in node["properties"].items()
            if not prop.get("description")] == []
    example = yaml.safe_load(generate_sample_yaml("dedup_pipeline.DedupDataset", schema))
    attrs = example["attributes"]
    del attrs["spark"]["remote"]  # master or remote
    del attrs["expiry"]["categories"]  # a categorical expiry needs a string column
    from dedup_pipeline.config.loading import COMPONENT_ONLY, component_document
    from dedup_pipeline.orchestration.component import ComponentOptions

    assert set(schema["properties"]) - set(DatasetConfig.model_fields) == set(COMPONENT_ONLY)
    ComponentOptions.model_validate(attrs)  # the component's own attributes: valid too
    cfg = PipelineConfig.model_validate(component_document(attrs, "defs.yaml"),
                                        context=Where("defs.yaml", Path("/tmp")))
    assert cfg.datasets[0].name == "clicks" and cfg.spark.master == "local[*]"


TEAM_SPARK_PY = """\
import dagster as dg


@dg.definitions
def team() -> dg.Definitions:
    return dg.Definitions(resources={"spark": dg.ResourceDefinition.hardcoded_resource("team's")})
"""


def test_a_team_spark_resource_sits_beside_the_component(project) -> None:
    """The component's Spark resource is `dedup_spark`: a team's own `spark` resource in the same
    code location is left alone (Dagster refused two different resources under one key)."""
    root, defs_dir = project
    (defs_dir / "team.py").write_text(TEAM_SPARK_PY)
    defs = _load(root)
    assert {"spark", SPARK_RESOURCE} <= set(defs.resources)
    assert defs.resources[SPARK_RESOURCE].__class__.__name__ == "SparkResource"
    dg.Definitions.validate_loadable(defs)


def test_sensors_stopped_and_a_group_name_are_the_components_own_attributes(project) -> None:
    root, defs_dir = project
    orders = defs_dir / "orders" / "defs.yaml"
    _edit(orders, "  # sensors: stopped", "  sensors: stopped\n  group_name: sales")
    repo = _load(root).get_repository_def()
    status = {s.name: s.default_status for s in repo.sensor_defs}
    assert status["orders_landing_sensor"] == dg.DefaultSensorStatus.STOPPED
    assert status["orders_index_recovery_sensor"] == dg.DefaultSensorStatus.STOPPED
    assert status["clicks_landing_sensor"] == dg.DefaultSensorStatus.RUNNING
    groups = {k.to_user_string(): g for k, g in repo.asset_graph.get_all_group_names().items()} \
        if hasattr(repo.asset_graph, "get_all_group_names") else {
            k.to_user_string(): repo.asset_graph.get(k).group_name
            for k in repo.asset_graph.get_all_asset_keys()}
    assert groups["orders/unique"] == "sales" and groups["clicks/unique"] == "clicks"
    # the command line reads the defs.yaml as ever: those two are not the dataset's
    assert load_config(orders).datasets[0].name == "orders"
    _edit(orders, "sensors: stopped", "sensors: paused")
    line = next(i for i, t in enumerate(orders.read_text().splitlines(), 1) if "sensors:" in t)
    assert str(_config_error(root)) == (f"config error in {orders}:{line}: dataset 'orders', field "
                                        "'sensors': must be running or stopped, got 'paused'")


def test_loading_the_definitions_prints_no_beta_or_preview_warning_of_ours(project) -> None:
    """What `dg launch` / `dg dev` load: the defs folder, the repository, its jobs, sensors and
    checks resolved, every filter set aside (pytest's too): the recovery sensor names its job
    (no resource-bound copy with `owners=[]`), the input check's copies stay check definitions
    (no conversion with `execution_type`), so no warning is there to filter."""
    import warnings

    root, _ = project
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        repo = _load(root).get_repository_def()
        repo.get_all_jobs()
        repo.sensor_defs  # noqa: B018 - resolved as the daemon resolves them
        repo.asset_checks_defs_by_key  # noqa: B018
    ours = [f"{w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (dg.BetaWarning, dg.PreviewWarning))]
    assert ours == []


def test_an_asset_key_prefix_puts_every_key_under_it_and_a_run_materializes_them(
        project, spark) -> None:
    """`asset_key_prefix:` (the translation a team gives its keys): the graph, the checks, the
    downstream helper and a real run's materializations all use [*prefix, name, asset]."""
    root, defs_dir = project
    orders = defs_dir / "orders" / "defs.yaml"
    _edit(orders, "  # sensors: stopped", "  asset_key_prefix: [sales, raw]")
    repo = _load(root).get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert {f"sales/raw/orders/{a}" for a in DATASET_ASSETS} <= keys
    assert not [k for k in keys if k.startswith("orders/")]
    assert {c.asset_key.to_user_string() for c in repo.asset_graph.asset_check_keys} >= {
        "sales/raw/orders/unique", "sales/raw/orders/index", "sales/raw/orders/raw_batch"}
    handle = dedup_pipeline.dataset_assets(orders)
    assert handle.asset_key() == dg.AssetKey(["sales", "raw", "orders", "unique"])
    assert handle.partitions_def == repo.asset_graph.get(handle.asset_key()).partitions_def
    # a run of the load job: its events carry the prefixed keys, and the run is the dataset's
    ds = load_config(orders).datasets[0]
    generate_landing(root / "data", hours=1, rows_per_hour=40, start=ds.start,
                     fmt=ds.source.format, name=ds.name)
    job = _load(root).resolve_job_def("orders_hourly_load")
    with dg.instance_for_test() as inst:
        res = job.execute_in_process(instance=inst, partition_key=ds.start)
        assert res.success
        for a in WRITTEN:
            assert inst.get_materialized_partitions(
                dg.AssetKey(["sales", "raw", "orders", a])) == {ds.start}, a
        run = inst.get_run_by_id(res.run_id)
        assert runs.dataset_of_run(run) == "orders" and runs.is_load(run, "orders")


def test_dataset_assets_gives_downstream_code_the_keys_partitions_and_a_loaded_guard(project
                                                                                    ) -> None:
    root, defs_dir = project
    handle = dedup_pipeline.dataset_assets(defs_dir / "clicks" / "defs.yaml")
    repo = _load(root).get_repository_def()
    assert handle.asset_key() == dg.AssetKey(["clicks", "unique"])
    assert handle.asset_key("rejected") == dg.AssetKey(["clicks", "rejected"])
    assert handle.partitions_def == repo.asset_graph.get(handle.asset_key()).partitions_def
    assert handle.table_path() == str(root / "data" / "warehouse" / "clicks" / "unique")
    start = handle.partitions_def.get_first_partition_key()
    with pytest.raises(dg.Failure, match=f"clicks hour {start} is not loaded"):
        handle.require_loaded(start)
    with pytest.raises(ValueError, match="no output 'uniqe'"):
        handle.asset_key("uniqe")


@pytest.mark.parametrize(("fmt", "key"), [("jsonl", []), ("csv", ["event_id", "user_id"]),
                                          ("parquet", ["event_id"])])
def test_each_format_scaffolds_its_template_and_its_commands_run_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, key: list[str]) -> None:
    """`dg scaffold defs dedup_pipeline.DedupDataset orders --source-format csv --key event_id
    --key user_id`: that format's template, that key; the sample-data command in its comments
    writes that dataset's landing files, in its format, where the defs.yaml reads them."""
    import shlex

    from click.testing import CliRunner

    from dedup_pipeline.cli import main
    from dedup_pipeline.orchestration.component import ScaffoldParams

    root = tmp_path / "teamproj"
    defs = write_project(root, "teamproj")
    DedupDatasetScaffolder().scaffold(ScaffoldRequest(
        type_name="dedup_pipeline.DedupDataset", target_path=defs / "orders",
        scaffold_format="yaml", project_root=root,
        params=ScaffoldParams(source_format=fmt, key=key)))
    path = defs / "orders" / "defs.yaml"
    text = path.read_text()
    ds = load_config(path).datasets[0]
    assert (ds.name, ds.source.format, list(ds.key)) == ("orders", fmt, key or ["event_id"])
    commands = [line.split("#", 1)[1].strip() for line in text.splitlines()
                if line.lstrip("# ").startswith(("dedup-pipeline ", "dg "))]
    assert any(c.startswith("dg check defs") for c in commands)
    assert f"dg launch --job orders_hourly_load --partition {ds.start}" in commands
    generate = [c for c in commands if c.startswith("dedup-pipeline generate")]
    if fmt == "parquet":
        assert generate == []  # the generator writes JSONL and CSV only: the comment says so
        return
    [command] = generate
    args = shlex.split(command)[1:]
    args[args.index("--rows-per-hour") + 1] = "20"  # the command as written, smaller
    monkeypatch.chdir(root)  # the comment's commands run from the project root
    out = CliRunner().invoke(main, args, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    files = sorted(Path(ds.source.path).rglob(f"part-*.{fmt}"))
    assert len(files) == 48 and not (root / "data" / "dedup.yaml").exists()
