"""`rebuild-index`, `migrate`, `vacuum`: each runs the dataset's own job (`cli/runs.py`)."""

from __future__ import annotations

import click

from dedup_pipeline.cli.common import datasets, load, load_dataset
from dedup_pipeline.cli.runs import execute_job
from dedup_pipeline.engine.contract import read_history
from dedup_pipeline.engine.core.index.health import check_index
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.orchestration.names import (
    rebuild_job_name,
    rebuild_op_name,
    upkeep_job_name,
    upkeep_op_name,
)

VERBOSE = click.option("--verbose", "-v", is_flag=True,
                       help="also print Dagster's own log of the run (tracebacks included)")


@click.command("rebuild-index")
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None)
@click.option("--hour", "hours", multiple=True, help="rebuild only these hours (repeatable); "
              "default: every committed hour")
@VERBOSE
def rebuild_index(config: str, dataset: str | None, hours: tuple[str, ...], verbose: bool) -> None:
    """Rebuild the key index from the unique output (reads only unique), through Dagster."""
    cfg, ds = load_dataset(config, dataset)
    click.echo(f"rebuilding the index of {ds.name!r} from {ds.output}/unique")
    ops = {rebuild_op_name(ds.name): {"config": {"hours": list(hours)}}}
    execute_job(cfg, rebuild_job_name(ds.name), verbose, {"ops": ops}, name_run=True)
    click.echo(f"done: {check_index(Storage(ds.output), ds).summary()}")


@click.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None)
@VERBOSE
def migrate(config: str, dataset: str | None, verbose: bool) -> None:
    """Move a dataset to its config as it is now after a breaking change (key, fingerprint,
    expiry, index layout, schema): re-derive the index from unique under the new contract, in
    one committed step, through Dagster. Refuses, writing nothing, if unique holds rows that are
    duplicates under the new contract."""
    cfg, ds = load_dataset(config, dataset)
    click.echo(f"migrating {ds.name!r} ({ds.output}) to its config in {cfg.config_file}")
    execute_job(cfg, rebuild_job_name(ds.name), verbose,
                {"ops": {rebuild_op_name(ds.name): {"config": {"migrate": True}}}})
    cur = read_history(Storage(ds.output), None).versions
    click.echo(f"done: {ds.name!r} is under contract v{cur[-1].version}" if cur else "done")


@click.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None)
@click.option("--retention-hours", default=24, show_default=True, type=click.IntRange(1),
              help="files a rerun removed from a table longer ago than this are deleted "
              "(readers of older table versions need them until then); at least 1")
@VERBOSE
def vacuum(config: str, dataset: str | None, retention_hours: int, verbose: bool) -> None:
    """Upkeep of the output tables: delete replaced files past the retention (never a full
    vacuum), checkpoint the Delta log and clean up old log entries, through Dagster."""
    cfg = load(config)
    for ds in datasets(cfg, dataset):
        ops = {upkeep_op_name(ds.name): {"config": {"retention_hours": retention_hours}}}
        execute_job(cfg, upkeep_job_name(ds.name), verbose, {"ops": ops}, name_run=True,
                    spark=False)  # the upkeep is delta-rs, no Spark
