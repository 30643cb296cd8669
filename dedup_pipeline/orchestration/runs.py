"""Which dataset and hours a Dagster run loads or rebuilds, and why it failed, however it was
launched.

A run launched from the UI (`__ASSET_JOB`, a backfill) carries none of our job tags, so the
dataset is derived from what the run materializes (its asset selection) or which job it runs,
and the hours from Dagster's own partition tags.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

# imported for their error classes: each registers its stage and fix (`errors.stage_and_fix`)
import dedup_pipeline.engine.load  # noqa: F401
import dedup_pipeline.engine.migrate  # noqa: F401
import dedup_pipeline.engine.session  # noqa: F401
from dedup_pipeline.config import BUILTIN_DEMO, DatasetConfig
from dedup_pipeline.config.loading import project_root
from dedup_pipeline.engine.core.formats import run_command
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.outputs import OUTPUTS
from dedup_pipeline.engine.errors import infrastructure_cause
from dedup_pipeline.errors import stage_and_fix
from dedup_pipeline.orchestration.names import (
    DATASET_TAG,
    LOAD_JOB_SUFFIX,
    PARTITION,
    RANGE_END,
    RANGE_START,
    REBUILD_JOB_SUFFIX,
    WRITTEN,
    dataset_of_key,
    load_job_name,
    pool_name,
    rebuild_job_name,
)

ACTIVE = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
          dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
RUN_KEY_TAG = "dagster/run_key"  # set by Dagster on a run a sensor requested
JOB_SUFFIXES = (LOAD_JOB_SUFFIX, REBUILD_JOB_SUFFIX)

# a step's progress lines, beside its run log: the CLI prints this logger (cli/common.py)
PROGRESS_LOGGER = logging.getLogger("dedup_pipeline.progress")


def config_path(ds: DatasetConfig | None = None) -> str:
    """The config file a command in a message names: DEDUP_CONFIG (what the standalone code
    location loaded), else the file the dataset was read from (a component's `defs.yaml`, or the
    CLI's `--config`); `<config.yaml>` only for the built-in demo dataset."""
    if os.environ.get("DEDUP_CONFIG"):
        return os.environ["DEDUP_CONFIG"]
    if ds is not None and ds.config_file != BUILTIN_DEMO:
        return ds.config_file
    return "<config.yaml>"


def with_config(ds: DatasetConfig | None, text: str) -> str:
    """A message of the engine (its fixes say `--config <file>`) with the real config file."""
    return text.replace("--config <file>", f"--config {config_path(ds)}")


# the directory name Dagster's CLI gives the instance it makes without DAGSTER_HOME (`dg launch`,
# `dagster asset materialize`; dagster._cli.utils.TMP_DAGSTER_HOME_PREFIX), removed at its exit
TEMPORARY_HOME_PREFIX = ".tmp_dagster_home_"
# the instance beside a config file or at a dg project's root: the demo writes it there, the CLI
# finds it there (cli/runs.py `instance_home`)
PROJECT_HOME = "dagster_home"


def temporary_instance_note(instance: dg.DagsterInstance, ds: DatasetConfig) -> str | None:
    """One line when a run of `ds` is recorded in an instance that ends with its command (Dagster's
    CLI without DAGSTER_HOME, or an in-memory one): what the UI will show, and how to keep runs.
    None on a lasting instance."""
    try:
        temporary = instance.is_ephemeral or Path(instance.root_directory).name.startswith(
            TEMPORARY_HOME_PREFIX)
    except Exception:  # noqa: BLE001 - a courtesy line never fails a load
        return None
    if not temporary:
        return None
    root = project_root(Path(ds.config_file)) if ds.config_file != BUILTIN_DEMO else None
    home = (root / PROJECT_HOME) if root is not None else Path.cwd() / PROJECT_HOME
    found = "the project's instance" if (home / "dagster.yaml").is_file() else "for example"
    return (f"{ds.name}: no DAGSTER_HOME, so this run is recorded in a temporary Dagster instance "
            f"removed when the command exits; the hours it loads stay loaded (their commit "
            f"records), and the landing sensor of the instance the UI uses reports them loaded. "
            f"To keep runs: export DAGSTER_HOME={home} ({found}; the same for dg dev)")


def progress(context: dg.OpExecutionContext) -> Progress:
    """Where a step says how far it is: its run's log, and the CLI's progress lines."""
    def say(msg: str) -> None:
        context.log.info(msg)
        PROGRESS_LOGGER.info(msg)

    return say


def dataset_of_run(run: dg.DagsterRun) -> str | None:
    """The dataset a run writes: its tag, else the assets it materializes or checks, else its job."""
    if run.tags.get(DATASET_TAG):
        return run.tags[DATASET_TAG]
    keys = [*(run.asset_selection or ()), *(c.asset_key for c in run.asset_check_selection or ())]
    found = sorted(d for d in (dataset_of_key(k, WRITTEN) for k in keys) if d is not None)
    if found:
        return found[0]
    for suffix in JOB_SUFFIXES:
        if run.job_name.endswith(suffix) and len(run.job_name) > len(suffix):
            return run.job_name[: -len(suffix)]
    return None


def hours_of_run(run: dg.DagsterRun) -> str | None:
    """'A' or 'A..B' from Dagster's partition tags (set by the UI, backfills, sensors, the CLI)."""
    start = run.tags.get(RANGE_START) or run.tags.get(PARTITION)
    end = run.tags.get(RANGE_END) or start
    if not start:
        return None
    return start if start == end else f"{start}..{end}"


def active_runs(instance: dg.DagsterInstance, dataset: str) -> list[dg.DagsterRun]:
    """Queued or running runs that load or rebuild `dataset`, however they were launched."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=ACTIVE), limit=500)
    return [r for r in runs if dataset_of_run(r) == dataset]


def latest_run(instance: dg.DagsterInstance, dataset: str) -> dg.DagsterRun | None:
    for r in instance.get_runs(limit=200):
        if dataset_of_run(r) == dataset:
            return r
    return None


def run_with_key(instance: dg.DagsterInstance, run_key: str) -> dg.DagsterRun | None:
    """The run a sensor requested under `run_key`, if it still exists (Dagster's run-key tag)."""
    found = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
    return found[0] if found else None


def is_load(run: dg.DagsterRun, dataset: str) -> bool:
    """A run that loads hours of `dataset`: its load job, or a UI run materializing its outputs."""
    if run.job_name == load_job_name(dataset):
        return True
    return any(dataset_of_key(k, OUTPUTS) == dataset for k in (run.asset_selection or ()))


@dataclass(frozen=True)
class LoadHistory:
    """The newest load run of a dataset, and the successful index rebuild that ran after it."""

    load: dg.DagsterRun | None
    rebuild_after: dg.DagsterRun | None

    @property
    def repair(self) -> dg.DagsterRun | None:
        """The index rebuild that succeeded after the latest load failed (or was cancelled): the
        fix a failed load on index damage names has been carried out. None otherwise."""
        failed = self.load is not None and self.load.status in (dg.DagsterRunStatus.FAILURE,
                                                                dg.DagsterRunStatus.CANCELED)
        return self.rebuild_after if failed else None


def load_history(instance: dg.DagsterInstance, dataset: str) -> LoadHistory:
    rebuild: dg.DagsterRun | None = None
    for r in instance.get_runs(limit=200):  # newest first
        if dataset_of_run(r) != dataset:
            continue
        if r.job_name == rebuild_job_name(dataset):
            if rebuild is None and r.status == dg.DagsterRunStatus.SUCCESS:
                rebuild = r
        elif is_load(r, dataset):
            return LoadHistory(r, rebuild)
    return LoadHistory(None, rebuild)


@dataclass(frozen=True)
class RootError:
    cls: str
    message: str  # first line, without a repeated "pkg.module.Class: " prefix

    def __str__(self) -> str:
        return f"{self.cls}: {self.message}"


def root_error(err: object | None) -> RootError | None:
    """The user error under Dagster's step-execution wrapper (and under the `Failure` a load
    raises with its summary in front, `load_failure`), in one line."""
    while err is not None and getattr(err, "cause", None) is not None and (
            "ExecutionStepExecutionError" in err.cls_name  # type: ignore[attr-defined]
            or err.cls_name == "Failure"):  # type: ignore[attr-defined]
        err = err.cause  # type: ignore[attr-defined]
    if err is None:
        return None
    cls: str = err.cls_name  # type: ignore[attr-defined]
    texts, e = [], err
    while e is not None:
        texts += [e.message or "", "".join(e.stack or [])]  # type: ignore[attr-defined]
        e = e.cause or e.context  # type: ignore[attr-defined]
    infra = infrastructure_cause("\n".join(texts))
    if infra is not None:  # disk full / read-only: say so, not "error calling o6206.parquet"
        return RootError(cls, infra)
    msg = (err.message or "").strip().splitlines()[0] if (err.message or "").strip() else ""  # type: ignore[attr-defined]
    head, sep, rest = msg.partition(": ")
    if sep and head.split(".")[-1] == cls:
        msg = rest
    return RootError(cls, msg)


def first_step_error(events: Iterable[dg.DagsterEvent | None]) -> RootError | None:
    """The root error of the first step failure among `events`: a run's stored log, the events of
    an in-process result, or a failure sensor's step failures all go through here."""
    for ev in events:
        if ev is not None and ev.is_step_failure and ev.step_failure_data:
            found = root_error(ev.step_failure_data.error)
            if found is not None:
                return found
    return None


def run_error(instance: dg.DagsterInstance, run_id: str) -> RootError | None:
    """The first step failure of a run, from its stored log."""
    return first_step_error(rec.dagster_event for rec in
                            instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE))


def _filled(template: str, ds: str, hours: str) -> str:
    """An error class's stage or fix with the dataset's names filled in."""
    return template.format(ds=ds, hours=hours, pool=pool_name(ds), rebuild_job=rebuild_job_name(ds))


def rerun_ways(ds: str, first: str, last: str, config: str = "<config.yaml>") -> str:
    """How to load hours first..last again, the UI way and the CLI way."""
    hours = first if first == last else f"{first}..{last}"
    backfill = ("select the hour and Materialize" if first == last else
                f"select {hours} and Launch backfill (one run, hours in order)")
    return (f"in the UI, open asset {ds}/unique, Partitions tab, {backfill}; or from a shell, "
            f"{run_command(first, last, ds, config)}")


def no_partition_load(ds: str, config: str = "<config.yaml>") -> str:
    """Why a load run without a partition loaded nothing, and how to pick the hours."""
    return (f"A load of {ds} needs the hours to load: this run has no partition (launched without "
            f"an hour selected), so it loaded nothing and changed nothing. Fix: "
            f"{rerun_ways(ds, 'FIRST', 'LAST', config)} (the landing sensor loads every complete "
            "hour by itself).")


def failure_summary(run: dg.DagsterRun, err: RootError | None, fallback: str,
                    config: str = "<config.yaml>") -> str:
    """One paragraph: dataset, hour(s), the cause once, the fix that fits it. A run that loads or
    rebuilds no dataset (a check's own run, a job of another code location) gets one plain line
    saying so, never a guessed dataset."""
    cause = str(err) if err else fallback
    ds = dataset_of_run(run)
    if ds is None:
        return (f"dedup_pipeline: run {run.run_id} of {run.job_name} failed; it loads no dataset "
                f"hour, so no dataset's state changed. Error: {cause}")
    if hours_of_run(run) is None and not run.job_name.endswith(REBUILD_JOB_SUFFIX):
        # a load launched with no hour (the launchpad allows it after a warning): Dagster fails
        # its step before the load's code runs, with an error about partition keys
        return f"dedup_pipeline run failure: {no_partition_load(ds, config)}"
    hours = hours_of_run(run) or "(no partition: every committed hour)"
    stage, fix = stage_and_fix(err.cls if err else None)
    stage, fix = _filled(stage, ds, hours), _filled(fix, ds, hours)
    return (f"dedup_pipeline run failure: dataset {ds}, hour(s) {hours}. Failed in {stage}: "
            f"{cause} Fix: {fix}.")


def load_failure(ds: str, first: str, last: str, err: BaseException, rerun_first: str,
                 config: str, rerun_last: str | None = None) -> str:
    """The description of the `Failure` a load step raises: what failed, in which hours, and the
    fix (UI and CLI ways) in one paragraph; the error's traceback stays below it, as its cause.
    `rerun_first`..`rerun_last` (default `last`) are the hours to load again, in order (for an
    order error: from the first missing one; for a rerun refused because later hours are loaded:
    through the latest loaded one)."""
    cls = type(err).__name__
    msg = (str(err).strip().splitlines() or [""])[0]
    root = root_error_of_exception(err) or RootError(cls, msg)
    stage, fix = stage_and_fix(root.cls)
    hours = first if first == last else f"{first}..{last}"
    stage, fix = _filled(stage, ds, hours), _filled(fix, ds, hours)
    cause = str(root).rstrip(".")  # an error's own last sentence ends with a period
    return (f"Load of {ds} hour(s) {hours} failed in {stage}: {cause}. Fix: {fix}. To load again: "
            f"{rerun_ways(ds, rerun_first, rerun_last or last, config)}.")


def root_error_of_exception(err: BaseException) -> RootError | None:
    """`root_error` for a live exception (its infrastructure cause, if any, in plain words)."""
    try:
        return root_error(_StoredShape.of(err))
    except Exception:  # a summary must never fail the failure
        return None


@dataclass(frozen=True)
class _StoredShape:
    """A live exception in the shape Dagster stores a step's error in (class name, message as
    `traceback` prints it, stack, cause and context), so one `root_error` reads both."""

    cls_name: str
    message: str
    stack: list[str]
    cause: _StoredShape | None
    context: _StoredShape | None

    @classmethod
    def of(cls, e: BaseException | None, seen: frozenset[int] = frozenset()) -> _StoredShape | None:
        if e is None or id(e) in seen:
            return None
        seen = seen | {id(e)}
        context = None if e.__cause__ is not None or e.__suppress_context__ else e.__context__
        return cls(type(e).__name__, "".join(traceback.format_exception_only(type(e), e)),
                   traceback.format_tb(e.__traceback__), cls.of(e.__cause__, seen),
                   cls.of(context, seen))
