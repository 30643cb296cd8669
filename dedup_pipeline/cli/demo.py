"""`generate` writes a sample landing zone; `demo` makes a `dg` project with one `DedupDataset`
and loads its sample hours through Dagster (design.md K1, D8)."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import click

from dedup_pipeline.cli.common import fail, load
from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML, run_hours
from dedup_pipeline.config.loading import COMPONENT_TYPE
from dedup_pipeline.hours import HOUR, format_hour, landing_dir, parse_hour
from dedup_pipeline.orchestration.component import scaffold_text
from dedup_pipeline.orchestration.names import WRITTEN
from dedup_pipeline.orchestration.runs import PROJECT_HOME
from dedup_pipeline.sample.demo import DEMO_DEFS, DEMO_PROJECT
from dedup_pipeline.sample.generate import default_start, generate_landing


@click.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="output directory")
@click.option("--hours", default=24, show_default=True, type=click.IntRange(1))
@click.option("--rows-per-hour", default=100_000, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=7, show_default=True, type=int)
@click.option("--start", default=None, help="first hour (default: so the last is the last "
              "complete UTC hour)")
@click.option("--format", "fmt", default="jsonl", show_default=True,
              type=click.Choice(["jsonl", "csv"]))
@click.option("--no-config", is_flag=True, help="write no dedup.yaml (for a DedupDataset "
              "component, whose defs.yaml is the dataset's config)")
@click.option("--dataset", "name", default="clicks", show_default=True,
              help="the dataset's name: the files land under {out}/landing/<name>/")
def generate(out: str, hours: int, rows_per_hour: int, seed: int, start: str | None,
             fmt: str, no_config: bool, name: str) -> None:
    """Write a sample landing zone (duplicates, conflicts, late and malformed records) + config."""
    try:
        stats = generate_landing(out, hours=hours, rows_per_hour=rows_per_hour, seed=seed,
                                 start=start, fmt=fmt, name=name,
                                 progress=lambda m: click.echo(f"  {m}"))
    except ValueError as e:
        fail(str(e))
    click.echo(f"wrote {stats.rows} rows in {stats.files} files over {stats.hours} hours to "
               f"{stats.landing} in {stats.seconds:.1f}s")
    if no_config:
        Path(stats.config).unlink()
    else:
        click.echo(f"config: {stats.config}")


# the demo's `dg` project: a package at its root (so `dg dev` imports it from there, nothing to
# install), its defs/ holding the component as `dg scaffold defs` writes it
PROJECT_TOML = """\
[project]
name = "{pkg}"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["dagster", "dedup_pipeline"]

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "{pkg}"
"""
# the project's definitions: whatever its defs/ folder holds (Dagster's `load_from_defs_folder`)
DEFINITIONS_PY = textwrap.dedent("""\
    from pathlib import Path

    import dagster as dg


    @dg.definitions
    def defs():
        return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
    """)


def write_project(root: Path, start: str) -> Path:
    """The demo's `dg` project with the dataset `clicks` from `start`; returns its defs.yaml."""
    pkg = root / DEMO_PROJECT
    (pkg / "defs" / "clicks").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PROJECT_TOML.format(pkg=DEMO_PROJECT))
    (pkg / "__init__.py").write_text("")
    (pkg / "defs" / "__init__.py").write_text("")
    (pkg / "definitions.py").write_text(DEFINITIONS_PY)
    defs_yaml = root / DEMO_DEFS
    defs_yaml.write_text(scaffold_text(COMPONENT_TYPE, "clicks", start))
    return defs_yaml


@click.command()
@click.option("--dir", "directory", default="demo", show_default=True,
              type=click.Path(file_okay=False), help="the demo's dg project and its data")
@click.option("--hours", default=6, show_default=True, type=click.IntRange(1, 48))
@click.option("--rows-per-hour", default=2_000, show_default=True, type=click.IntRange(10))
def demo(directory: str, hours: int, rows_per_hour: int) -> None:
    """Make a dg project with one DedupDataset (clicks), generate its sample landing zone and load
    it hour by hour through Dagster on local Spark; the newest hour lands without its _SUCCESS
    marker and is left for you to load from the UI."""
    root = Path(directory).resolve()
    if (root / DEMO_PROJECT).is_dir() or (root / "dedup.yaml").exists():
        click.echo(f"removing the previous demo in {root}")
        shutil.rmtree(root)
    t0 = time.perf_counter()
    # one hour more than loaded: the newest complete hour, its marker not there yet
    start = default_start(hours + 1)
    defs_yaml = write_project(root, start)
    # the sample data where the scaffolded defs.yaml reads it: the project's data/
    stats = generate_landing(root / "data", hours=hours + 1, rows_per_hour=rows_per_hour,
                             seed=7, start=start)
    Path(stats.config).unlink()  # the dataset's config is the component's defs.yaml
    click.echo(f"a dg project in {root}: the dataset clicks is the DedupDataset component "
               f"{defs_yaml.relative_to(root)}")
    click.echo(f"generated {stats.rows} rows over {stats.hours} hours in {stats.landing}: "
               f"~{stats.in_batch_duplicates} in-batch duplicates, {stats.cross_batch_replays} "
               f"replays, {stats.conflicts} conflicts, {stats.late_over_day} records over a day "
               f"late, {stats.malformed + stats.null_keys + stats.bad_values} bad records")
    cfg = load(str(defs_yaml))
    ds = cfg.datasets[0]
    last = format_hour(parse_hour(ds.start) + (hours - 1) * HOUR)
    pending = parse_hour(ds.start) + hours * HOUR
    pending_marker = Path(landing_dir(ds.source.path, pending)) / (ds.landing.marker or "_SUCCESS")
    pending_marker.unlink(missing_ok=True)
    if not os.environ.get("DAGSTER_HOME"):
        os.environ["DAGSTER_HOME"] = str(root / PROJECT_HOME)
    home = Path(os.environ["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)
    run_hours(cfg, ds, ds.start, last)
    click.echo("")
    click.echo(f"done in {time.perf_counter() - t0:.0f}s. Outputs ("
               + ("Delta tables" if ds.output_format == "delta" else "Parquet directories")
               + ", partitioned by load_hour):")
    for name in WRITTEN:
        click.echo(f"  {name:<10} {ds.output}/{name}/")
    click.echo(f"Dagster runs recorded in DAGSTER_HOME={os.environ['DAGSTER_HOME']}")
    click.echo("")
    for line in ui_hint(os.environ["DAGSTER_HOME"], root, ds.name, format_hour(pending),
                        str(pending_marker)):
        click.echo(line)
    click.echo(f"Recheck everything:  .venv/bin/dedup-pipeline verify --config {defs_yaml}")


def ui_hint(home: str, project: Path, dataset: str, pending: str, marker: str) -> list[str]:
    """The demo's closing lines: the README's two UI commands, and the hour left to load."""
    return [
        "See it in the UI (the README's two commands, each in its own shell):",
        "  .venv/bin/dedup-pipeline spark-server",
        f"  cd {project} && SPARK_REMOTE=sc://127.0.0.1:15002 DAGSTER_HOME={home} "
        f"{Path(sys.executable).parent / 'dg'} dev",
        f"Your turn: hour {pending} has landed without its _SUCCESS marker, so it is not loaded. "
        "Load it either way:",
        f"  - in the UI: asset {dataset}/unique, Materialize…, Confirm (its five outputs are one "
        f"load), select {pending}, Launch 1 run;",
        f"  - or drop the marker and the landing sensor loads it within a minute: touch {marker}",
        "The CLI (run, verify) records in this instance too and uses the warm server "
        "once you export SPARK_REMOTE=sc://127.0.0.1:15002 (else it starts local Spark, 20-30 s).",
    ]
