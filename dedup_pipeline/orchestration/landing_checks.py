"""The late-input check: did a loaded hour's landing files change after its load? (design.md D2, D4)

`{ds}/raw_batch` check `input_unchanged_since_load`, hourly partitioned, severity WARN. It runs on
its own (UI: the check's "Execute" for a partition; no Spark, it lists files and reads the commit
record), and the landing sensor reports the same evaluation for every hour it finds changed, so a
file that lands after its hour was loaded shows as a failing check on that very partition instead of
being silently ignored. The outputs are not wrong by their own rules (they are exactly the load of
the files that were there), hence WARN: reprocessing from that hour is the operator's call
(docs/operations.md, "Late files"), or the reconciliation schedule's.

Partitioned asset checks are a preview feature of Dagster 1.13 (`partitions_def` on a check); the
PreviewWarning is silenced here so `dagster dev` stays quiet.
"""

import warnings
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import landing
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import compress_ranges, format_hour, format_tag, parse_hour, to_tag
from dedup_pipeline.orchestration.names import RAW, asset_key, input_check_job_name
from dedup_pipeline.orchestration.partitions import hourly_partitions

CHECK_NAME = "input_unchanged_since_load"
MAX_LISTED = 20  # files named in the metadata per kind of change


def raw_key(ds: DatasetConfig) -> dg.AssetKey:
    return asset_key(ds, RAW)


def _change_metadata(ds: DatasetConfig, change: landing.InputChange) -> dict[str, object]:
    def listed(paths: list[str]) -> str:
        shown = [landing.display_path(p, ds) for p in paths[:MAX_LISTED]]
        more = [f"... and {len(paths) - MAX_LISTED} more"] if len(paths) > MAX_LISTED else []
        return "\n".join(shown + more)

    return {
        "files_added": len(change.added),
        "files_removed": len(change.removed),
        "files_modified": len(change.modified),
        "added": listed(change.added),
        "removed": listed(change.removed),
        "modified": listed(change.modified),
        "reprocess_from": change.key,
    }


@dataclass(frozen=True)
class HourState:
    """One hour's comparison: `change` is None when its files are the ones its load read."""

    key: str
    loaded: bool
    change: landing.InputChange | None = None
    files: int = 0


def hour_state(ds: DatasetConfig, hour: datetime) -> HourState:
    record = CommitLog(Storage(ds.output)).read(to_tag(hour))
    if record is None:
        return HourState(format_hour(hour), loaded=False)
    return HourState(format_hour(hour), loaded=True,
                     change=landing.input_change(ds, hour, record), files=len(record.inputs))


def _hour_result(ds: DatasetConfig, st: HourState) -> dg.AssetCheckResult:
    warn = dg.AssetCheckSeverity.WARN
    if not st.loaded:
        return dg.AssetCheckResult(passed=True, severity=warn, metadata={"loaded": False},
                                   description=f"{st.key} is not loaded yet: nothing to compare")
    if st.change is None:
        return dg.AssetCheckResult(passed=True, severity=warn,
                                   description="the landing files are the ones the load read",
                                   metadata={"loaded": True, "files": st.files})
    c = st.change
    return dg.AssetCheckResult(
        passed=False, severity=warn,
        description=f"landing files of {c.summary()} changed after the hour was loaded; "
                    f"{landing.reload_hint(ds.name, c.key, _latest(ds))}",
        metadata={"loaded": True, **_change_metadata(ds, c)})


class _UnpartitionedResult(dg.AssetCheckResult):
    """The result of a run with no partition at all (the UI's Execute button sends none).

    Dagster 1.13 looks up the target materialization of such a result as that of an unpartitioned
    input: for a partitioned check on an asset with any event it then asks the run for its
    partition range and raises "Cannot access partition_key for a non-partitioned run". A result
    about several hours targets no single materialization, so it names none.
    """

    def _get_target_materialization_data(self, step_context: Any, check_key: Any) -> None:
        return None


def _many_result(ds: DatasetConfig, scope: str, states: list[HourState],
                 cls: type[dg.AssetCheckResult] = dg.AssetCheckResult) -> dg.AssetCheckResult:
    """One result for several hours (a run of the check without one partition selected)."""
    changed = [s.change for s in states if s.change is not None]
    loaded = [s for s in states if s.loaded]
    md: dict[str, object] = {"hours_compared": sum(s.loaded for s in states),
                             "hours_loaded": len(loaded), "hours_changed": len(changed),
                             "changed_hours": compress_ranges([c.hour for c in changed])}
    if not loaded:
        return cls(passed=True, severity=dg.AssetCheckSeverity.WARN, metadata=md,
                   description=f"{scope}: no hour is loaded yet, nothing to compare")
    if not changed:
        return cls(
            passed=True, severity=dg.AssetCheckSeverity.WARN, metadata=md,
            description=f"{scope}: the landing files of every loaded hour are the ones its load "
                        "read")
    return cls(
        passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=md,
        description=f"{scope}: {landing.describe_changes(changed, latest=_latest(ds), dataset=ds.name)}")


def _latest(ds: DatasetConfig) -> str | None:
    """The latest loaded hour (a partition key), None with none."""
    newest = CommitLog(Storage(ds.output)).committed().max()
    return format_tag(newest) if newest else None


class InputCheckDefinition(dg.AssetChecksDefinition):
    """The input check's definition: an `AssetChecksDefinition` whose copies stay one.

    Why: Dagster 1.13 copies every definition of a yaml component to add the component's metadata
    (`Definitions.with_definition_metadata_update`), and `with_attributes` returns a plain
    `AssetsDefinition` for a check-only definition. The repository then converts it back with
    `AssetChecksDefinition(**attributes)`, passing the beta `execution_type` itself, which prints a
    BetaWarning on every code load (`dg dev`, the daemon). A copy that keeps this class is never
    converted. `AssetChecksDefinition` adds no state to `AssetsDefinition`, so the class of the
    copy is all that changes."""

    def with_attributes(self, **kwargs: Any) -> dg.AssetsDefinition:
        copy = super().with_attributes(**kwargs)
        if isinstance(copy, dg.AssetsDefinition) and not copy.keys and not isinstance(
                copy, InputCheckDefinition):
            copy.__class__ = InputCheckDefinition
        return copy


def build_input_check(ds: DatasetConfig) -> dg.AssetChecksDefinition:
    """The check for one dataset. With a partition selected it evaluates that hour; a range, each
    hour of it; none (the UI's Execute without a partition), every loaded hour the landing sensor
    watches (`landing.watch_hours` back from the latest) - one result either way, so the UI's
    Execute works with and without a partition (design.md D4b)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)

        @dg.asset_check(
            asset=raw_key(ds),
            name=CHECK_NAME,
            partitions_def=hourly_partitions(ds),
            blocking=False,
            description="The hour's landing files are still the ones its load read (path, size, "
                        "modification time, against the hour's commit record). Warns when files "
                        "arrived, vanished or changed after the load: reprocess from that hour. "
                        "Without a partition selected it compares every recently loaded hour.",
        )
        def input_unchanged_since_load(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
            if context.has_partition_key:
                return _hour_result(ds, hour_state(ds, parse_hour(context.partition_key)))
            if context.has_partition_key_range:
                keys = list(context.partition_keys)
                return _many_result(ds, f"hours {keys[0]}..{keys[-1]}",
                                    [hour_state(ds, parse_hour(k)) for k in keys])
            committed = CommitLog(Storage(ds.output)).committed()
            hours = landing.watched_hours(ds, committed)
            scope = (f"loaded hours {compress_ranges(hours)}" if hours else "every hour")
            return _many_result(ds, scope, [hour_state(ds, h) for h in hours], _UnpartitionedResult)

    input_unchanged_since_load.__class__ = InputCheckDefinition  # (above) no state of its own
    return input_unchanged_since_load


def build_input_check_job(ds: DatasetConfig, check: dg.AssetChecksDefinition
                          ) -> Any:
    """The job the landing sensor launches to record the check's evaluation of one hour.

    Why a run and not a runless evaluation from the sensor: Dagster stores a runless evaluation
    with run_id '' under a unique index on (asset, check, run_id, partition), so a second one for
    the same hour (the hour reprocessed, or a later file in it) is refused and fails the tick.
    """
    return dg.define_asset_job(
        name=input_check_job_name(ds.name),
        selection=dg.AssetSelection.checks(check),
        description=f"Compares the landing files of hours of {ds.name!r} with the files their loads "
                    "read (check input_unchanged_since_load); no Spark.",
    )
