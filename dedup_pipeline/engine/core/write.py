"""Write (design.md L1-L3, D4): the hour's outputs and its index entries from the cached
classification, the blocking checks on what was written, what the commit record lists of it,
and how an uncommitted attempt's files are removed (Apex Malhar's BucketStore side)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import checks, hooks
from dedup_pipeline.engine.core.batch import Batch
from dedup_pipeline.engine.core.commits import IndexFileEntry, OutputFileEntry
from dedup_pipeline.engine.core.decide import Classified
from dedup_pipeline.engine.core.index import layout, store
from dedup_pipeline.engine.core.index.health import index_file_manifest
from dedup_pipeline.engine.core.outputs import (
    DUPLICATES,
    OUT,
    OUTPUTS,
    UNIQUE,
    partition,
    select_output,
    write_options,
)
from dedup_pipeline.engine.core.storage import ROWS_PER_FILE, TMP, Storage, place_files


class Hour(Protocol):
    """The hour being written: where, which, from what batch."""

    st: Storage
    tag: str
    batch: Batch

    @property
    def key(self) -> str: ...


@dataclass(frozen=True)
class Written:
    """Each output partition swapped in, and the index entries staged (not yet in place)."""

    out_files: dict[str, list[str]]  # per output: the Parquet files its partition holds
    staged: str


@dataclass(frozen=True)
class Verified:
    """The written files pass the blocking checks; the index entries are in place."""

    figures: checks.WrittenFigures
    slices: list[int]


def beside_tables(ds: DatasetConfig) -> bool:
    """Outputs that are Delta tables: a load's files are moved in beside the files a table
    version may still list (its commit swaps them), not swapped in as a partition directory."""
    return ds.output_format == "delta"


def forget_outputs(st: Storage, tag: str, files: dict[str, list[str]] | None = None) -> None:
    """Remove everything an uncommitted attempt of `tag` wrote (after a failed check): its
    partitions, or with Delta tables only its own `files` (earlier versions' stay published)."""
    for name in OUTPUTS:
        if files is None:
            st.remove(st.path(*partition(name, tag)))
        else:
            for f in files.get(name, []):
                st.remove(f)
            part = st.path(*partition(name, tag))
            if not st.list_names(part):  # no earlier version's files: no partition either
                st.remove(part)
    store.clear_load(st, tag)


def write(ds: DatasetConfig, p: Hour, c: Classified) -> Written:
    """The outputs and the staged index entries, written concurrently from the cached
    classification (on small batches a load is mostly per-job latency). Each output partition is
    then swapped in atomically."""
    st, tag = p.st, p.tag
    run_tmp = st.path(TMP, f"{tag}-{uuid.uuid4().hex[:12]}")
    n_files = max(1, math.ceil(p.batch.rows_in / ROWS_PER_FILE))
    out_files: dict[str, list[str]] = {}

    delta = beside_tables(ds)

    def write_output(name: str) -> str:
        tmp = f"{run_tmp}/{name}"
        out_df = hooks.frame(select_output(c.frame, ds, name), name,
                             select_output(c.frame, ds, DUPLICATES) if name == UNIQUE else None)
        (out_df.coalesce(n_files).write.mode("overwrite")
         .option("maxRecordsPerFile", ROWS_PER_FILE)
         .options(**write_options(ds, name, p.batch.rows_in))
         .parquet(st.to_uri(tmp)))
        return tmp

    entries = hooks.frame(c.frame.filter(F.col(OUT) == UNIQUE), "index")
    with ThreadPoolExecutor(max_workers=len(OUTPUTS) + 1) as pool:
        written = {name: pool.submit(write_output, name) for name in OUTPUTS}
        staging = pool.submit(store.stage_entries, ds, st, entries, tag, n_files)
        for name in OUTPUTS:
            target = st.path(*partition(name, tag))
            if delta:  # beside the files a table may still list: its commit swaps them
                out_files[name] = place_files(st, written[name].result(), target)
            else:
                st.replace_dir(written[name].result(), target)
                out_files[name] = st.list_files(target, ".parquet")
            hooks.at(f"after_output:{name}")
        staged = staging.result()
    st.remove(run_tmp)
    hooks.at("after_outputs")
    return Written(out_files, staged)


def verify_written(spark: SparkSession, ds: DatasetConfig, p: Hour, c: Classified, w: Written,
                   lap: Callable[[str], None]) -> Verified:
    """The blocking checks on what was written (read back, not trusted from the counts); the
    staged index entries move in place once conservation holds (timed as `write_index`). On a
    failed check everything this attempt wrote is removed: nothing is committed."""
    st, tag = p.st, p.tag
    label = f"dataset {ds.name!r} hour {p.key}"
    files = w.out_files if beside_tables(ds) else None  # beside older versions' files
    try:
        figures = checks.check_conservation(st, tag, p.batch.rows_in, label, files)
        hooks.at("after_index_staged")
        slices = store.publish_entries(st, w.staged, tag)
        lap("write_index")
        checks.check_unique_and_index(spark, ds, st, tag, figures, c.candidates, label,
                                      files[UNIQUE] if files is not None else None)
    except checks.LoadCheckError:
        forget_outputs(st, tag, files)
        raise
    return Verified(figures, slices)


@dataclass(frozen=True)
class Listed:
    """What the commit record lists of the written files."""

    output_files: dict[str, tuple[OutputFileEntry, ...]]
    index_files: tuple[IndexFileEntry, ...]
    index_format: int
    files_written: int


def on_disk(ds: DatasetConfig, st: Storage, tag: str, w: Written, v: Verified) -> Listed:
    """Sync what the record will vouch for (local file systems), and list it for the record."""
    for name in OUTPUTS:
        if beside_tables(ds):
            for f in w.out_files[name]:
                st.sync_tree(f)
        else:
            st.sync_tree(st.path(*partition(name, tag)))
    for n in v.slices:
        st.sync_tree(st.path(layout.INDEX, layout.load_rel(n, tag)))
    return Listed(
        output_files={name: tuple(OutputFileEntry(name=f.rsplit("/", 1)[1],
                                                  size=int(st.fs.info(f)["size"]))
                                  for f in files) for name, files in w.out_files.items()},
        index_files=tuple(index_file_manifest(st, tag, v.slices)),
        index_format=layout.INDEX_FORMAT,
        files_written=sum(len(f) for f in w.out_files.values()) + len(v.slices),
    )
