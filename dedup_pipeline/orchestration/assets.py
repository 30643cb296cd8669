"""Per dataset: the raw batch (an external asset over the landing files) and one PySpark multi-asset
that materializes unique, duplicates, expired, rejected and the key index together (design.md D1, D5, D6).

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



import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import columns, landing, outputs
from dedup_pipeline.engine.core.checks import LoadCheckError
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord, LaterHoursLoadedError, LoadOrderError
from dedup_pipeline.engine.core.index.store import entry_schema
from dedup_pipeline.engine.core.outputs import OUTPUTS
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.hours import format_hour, parse_hour, tag_hour
from dedup_pipeline.orchestration import checks, hour_events, names, runs
from dedup_pipeline.orchestration.names import INDEX, RAW
from dedup_pipeline.orchestration.partitions import hourly_partitions
from dedup_pipeline.orchestration.resources import SparkResource

DESCRIPTIONS = {
    RAW: "The hour's landing files ({path}/date=YYYY-MM-DD/hour=HH/), read where they are, not "
         "copied. Each load records how many files and rows it read here.",
    "unique": "The clean table: for each key, the first record ever seen, once. Later records "
              "with a key already kept go to duplicates. {table} at {output}/unique, one "
              "load_hour=YYYY-MM-DD-HH partition per loaded hour. (Rules R3, R4 in "
              "docs/design.md.)",
    "duplicates": "Records whose key was already kept, in this hour or an earlier one: resends "
                  "(natural) and records that differ from the kept one (conflict), each naming "
                  "the hour that holds the kept record. (Rules R4, R5 in docs/design.md.)",
    "expired": "Records too old to deduplicate: behind the load's expiry point, so they were "
               "not compared with the index. (Rule R6 in docs/design.md.)",
    "rejected": "Records that could not be read, parsed or typed, with the reason and the "
                "original text, so nothing is lost. (Rule R9 in docs/design.md.)",
    INDEX: "The key index: one short digest per kept key, so each load finds earlier keys "
           "without reading the clean table. Each hour's entries depend on the previous hour's. "
           "(Rules R4, R7, R12 in docs/design.md.)",
}

# what the product's own columns mean (source columns are described from the config)
PRODUCT_COLUMNS = {
    columns.SOURCE_FILE: "The landing file the record was read from (full path).",
    columns.KIND: "natural: the same record sent again (same fingerprint as the kept one); "
                  "conflict: same key, different content (rule R5).",
    columns.FIRST: "The load hour (YYYY-MM-DD-HH) whose unique output holds the kept record with "
                   "this key.",
    columns.EXPIRY_POINT: "The expiry point of the load that read the record: records whose "
                          "expiry column is older than this are expired (rule R6).",
    columns.REASON: "Why the record was rejected: unreadable_file, bad_encoding, malformed, "
            "bad_value:COLUMN (a value of that column that does not parse as its type), "
            "null_key, unknown_category or bad_expiry_value.",
    columns.RAW: "The record's original text (a JSONL line, a CSV record, a Parquet row as JSON; "
                 "base64 of the bytes for bad_encoding), so it can be fixed and replayed.",
}
INDEX_COLUMNS = {
    columns.H1: "First half of the key's 128-bit digest.",
    columns.H2: "Second half of the key's 128-bit digest.",
    columns.ENTRY_LOAD_HOUR: "The load hour that kept the key (its unique row is in that hour's partition).",
    columns.V: "The kept record's expiry value, as a number (epoch microseconds, days or the value), "
       "for expiry.",
    columns.FP: "A 32-bit hash of the fingerprint columns of the kept record: tells a resend from a "
        "conflict.",
}


def _source_column(ds: DatasetConfig, col: str, typ: str) -> str:
    roles = [r for r, on in (("part of the key", col in ds.key),
                             ("a fingerprint column", col in (ds.fingerprint or ())),
                             ("the expiry column", ds.expiry is not None and col == ds.expiry.column))
             if on]
    return f"From the landing files, declared type {typ}" + (f"; {', '.join(roles)}." if roles
                                                              else ".")


def _column_schema(ds: DatasetConfig, output: str) -> dg.TableSchema:
    """The output contract (`engine.outputs`) as Dagster shows it, every column described
    (design.md D4b)."""
    return dg.TableSchema(columns=[
        dg.TableColumn(c, t, description=PRODUCT_COLUMNS.get(c) or _source_column(ds, c, t))
        for c, t in outputs.columns(ds, output)])


def _index_schema(ds: DatasetConfig) -> dg.TableSchema:
    return dg.TableSchema(columns=[
        dg.TableColumn(f.name, f.dataType.simpleString(), description=INDEX_COLUMNS.get(f.name)
                       or _source_column(ds, f.name, ds.source.schema.get(f.name, "string")))
        for f in entry_schema(ds).fields])


def _kind(ds: DatasetConfig) -> str:
    """The storage kind tag the UI shows: delta for Delta tables, parquet for plain directories."""
    return "delta" if ds.output_format == "delta" else "parquet"


def _table_kind(ds: DatasetConfig) -> str:
    return "A Delta table" if ds.output_format == "delta" else "Parquet directories"


def rerun_range(ds: DatasetConfig, partition_keys: list[str], err: BaseException
                ) -> tuple[str, str]:
    """The hours to load again after `err`, first <= last, as the CLI's --from/--to take them.

    A rerun refused because later hours are loaded (`LaterHoursLoadedError`): from the run's first
    hour through the latest loaded one. Any other order error (an earlier hour is missing): from
    the first hour not loaded through the run's last. Anything else: the run's own hours."""
    keys = sorted(partition_keys, key=parse_hour)
    first, last = keys[0], keys[-1]
    with contextlib.suppress(Exception):  # the fix's hours are a courtesy: never fail the failure
        committed = CommitLog(Storage(ds.output)).committed()
        if isinstance(err, LaterHoursLoadedError):
            newest = committed.max()
            latest = tag_hour(newest) if newest is not None else None
            if latest is not None and latest > parse_hour(last):
                last = format_hour(latest)
        elif isinstance(err, LoadOrderError):
            gap = landing.first_unloaded(ds, committed)
            if gap < parse_hour(first):
                first = format_hour(gap)
    return first, last


def _load_failure(ds: DatasetConfig, partition_keys: list[str], err: BaseException) -> dg.Failure:
    """The step's failure with the cause and the fix in front (the UI shows a Failure's
    description at the top of the step's error; the original traceback stays, as its cause;
    design.md D4b)."""
    keys = sorted(partition_keys, key=parse_hour)
    rerun_first, rerun_last = rerun_range(ds, keys, err)
    return dg.Failure(
        description=runs.with_config(ds, runs.load_failure(
            ds.name, keys[0], keys[-1], err, rerun_first, runs.config_path(ds), rerun_last)),
        metadata={"error": f"{type(err).__name__}: "
                           f"{(str(err).strip().splitlines() or [''])[0][:500]}"})


@dataclass(frozen=True)
class DatasetDefs:
    raw: dg.AssetSpec
    load: dg.AssetsDefinition
    job: Any  # the unresolved asset job of define_asset_job


def build_dataset_defs(ds: DatasetConfig, group: str | None = None) -> DatasetDefs:
    """The dataset's assets and load job; `group`: their asset group (default: the dataset's
    name, `names.group_name`)."""
    group = group or names.group_name(ds.name)
    pdef = hourly_partitions(ds)
    raw_key = names.asset_key(ds, RAW)
    index_key = names.asset_key(ds, INDEX)
    raw = dg.AssetSpec(
        raw_key,
        description=DESCRIPTIONS[RAW].format(path=ds.source.path),
        partitions_def=pdef,
        group_name=group,
        kinds={ds.source.format},
        metadata={"path": ds.source.path, "format": ds.source.format},
    )
    specs = [
        dg.AssetSpec(
            names.asset_key(ds, name),
            deps=[raw_key],
            description=DESCRIPTIONS[name].format(output=ds.output, table=_table_kind(ds)),
            partitions_def=pdef,
            group_name=group,
            kinds={"spark", _kind(ds)},
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
            group_name=group,
            kinds={"spark", _kind(ds)},
            metadata={"dagster/column_schema": _index_schema(ds), "path": f"{ds.output}/index"},
        )
    )
    keys = [s.key for s in specs]

    @dg.multi_asset(
        name=names.load_op_name(ds.name),
        specs=specs,
        check_specs=checks.check_specs(ds, pdef),
        partitions_def=pdef,
        backfill_policy=dg.BackfillPolicy.single_run(),
        pool=names.pool_name(ds.name),
        op_tags={names.DATASET_TAG: ds.name},
    )
    def load(context: dg.AssetExecutionContext, dedup_spark: SparkResource) -> Iterator[Any]:
        if not (context.has_partition_key or context.has_partition_key_range):
            raise dg.Failure(description=runs.no_partition_load(ds.name, runs.config_path(ds)))
        partition_keys = list(context.partition_keys)
        if (note := runs.temporary_instance_note(context.instance, ds)) is not None:
            context.log.warning(note)

        progress = runs.progress(context)
        results: list[CommitRecord] = []
        session = None
        try:
            session = dedup_spark.get_session((ds.output, ds.source.path))
            load_hours(session, ds, partition_keys, progress, f"dagster run {context.run.run_id}",
                       remote=dedup_spark.remote_url(), on_hour=results.append)
        except (Exception, KeyboardInterrupt, dg.DagsterExecutionInterruptedError) as err:
            # Committed hours get their own events; the failing hour its failed check; every other
            # hour of the run that an earlier load committed gets that load's materializations and
            # checks again (restated), so a refused or failed run never turns a committed hour
            # "Failed" (hour_events.restate says why Dagster would).
            for r in results:
                yield from hour_events.of_hour(context, ds, keys, raw_key, r, session)
            loaded = {parse_hour(r.partition_key) for r in results}
            rest = [pk for pk in sorted(partition_keys, key=parse_hour) if parse_hour(pk) not in loaded]
            if isinstance(err, LoadCheckError) and not hour_events.committed(ds, rest[0]):
                # load_hours stopped at the first hour not loaded; a rerun's old load stays
                yield hour_events.failed_check(context, ds, rest.pop(0), err)
            for pk in rest:
                yield from hour_events.restate(context, ds, keys, pk)
            if not isinstance(err, Exception):  # interrupted (a cancelled run): as it came
                raise
            raise _load_failure(ds, partition_keys, err) from err
        if len(results) == 1 and context.has_partition_key:
            # one partition (not a one-hour range, whose check results Dagster would record
            # with no partition): Dagster's own output events carry the hour's figures
            r = results[0]
            yield dg.AssetObservation(asset_key=raw_key, partition=r.partition_key,
                                      metadata={"rows": r.rows_in, "files": r.files_in})
            for key in keys:
                yield dg.MaterializeResult(
                    asset_key=key, metadata=hour_events.output_metadata(ds, r, key.path[-1]))
            yield from (checks.as_result(ds, e) for e in hour_events.evaluate(ds, r, session))
        else:
            # A ranged step's output stamps the same metadata on every partition of the range, so
            # it carries none; each hour's own materialization follows it and is the latest.
            # The summary check results (no partition) come right after the outputs: yielded after
            # the per-hour materializations, Dagster compared their target's data version with the
            # hour's (untagged) materialization and logged "Data version mismatch" per asset.
            for key in keys:
                yield dg.MaterializeResult(asset_key=key)
            yield from checks.summarize(ds, [(r.partition_key, checks.evaluate(ds, r))
                                             for r in results])
            for r in results:
                yield from hour_events.of_hour(context, ds, keys, raw_key, r, session)
        if len(results) > 1:  # range totals go to the run's log, never onto a partition
            context.log.info(
                f"{ds.name}: loaded {len(results)} hours {results[0].partition_key} .. "
                f"{results[-1].partition_key}: rows in {sum(r.rows_in for r in results)}, unique "
                f"{sum(r.unique for r in results)}, duplicates {sum(r.duplicates for r in results)}, "
                f"expired {sum(r.expired for r in results)}, rejected "
                f"{sum(r.rejected for r in results)}")

    job = dg.define_asset_job(
        name=names.load_job_name(ds.name),
        selection=dg.AssetSelection.assets(*keys),
        description=f"Load hours of dataset {ds.name!r}: unique, duplicates, expired, rejected "
                    "and the key index. A range runs as one run, hours in ascending order.",
        tags={names.DATASET_TAG: ds.name},
    )
    return DatasetDefs(raw, load, job)
