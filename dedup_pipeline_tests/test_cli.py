"""The command line (design.md K2, K4): run through Dagster into DAGSTER_HOME, verify from files."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from dedup_pipeline.cli import main
from dedup_pipeline.config import load_config
from dedup_pipeline_tests.conftest import dataset_raw, source_raw, write_config, write_hour

ORDERS_SCHEMA = {"order_id": "long", "shop": "string", "ts": "timestamp", "amount": "double"}


def _orders(period: str = "2h") -> dict:
    return dataset_raw(name="orders", source=source_raw(fmt="csv", schema=ORDERS_SCHEMA),
                       key=["order_id", "shop"], fingerprint="all",
                       expiry={"column": "ts", "period": period})


HEADER = "order_id,shop,ts,amount"


@pytest.fixture
def orders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg_path = write_config(tmp_path, _orders())
    ds = load_config(cfg_path).datasets[0]
    write_hour(ds, "2026-11-01-00:00", ["1,s1,2026-11-01T00:01:00Z,1.5",
                                        "1,s2,2026-11-01T00:02:00Z,2.5",
                                        "1,s1,2026-11-01T00:03:00Z,9.5",
                                        "x,s1,2026-11-01T00:03:00Z,1",
                                        "2,s1,2026-11-01T00:04:00Z"], "a.csv", header=HEADER)
    write_hour(ds, "2026-11-01-01:00", ["3,s1,2026-11-01T01:01:00Z,1.0",
                                        "1,s1,2026-11-01T00:01:00Z,1.5"], "a.csv", header=HEADER)
    write_hour(ds, "2026-11-01-03:00", ["4,s1,2026-10-31T20:00:00Z,1.0",
                                        "1,s1,2026-11-01T03:00:00Z,1.5"], "a.csv", header=HEADER)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    return cfg_path


def test_run_loads_in_order_and_records_in_dagster_home(spark, orders: Path) -> None:
    r = CliRunner().invoke(main, ["run", "--config", str(orders), "--from", "2026-11-01-00:00",
                                  "--to", "2026-11-01-03:00"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    # one progress line per hour, then the table with one row per hour and a total
    assert sum("rows in, classified" in line for line in lines) == 4
    rows = [line.split() for line in lines if line.startswith("2026-11-01-0")]
    assert [row[0] for row in rows] == ["2026-11-01-00:00", "2026-11-01-01:00",
                                        "2026-11-01-02:00", "2026-11-01-03:00"]
    # hour 0: 5 in; (1,s1) twice -> 1 dup (conflict: amount differs); bad long and short row rejected
    assert rows[0][1:7] == ["5", "2", "1", "1", "0", "2"]
    # hour 2 has no input: a zero-row load
    assert rows[2][1:7] == ["0", "0", "0", "0", "0", "0"]
    # hour 3: L = 03:00, X = 01:00: order 4 (20:00 the day before) expires; (1,s1) is unique
    # again because its unique record (00:01) is older than X
    assert rows[3][1:7] == ["2", "1", "0", "0", "1", "0"]
    with dg.DagsterInstance.get() as inst:
        parts = inst.get_materialized_partitions(dg.AssetKey(["orders", "unique"]))
        assert parts == {f"2026-11-01-0{h}:00" for h in range(4)}


def test_run_failure_is_one_line_and_nonzero(spark, orders: Path) -> None:
    r = CliRunner().invoke(main, ["run", "--config", str(orders), "--from", "2026-11-01-01:00",
                                  "--to", "2026-11-01-01:00"])
    assert r.exit_code == 1
    err = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "missing 1 hour(s): 2026-11-01-00:00" in err[0]


def test_run_rejects_bad_config_naming_field(tmp_path: Path) -> None:
    bad = write_config(tmp_path, _orders(period="2 fortnights"), name="bad.yaml")
    r = CliRunner().invoke(main, ["run", "--config", str(bad), "--from", "2026-11-01-00:00",
                                  "--to", "2026-11-01-00:00"])
    assert r.exit_code == 1
    assert str(bad) in r.output and "'orders'" in r.output and "expiry.period" in r.output


def _append_rows(partition: Path, rows: list[dict]) -> None:
    existing = next(p for p in partition.glob("*.parquet"))
    schema = pq.read_schema(existing)
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, partition / "part-tampered.parquet")


def test_verify_passes_then_catches_tampering(spark, orders: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["run", "--config", str(orders), "--from", "2026-11-01-00:00",
                             "--to", "2026-11-01-03:00"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["verify", "--config", str(orders)])
    assert r.exit_code == 0, r.output
    assert "orders: 4 hours, 9 rows in, 9 rows out: OK" in r.output

    # a key already unique in hour 0 (ts 00:01, inside the window at hour 1) slipped into hour 1
    out = Path(orders).parent / "warehouse"
    row = pq.read_table(next((out / "unique/load_hour=2026-11-01-00").glob("*.parquet")))
    first = [r for r in row.to_pylist() if r["order_id"] == 1 and r["shop"] == "s1"]
    _append_rows(out / "unique/load_hour=2026-11-01-01", first)
    r = runner.invoke(main, ["verify", "--config", str(orders)])
    assert r.exit_code == 1
    violations = [line for line in r.output.splitlines() if line.startswith("VIOLATION")]
    assert any("2026-11-01-01:00: conservation broken: 2 rows in the landing files, 3" in v
               for v in violations), r.output
    assert any("2026-11-01-01:00: a key in unique is also unique" in v for v in violations)
    assert not any("2026-11-01-00:00" in v for v in violations)


@pytest.mark.spark  # the demo loads an hour through Dagster on local Spark
def test_demo_loads_all_but_the_newest_hour_and_says_how_to_load_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo is a dg project whose dataset is a DedupDataset component (design.md K1, D8), and
    it leaves the user something to do in the UI: its newest hour landed without its marker; the
    closing lines give the README's two UI commands and both ways to load that hour."""
    import os
    import sys

    from dedup_pipeline.engine.core import commits
    from dedup_pipeline.engine.core.storage import Storage
    from dedup_pipeline.hours import parse_hour, to_tag
    from dedup_pipeline.sample.generate import default_start

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    monkeypatch.setenv("SPARK_MASTER_URL", "local[1]")
    root = tmp_path / "demo"
    r = CliRunner().invoke(main, ["demo", "--dir", str(root), "--hours", "1",
                                  "--rows-per-hour", "20"])
    assert r.exit_code == 0, r.output
    loaded, pending = default_start(2), default_start(1)
    defs_yaml = root / "dedup_demo" / "defs" / "clicks" / "defs.yaml"
    assert yaml.safe_load(defs_yaml.read_text())["type"] == "dedup_pipeline.DedupDataset"
    assert not list(root.rglob("dedup.yaml"))  # one config: the component's
    cfg = load_config(str(defs_yaml))
    ds = cfg.datasets[0]
    assert ds.output == str(root / "data" / "warehouse" / "clicks")
    assert commits.committed_tags(Storage(ds.output)) == {to_tag(parse_hour(loaded))}
    marker = Path(ds.source.path) / f"date={pending[:10]}" / f"hour={pending[11:13]}" / "_SUCCESS"
    assert not marker.exists() and list(marker.parent.glob("*.jsonl"))
    assert "  .venv/bin/dedup-pipeline spark-server\n" in r.output
    assert (f"  cd {root} && SPARK_REMOTE=sc://127.0.0.1:15002 DAGSTER_HOME="
            f"{os.environ['DAGSTER_HOME']} {Path(sys.executable).parent / 'dg'} dev\n") in r.output
    assert f"hour {pending} has landed without its _SUCCESS marker" in r.output
    assert f"select {pending}, Launch" in r.output and f"touch {marker}" in r.output
    assert f"verify --config {defs_yaml}" in r.output
    # what `dg dev` in the project loads: the component's definitions, as the project's own
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    try:
        defs = dg.load_from_defs_folder(path_within_project=root / "dedup_demo")
        assert defs.resolve_job_def("clicks_hourly_load") is not None
    finally:
        for mod in [m for m in sys.modules if m.split(".")[0] == "dedup_demo"]:
            del sys.modules[mod]


def test_cascade_needs_no_to_and_to_is_required_without_it(orders: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --from H --cascade` (as docs/operations.md writes it) runs H through the latest loaded
    hour; without --cascade, --to is required."""
    import dedup_pipeline.cli.load as cli_load

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(cli_load, "run_hours", lambda cfg, ds, first, last, verbose=False: calls.append(
        (first, last)))
    r = CliRunner().invoke(main, ["run", "--config", str(orders), "--from", "2026-11-01-00:00"])
    assert r.exit_code == 2 and "Missing option '--to'" in r.output and "--cascade" in r.output
    r = CliRunner().invoke(main, ["run", "--config", str(orders), "--from", "2026-11-01-00:00",
                                  "--cascade"])
    assert r.exit_code == 0, r.output
    assert calls == [("2026-11-01-00:00", "2026-11-01-00:00")]  # nothing loaded yet: H alone


def test_the_cli_records_in_the_instance_beside_the_config(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Without DAGSTER_HOME the CLI records where the demo's UI reads: dagster_home/ beside the
    config when it holds a dagster.yaml; DAGSTER_HOME wins; with neither, a temporary instance."""
    from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML, instance_home

    cfg = load_config(write_config(tmp_path, _orders()))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert instance_home(cfg) is None
    (tmp_path / "dagster_home").mkdir()
    (tmp_path / "dagster_home" / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)
    assert instance_home(cfg) == tmp_path.resolve() / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "elsewhere"))
    assert instance_home(cfg) == tmp_path / "elsewhere"
