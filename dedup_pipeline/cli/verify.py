"""`verify`: recheck everything loaded, from the files alone (the audit wing, engine/verify.py);
`--repair` first runs the dataset's table repair job (`cli/runs.py`)."""

from __future__ import annotations

import sys

import click

from dedup_pipeline.cli.common import datasets, load, with_file
from dedup_pipeline.cli.runs import execute_job
from dedup_pipeline.cli.spark import spark_note
from dedup_pipeline.engine.contract import ContractError
from dedup_pipeline.engine.session import SparkSettings, get_session
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline.hours import compress_ranges, format_tag, parse_hour
from dedup_pipeline.orchestration.names import upkeep_job_name, upkeep_op_name


@click.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None)
@click.option("--repair", is_flag=True,
              help="first, under the dataset lock and through Dagster, roll each output's Delta "
              "table forward to the commit records and write lost or altered key digests (what "
              "makes explain fast) again; then verify")
def verify(config: str, dataset: str | None, repair: bool) -> None:
    """Recheck conservation and uniqueness of everything loaded, from the files alone; with Delta
    outputs, also that each table holds exactly the files of every hour's commit record; warn
    about hours explain cannot look up quickly."""
    cfg = load(config)
    chosen = datasets(cfg, dataset)
    if repair:
        for ds in chosen:
            ops = {upkeep_op_name(ds.name): {"config": {"repair": True}}}
            execute_job(cfg, upkeep_job_name(ds.name), False, {"ops": ops}, name_run=True,
                        spark=False)
    click.echo(spark_note(cfg))
    spark = get_session(SparkSettings(cfg.spark.master, cfg.spark.remote, cfg.spark.conf),
                        [r for ds in chosen for r in (ds.output, ds.source.path)])
    failed = False
    for ds in chosen:
        try:
            rep = verify_dataset(spark, ds)
        except ContractError as e:
            click.echo(f"error: {e}", err=True)
            failed = True
            continue
        for w in rep.warnings:
            click.echo(f"warning: {ds.name}: {w}")
        for v in rep.violations:
            click.echo(f"VIOLATION: {ds.name}: {with_file(cfg, v)}")
        if rep.contracts:
            click.echo(f"{ds.name}: checked under contract " + "; ".join(
                f"{v}: {compress_ranges([parse_hour(format_tag(t)) for t in tags])}"
                for v, tags in sorted(rep.contracts.items())))
        status = "OK" if rep.ok else f"FAILED ({len(rep.bad_hours)} hour(s))"
        click.echo(f"{ds.name}: {rep.hours_checked} hours, {rep.rows_in} rows in, "
                   f"{rep.rows_out} rows out: {status}")
        failed |= not rep.ok
    sys.exit(1 if failed else 0)

