"""The landing sensor (design.md D2, R10, R11): load every hour whose input is complete, in order, once.

One sensor per dataset, `{ds}_landing_sensor`, on by default (RUNNING); the hourly schedule is the
documented alternative (``orchestration/schedules.py``). Each tick:

1. If a run of the dataset is queued or running, it requests nothing (two runs of one dataset never
   overlap; the engine's lock would refuse the second anyway). A run counts as the dataset's by
   what it materializes (`orchestration/runs.py`), so a run launched from the UI without our tags counts.
2. It reads which hours are loaded from the dataset's commit records, not from Dagster, so a wiped
   instance, a CLI load or a manual backfill all count. Loading resumes at the first hour since
   `start` without a commit record.
3. If the cursor says hours up to X were requested but the first unloaded hour is <= X and nothing
   runs, the requested run failed (or was cancelled): the tick is skipped with a reason naming the
   hours, the failed load and its error. It is not retried blindly (a load fails only on an
   infrastructure, config or index error, R9; blind retries would hide it); re-executing the run
   or a CLI `run` that loads those hours unblocks the sensor, since it then sees them committed.
   One repair is recognised: an index rebuild of the dataset that succeeded after the failed load
   (the fix an index-damage failure names; the recovery sensor launches it by itself). Then the
   hours are requested again, once per such rebuild (its run id is in the run key), so the index
   deleted under a running load heals without a person. A requested run that no longer exists
   (deleted from the UI before it ran) is requested again, under a run key derived from its own.
4. Otherwise it requests ONE run for the contiguous complete hours from the first unloaded one
   (a ranged run, hours loaded in ascending order in one Spark session; one hour is a
   single-partition run, as the UI's Materialize and the CLI make it), run key
   `{ds}:{first}..{last}`, and records `last` in the cursor, so a repeated tick or a restarted
   daemon never requests an hour twice (Dagster also drops a repeated run key).

It also compares the watched loaded hours' landing files with their commit records: changed hours are
named in the skip reason on every quiet tick, and each difference is recorded once (again if it
changes) as a failing WARN evaluation of `input_unchanged_since_load` on that partition, by a run of
the check's own job `{ds}_input_check` (no Spark); a passing one follows, the same way, once the
hour has been reprocessed. Through a run, not as a runless event of the sensor: Dagster keeps a
runless evaluation under run_id '' in a unique index on (asset, check, run_id, partition), so the
second one for an hour would be refused and fail every tick from then on.

Only the loads are essential to a tick. Everything else it does (the late-input comparison, the
error of a failed run named in a skip reason) is isolated: if it raises, the tick still requests
the loads of new complete hours, and the error is logged once per cause (the cursor keeps the
causes already logged), not on every tick.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract
from dedup_pipeline.engine.core import landing
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.formats import run_command
from dedup_pipeline.engine.core.lock import Lock
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import compress_ranges, format_hour, format_tag, hour_range, parse_hour, to_tag
from dedup_pipeline.orchestration import hour_events, runs
from dedup_pipeline.orchestration.landing_checks import build_input_check, build_input_check_job
from dedup_pipeline.orchestration.names import (
    PARTITION,
    TRIGGER_TAG,
    landing_sensor_name,
    range_tags,
    sensor_status,
)

INPUT_STATE_TAG = "dedup_pipeline/input_state"  # on a check run: "changed" or "reprocessed"
T = TypeVar("T")


def active_runs(instance: dg.DagsterInstance, ds: DatasetConfig) -> list[dg.DagsterRun]:
    """Queued or running runs of the dataset, however launched (UI, backfill, sensor, CLI)."""
    return runs.active_runs(instance, ds.name)


def describe_run(run: dg.DagsterRun) -> str:
    hours = runs.hours_of_run(run)
    return f"{run.job_name} run {run.run_id}" + (f" (hours {hours})" if hours else "") + \
        f", {run.status.value}"


@dataclass
class LandingCursor:
    """What the sensor remembers: the last hour it requested; the late-input differences it
    already recorded (hour -> signature), so each is recorded once; how many check runs it
    requested (their run keys count up); the errors it already logged (one log line per cause)."""

    requested_through: str | None = None
    reported: dict[str, str] = field(default_factory=dict)
    check_runs: int = 0
    errors: list[str] = field(default_factory=list)
    run_key: str | None = None  # of the last load requested: is that run still there?

    @classmethod
    def parse(cls, text: str | None) -> LandingCursor:
        if not text:
            return cls()
        raw = json.loads(text)
        return cls(raw.get("requested_through"), dict(raw.get("reported") or {}),
                   int(raw.get("check_runs") or 0), list(raw.get("errors") or []),
                   raw.get("run_key"))

    def dump(self) -> str:
        return json.dumps({"requested_through": self.requested_through,
                           "reported": dict(sorted(self.reported.items())),
                           "check_runs": self.check_runs, "errors": self.errors,
                           "run_key": self.run_key}, sort_keys=True)


def late_input_requests(ds: DatasetConfig, changes: list[landing.InputChange], committed: set[str],
                        cur: LandingCursor, check_job: str) -> list[dg.RunRequest]:
    """Runs of the input check to request this tick, one per hour whose state changed; updates
    `cur`.

    A new or different change -> a run that records the failing WARN; a reported hour that is
    loaded again and matches its inputs -> a run that records the pass. A reported hour that is not
    loaded right now (a reload failed half-way) stays reported; one that left the watch window is
    forgotten. Run keys count up in the cursor: a tick repeated with the same cursor requests the
    same keys, which Dagster drops.
    """
    requests: list[dg.RunRequest] = []

    def request(key: str, state: str) -> None:
        cur.check_runs += 1
        requests.append(dg.RunRequest(
            run_key=f"{ds.name}:input_check:{key}:{cur.check_runs}", job_name=check_job,
            # the partition as a tag: a job of a check alone has no partitions definition of its
            # own in Dagster 1.13 (inferred from selected assets: none), the check reads the tag
            tags={PARTITION: key, TRIGGER_TAG: landing_sensor_name(ds.name),
                  INPUT_STATE_TAG: state}))

    now_changed = {c.key: c for c in changes}
    for c in changes:
        if cur.reported.get(c.key) != c.signature:
            request(c.key, "changed")
            cur.reported[c.key] = c.signature
    watched = {format_hour(h) for h in landing.watched_hours(ds, committed)}
    for key in sorted(set(cur.reported) - set(now_changed)):
        if key in watched:
            request(key, "reprocessed")
            del cur.reported[key]
        elif to_tag(parse_hour(key)) in committed or not committed:
            del cur.reported[key]  # out of the watch window: no longer compared
    return requests


class TickErrors:
    """Errors of a tick's non-essential parts: caught, and each cause logged once."""

    def __init__(self) -> None:
        self.causes: list[str] = []

    def guard(self, what: str, fn: Callable[[], T], default: T) -> T:
        try:
            return fn()
        except Exception as err:  # isolated on purpose: the loads must go on
            first = (str(err).strip().splitlines() or [""])[0]
            self.causes.append(f"{what} failed: {type(err).__name__}: {first}")
            return default

    def report(self, context: Any, cur: LandingCursor) -> None:
        for cause in self.causes:
            if cause not in cur.errors:
                context.log.error(f"landing sensor: {cause}. Loads of complete hours go on; "
                                  "this is logged once, until the cause is gone.")
        cur.errors = list(dict.fromkeys(self.causes))


def _stalled(instance: dg.DagsterInstance, ds: DatasetConfig, frontier: str, through: str,
             history: runs.LoadHistory | None) -> str:
    last = history.load if history is not None else None
    what = "load"
    if last is None:
        last, what = runs.latest_run(instance, ds.name), "run"
    if last is not None:
        err = runs.run_error(instance, last.run_id) if last.status != dg.DagsterRunStatus.SUCCESS else None
        latest = f"the latest {what} of the dataset is {describe_run(last)}" + (f": {err}" if err else "")
    else:
        latest = "no run of the dataset is recorded in this instance"
    hours = compress_ranges(hour_range(frontier, through))
    return (f"hour(s) {hours} were requested but are not loaded, and no run of {ds.name!r} is in "
            f"progress; {latest}. Not retried automatically: fix the cause, then re-execute that "
            f"run (or `{run_command(frontier, through, ds.name)}`); the sensor resumes once the "
            "commit records show the hours loaded (or requests them again once an index rebuild "
            "of the dataset has succeeded since that run).")


def build_landing_sensor(ds: DatasetConfig, job: Any,
                         clock: Callable[[], datetime] | None = None, running: bool = True
                         ) -> dg.SensorDefinition:
    """The landing sensor of one dataset; `job` is its load job (the unresolved asset job). It also
    targets the dataset's input-check job. `clock` returns the current UTC time (tests pin it)."""
    now_fn = clock or (lambda: datetime.now(UTC))
    marker = (f"a {ds.landing.marker} marker in the hour's directory" if ds.landing.marker
              else f"the hour's end plus {ds.landing.grace_s:g}s grace")
    check_job = build_input_check_job(ds, build_input_check(ds))

    @dg.sensor(
        name=landing_sensor_name(ds.name),
        jobs=[job, check_job],
        minimum_interval_seconds=round(ds.landing.check_every_s),
        default_status=sensor_status(running),
        description=f"Loads each hour of {ds.name!r} once its input is complete ({marker}), in "
                    "ascending order, never skipping an hour; one ranged run per tick. Files that "
                    "land after their hour was loaded turn the hour's check "
                    "input_unchanged_since_load to a warning (a short run of its own job).",
    )
    def landing_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        errors = TickErrors()
        cur = errors.guard("reading the sensor cursor", lambda: LandingCursor.parse(context.cursor),
                           LandingCursor())
        running = active_runs(context.instance, ds)
        if running:
            return dg.SensorResult(skip_reason=f"waiting for {describe_run(running[0])}",
                                   cursor=cur.dump())
        log = CommitLog(Storage(ds.output))
        committed = log.committed()
        # hours loaded where this instance did not see them (a `dg launch` on a temporary
        # instance, a CLI run under another DAGSTER_HOME): reported loaded, from their records
        seen_now = errors.guard(
            "reporting hours loaded outside this instance",
            lambda: hour_events.report_unseen(
                ds, log, hour_events.unseen_hours(context.instance, ds, committed)), [])
        changes = errors.guard("comparing loaded hours' landing files with their commit records",
                               lambda: landing.changed_hours(ds, committed), [])
        saved = (dict(cur.reported), cur.check_runs)

        def late_checks() -> list[dg.RunRequest]:
            try:
                return late_input_requests(ds, changes, committed, cur, check_job.name)
            except Exception:  # nothing half-recorded: the next tick requests them again
                cur.reported, cur.check_runs = saved
                raise

        checks = errors.guard("requesting input-check runs", late_checks, [])
        newest = format_tag(committed.max() or "") if committed.max() else None
        late = (f" | {landing.describe_changes(changes, latest=newest, dataset=ds.name)}"
                if changes else "")

        def result(load: dg.RunRequest | None, skip: str | None) -> dg.SensorResult:
            errors.report(context, cur)
            skip = runs.with_config(ds, skip) if skip else skip
            requests = ([load] if load else []) + checks
            if seen_now:
                hours = compress_ranges(sorted({parse_hour(e.partition) for e in seen_now
                                                if e.partition is not None}))
                context.log.info(f"{ds.name}: reported hour(s) {hours} loaded: committed, but "
                                 "loaded outside this Dagster instance")
            if requests or seen_now:
                if skip:  # Dagster takes no skip reason beside run requests: into the tick's log
                    context.log.info(skip)
                return dg.SensorResult(run_requests=requests, cursor=cur.dump(),
                                       asset_events=seen_now)
            return dg.SensorResult(skip_reason=skip, cursor=cur.dump())

        frontier = landing.first_unloaded(ds, committed)
        retry = ""  # a run key suffix: the repair that allows requesting failed hours once more
        waiting = cur.requested_through is not None and parse_hour(cur.requested_through) >= frontier
        if waiting and cur.run_key is not None and not errors.guard(
                "looking up the requested run",
                lambda: runs.run_with_key(context.instance, cur.run_key or ""), True):
            # deleted before it loaded anything: request the hours again, under a key derived
            # from the gone one (deterministic for a repeated tick; no clash with an older run)
            retry = ":again:" + hashlib.sha256(cur.run_key.encode()).hexdigest()[:8]
            context.log.info(f"the requested run {cur.run_key} is gone; requesting its hours again")
        elif waiting:
            history = errors.guard("reading the dataset's runs",
                                   lambda: runs.load_history(context.instance, ds.name), None)
            repair = history.repair if history is not None else None
            if history is not None and history.load is not None and repair is not None:
                retry = f":after:{repair.run_id}"
                context.log.info(
                    f"requesting hour(s) from {format_hour(frontier)} again: the load "
                    f"{history.load.run_id} ({history.load.status.value}) was followed by the "
                    f"successful index rebuild {repair.run_id}")
            else:
                hours = compress_ranges(hour_range(format_hour(frontier), cur.requested_through))
                reason = errors.guard(
                    "naming the failed run",
                    lambda: _stalled(context.instance, ds, format_hour(frontier),
                                     cur.requested_through or "", history),
                    f"hour(s) {hours} were requested but are not loaded, and no run of "
                    f"{ds.name!r} is in progress. Not retried automatically: re-execute the "
                    "failed run.")
                return result(None, reason + late)

        ready = landing.ready_hours(ds, frontier, now_fn())
        if not ready.hours:
            return result(None, f"nothing to load: {ready.blocked_why}{late}")
        holder = errors.guard("reading the dataset lock", lambda: Lock.holder(Storage(ds.output)),
                              None)
        if holder is not None:  # a writer this instance does not see (a CLI run elsewhere)
            return result(None, f"not loading {compress_ranges(ready.hours)} yet: the dataset is "
                                f"locked by {holder}; the hours are requested once it is "
                                f"released{late}")
        first, last = format_hour(ready.hours[0]), format_hour(ready.hours[-1])
        try:  # a run under a config that breaks the dataset contract would only fail: say why
            contract.check(Storage(ds.output), ds, first, committed)
        except contract.ContractError as e:
            return result(None, f"not loading {compress_ranges(ready.hours)}: {e}{late}")
        cur.requested_through = last
        trigger = landing_sensor_name(ds.name)
        run_key = cur.run_key = f"{ds.name}:{first}..{last}{retry}"
        if first == last:  # one hour: a single-partition run, as the UI's Materialize of it
            return result(dg.RunRequest(run_key=run_key, job_name=job.name, partition_key=first,
                                        tags={TRIGGER_TAG: trigger}), None)
        return result(dg.RunRequest(run_key=run_key, job_name=job.name,
                                    tags=range_tags(first, last, trigger)), None)

    return landing_sensor
