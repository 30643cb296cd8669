"""Per dataset: the raw batch (an external asset over the landing files) and one PySpark multi-asset
that materializes unique, duplicates, expired, rejected and the key index together (SPEC D1, D5, D6).

Why one multi-asset: the four outputs and the index are one atomic decision per hour; splitting
them would parse and classify the batch several times. Why the raw batch is external (observed,
not copied): a typed Parquet copy would double the I/O of every load for nothing the outputs do not
already keep (every output row carries its typed columns and `_source_file`, rejected rows their
`_raw` text); the load logs an observation of it per hour (files, rows).

The index depends on its own previous partition, so Dagster shows that hour H needs H-1; a backfill
of a range runs as a single run (BackfillPolicy.single_run) whose hours are loaded in ascending
order in one Spark session (R11). Per-hour figures are logged as AssetObservations per partition,
because one MaterializeResult of a ranged run stamps the same metadata on every partition.
"""



import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.defs import checks
from dedup_pipeline.defs.partitions import hourly_partitions
from dedup_pipeline.defs.resources import SparkResource
from dedup_pipeline.engine.checks import LoadCheckError
from dedup_pipeline.engine.classify import OUTPUTS
from dedup_pipeline.engine.load import LoadResult, output_columns, run_load
from dedup_pipeline.engine.session import connect_errors
from dedup_pipeline.engine.storage import Lock, Storage

PROGRESS_LOGGER = logging.getLogger("dedup_pipeline.progress")
INDEX = "index"
RAW = "raw_batch"

DESCRIPTIONS = {
    RAW: "Landing files of the hour ({path}/date=YYYY-MM-DD/hour=HH/), read in place.",
    "unique": "The clean table: the first record of every key (R3, R4). "
              "Parquet at {output}/unique/load_hour=YYYY-MM-DD-HH/.",
    "duplicates": "Records whose key was already kept (this hour or an earlier one), with "
                  "_duplicate_kind (natural|conflict) and _first_load_hour.",
    "expired": "Records older than the expiry point of their load (R6), with _expiry_point.",
    "rejected": "Records that could not be parsed or typed, with _reject_reason and _raw (R9).",
    INDEX: "The persisted key index (128-bit digests) that lets each load skip the clean table; "
           "it depends on its own previous hour.",
}


def _column_schema(ds: DatasetConfig, output: str) -> dg.TableSchema:
    extra_types = {"_source_file": "string", "_duplicate_kind": "string",
                   "_first_load_hour": "string", "_reject_reason": "string", "_raw": "string"}
    if ds.expiry is not None:
        et = ds.expiry_type
        extra_types["_expiry_point"] = "string" if et == "category" else str(et)
    cols = [dg.TableColumn(c, ds.source.schema.get(c) or extra_types.get(c, "string"))
            for c in output_columns(ds, output)]
    return dg.TableSchema(columns=cols)


def hour_metadata(r: LoadResult) -> dict[str, Any]:
    """Numeric figures of one hour, so the UI plots them across partitions (D5)."""
    md: dict[str, Any] = {
        "rows_in": r.rows_in,
        "unique": r.unique,
        "duplicates": r.duplicates,
        "expired": r.expired,
        "rejected": r.rejected,
        "conflicts": r.conflicts,
        "duplicate_rate": round(r.duplicate_rate, 6),
        "index_keys_written": r.index_rows_written,
        "index_rows_read": r.index_rows_read,
        "index_bytes_read": r.index_bytes_read,
        "files_in": r.files_in,
        "files_written": r.files_written,
    }
    if r.latest_point is not None:
        md["latest_point"] = r.latest_point
    if r.expiry_point is not None:
        md["expiry_point"] = r.expiry_point
    for stage, secs in r.seconds.items():
        md[f"seconds_{stage}"] = secs
    return md


def _row_count(r: LoadResult, name: str) -> int:
    return r.index_rows_written if name == INDEX else int(getattr(r, name))


@dataclass(frozen=True)
class DatasetDefs:
    raw: dg.AssetSpec
    load: dg.AssetsDefinition
    job: Any  # the unresolved asset job of define_asset_job


def build_dataset_defs(ds: DatasetConfig) -> DatasetDefs:
    pdef = hourly_partitions(ds)
    raw_key = dg.AssetKey([ds.name, RAW])
    index_key = dg.AssetKey([ds.name, INDEX])
    raw = dg.AssetSpec(
        raw_key,
        description=DESCRIPTIONS[RAW].format(path=ds.source.path),
        partitions_def=pdef,
        group_name=ds.name,
        kinds={ds.source.format},
        metadata={"path": ds.source.path, "format": ds.source.format},
    )
    specs = [
        dg.AssetSpec(
            dg.AssetKey([ds.name, name]),
            deps=[raw_key],
            description=DESCRIPTIONS[name].format(output=ds.output),
            partitions_def=pdef,
            group_name=ds.name,
            kinds={"spark", "parquet"},
            metadata={"dagster/column_schema": _column_schema(ds, name),
                      "path": f"{ds.output}/{name}"},
        )
        for name in OUTPUTS
    ]
    specs.append(
        dg.AssetSpec(
            index_key,
            deps=[raw_key, dg.AssetDep(index_key, partition_mapping=dg.TimeWindowPartitionMapping(
                start_offset=-1, end_offset=-1))],
            description=DESCRIPTIONS[INDEX],
            partitions_def=pdef,
            group_name=ds.name,
            kinds={"spark", "parquet"},
            metadata={"path": f"{ds.output}/index"},
        )
    )
    keys = [s.key for s in specs]

    @dg.multi_asset(
        name=f"{ds.name}_load",
        specs=specs,
        check_specs=checks.check_specs(ds, pdef),
        partitions_def=pdef,
        backfill_policy=dg.BackfillPolicy.single_run(),
        pool=f"dedup_{ds.name}",
        op_tags={"dedup_pipeline/dataset": ds.name},
    )
    def load(
        context: dg.AssetExecutionContext, spark: SparkResource
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        partition_keys = list(context.partition_keys)
        ranged = len(partition_keys) > 1
        evaluations: list[tuple[str, list[checks.Evaluation]]] = []

        def progress(msg: str) -> None:
            context.log.info(msg)
            PROGRESS_LOGGER.info(msg)

        session = spark.get_session()
        results: list[LoadResult] = []
        with Lock(Storage(ds.output), owner=f"dagster run {context.run.run_id}"), \
                connect_errors(spark.remote_url()):
            for pk in partition_keys:
                try:
                    r = run_load(session, ds, pk, progress)
                except LoadCheckError as err:  # blocking check failed: nothing was committed
                    # Recorded on the instance directly: events logged through the context are
                    # buffered and dropped when the step raises.
                    context.instance.report_runless_asset_event(checks.as_event(
                        ds, checks.Evaluation(err.check, False, {"error": str(err), **err.figures}),
                        pk))
                    raise
                results.append(r)
                evals = checks.evaluate(ds, r)
                evaluations.append((pk, evals))
                if ranged:
                    for e in evals:
                        context.log_event(checks.as_event(ds, e, pk))
                md = hour_metadata(r)
                context.log_event(dg.AssetObservation(
                    asset_key=raw_key, partition=pk,
                    metadata={"rows": r.rows_in, "files": r.files_in}))
                for key in keys:
                    name = key.path[-1]
                    context.log_event(dg.AssetObservation(
                        asset_key=key, partition=pk,
                        metadata={"dagster/row_count": _row_count(r, name), **md}))
        for key in keys:
            name = key.path[-1]
            if len(results) == 1:
                md = {"dagster/row_count": _row_count(results[0], name), **hour_metadata(results[0])}
            else:  # a ranged run: these figures are totals over the range
                md = {"range_hours": len(results),
                      "range_rows": sum(_row_count(r, name) for r in results),
                      "range_rows_in": sum(r.rows_in for r in results)}
            yield dg.MaterializeResult(asset_key=key, metadata=md)
        if ranged:
            yield from checks.summarize(ds, evaluations)
        else:
            yield from (checks.as_result(ds, e) for e in evaluations[0][1])

    job = dg.define_asset_job(
        name=f"{ds.name}_hourly_load",
        selection=dg.AssetSelection.assets(*keys),
        description=f"Load hours of dataset {ds.name!r}: unique, duplicates, expired, rejected "
                    "and the key index. A range runs as one run, hours in ascending order.",
        tags={"dedup_pipeline/dataset": ds.name},
    )
    return DatasetDefs(raw, load, job)
