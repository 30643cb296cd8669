"""The landing sensor (SPEC D2, R10, R11): load every hour whose input is complete, in order, once.

One sensor per dataset, `{ds}_landing_sensor`, on by default (RUNNING); the hourly schedule is the
documented alternative (``defs/schedules.py``). Each tick:

1. If a run of the dataset is queued or running, it requests nothing (two runs of one dataset never
   overlap; the engine's lock would refuse the second anyway). A run counts as the dataset's by
   what it materializes (`defs/runs.py`), so a run launched from the UI without our tags counts.
2. It reads which hours are loaded from the dataset's commit records, not from Dagster, so a wiped
   instance, a CLI load or a manual backfill all count. Loading resumes at the first hour since
   `start` without a commit record.
3. If the cursor says hours up to X were requested but the first unloaded hour is <= X and nothing
   runs, the requested run failed (or was cancelled): the tick is skipped with a reason naming the
   hours, the run and its error. It is not retried automatically (a load fails only on an
   infrastructure or config error, R9; blind retries would hide it); re-executing the run or a CLI
   `run` that loads those hours unblocks the sensor, since it then sees them committed.
4. Otherwise it requests ONE run for the contiguous complete hours from the first unloaded one
   (ranged run, hours loaded in ascending order in one Spark session), run key
   `{ds}:{first}..{last}`, and records `last` in the cursor, so a repeated tick or a restarted
   daemon never requests an hour twice (Dagster also drops a repeated run key).

It also compares the watched loaded hours' landing files with their commit records: changed hours are
named in the skip reason on every quiet tick, and reported once (again if the difference changes) as
a failing WARN evaluation of `input_unchanged_since_load` on that partition; a passing evaluation
follows once the hour has been reprocessed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.defs import runs
from dedup_pipeline.defs.landing_checks import late_input_evaluation, resolved_evaluation
from dedup_pipeline.defs.names import landing_sensor_name, range_tags
from dedup_pipeline.engine import commits, contract, landing
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import compress_ranges, hour_range, parse_key, to_key, to_tag

SENSOR_INTERVAL_S = 30


def active_runs(instance: dg.DagsterInstance, ds: DatasetConfig) -> list[dg.DagsterRun]:
    """Queued or running runs of the dataset, however launched (UI, backfill, sensor, CLI)."""
    return runs.active_runs(instance, ds.name)


def describe_run(run: dg.DagsterRun) -> str:
    hours = runs.hours_of_run(run)
    return f"{run.job_name} run {run.run_id}" + (f" (hours {hours})" if hours else "") + \
        f", {run.status.value}"


@dataclass
class LandingCursor:
    """What the sensor remembers: the last hour it requested, and the late-input differences it
    already reported (hour -> signature), so each is reported once."""

    requested_through: str | None = None
    reported: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None) -> LandingCursor:
        if not text:
            return cls()
        raw = json.loads(text)
        return cls(raw.get("requested_through"), dict(raw.get("reported") or {}))

    def dump(self) -> str:
        return json.dumps({"requested_through": self.requested_through,
                           "reported": dict(sorted(self.reported.items()))}, sort_keys=True)


def late_input_events(ds: DatasetConfig, changes: list[landing.InputChange], committed: set[str],
                      cur: LandingCursor) -> list[dg.AssetCheckEvaluation]:
    """Evaluations to report this tick; updates `cur.reported`.

    New or different changes -> failing WARN; a reported hour that is loaded again and matches its
    inputs -> passing. A reported hour that is not loaded right now (a reload failed half-way) stays
    reported; one that left the watch window is forgotten.
    """
    events: list[dg.AssetCheckEvaluation] = []
    now_changed = {c.key: c for c in changes}
    for c in changes:
        if cur.reported.get(c.key) != c.signature:
            events.append(late_input_evaluation(ds, c))
            cur.reported[c.key] = c.signature
    watched = {to_key(h) for h in landing.watched_hours(ds, committed)}
    for key in sorted(set(cur.reported) - set(now_changed)):
        if key in watched:
            events.append(resolved_evaluation(ds, key))
            del cur.reported[key]
        elif to_tag(parse_key(key)) in committed or not committed:
            del cur.reported[key]  # out of the watch window: no longer compared
    return events


def _stalled(instance: dg.DagsterInstance, ds: DatasetConfig, frontier: str, through: str) -> str:
    last = runs.latest_run(instance, ds.name)
    if last is not None:
        err = runs.run_error(instance, last.run_id) if last.status != dg.DagsterRunStatus.SUCCESS else None
        latest = f"the latest run of the dataset is {describe_run(last)}" + (f": {err}" if err else "")
    else:
        latest = "no run of the dataset is recorded in this instance"
    hours = compress_ranges(hour_range(frontier, through))
    return (f"hour(s) {hours} were requested but are not loaded, and no run of {ds.name!r} is in "
            f"progress; {latest}. Not retried automatically: fix the cause, then re-execute that "
            f"run (or `dedup-pipeline run --from {frontier} --to {through}`); the sensor resumes "
            f"once the commit records show the hours loaded.")


def build_landing_sensor(ds: DatasetConfig, job_name: str,
                         clock: Callable[[], datetime] | None = None) -> dg.SensorDefinition:
    """The landing sensor of one dataset. `clock` returns the current UTC time (tests pin it)."""
    now_fn = clock or (lambda: datetime.now(UTC))
    marker = (f"a {ds.landing.marker} marker in the hour's directory" if ds.landing.marker
              else f"the hour's end plus {ds.landing.grace_s:g}s grace")

    @dg.sensor(
        name=landing_sensor_name(ds.name),
        job_name=job_name,
        minimum_interval_seconds=SENSOR_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Loads each hour of {ds.name!r} once its input is complete ({marker}), in "
                    "ascending order, never skipping an hour; one ranged run per tick. Reports "
                    "files that land after their hour was loaded (check input_unchanged_since_load).",
    )
    def landing_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cur = LandingCursor.parse(context.cursor)
        running = active_runs(context.instance, ds)
        if running:
            return dg.SensorResult(skip_reason=f"waiting for {describe_run(running[0])}",
                                   cursor=cur.dump())
        committed = commits.committed_tags(Storage(ds.output))
        changes = landing.changed_hours(ds, committed)
        events = late_input_events(ds, changes, committed, cur)
        late = f" | {landing.describe_changes(changes)}" if changes else ""

        frontier = landing.first_unloaded(ds, committed)
        if cur.requested_through is not None and parse_key(cur.requested_through) >= frontier:
            reason = _stalled(context.instance, ds, to_key(frontier), cur.requested_through)
            return dg.SensorResult(skip_reason=reason + late, cursor=cur.dump(), asset_events=events)

        ready = landing.ready_hours(ds, frontier, now_fn())
        if not ready.hours:
            return dg.SensorResult(skip_reason=f"nothing to load: {ready.blocked_why}{late}",
                                   cursor=cur.dump(), asset_events=events)
        first, last = to_key(ready.hours[0]), to_key(ready.hours[-1])
        try:  # a run under a config that breaks the dataset contract would only fail: say why
            contract.check(Storage(ds.output), ds, first, committed)
        except contract.ContractError as e:
            return dg.SensorResult(
                skip_reason=f"not loading {compress_ranges(ready.hours)}: {e}{late}",
                cursor=cur.dump(), asset_events=events)
        cur.requested_through = last
        request = dg.RunRequest(run_key=f"{ds.name}:{first}..{last}", job_name=job_name,
                                tags=range_tags(first, last, landing_sensor_name(ds.name)))
        return dg.SensorResult(run_requests=[request], cursor=cur.dump(), asset_events=events)

    return landing_sensor
