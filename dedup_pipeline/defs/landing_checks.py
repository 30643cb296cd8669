"""The late-input check: did a loaded hour's landing files change after its load? (SPEC D2, D4)

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

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.defs.names import RAW, asset_key
from dedup_pipeline.defs.partitions import hourly_partitions
from dedup_pipeline.engine import commits, landing
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import parse_key, to_key, to_tag

CHECK_NAME = "input_unchanged_since_load"
MAX_LISTED = 20  # files named in the metadata per kind of change


def raw_key(ds: DatasetConfig) -> dg.AssetKey:
    return asset_key(ds.name, RAW)


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


def late_input_evaluation(ds: DatasetConfig, change: landing.InputChange) -> dg.AssetCheckEvaluation:
    """The failing WARN evaluation the sensor reports for a changed hour."""
    return dg.AssetCheckEvaluation(
        asset_key=raw_key(ds),
        check_name=CHECK_NAME,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        partition=change.key,
        description=f"landing files of {change.summary()} changed after the hour was loaded; "
                    f"reprocess from {change.key} through the latest loaded hour",
        metadata=_change_metadata(ds, change),
    )


def resolved_evaluation(ds: DatasetConfig, key: str) -> dg.AssetCheckEvaluation:
    """The passing evaluation once a reported hour's input matches its commit record again."""
    return dg.AssetCheckEvaluation(
        asset_key=raw_key(ds),
        check_name=CHECK_NAME,
        passed=True,
        severity=dg.AssetCheckSeverity.WARN,
        partition=key,
        description="the landing files match the ones the hour's load read (reprocessed)",
    )


def build_input_check(ds: DatasetConfig) -> dg.AssetChecksDefinition:
    """The check for one dataset; evaluates the run's partition from the files alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)

        @dg.asset_check(
            asset=raw_key(ds),
            name=CHECK_NAME,
            partitions_def=hourly_partitions(ds),
            blocking=False,
            description="The hour's landing files are the ones its load read (path, size, mtime "
                        "against the commit record). Fails (WARN) when files arrived, vanished or "
                        "changed after the load: reprocess from that hour.",
        )
        def input_unchanged_since_load(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
            hour = parse_key(context.partition_key)
            record = commits.read_commit(Storage(ds.output), to_tag(hour))
            if record is None:
                return dg.AssetCheckResult(
                    passed=True, severity=dg.AssetCheckSeverity.WARN,
                    description=f"{to_key(hour)} is not loaded yet: nothing to compare",
                    metadata={"loaded": False})
            if record.inputs is None:
                return dg.AssetCheckResult(
                    passed=True, severity=dg.AssetCheckSeverity.WARN,
                    description="the commit record predates input tracking: cannot compare",
                    metadata={"loaded": True})
            change = landing.input_change(ds, hour, record)
            if change is None:
                return dg.AssetCheckResult(
                    passed=True, severity=dg.AssetCheckSeverity.WARN,
                    description="the landing files are the ones the load read",
                    metadata={"loaded": True, "files": len(record.inputs)})
            ev = late_input_evaluation(ds, change)
            return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                       description=ev.description,
                                       metadata={"loaded": True, **_change_metadata(ds, change)})

    return input_unchanged_since_load
