"""`explain`: where did key K go, and why (design.md K6; the explain wing, no Spark, no Dagster)."""

from __future__ import annotations

import json

import click

from dedup_pipeline.cli.common import fail, load
from dedup_pipeline.config import ConfigError
from dedup_pipeline.engine.explain import ExplainKeyError, explain_key, parse_key_args
from dedup_pipeline.hours import parse_hour


@click.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None, help="dataset name (needed if the file has several)")
@click.option("--key", "pairs", multiple=True, metavar="COLUMN=VALUE",
              help="a key column and its value (repeat for a composite key); the value is "
              "everything after the first '=', verbatim, typed by the dataset's schema")
@click.option("--key-json", default=None, metavar="JSON",
              help='the key (or some of its columns) as a JSON object; null for a null, e.g. '
              '\'{"event_id": 4711, "user_id": null}\'')
@click.option("--from", "first", default=None, help="first load hour to search (default: all)")
@click.option("--to", "last", default=None, help="last load hour to search (inclusive)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def explain(config: str, dataset: str | None, pairs: tuple[str, ...], key_json: str | None,
            first: str | None, last: str | None, as_json: bool) -> None:
    """Where did key K go, and why: every record of it, oldest first, from the committed outputs,
    commit records and index (never by running the rules again)."""
    cfg = load(config)
    try:
        ds = cfg.dataset(dataset)
        given = parse_key_args(ds, pairs, key_json)
        for h in (first, last):
            if h is not None:
                parse_hour(h)
    except (ConfigError, ExplainKeyError, ValueError) as e:
        fail(str(e))
    try:  # no Spark: pyarrow reads what the loads committed
        ex = explain_key(ds, given, first, last)
    except ExplainKeyError as e:
        fail(str(e))
    if as_json:
        click.echo(json.dumps(ex.to_json(), ensure_ascii=False, indent=1))
    else:
        for line in ex.lines():
            click.echo(line)
