"""Shared fixtures and builders: one real local Spark session per test session, datasets in tmp
dirs, and the config builders every test file uses (`dataset_raw`, `source_raw`, `write_config`,
`pipeline_config`, `dataset_config`, `generated_config`) instead of its own copy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig, PipelineConfig, load_config, parse_config
from dedup_pipeline.engine.session import SparkSettings, get_session

# The fast tier: `./scripts/test.sh --fast` (pytest -m fast). It holds, marked by
# `pytest_collection_modifyitems` below, every test that starts no Spark and no service (pure Python:
# config, layout, digests, sensors' completeness rules, deploy files, ...), plus the tests marked
# `@pytest.mark.fast` by hand: every rule on small data with the one shared local Spark session below
# and a real Dagster run. Together under 2 minutes. A test that needs Spark without the `spark`
# fixture (a load, a Dagster run or a CLI command that starts its own session) carries
# `@pytest.mark.spark`; one that starts a server, daemon or subprocess load is `slow` (both run in
# the whole suite, which CI runs). The benchmark harness's tests are `bench` (`-m "not bench"` leaves
# them out; its pure ones are fast too). A test marked fast
# automatically that starts Spark anyway fails, naming the marker it needs.
#
# Which fast test covers which rule:
#
#   C2       test_config.py (all four tests: bad configs name the file, dataset and field)
#   R1       test_rules.py::test_exact_keys_null_keys_and_bad_input (exact compare, null keys)
#   R2       test_digest.py (all: unambiguous, type-aware, null-explicit, Spark = pure Python)
#   R3       test_rules.py::test_in_batch_winner_order
#   R4, R5   test_rules.py::test_cross_batch_fingerprint_order_and_empty_hour[fingerprint]
#   R6       test_rules.py::test_expiry_ordered_numbers (v = X kept, v < X expired, rejected
#            records do not move L), ::test_expiry_categories, ::test_expiry_processing_basis_uses_the_
#            partition_not_the_clock; across loads: the R7 test below (a key behind X_H is unique again)
#   R7       test_rules.py::test_retention_deletes_expired_slices_and_never_changes_a_result
#   R8       every test_rules.py load (`load` checks conservation against the landing files)
#   R9       test_rules.py::test_exact_keys_null_keys_and_bad_input,
#            ::test_csv_rows_with_wrong_field_count_and_bad_values
#   R10      test_rules.py::test_rerun_of_loaded_hours_changes_nothing (reruns);
#            test_storage.py::test_lock_excludes_a_second_holder_and_names_the_owner,
#            ::test_stale_lock_of_a_dead_process_is_taken_over (one writer)
#   R11      test_rules.py::test_cross_batch_fingerprint_order_and_empty_hour[fingerprint] (order,
#            missing hours named, an empty hour is a load); through Dagster:
#            test_dagster.py::test_out_of_order_load_fails_naming_missing_hours
#   R11a     test_rules.py::test_rerun_of_an_earlier_hour_never_leaves_later_hours_stale (a rerun
#            leaving out later loaded hours is refused; the full range is exact); through Dagster
#            and the CLI: test_reruns.py
#   R12      test_rules.py::test_lost_index_is_refused_then_rebuilt_and_later_loads_are_exact
#   L3       test_storage.py::test_replace_dir_readers_never_see_a_mix_or_nothing
#   D1, D5   test_dagster.py::test_asset_graph_shape, ::test_single_hour_materialization_metadata
#            (a real materialization of one hour with its checks and numeric metadata)
#
# Everything else with Spark or a service (landing-file corpora, crash points, checks and recovery
# through Dagster, sensor runs, CLI loads, servers, clusters, benchmarks) runs in the whole suite,
# `./scripts/test.sh`, which CI runs.

def pytest_configure(config: pytest.Config) -> None:
    """The suite's own config directory: the Spark Connect token file of `spark-server`
    (engine/connect_auth.py) lands there, never in the home directory of whoever runs the suite."""
    import tempfile

    if "DEDUP_TEST_CONFIG_HOME" not in os.environ:
        os.environ["DEDUP_TEST_CONFIG_HOME"] = tempfile.mkdtemp(prefix="dedup-tests-config-")
    os.environ["XDG_CONFIG_HOME"] = os.environ["DEDUP_TEST_CONFIG_HOME"]


# Markers that keep a test out of the automatic fast tier (the `spark` fixture does too).
NEEDS_MORE = ("spark", "slow")
_AUTO_FAST = pytest.StashKey[bool]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `fast` every test that uses no `spark` fixture (directly or through another fixture)
    and carries none of the markers in NEEDS_MORE."""
    for item in items:
        if item.get_closest_marker("fast") is not None:
            continue
        if "spark" in getattr(item, "fixturenames", ()):
            continue
        if any(item.get_closest_marker(m) is not None for m in NEEDS_MORE):
            continue
        item.add_marker(pytest.mark.fast)
        item.stash[_AUTO_FAST] = True
    _slow_files_first(items)


# The longest files, longest first (CI seconds by file: docs/notes.md, "CI time"): started first,
# so that no long file starts last on one worker while the other one has nothing left to run.
LONGEST_FILES = ("test_warm_server.py", "test_ui_buttons.py", "test_benchmarks.py",
                 "test_crash.py", "test_operations.py")


def _slow_files_first(items: list[pytest.Item]) -> None:
    """Files holding a `slow` test (servers, daemons, clusters: minutes each) run first, the
    LONGEST_FILES ahead of them, each file's tests together and in order: the suite's two workers
    (scripts/test.sh) take one file at a time, so the short files fill in at the end and both
    finish near the same time."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        return (item.path not in slow_files,
                LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES))

    items.sort(key=rank)  # stable: order kept otherwise


@pytest.fixture(autouse=True)
def _auto_fast_starts_no_spark(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked fast automatically that starts Spark fails at once, naming the marker it needs."""
    if not request.node.stash.get(_AUTO_FAST, False):
        return

    def refuse(*_: Any, **__: Any) -> None:
        pytest.fail(f"{request.node.nodeid} starts Spark: use the `spark` fixture or mark it "
                    "@pytest.mark.spark (it is in the fast tier only if it starts no Spark)",
                    pytrace=False)

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", refuse)


TEST_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "4",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)  # type: ignore[attr-defined]
    session = get_session(SparkSettings(master="local[2]", conf=TEST_SPARK_CONF))
    session.sparkContext.setLogLevel("ERROR")
    yield session


CLICKS_SCHEMA = {"event_id": "string", "user_id": "string", "event_time": "timestamp", "url": "string"}
START = "2026-11-01-00:00"


def source_raw(path: str = "landing", fmt: str = "jsonl", schema: dict[str, str] | None = None,
               **extra: Any) -> dict[str, Any]:
    """The YAML mapping of a dataset's `source` (default: the clicks schema in `landing`, JSONL)."""
    return {"path": path, "format": fmt, "schema": dict(schema or CLICKS_SCHEMA), **extra}


def dataset_raw(**fields: Any) -> dict[str, Any]:
    """The YAML mapping of a small clicks-like dataset; keyword arguments replace or add top-level
    fields (`fingerprint=["url"]`, `expiry={...}`, `source=source_raw(...)`, `name=...`)."""
    return {"name": "clicks", "start": START, "source": source_raw(), "key": ["event_id"],
            "output": "warehouse", **fields}


def write_config(root: Path, *datasets: dict[str, Any], name: str = "dedup.yaml",
                 **top: Any) -> Path:
    """Write a config file `root/name` of `datasets` (default: one `dataset_raw()`) and the
    file-level sections `top` (e.g. `spark={...}`); returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    doc = {"datasets": list(datasets) or [dataset_raw()], **top}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def pipeline_config(root: Path, *datasets: dict[str, Any], name: str = "dedup.yaml") -> PipelineConfig:
    """`write_config`, then load it as the definitions would (paths relative to `root`)."""
    return load_config(write_config(root, *datasets, name=name))


def dataset_config(tmp: Path, **overrides: Any) -> DatasetConfig:
    """A small clicks-like dataset rooted in `tmp` (no file written); keyword arguments replace
    top-level fields as in `dataset_raw`."""
    return parse_config({"datasets": [dataset_raw(**overrides)]}, "test", tmp).datasets[0]


def generated_config(root: Path, label: str, uris: bool = False, name: str | None = None) -> Path:
    """The config `generate_landing` wrote as `root/dedup.yaml`, with absolute paths (or file://
    URIs) and its own output `root/warehouse/<label>`, written as `root/<name or label.yaml>`."""
    raw = yaml.safe_load((root / "dedup.yaml").read_text())
    ds = raw["datasets"][0]
    scheme = "file://" if uris else ""
    ds["source"]["path"] = f"{scheme}{root / 'landing' / 'clicks'}"
    ds["output"] = f"{scheme}{root / 'warehouse' / label}"
    path = root / (name or f"{label}.yaml")
    path.write_text(yaml.safe_dump(raw))
    return path


def write_hour(ds: DatasetConfig, hour: str, rows: list[Any], name: str = "part-0.jsonl",
               header: str | None = None) -> Path:
    """Write one landing file for partition key `hour` ('2026-11-01-03:00').

    Rows are dicts (JSON-encoded), or raw strings written as they are (malformed lines, CSV rows).
    """
    d = Path(ds.source.path) / f"date={hour[:10]}" / f"hour={hour[11:13]}"
    d.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    if header is not None:
        lines = [header, *lines]
    p = d / name
    p.write_text("".join(f"{line}\n" for line in lines))
    return p


def table_files(table: Path, tag: str | None = None) -> list[str]:
    """The files (absolute paths) of the latest version of the Delta table at `table`, all hours
    or hour `tag`: from the add actions' relative paths (`file_uris()` percent-encodes the table
    root, so it does not name a root with spaces or unicode as the file system does)."""
    from deltalake import DeltaTable

    acts = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pydict()
    return [str(table / rel) for rel, hour in zip(acts["path"], acts["partition.load_hour"],
                                                  strict=True) if tag is None or hour == tag]


def read_output(spark: SparkSession, ds: DatasetConfig, output: str,
                hour: str | None = None) -> list[dict[str, Any]]:
    """Rows of one output (optionally one load hour) as dicts: through its Delta table where it
    is one (the files of the current version; a rerun's replaced files stay on disk until a
    vacuum), else its directory."""
    table = Path(ds.output) / output
    base = table if hour is None else table / f"load_hour={hour[:13]}"
    if not base.exists():
        return []
    if (table / "_delta_log").is_dir():
        files = table_files(table, None if hour is None else hour[:13])
        if not files:
            return []
        reader = spark.read if hour is not None else spark.read.option("basePath", str(table))
        return [r.asDict() for r in reader.parquet(*files).collect()]
    return [r.asDict() for r in spark.read.parquet(str(base)).collect()]


def output_table(ds: DatasetConfig, output: str, tag: str) -> Any:
    """One hour of one output as a pyarrow Table, as a reader sees it: through the Delta table
    where the output is one, else the partition directory; None where the hour is not there."""
    import pyarrow.parquet as pq

    table = Path(ds.output) / output
    part = table / f"load_hour={tag}"
    if (table / "_delta_log").is_dir():
        files = table_files(table, tag)
        return pq.read_table(files) if files else None
    return pq.read_table(part) if part.exists() else None


def table_readers(ds: DatasetConfig, output: str, column: str) -> dict[str, Any]:
    """The values of `column` (with `load_hour`) that each reader of output `output` sees, as a
    Counter of (load_hour, value): deltalake/pyarrow, DuckDB over the table's Arrow dataset, Polars
    (its own Delta reader), and a plain Hive-partitioned directory read (pyarrow.dataset)."""
    from collections import Counter

    import duckdb
    import polars as pl
    import pyarrow.dataset as pads
    from deltalake import DeltaTable

    uri = str(Path(ds.output) / output)
    dt = DeltaTable(uri)
    arrow = dt.to_pyarrow_table(columns=["load_hour", column]).to_pylist()
    data = dt.to_pyarrow_dataset()  # noqa: F841 - DuckDB reads it by its variable name
    duck = duckdb.sql(f'select load_hour, "{column}" from data').fetchall()
    polars = pl.read_delta(uri).select("load_hour", column).rows()
    plain = pads.dataset(uri, format="parquet", partitioning="hive",
                         exclude_invalid_files=True).to_table(columns=["load_hour", column])
    return {
        "deltalake": Counter((r["load_hour"], r[column]) for r in arrow),
        "duckdb": Counter(tuple(r) for r in duck),
        "polars": Counter(tuple(r) for r in polars),
        "directory": Counter((str(r["load_hour"]), r[column]) for r in plain.to_pylist()),
    }


# A commit record's required fields (every field a load writes), at nothing: for records built by
# hand (`CommitRecord(**NOTHING, load_hour=..., ...)`)
NOTHING: dict[str, Any] = {
    "conflicts": 0, "latest_point": None, "expiry_point": None, "files_in": 0,
    "index_rows_written": 0, "index_rows_read": 0, "index_bytes_read": 0, "index_files_read": 0,
    "index_slices_written": (), "index_slices_deleted": 0, "files_written": 0, "seconds": {},
    "check_figures": {}, "committed_at": "2026-11-01T00:00:00Z", "index_checksum": {},
    "inputs": (), "index_files": (), "index_format": 1, "output_files": {}, "contract_version": 1,
}


# -- the S3 tier: a real S3 server (SeaweedFS) per test session ---------------------------------------

@pytest.fixture(scope="session")
def s3_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """SeaweedFS on 127.0.0.1 (dedup_pipeline_tests/s3_store.py), its conditional writes checked."""
    from dedup_pipeline_tests.s3_store import running_store

    with running_store(tmp_path_factory.mktemp("s3store")) as store:
        store.lake = store.bucket("lake")  # type: ignore[attr-defined]
        yield store


@pytest.fixture
def s3(s3_store: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """This test's S3: the standard AWS variables set for the store (as a user would), and a
    prefix of its own, `s3.root` = ``s3://lake-…/<test>-<uuid>``."""
    import uuid

    for k, v in s3_store.env.items():
        monkeypatch.setenv(k, v)
    s3_store.root = f"s3://{s3_store.lake}/{uuid.uuid4().hex[:10]}"
    return s3_store


class SensorTicks:
    """A sensor evaluated tick after tick as the daemon does it: its cursor kept between ticks."""

    def __init__(self, sensor: Any, instance: Any) -> None:
        self.sensor, self.instance, self.cursor = sensor, instance, None

    def tick(self) -> Any:
        import dagster as dg

        data = self.sensor.evaluate_tick(dg.build_sensor_context(instance=self.instance,
                                                                 cursor=self.cursor))
        self.cursor = data.cursor
        return data
