"""The commands that write a dataset run its Dagster job in this process, recorded in the
instance the UI reads (design.md K2): which instance, opening it, running a job, a load's range."""

from __future__ import annotations

import contextlib
import fcntl
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import dagster as dg

from dedup_pipeline.cli.common import fail, one_line, print_table, progress_to_stdout, with_file
from dedup_pipeline.cli.spark import spark_note
from dedup_pipeline.config import BUILTIN_DEMO, DatasetConfig, PipelineConfig
from dedup_pipeline.config.loading import project_root
from dedup_pipeline.engine.core import landing
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import format_tag, hour_range
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.runner import QUIET_LOGGERS, failure_message, run_range
from dedup_pipeline.orchestration.runs import PROJECT_HOME

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

# Held while a command opens the instance at DAGSTER_HOME: Dagster creates its SQLite storages
# there on first use with "create table" and no retry, so two commands starting on a brand-new
# DAGSTER_HOME at the same instant failed with "table jobs already exists".
INIT_LOCK = ".dedup_pipeline_instance.lock"


def quiet_dagster() -> None:
    """Drop Dagster's preview/beta/supersession notices (about Dagster's own APIs, not our data)
    so the CLI's progress and tables stay readable. Errors and other warnings still print."""
    for category in (dg.PreviewWarning, dg.BetaWarning, dg.SupersessionWarning):
        warnings.filterwarnings("ignore", category=category)


@contextlib.contextmanager
def _instance_lock(home: Path) -> Iterator[None]:
    with open(home / INIT_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file is closed
        yield


def instance_home(cfg: PipelineConfig | None = None) -> Path | None:
    """The Dagster instance a command records its runs in, so the CLI and the UI share one:
    DAGSTER_HOME when set; else `dagster_home/` beside the config file, or at the root of the dg
    project the file is in, when it holds a dagster.yaml (what `dedup-pipeline demo` writes and
    its `dg dev` command uses); else None (a temporary instance)."""
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"])
    if cfg is not None and cfg.config_file != BUILTIN_DEMO:
        path = Path(cfg.config_file).resolve()
        for base in (path.parent, project_root(path)):
            if base is not None and (base / PROJECT_HOME / "dagster.yaml").is_file():
                return base / PROJECT_HOME
    return None


@contextlib.contextmanager
def instance(cfg: PipelineConfig | None = None) -> Iterator[dg.DagsterInstance]:
    """The Dagster instance at `instance_home` (design.md K2), or a temporary one without one.

    Opened (its storages created, the first time) under a file lock in its home; an error
    opening it is one line naming the home and the cause."""
    quiet_dagster()
    home = instance_home(cfg)
    if home is not None:
        if not os.environ.get("DAGSTER_HOME"):
            click.echo(f"recording in the Dagster instance {home}, found by the config (the "
                       "UI's; set DAGSTER_HOME to choose another)")
        try:
            home.mkdir(parents=True, exist_ok=True)
            with _instance_lock(home):
                inst = dg.DagsterInstance.from_config(str(home))
        except Exception as e:  # noqa: BLE001 - the cause in one line, not a traceback
            fail(f"the Dagster instance at DAGSTER_HOME={home} cannot be opened: {one_line(e)}")
        with inst:
            yield inst
    else:  # in memory: nothing outlives the command (its commit records are the history)
        click.echo("no DAGSTER_HOME: this run is recorded in a temporary instance no UI shows "
                   "(the landing sensor of a running UI still sees the dataset's lock)")
        with dg.DagsterInstance.ephemeral() as inst:
            yield inst


def execute_job(cfg: PipelineConfig, job_name: str, verbose: bool, run_config: dict[str, Any],
                name_run: bool = False, spark: bool = True) -> None:
    """Run one of the dataset's jobs (not its load) in this process, recorded in the instance;
    its progress lines printed (and which Spark it uses, if it uses one); exit 1 with its
    failure summary if it fails."""
    quiet_dagster()
    progress_to_stdout()
    job = build_definitions(cfg).resolve_job_def(job_name)
    if spark:
        click.echo(spark_note(cfg))
    with instance(cfg) as inst:
        res = job.execute_in_process(
            instance=inst, run_config={**(QUIET_LOGGERS if not verbose else {}), **run_config},
            raise_on_error=False)
    if not res.success:
        fail(f"run {res.run_id} failed: {failure_message(res)}" if name_run
             else failure_message(res))


def run_hours(cfg: PipelineConfig, ds: DatasetConfig, first: str, last: str,
              verbose: bool = False) -> list[CommitRecord]:
    """Load hours first..last of `ds` in one run of its load job; its table printed."""
    quiet_dagster()
    n = len(hour_range(first, last))
    click.echo(f"loading {n} hour(s) of {ds.name!r}, {first} .. {last}, in one Dagster run")
    click.echo(spark_note(cfg))
    progress_to_stdout()
    with instance(cfg) as inst:
        try:
            run = run_range(cfg, ds.name, first, last, inst, quiet=not verbose)
        except Exception as e:  # noqa: BLE001 - e.g. the instance's storage: one line, not a trace
            if verbose:
                raise
            fail(f"the run of {ds.name!r} {first} .. {last} could not run: {one_line(e)} "
                 "(--verbose shows the traceback)")
    if run.results:
        click.echo("")
        print_table(run.results)
    _report_late_input(cfg, ds)
    if not run.success:
        fail(f"run {run.run_id} failed: {with_file(cfg, run.error or '')}")
    return run.results


def _report_late_input(cfg: PipelineConfig, ds: DatasetConfig) -> None:
    """One line per loaded hour (within landing.watch_hours of the latest) whose landing files
    changed after it was loaded: the CLI's late-file report, as the landing sensor's."""
    try:
        committed = CommitLog(Storage(ds.output)).committed()
        changes = landing.changed_hours(ds, committed)
    except Exception as e:  # noqa: BLE001 - a report, never the command's failure
        click.echo(f"warning: late files of {ds.name!r} not checked: {one_line(e)}")
        return
    for c in changes:
        click.echo(f"late input: {ds.name} "
                   f"{with_file(cfg, c.line(ds, format_tag(committed.max() or '')))}")
