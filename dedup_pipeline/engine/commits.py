"""Commit records: the dataset's own memory of which hours are loaded (SPEC R10, R11).

A load of hour H is committed iff ``{output}/_commits/load_hour=H.json`` exists. It is written
last (atomically), after the outputs and the index, and removed first when H is loaded again, so a
crash at any point leaves H either fully committed or visibly not loaded. The load order rule reads
these records, never the Dagster instance, so it holds whichever instance runs the load.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import HOUR, compress_ranges, parse_key, to_key, to_tag

COMMITS = "_commits"
PREFIX = "load_hour="


class LoadOrderError(RuntimeError):
    """Load H was asked for before every earlier hour since `start` was loaded (R11)."""


def commit_path(st: Storage, tag: str) -> str:
    return st.path(COMMITS, f"{PREFIX}{tag}.json")


def committed_tags(st: Storage) -> set[str]:
    try:
        names = st.fs.ls(st.path(COMMITS), detail=False)
    except FileNotFoundError:
        return set()
    out = set()
    for n in names:
        base = n.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(PREFIX) and base.endswith(".json"):
            out.add(base[len(PREFIX):-len(".json")])
    return out


def read_commit(st: Storage, tag: str) -> dict[str, Any] | None:
    try:
        return st.read_json(commit_path(st, tag))
    except FileNotFoundError:
        return None


def write_commit(st: Storage, tag: str, record: dict[str, Any]) -> None:
    st.write_json_atomic(commit_path(st, tag), record)


def invalidate(st: Storage, tag: str) -> None:
    st.remove(commit_path(st, tag))


def missing_before(ds: DatasetConfig, hour: datetime, committed: set[str]) -> list[datetime]:
    """Hours from the dataset's start up to (excluding) `hour` that have no commit record."""
    cur, out = parse_key(ds.start), []
    while cur < hour:
        if to_tag(cur) not in committed:
            out.append(cur)
        cur += HOUR
    return out


def check_order(ds: DatasetConfig, hour: datetime, committed: set[str]) -> None:
    start = parse_key(ds.start)
    if hour < start:
        raise LoadOrderError(
            f"dataset {ds.name!r}: hour {to_key(hour)} is before the dataset's start {ds.start}"
        )
    missing = missing_before(ds, hour, committed)
    if missing:
        raise LoadOrderError(
            f"dataset {ds.name!r}: cannot load {to_key(hour)} before the earlier hours are loaded; "
            f"missing {len(missing)} hour(s): {compress_ranges(missing)}. Load from "
            f"{to_key(missing[0])} on (e.g. dedup-pipeline run --from {to_key(missing[0])} "
            f"--to {to_key(hour)})."
        )
