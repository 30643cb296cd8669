"""`dedup-pipeline`: the command line (design.md K1-K7).

One way in (K7): a command that writes a dataset (`run`, `rebuild-index`, `migrate`, `vacuum`,
`verify --repair`) runs that dataset's Dagster job in the instance (`cli/runs.py`), so the UI's
Runs list is the whole log of what changed a dataset and its pool queues them; `verify` and
`explain` only read and call their wing. Each command lives in the module named here and is
imported when it is called, so `explain` starts without Dagster and Spark (K6).
"""

from __future__ import annotations

import importlib

import click

# command -> "module:attribute" under dedup_pipeline.cli
COMMANDS = {
    "demo": "demo:demo",
    "generate": "demo:generate",
    "run": "load:run",
    "verify": "verify:verify",
    "explain": "explain:explain",
    "rebuild-index": "jobs:rebuild_index",
    "migrate": "jobs:migrate",
    "vacuum": "jobs:vacuum",
    "spark-server": "spark:spark_server",
}


class _Commands(click.Group):
    """click's lazily loaded subcommands: a command's module is imported when it is called
    (or when `--help` lists them all)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attr = where.split(":")
        command = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        assert isinstance(command, click.Command), where
        return command


@click.group(cls=_Commands)
def main() -> None:
    """Deduplicate hourly at-least-once batches into clean Delta lake tables."""

