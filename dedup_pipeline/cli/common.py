"""What every command shares: its config, its one-line errors, its progress lines and tables.
Imports neither Dagster nor Spark (`explain` starts without them)."""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

import click

from dedup_pipeline.config import (
    BUILTIN_DEMO,
    ConfigError,
    DatasetConfig,
    PipelineConfig,
    load_config,
)
from dedup_pipeline.engine.core.commits import CommitRecord, rate


def fail(msg: str) -> NoReturn:
    click.echo(f"error: {msg}", err=True)
    sys.exit(1)


def load(config: str) -> PipelineConfig:
    try:
        return load_config(config)
    except ConfigError as e:
        fail(str(e))


def load_dataset(config: str, dataset: str | None) -> tuple[PipelineConfig, DatasetConfig]:
    """The config and its dataset, or exit 1 with the config error."""
    cfg = load(config)
    try:
        return cfg, cfg.dataset(dataset)
    except ConfigError as e:
        fail(str(e))


def datasets(cfg: PipelineConfig, dataset: str | None) -> list[DatasetConfig]:
    """The dataset named, or every dataset of the file; exit 1 naming an unknown one."""
    try:
        return [cfg.dataset(dataset)] if dataset else list(cfg.datasets)
    except ConfigError as e:
        fail(str(e))


def one_line(e: BaseException) -> str:
    """An error in one line: its class and first line of text, never SQLAlchemy's "Background on
    this error" link alone (the cause is on the first line; the link is the last)."""
    lines = [line.strip() for line in str(e).splitlines()
             if line.strip() and not line.strip().startswith("(Background on this error at")]
    return f"{type(e).__name__}: {lines[0] if lines else repr(e)}"


def with_file(cfg: PipelineConfig, text: str) -> str:
    """The engine's fix for this command: its `--config <file>` made this command's own file."""
    return text if cfg.config_file == BUILTIN_DEMO else text.replace("--config <file>",
                                                                f"--config {cfg.config_file}")


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever `sys.stdout` is at emit time (a runner or a test may swap it)."""

    _dedup = True

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201 - logging's own attribute
        return sys.stdout

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def progress_to_stdout() -> None:
    """The jobs' progress lines (logger `dedup_pipeline.progress`) printed as they come."""
    log = logging.getLogger("dedup_pipeline.progress")
    if not any(getattr(h, "_dedup", False) for h in log.handlers):
        h = _StdoutHandler()
        h.setFormatter(logging.Formatter("  %(asctime)s  %(message)s", "%H:%M:%S"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
    logging.getLogger("py4j").setLevel(logging.ERROR)


def print_table(results: list[CommitRecord]) -> None:
    cols = ["hour", "in", "unique", "dups", "conflicts", "expired", "rejected", "dup %", "secs"]
    rows = [[r.partition_key, r.rows_in, r.unique, r.duplicates, r.conflicts, r.expired,
             r.rejected, f"{100 * r.duplicate_rate:.1f}", f"{r.seconds.get('total', 0):.1f}"]
            for r in results]
    if results:
        tot = [sum(getattr(r, a) for r in results) for a in
               ("rows_in", "unique", "duplicates", "conflicts", "expired", "rejected")]
        rows.append(["total", *tot, f"{100 * rate(tot[2], tot[1] + tot[2]):.1f}",
                     f"{sum(r.seconds.get('total', 0) for r in results):.1f}"])
    widths = [max([len(str(c))] + [len(str(r[i])) for r in rows]) for i, c in enumerate(cols)]
    line = "  ".join(str(c).rjust(w) for c, w in zip(cols, widths, strict=True))
    click.echo(line)
    click.echo("-" * len(line))
    for r in rows:
        click.echo("  ".join(str(v).rjust(w) for v, w in zip(r, widths, strict=True)))
