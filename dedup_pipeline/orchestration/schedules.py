"""Schedules per dataset (design.md D2): the hourly load, and a daily reconciliation of late input.

- `{ds}_hourly_schedule` (STOPPED by default): the alternative to the landing sensor for sources
  that write no marker. Each tick requests one partition of the load job, the hour that just
  ended, at minute `ceil(landing.grace / 60)` past the hour (capped at 59): the grace period
  lets stragglers land. It knows nothing about markers or late files and, like any load, fails
  with LoadOrderError if an earlier hour is not loaded; hence the sensor is the default.
- `{ds}_reconcile_schedule` (STOPPED by default, daily at 00:30 UTC): if any loaded hour within
  `landing.watch_hours` of the latest loaded hour got new, removed or changed landing files after
  its load, ONE ranged run reloads from the earliest such hour through the latest loaded hour, in
  order (R11). That is exact: a rerun of hour H reads only index entries of loads before H, and
  every later hour is reloaded after it. A gap before the latest loaded hour (a reload that failed
  half-way) also starts the range. Nothing is launched while a run of the dataset is active.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract
from dedup_pipeline.engine.core import landing
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import HOUR, compress_ranges, format_hour, parse_hour
from dedup_pipeline.orchestration import runs
from dedup_pipeline.orchestration.names import (
    LATE_HOURS_TAG,
    PARTITION,
    hourly_schedule_name,
    range_tags,
    reconcile_schedule_name,
)
from dedup_pipeline.orchestration.sensors import active_runs, describe_run

RECONCILE_CRON = "30 0 * * *"


def build_hourly_schedule(ds: DatasetConfig, job: Any) -> dg.ScheduleDefinition:
    """Load the hour that just ended, `grace` minutes past every hour (off by default).

    `job` is the dataset's asset job. Each tick requests one partition, the hour that ended; a
    config that breaks the dataset contract skips the tick with the contract line (a run would
    only fail with it), as the landing sensor does.
    """
    minute = min(59, math.ceil(ds.landing.grace_s / 60))

    @dg.schedule(
        job=job,
        cron_schedule=f"{minute} * * * *",
        execution_timezone="UTC",
        name=hourly_schedule_name(ds.name),
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Loads the hour of {ds.name!r} that just ended, at minute {minute} of every "
                    "hour (hour closed + grace). The alternative to the landing sensor: turn on "
                    "one of the two, not both.",
    )
    def hourly(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        tick = context.scheduled_execution_time or datetime.now(UTC)
        hour = tick.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - HOUR
        key = format_hour(hour)
        if hour < parse_hour(ds.start):
            return dg.SkipReason(f"hour {key} is before the dataset's start {ds.start}: the "
                                 "schedule has no partitions to load yet")
        st = Storage(ds.output)
        try:  # a run under a config that breaks the dataset contract would only fail: say why
            contract.check(st, ds, key, CommitLog(st).committed())
        except contract.ContractError as e:
            return dg.SkipReason(runs.with_config(ds, f"not loading {key}: {e}"))
        # the partition tag set here: the request needs no repository to resolve it
        return dg.RunRequest(run_key=f"{ds.name}:hourly:{key}", job_name=job.name, partition_key=key,
                             tags={PARTITION: key})

    return hourly


def build_reconcile_schedule(ds: DatasetConfig, job_name: str) -> dg.ScheduleDefinition:
    """Daily: reprocess from the earliest loaded hour whose input changed after its load."""

    @dg.schedule(
        cron_schedule=RECONCILE_CRON,
        execution_timezone="UTC",
        job_name=job_name,
        name=reconcile_schedule_name(ds.name),
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Daily: if files of an already-loaded hour of {ds.name!r} changed after its "
                    "load, reloads from that hour through the latest loaded hour in one ordered run.",
    )
    def reconcile(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        running = active_runs(context.instance, ds)
        if running:
            return dg.SkipReason(f"waiting for {describe_run(running[0])}")
        plan = landing.reprocess_range(ds)
        if plan is None:
            return dg.SkipReason(f"no loaded hour within {ds.landing.watch_hours}h of the latest "
                                 "one has input that changed after its load, and no gap")
        first, last = format_hour(plan.first), format_hour(plan.last)
        st = Storage(ds.output)
        try:  # a run under a config that breaks the dataset contract would only fail: say why
            contract.check(st, ds, first, CommitLog(st).committed())
        except contract.ContractError as e:
            return dg.SkipReason(runs.with_config(ds, f"not reloading {first} .. {last}: {e}"))
        tick = context.scheduled_execution_time
        stamp = tick.strftime("%Y-%m-%dT%H:%M") if tick else "now"
        return dg.RunRequest(
            run_key=f"{ds.name}:reconcile:{first}..{last}@{stamp}",
            job_name=job_name,
            tags={**range_tags(first, last, reconcile_schedule_name(ds.name)),
                  LATE_HOURS_TAG: compress_ranges([c.hour for c in plan.changes])},
        )

    return reconcile
