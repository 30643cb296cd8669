"""`dedup-pipeline`: demo, run, verify, rebuild-index, migrate, generate, spark-server (design.md K1,
K2, K4, K5, N5)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import click

from dedup_pipeline.config import (
    BUILTIN_DEMO,
    ConfigError,
    DatasetConfig,
    PipelineConfig,
    load_config,
)
from dedup_pipeline.engine.contract import ContractError
from dedup_pipeline.engine.core.commits import CommitRecord, rate

SPARK_NOISE = "Spark is starting (10-20 s the first time)..."


def spark_note(cfg: PipelineConfig | None) -> str:
    """Which Spark the command uses: the Connect server the environment or the config names, or
    local Spark starting (and how to use a warm server instead)."""
    from dedup_pipeline.engine.session import SparkSettings

    sp = cfg.spark if cfg is not None else None
    s = SparkSettings(sp.master if sp else None, sp.remote if sp else None,
                      dict(sp.conf) if sp else {}).resolved()
    if s.remote:
        src = "SPARK_REMOTE" if os.environ.get("SPARK_REMOTE") else "spark.remote of the config"
        return f"Spark: the Connect server at {s.remote} ({src})"
    return (f"{SPARK_NOISE} (local Spark; with `dedup-pipeline spark-server` running, export "
            "SPARK_REMOTE=sc://127.0.0.1:15002 to use its warm Spark instead)")

# The demo's DAGSTER_HOME/dagster.yaml (written when there is none): `dg dev` on it then
# queues a second run of a dataset instead of failing it on the dataset lock (pool dedup_<ds>,
# one run at a time, as deploy/dagster.yaml), and prints no telemetry notice.
DEMO_INSTANCE_YAML = """\
# Written by `dedup-pipeline demo`. Runs wait in a queue; the steps that write a dataset (load,
# index rebuild, migration, table upkeep) use the pool dedup_<dataset>, limited to one RUN at a
# time, so a UI backfill, a sensor run and a CLI rebuild of one dataset never overlap
# (docs/operations.md, "One run at a time").
# See deploy/dagster.yaml for a service.
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1  # Dagster's 5 s was half of a small hour's click-to-done time
concurrency:
  runs:
    max_concurrent_runs: 4
  pools:
    default_limit: 1
    granularity: run
telemetry:
  enabled: false
"""


def _quiet_dagster() -> None:
    """Drop Dagster's preview/beta/supersession notices (about Dagster's own APIs, not our data)
    so the CLI's progress and tables stay readable. Errors and other warnings still print."""
    import warnings

    import dagster as dg

    for category in (dg.PreviewWarning, dg.BetaWarning, dg.SupersessionWarning):
        warnings.filterwarnings("ignore", category=category)


def _fail(msg: str) -> NoReturn:
    click.echo(f"error: {msg}", err=True)
    sys.exit(1)


def _load(config: str) -> PipelineConfig:
    try:
        return load_config(config)
    except ConfigError as e:
        _fail(str(e))
        raise


# Held while a command opens the instance at DAGSTER_HOME: Dagster creates its SQLite storages
# there on first use with "create table" and no retry, so two commands starting on a brand-new
# DAGSTER_HOME at the same instant failed with "table jobs already exists".
INIT_LOCK = ".dedup_pipeline_instance.lock"


def one_line(e: BaseException) -> str:
    """An error in one line: its class and first line of text, never SQLAlchemy's "Background on
    this error" link alone (the cause is on the first line; the link is the last)."""
    lines = [line.strip() for line in str(e).splitlines()
             if line.strip() and not line.strip().startswith("(Background on this error at")]
    return f"{type(e).__name__}: {lines[0] if lines else repr(e)}"


@contextlib.contextmanager
def _instance_lock(home: Path) -> Iterator[None]:
    import fcntl

    with open(home / INIT_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file is closed
        yield


BESIDE_CONFIG = "dagster_home"  # the instance the demo writes beside its config file


def instance_home(cfg: PipelineConfig | None = None) -> Path | None:
    """The Dagster instance a command records its runs in, so the CLI and the UI share one:
    DAGSTER_HOME when set; else `dagster_home/` beside the config file when it holds a
    dagster.yaml (what `dedup-pipeline demo` writes and its `dg dev` command uses); else None (a
    temporary instance)."""
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"])
    if cfg is not None and cfg.config_file != BUILTIN_DEMO:
        beside = Path(cfg.config_file).resolve().parent / BESIDE_CONFIG
        if (beside / "dagster.yaml").is_file():
            return beside
    return None


@contextlib.contextmanager
def _instance(cfg: PipelineConfig | None = None) -> Iterator[object]:
    """The Dagster instance at `instance_home` (design.md K2), or a temporary one without one.

    Opened (its storages created, the first time) under a file lock in its home; an error
    opening it is one line naming the home and the cause."""
    import dagster as dg

    _quiet_dagster()
    home = instance_home(cfg)
    if home is not None:
        if not os.environ.get("DAGSTER_HOME"):
            click.echo(f"recording in the Dagster instance beside the config, {home} (the UI's; "
                       "set DAGSTER_HOME to choose another)")
        try:
            home.mkdir(parents=True, exist_ok=True)
            with _instance_lock(home):
                inst = dg.DagsterInstance.from_config(str(home))
        except Exception as e:  # noqa: BLE001 - the cause in one line, not a traceback
            _fail(f"the Dagster instance at DAGSTER_HOME={home} cannot be opened: {one_line(e)}")
        with inst:
            yield inst
    else:  # in memory: nothing outlives the command (its commit records are the history)
        click.echo("no DAGSTER_HOME: this run is recorded in a temporary instance no UI shows "
                   "(the landing sensor of a running UI still sees the dataset's lock)")
        with dg.DagsterInstance.ephemeral() as inst:
            yield inst


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever `sys.stdout` is at emit time (a runner or a test may swap it)."""

    _dedup = True

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201 - logging's own attribute
        return sys.stdout

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def _progress_to_stdout() -> None:
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


def _run(cfg: PipelineConfig, dataset: str | None, first: str, last: str,
         verbose: bool = False) -> list[CommitRecord]:
    from dedup_pipeline.hours import hour_range
    from dedup_pipeline.orchestration.runner import run_range

    _quiet_dagster()
    ds = cfg.dataset(dataset)
    n = len(hour_range(first, last))
    click.echo(f"loading {n} hour(s) of {ds.name!r}, {first} .. {last}, in one Dagster run")
    click.echo(spark_note(cfg))
    _progress_to_stdout()
    with _instance(cfg) as inst:
        try:
            run = run_range(cfg, ds.name, first, last, inst,  # type: ignore[arg-type]
                            quiet=not verbose)
        except Exception as e:  # noqa: BLE001 - e.g. the instance's storage: one line, not a trace
            if verbose:
                raise
            _fail(f"the run of {ds.name!r} {first} .. {last} could not run: {one_line(e)} "
                  "(--verbose shows the traceback)")
    if run.results:
        click.echo("")
        print_table(run.results)
    _report_late_input(cfg, ds)
    if not run.success:
        _fail(f"run {run.run_id} failed: {_with_file(cfg, run.error or '')}")
    return run.results


def _with_file(cfg: PipelineConfig, text: str) -> str:
    """The engine's fix for this command: its `--config <file>` made this command's own file."""
    return text if cfg.config_file == BUILTIN_DEMO else text.replace("--config <file>",
                                                                f"--config {cfg.config_file}")


def _report_late_input(cfg: PipelineConfig, ds: DatasetConfig) -> None:
    """One line per loaded hour (within landing.watch_hours of the latest) whose landing files
    changed after it was loaded: the CLI's late-file report, as the landing sensor's."""
    from dedup_pipeline.engine.core import landing
    from dedup_pipeline.engine.core.commit_log import CommitLog
    from dedup_pipeline.engine.core.storage import Storage
    from dedup_pipeline.hours import format_tag

    try:
        committed = CommitLog(Storage(ds.output)).committed()
        changes = landing.changed_hours(ds, committed)
    except Exception as e:  # noqa: BLE001 - a report, never the command's failure
        click.echo(f"warning: late files of {ds.name!r} not checked: {one_line(e)}")
        return
    for c in changes:
        click.echo(f"late input: {ds.name} {_with_file(cfg, c.line(ds, format_tag(committed.max() or '')))}")


@click.group()
def main() -> None:
    """Deduplicate hourly at-least-once batches into clean Delta lake tables."""


@main.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False),
              help="the YAML config file (docs/operations.md, Configuration)")
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
    cfg = _load(config)
    try:
        ds = cfg.dataset(dataset)
        from dedup_pipeline.hours import format_tag, parse_hour
        parse_hour(last)
        if parse_hour(first) < parse_hour(ds.start):  # Dagster would refuse it with a CheckError
            raise ValueError(f"dataset {ds.name!r}: hour {first} is before the dataset's start "
                             f"{ds.start}")
        _check_contract(ds, first)
    except (ConfigError, ValueError, ContractError) as e:
        _fail(str(e))
    if cascade:
        from dedup_pipeline.engine.core.commit_log import CommitLog
        from dedup_pipeline.engine.core.storage import Storage

        latest = CommitLog(Storage(ds.output)).committed().max()
        if latest is not None and parse_hour(latest) > parse_hour(last):
            click.echo(f"--cascade: hours up to {format_tag(latest)} are loaded; reloading "
                       f"{first} .. {format_tag(latest)}")
            last = format_tag(latest)
    _run(cfg, dataset, first, last, verbose)


def _check_contract(ds: DatasetConfig, first: str) -> None:
    """The load's own contract check, before Spark starts: a breaking change fails in a second
    (the load checks again under the dataset lock; this one writes nothing)."""
    from dedup_pipeline.engine import contract
    from dedup_pipeline.engine.core.commit_log import CommitLog
    from dedup_pipeline.engine.core.storage import Storage

    st = Storage(ds.output)
    contract.check(st, ds, first, CommitLog(st).committed())


@main.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None)
@click.option("--repair", is_flag=True,
              help="first, under the dataset lock, roll each output's Delta table forward to "
              "the commit records and write lost or altered key digests (what makes explain "
              "fast) again; then verify")
def verify(config: str, dataset: str | None, repair: bool) -> None:
    """Recheck conservation and uniqueness of everything loaded, from the files alone; with Delta
    outputs, also that each table holds exactly the files of every hour's commit record; warn
    about hours explain cannot look up quickly."""
    cfg = _load(config)
    names = [dataset] if dataset else [d.name for d in cfg.datasets]
    from dedup_pipeline.engine.session import SparkSettings, get_session
    from dedup_pipeline.engine.verify import verify_dataset

    click.echo(spark_note(cfg))
    spark = get_session(SparkSettings(cfg.spark.master, cfg.spark.remote, cfg.spark.conf))
    failed = False
    for name in names:
        try:
            ds = cfg.dataset(name)
        except ConfigError as e:
            _fail(str(e))
        if repair:
            _repair(ds)
        try:
            rep = verify_dataset(spark, ds)
        except ContractError as e:
            click.echo(f"error: {e}", err=True)
            failed = True
            continue
        for w in rep.warnings:
            click.echo(f"warning: {ds.name}: {w}")
        for v in rep.violations:
            click.echo(f"VIOLATION: {ds.name}: {_with_file(cfg, v)}")
        if rep.contracts:
            from dedup_pipeline.hours import compress_ranges, format_tag, parse_hour
            click.echo(f"{ds.name}: checked under contract " + "; ".join(
                f"{v}: {compress_ranges([parse_hour(format_tag(t)) for t in tags])}"
                for v, tags in sorted(rep.contracts.items())))
        status = "OK" if rep.ok else f"FAILED ({len(rep.bad_hours)} hour(s))"
        click.echo(f"{ds.name}: {rep.hours_checked} hours, {rep.rows_in} rows in, "
                   f"{rep.rows_out} rows out: {status}")
        failed |= not rep.ok
    sys.exit(1 if failed else 0)


def _repair(ds: DatasetConfig) -> None:
    """Under the dataset lock: roll `ds`'s output tables forward to its commit records, then
    write its lost or altered key digests again."""
    from dedup_pipeline.engine import keydigest, lake
    from dedup_pipeline.engine.core.lock import DatasetLockedError, Lock
    from dedup_pipeline.engine.core.storage import Storage

    st = Storage(ds.output)
    try:
        with Lock(st, "dedup-pipeline verify --repair"):
            if lake.enabled(ds):
                made = lake.roll_forward(st, ds, None, click.echo, trust_tokens=False)
                click.echo(f"{ds.name}: {len(made)} table commit(s) rolled the tables forward"
                           if made else f"{ds.name}: every table already agrees with the commit "
                           "records")
            else:
                click.echo(f"{ds.name}: output_format is parquet: no tables to repair")
            if not keydigest.repair(ds, st, click.echo):
                click.echo(f"{ds.name}: every key digest matches its hours")
    except (DatasetLockedError, lake.LakeError) as e:
        _fail(str(e))


@main.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None)
@click.option("--retention-hours", default=24, show_default=True, type=click.IntRange(1),
              help="files a rerun removed from a table longer ago than this are deleted "
              "(readers of older table versions need them until then); at least 1")
def vacuum(config: str, dataset: str | None, retention_hours: int) -> None:
    """Upkeep of the output tables: delete replaced files past the retention (never a full
    vacuum), checkpoint the Delta log and clean up old log entries."""
    from dedup_pipeline.engine import lake
    from dedup_pipeline.engine.core.lock import DatasetLockedError
    from dedup_pipeline.engine.core.storage import Storage

    cfg = _load(config)
    for name in [dataset] if dataset else [d.name for d in cfg.datasets]:
        try:
            ds = cfg.dataset(name)
        except ConfigError as e:
            _fail(str(e))
        if not lake.enabled(ds):
            click.echo(f"{ds.name}: output_format is parquet: nothing to vacuum")
            continue
        try:
            lake.upkeep(Storage(ds.output), ds, retention_hours, "dedup-pipeline vacuum", click.echo)
        except DatasetLockedError as e:
            _fail(str(e))


# design.md K6: the key's story (engine/explain.py, no Spark); its help text is the docstring below.
@main.command()
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
    import json

    from dedup_pipeline.engine.explain import ExplainKeyError, explain_key, parse_key_args
    from dedup_pipeline.hours import parse_hour

    cfg = _load(config)
    try:
        ds = cfg.dataset(dataset)
        given = parse_key_args(ds, pairs, key_json)
        for h in (first, last):
            if h is not None:
                parse_hour(h)
    except (ConfigError, ExplainKeyError, ValueError) as e:
        _fail(str(e))
    try:  # no Spark: pyarrow reads what the loads committed
        ex = explain_key(ds, given, first, last)
    except ExplainKeyError as e:
        _fail(str(e))
    if as_json:
        click.echo(json.dumps(ex.to_json(), ensure_ascii=False, indent=1))
    else:
        for line in ex.lines():
            click.echo(line)


@main.command("rebuild-index")
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None)
@click.option("--hour", "hours", multiple=True, help="rebuild only these hours (repeatable); "
              "default: every committed hour")
@click.option("--verbose", "-v", is_flag=True,
              help="also print Dagster's own log of the run (tracebacks included)")
def rebuild_index_cmd(config: str, dataset: str | None, hours: tuple[str, ...],
                      verbose: bool) -> None:
    """Rebuild the key index from the unique output (reads only unique), through Dagster."""
    from dedup_pipeline.orchestration.names import rebuild_job_name, rebuild_op_name

    cfg, ds = _load_dataset(config, dataset)
    click.echo(f"rebuilding the index of {ds.name!r} from {ds.output}/unique")
    ops = {rebuild_op_name(ds.name): {"config": {"hours": list(hours)}}}
    _execute_job(cfg, rebuild_job_name(ds.name), verbose, {"ops": ops}, name_run=True)
    from dedup_pipeline.engine.core.index.health import check_index
    from dedup_pipeline.engine.core.storage import Storage

    click.echo(f"done: {check_index(Storage(ds.output), ds).summary()}")


def _load_dataset(config: str, dataset: str | None) -> tuple[PipelineConfig, DatasetConfig]:
    """The config and its dataset, or exit 1 with the config error."""
    cfg = _load(config)
    try:
        return cfg, cfg.dataset(dataset)
    except ConfigError as e:
        _fail(str(e))


def _execute_job(cfg: PipelineConfig, job_name: str, verbose: bool, run_config: dict,
                 name_run: bool = False) -> None:
    """Run one of the dataset's maintenance jobs in this process (Dagster records it); exit 1
    with its failure summary if it fails."""
    from dedup_pipeline.orchestration.definitions import build_definitions
    from dedup_pipeline.orchestration.runner import QUIET_LOGGERS, failure_message

    _quiet_dagster()
    job = build_definitions(cfg).resolve_job_def(job_name)
    click.echo(spark_note(cfg))
    with _instance(cfg) as inst:
        res = job.execute_in_process(  # type: ignore[arg-type]
            instance=inst, run_config={**(QUIET_LOGGERS if not verbose else {}), **run_config},
            raise_on_error=False)
    if not res.success:
        _fail(f"run {res.run_id} failed: {failure_message(res)}" if name_run
              else failure_message(res))


@main.command()
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--dataset", default=None)
@click.option("--verbose", "-v", is_flag=True,
              help="also print Dagster's own log of the run (tracebacks included)")
def migrate(config: str, dataset: str | None, verbose: bool) -> None:
    """Move a dataset to its config as it is now after a breaking change (key, fingerprint,
    expiry, index layout, schema): re-derive the index from unique under the new contract, in
    one committed step, through Dagster. Refuses, writing nothing, if unique holds rows that are
    duplicates under the new contract."""
    from dedup_pipeline.orchestration.names import migrate_job_name

    cfg, ds = _load_dataset(config, dataset)
    _progress_to_stdout()
    click.echo(f"migrating {ds.name!r} ({ds.output}) to its config in {cfg.config_file}")
    _execute_job(cfg, migrate_job_name(ds.name), verbose, {})
    from dedup_pipeline.engine.contract import read_history
    from dedup_pipeline.engine.core.storage import Storage

    cur = read_history(Storage(ds.output), None).versions
    click.echo(f"done: {ds.name!r} is under contract v{cur[-1].version}" if cur else "done")


@main.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="output directory")
@click.option("--hours", default=24, show_default=True, type=click.IntRange(1))
@click.option("--rows-per-hour", default=100_000, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=7, show_default=True, type=int)
@click.option("--start", default=None, help="first hour (default: so the last is the last "
              "complete UTC hour)")
@click.option("--format", "fmt", default="jsonl", show_default=True,
              type=click.Choice(["jsonl", "csv"]))
def generate(out: str, hours: int, rows_per_hour: int, seed: int, start: str | None,
             fmt: str) -> None:
    """Write a sample landing zone (duplicates, conflicts, late and malformed records) + config."""
    from dedup_pipeline.sample.generate import generate_landing

    stats = generate_landing(out, hours=hours, rows_per_hour=rows_per_hour, seed=seed,
                             start=start, fmt=fmt, progress=lambda m: click.echo(f"  {m}"))
    click.echo(f"wrote {stats.rows} rows in {stats.files} files over {stats.hours} hours to "
               f"{stats.landing} in {stats.seconds:.1f}s")
    click.echo(f"config: {stats.config}")


@main.command()
@click.option("--dir", "directory", default="demo", show_default=True,
              type=click.Path(file_okay=False), help="where the demo data goes")
@click.option("--hours", default=6, show_default=True, type=click.IntRange(1, 48))
@click.option("--rows-per-hour", default=2_000, show_default=True, type=click.IntRange(10))
def demo(directory: str, hours: int, rows_per_hour: int) -> None:
    """Generate a sample landing zone and load it hour by hour through Dagster on local Spark;
    the newest hour lands without its _SUCCESS marker and is left for you to load from the UI."""
    import shutil

    from dedup_pipeline.orchestration.names import WRITTEN
    from dedup_pipeline.sample.generate import default_start, generate_landing

    root = Path(directory).resolve()
    if (root / "dedup.yaml").exists():
        click.echo(f"removing the previous demo in {root}")
        shutil.rmtree(root)
    t0 = time.perf_counter()
    # one hour more than loaded: the newest complete hour, its marker not there yet
    stats = generate_landing(root, hours=hours + 1, rows_per_hour=rows_per_hour, seed=7,
                             start=default_start(hours + 1))
    click.echo(f"generated {stats.rows} rows over {stats.hours} hours in {stats.landing}: "
               f"~{stats.in_batch_duplicates} in-batch duplicates, {stats.cross_batch_replays} "
               f"replays, {stats.conflicts} conflicts, {stats.late_over_day} records over a day "
               f"late, {stats.malformed + stats.null_keys + stats.bad_values} bad records")
    cfg = _load(stats.config)
    ds = cfg.datasets[0]
    from dedup_pipeline.hours import HOUR, format_hour, parse_hour

    last = format_hour(parse_hour(ds.start) + (hours - 1) * HOUR)
    pending = parse_hour(ds.start) + hours * HOUR
    pending_marker = (Path(ds.source.path) / f"date={pending:%Y-%m-%d}" / f"hour={pending:%H}" /
                      (ds.landing.marker or "_SUCCESS"))
    pending_marker.unlink(missing_ok=True)
    if not os.environ.get("DAGSTER_HOME"):
        os.environ["DAGSTER_HOME"] = str(root / "dagster_home")
    home = Path(os.environ["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)
    results = _run(cfg, ds.name, ds.start, last)
    click.echo("")
    click.echo(f"done in {time.perf_counter() - t0:.0f}s. Outputs ("
               + ("Delta tables" if ds.output_format == "delta" else "Parquet directories")
               + ", partitioned by load_hour):")
    for name in WRITTEN:
        click.echo(f"  {name:<10} {ds.output}/{name}/")
    click.echo(f"Dagster runs recorded in DAGSTER_HOME={os.environ['DAGSTER_HOME']}")
    click.echo("")
    for line in ui_hint(os.environ["DAGSTER_HOME"], str(stats.config), ds.name,
                        format_hour(pending), str(pending_marker)):
        click.echo(line)
    click.echo(f"Recheck everything:  .venv/bin/dedup-pipeline verify --config {stats.config}")
    del results


def ui_hint(home: str, config: str, dataset: str, pending: str, marker: str) -> list[str]:
    """The demo's closing lines: the README's two UI commands, and the hour left to load."""
    return [
        "See it in the UI (the README's two commands, each in its own shell):",
        "  .venv/bin/dedup-pipeline spark-server",
        f"  SPARK_REMOTE=sc://127.0.0.1:15002 DAGSTER_HOME={home} DEDUP_CONFIG={config} "
        ".venv/bin/dg dev",
        f"Your turn: hour {pending} has landed without its _SUCCESS marker, so it is not loaded. "
        "Load it either way:",
        f"  - in the UI: asset {dataset}/unique, Materialize…, Confirm (its five outputs are one "
        f"load), select {pending}, Launch 1 run;",
        f"  - or drop the marker and the landing sensor loads it within a minute: touch {marker}",
        "The CLI (run, verify) records in this instance too and uses the warm server "
        "once you export SPARK_REMOTE=sc://127.0.0.1:15002 (else it starts local Spark, 20-30 s).",
    ]


@main.command("spark-server")
@click.option("--port", default=None, type=click.IntRange(1, 65535),
              help="gRPC port  [default: 15002]")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on (0.0.0.0: every interface; Spark Connect has no "
              "authentication, keep it private)")
@click.option("--master", default=None, help="where the server's jobs run: local[*], "
              "spark://host:7077, k8s://…  [default: SPARK_MASTER_URL, else local[*]]")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE",
              help="a Spark setting for the server (repeatable), e.g. spark.driver.memory=4g")
@click.option("--log-level", default="WARN", show_default=True,
              type=click.Choice(["ERROR", "WARN", "INFO", "DEBUG"], case_sensitive=False),
              help="Spark's log level; a line per client session started or ended is printed "
                   "at any level")
def spark_server(port: int | None, host: str, master: str | None,
                 confs: tuple[str, ...], log_level: str) -> None:
    """Run a warm Spark Connect server in the foreground, with this package's start-up settings;
    point runs at it with SPARK_REMOTE (printed when it is ready). Ctrl-C stops it."""
    import signal
    import socket
    import subprocess

    from dedup_pipeline.engine.connect_host import die_with_parent
    from dedup_pipeline.engine.session import CONNECT_PORT, DEFAULT_MASTER, server_command

    port = port or CONNECT_PORT
    conf = {}
    for c in confs:
        k, sep, v = c.partition("=")
        if not sep or not k.strip():
            _fail(f"--conf {c!r}: expected KEY=VALUE")
        conf[k.strip()] = v
    master = master or os.environ.get("SPARK_MASTER_URL") or DEFAULT_MASTER
    probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host

    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection((probe, port), timeout=1):
            return True
        return False

    if listening():
        _fail(f"{probe}:{port} is already in use (another Spark Connect server?); "
              f"pick another --port")
    cmd = server_command(master, host, port, conf)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE")}
    env["SPARK_CONNECT_MODE"] = "0"  # start a classic JVM server, not a client of one
    # spark-submit runs the server's driver program (engine/connect_host.py) with this Python
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # the server's driver is spark-submit's own JVM (client mode): SPARK_SUBMIT_OPTS reach it
    import tempfile

    from dedup_pipeline.engine.connect_host import LOG4J2, LOG_LEVEL_ENV

    log_conf = Path(tempfile.mkdtemp(prefix="dedup-spark-server-")) / "log4j2.properties"
    log_conf.write_text(LOG4J2.format(level=log_level.lower()))
    env["SPARK_SUBMIT_OPTS"] = (env.get("SPARK_SUBMIT_OPTS", "") +
                                f" -Dlog4j2.configurationFile=file:{log_conf}").strip()
    env[LOG_LEVEL_ENV] = log_level.upper()
    click.echo(f"starting a Spark Connect server on {host}:{port}, master {master}, Spark log "
               f"level {log_level.upper()} (10-30 s)...")
    # Same process group as this command, so a supervisor that kills the group (or a terminal's
    # Ctrl-C) reaches the JVM too; it also gets SIGTERM if this process dies (Linux).
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)  # also when started with SIGINT ignored (`cmd &`)
    signal.signal(signal.SIGTERM, stop)
    url = f"sc://{probe}:{port}"
    try:
        while proc.poll() is None and not listening():
            time.sleep(0.5)
        if proc.poll() is None:
            click.echo(f"Spark Connect server ready. Point runs (and `dg dev`) at it:\n"
                       f"  export SPARK_REMOTE={url}\n(Ctrl-C stops it)")
        rc = proc.wait()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan the JVM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        click.echo("stopping the Spark Connect server...")
        proc.terminate()  # the JVM (spark-submit execs it): its shutdown hooks stop Spark
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        click.echo("stopped")
        return
    _fail(f"the Spark Connect server {url} exited with code {rc} (its log is above)")


if __name__ == "__main__":
    main()
