"""Every name the Dagster layer gives out: asset keys and groups, jobs, ops, sensors, schedules,
concurrency pools and run tags.

Why one module: these strings are an interface. The UI shows them, deploy/dagster.yaml's
concurrency limit matches on the pools, the sensors read the tags back from runs (`orchestration/runs.py`),
and the CLI addresses the rebuild op by name in its run config; a name spelled twice drifts. Every
per-dataset name starts with the dataset's name. The asset checks' names live with their
definitions (`orchestration/checks.py`, `orchestration/landing_checks.py`): the engine raises three of them.
"""

from __future__ import annotations

from collections.abc import Callable

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.outputs import OUTPUTS

# --- assets: AssetKey([*asset_key_prefix, dataset, name]), one group per dataset
RAW = "raw_batch"  # the landing files of an hour (an external asset, observed)
INDEX = "index"
WRITTEN = (*OUTPUTS, INDEX)  # the assets a load or an index rebuild writes


def asset_key(ds: DatasetConfig, name: str) -> dg.AssetKey:
    """The key of a dataset's asset: its `asset_key_prefix` (none by default), its name, `name`."""
    return dg.AssetKey([*ds.asset_key_prefix, ds.name, name])


def dataset_of_key(key: dg.AssetKey, names: tuple[str, ...] = ()) -> str | None:
    """The dataset whose asset `key` is (the part before the asset's own name), None if `key` is
    no dataset's; `names`: the asset names that count (default: any)."""
    if len(key.path) < 2 or (names and key.path[-1] not in names):
        return None
    return key.path[-2]


def sensor_status(running: bool) -> dg.DefaultSensorStatus:
    """A dataset's sensors start running unless its component says `sensors: stopped`."""
    return dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED


def group_name(dataset: str) -> str:
    """One asset group per dataset, named like it."""
    return dataset


# --- the Spark resource every step that needs Spark takes: one per code location, under a key of
# its own so that a team's `spark` resource in the same location never collides with it
SPARK_RESOURCE = "dedup_spark"


# --- per-dataset names of jobs, ops, sensors, schedules and pools: name(dataset) -> str
PerDataset = Callable[[str], str]
LOAD_JOB_SUFFIX = "_hourly_load"
REBUILD_JOB_SUFFIX = "_index_rebuild"
EXPLAIN_JOB_SUFFIX = "_explain"  # `orchestration/explain.py`: where did key K go, and why

load_job_name: PerDataset = ("{}" + LOAD_JOB_SUFFIX).format
rebuild_job_name: PerDataset = ("{}" + REBUILD_JOB_SUFFIX).format
load_op_name: PerDataset = "{}_load".format  # the multi-asset: the load's step in the UI
rebuild_op_name: PerDataset = "{}_rebuild_index".format  # run config addresses its hours under it
# the late-input check's own job (no Spark): the landing sensor records evaluations through it
input_check_job_name: PerDataset = "{}_input_check".format
landing_sensor_name: PerDataset = "{}_landing_sensor".format
recovery_sensor_name: PerDataset = "{}_index_recovery_sensor".format
hourly_schedule_name: PerDataset = "{}_hourly_schedule".format
reconcile_schedule_name: PerDataset = "{}_reconcile_schedule".format
# the output Delta tables' upkeep (orchestration/upkeep.py): vacuum with retention, checkpoint, log clean-up
upkeep_job_name: PerDataset = "{}_table_upkeep".format
upkeep_op_name: PerDataset = "{}_vacuum_tables".format
upkeep_schedule_name: PerDataset = "{}_table_upkeep_schedule".format
# The pool of every step that writes the dataset (load, index rebuild, migration): with a limit of 1
# (deploy/dagster.yaml) runs of one dataset queue instead of failing on its lock.
pool_name: PerDataset = "dedup_{}".format
# on the dataset's runs that end without success (orchestration/recovery.py): per dataset, so datasets
# added as components to one code location never share a name and other jobs' runs are left alone
run_end_sensor_name: PerDataset = "{}_run_end".format


# --- run tags: ours, and Dagster's own that we read or set
DATASET_TAG = "dedup_pipeline/dataset"  # the dataset a run writes (`runs.dataset_of_run`)
TRIGGER_TAG = "dedup_pipeline/trigger"  # the sensor or schedule that requested the run
REASON_TAG = "dedup_pipeline/reason"  # why the recovery sensor requested a rebuild
LATE_HOURS_TAG = "dedup_pipeline/late_hours"  # the changed hours a reconcile run reloads
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
PARTITION = "dagster/partition"


def range_tags(first: str, last: str, trigger: str | None = None) -> dict[str, str]:
    """Tags of a ranged run of the load job, as a single-run backfill of the range sets them."""
    tags = {RANGE_START: first, RANGE_END: last}
    if trigger is not None:
        tags[TRIGGER_TAG] = trigger
    return tags
