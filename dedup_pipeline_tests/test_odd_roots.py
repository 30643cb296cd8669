"""An output root may hold any character a POSIX path may (docs/design.md R9a, "Any name"): `#`,
`%`, `?`, `[`, spaces, non-ASCII, a trailing space. The load, the Delta publish, `verify`,
`vacuum`, `explain` and operations.md's readers (deltalake, Polars through the Arrow dataset,
DuckDB over it) all work under such a root, driven through the command line as a user drives it.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
import yaml
from click.testing import CliRunner
from deltalake import DeltaTable

from dedup_pipeline.cli import main
from dedup_pipeline.config import load_config
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.sample.generate import generate_landing

ROOTS = ["w out #1 A ü [x]", "p% ?q=1&r {a,b} * trailing "]
START = "2026-11-01-00:00"


def _config(tmp: Path, root: str, uri: bool) -> Path:
    generate_landing(tmp, hours=2, rows_per_hour=60, start=START)
    raw = yaml.safe_load((tmp / "dedup.yaml").read_text())
    ds = raw["datasets"][0]
    # a file:// URI names the path as written after it (not percent-decoded)
    ds["output"] = f"file://{tmp / 'warehouse' / root}" if uri else f"warehouse/{root}"
    path = tmp / "odd.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return path


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize(("root", "uri"), [(ROOTS[0], False), (ROOTS[1], True)])
def test_an_output_root_with_any_character_loads_verifies_and_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: str, uri: bool) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, root, uri)
    runner = CliRunner()
    r = runner.invoke(main, ["run", "--config", str(cfg), "--from", START,
                             "--to", "2026-11-01-01:00"])
    assert r.exit_code == 0, r.output
    ds = load_config(str(cfg)).datasets[0]
    out = tmp_path / "warehouse" / root
    assert Path(ds.output.removeprefix("file://")) == out and out.is_dir()
    assert commits.committed_tags(Storage(ds.output)) == {"2026-11-01-00", "2026-11-01-01"}
    r = runner.invoke(main, ["verify", "--config", str(cfg)])
    assert r.exit_code == 0 and "OK" in r.output, r.output
    r = runner.invoke(main, ["vacuum", "--config", str(cfg), "--retention-hours", "1"])
    assert r.exit_code == 0, r.output

    # operations.md's readers, on the plain path a user has
    table = str(out / "unique")
    dt = DeltaTable(table)
    rows = dt.to_pyarrow_dataset().to_table()
    assert dt.version() == 1 and rows.num_rows > 0
    assert pl.scan_delta(table, use_pyarrow=True).collect().height == rows.num_rows
    arrow = dt.to_pyarrow_dataset()  # noqa: F841 - DuckDB reads the local variable by name
    assert duckdb.sql("select count(*) from arrow").fetchall() == [(rows.num_rows,)]

    # explain finds a key of the table
    key = rows.column("event_id")[0].as_py()
    r = runner.invoke(main, ["explain", "--config", str(cfg), f"--key=event_id={key}", "--json"])
    assert r.exit_code == 0, r.output
    life = json.loads(r.output)
    assert [o["output"] for o in life["occurrences"]][:1] == ["unique"], life
    assert life["index_agrees"] is True, life


@pytest.mark.parametrize(("root", "shown"), [("a%41b", "'%41'"), ("a\\b", "'\\\\'"),
                                             ("a\tb", "'\\t'")])
def test_a_root_the_delta_library_cannot_hold_is_refused_naming_the_character(
        tmp_path: Path, root: str, shown: str) -> None:
    generate_landing(tmp_path, hours=1, rows_per_hour=10, start=START)
    raw = yaml.safe_load((tmp_path / "dedup.yaml").read_text())
    raw["datasets"][0]["output"] = f"warehouse/{root}"
    cfg = tmp_path / "odd.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    r = CliRunner().invoke(main, ["verify", "--config", str(cfg)])
    assert r.exit_code != 0
    assert f"config error in {cfg}: dataset 'clicks', field 'output': the Delta tables cannot " \
           f"live under " in r.output and f"it holds {shown}, which the Delta library" in r.output
    assert "set output_format: parquet" in r.output and not (tmp_path / "warehouse").exists()
    raw["datasets"][0]["output_format"] = "parquet"  # plain directories hold any name
    cfg.write_text(yaml.safe_dump(raw))
    assert load_config(str(cfg)).datasets[0].output.endswith(root)
