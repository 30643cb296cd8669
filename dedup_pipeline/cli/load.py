"""`run`: load hours in order, in one run of the dataset's load job (design.md K1, K2)."""

from __future__ import annotations

import click

from dedup_pipeline.cli.common import fail, load
from dedup_pipeline.cli.runs import run_hours
from dedup_pipeline.config import ConfigError, DatasetConfig
from dedup_pipeline.engine import contract
from dedup_pipeline.engine.contract import ContractError
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import format_tag, parse_hour


@click.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False),
              help="the YAML config file, or a DedupDataset component's defs.yaml "
              "(docs/operations.md, Configuration)")
@click.option("--dataset", default=None, help="dataset name (needed if the file has several)")
@click.option("--from", "first", required=True, help="first hour, e.g. 2026-11-01-00:00")
@click.option("--to", "last", default=None,
              help="last hour (inclusive); optional with --cascade (then --from)")
@click.option("--cascade", is_flag=True,
              help="also reload every hour loaded after --to (or --from), in the same run (a "
              "rerun of an earlier hour is refused while later loaded hours are left out)")
@click.option("--verbose", "-v", is_flag=True,
              help="also print Dagster's own log of the run (tracebacks included)")
def run(config: str, dataset: str | None, first: str, last: str | None, cascade: bool,
        verbose: bool) -> None:
    """Load hours FROM..TO in order, through Dagster (records in DAGSTER_HOME)."""
    if last is None:
        if not cascade:
            raise click.UsageError("Missing option '--to' (or give --cascade: --from through the "
                                   "latest loaded hour)")
        last = first
    cfg = load(config)
    try:
        ds = cfg.dataset(dataset)
        parse_hour(last)
        if parse_hour(first) < parse_hour(ds.start):  # Dagster would refuse it with a CheckError
            raise ValueError(f"dataset {ds.name!r}: hour {first} is before the dataset's start "
                             f"{ds.start}")
        _check_contract(ds, first)
    except (ConfigError, ValueError, ContractError) as e:
        fail(str(e))
    if cascade:
        latest = CommitLog(Storage(ds.output)).committed().max()
        if latest is not None and parse_hour(latest) > parse_hour(last):
            click.echo(f"--cascade: hours up to {format_tag(latest)} are loaded; reloading "
                       f"{first} .. {format_tag(latest)}")
            last = format_tag(latest)
    run_hours(cfg, ds, first, last, verbose)


def _check_contract(ds: DatasetConfig, first: str) -> None:
    """The load's own contract check, before Spark starts: a breaking change fails in a second
    (the load checks again under the dataset lock; this one writes nothing)."""
    st = Storage(ds.output)
    contract.check(st, ds, first, CommitLog(st).committed())
