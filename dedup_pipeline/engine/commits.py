"""Commit records: the dataset's own memory of which hours are loaded (SPEC R10, R11).

A load of hour H is committed iff ``{output}/_commits/load_hour=H.json`` exists. It is written
last (atomically), after the outputs and the index, and removed first when H is loaded again, so a
crash at any point leaves H either fully committed or visibly not loaded. The load order rule reads
these records, never the Dagster instance, so it holds whichever instance runs the load.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import HOUR, compress_ranges, key_of, parse_key, to_key, to_tag

COMMITS = "_commits"
PREFIX = "load_hour="


class CommitRecordError(RuntimeError):
    """A commit record that does not parse or lacks required fields: damage of that hour."""

    def __init__(self, path: str, tag: str, problem: str):
        self.path, self.tag, self.problem = path, tag, problem
        super().__init__(
            f"commit record {path} of hour {key_of(tag)} is damaged ({problem}); the hour's state "
            f"cannot be trusted. Rerun that hour (dedup-pipeline run --from {key_of(tag)} --to "
            f"{key_of(tag)}): it deletes the record and loads the hour afresh, with the same result"
        )


# Fields every commit record has had since the first release, with their JSON types.
_COUNTS = ("rows_in", "unique", "duplicates", "expired", "rejected")
_FILE_FIELDS: dict[str, tuple[type, ...]] = {"slice": (int,), "name": (str,), "size": (int,)}
_OPTIONAL_FILE_FIELDS: dict[str, tuple[type, ...]] = {"rows": (int, type(None)),
                                                       "sha256": (str,)}


def validate_record(rec: Any, tag: str) -> str | None:
    """What is wrong with a parsed commit record of load `tag`, or None if it is well formed."""
    if not isinstance(rec, dict):
        return f"not a JSON object but {type(rec).__name__}"
    if rec.get("load_hour") != tag:
        return f"load_hour is {rec.get('load_hour')!r}, expected {tag!r}"
    for k in _COUNTS:
        v = rec.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return f"field {k!r} is {v!r}, expected a count"
    for k in ("latest_point", "expiry_point"):  # numbers (expiry values), or null
        v = rec.get(k)
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)
                              or not math.isfinite(v)):
            return f"field {k!r} is {v!r}, expected a number or null"
    files = rec.get("index_files", [])
    if not isinstance(files, list):
        return "field 'index_files' is not a list"
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            return f"index_files[{i}] is not an object"
        for k, types in _FILE_FIELDS.items():
            if not isinstance(f.get(k), types) or isinstance(f.get(k), bool):
                return f"index_files[{i}].{k} is {f.get(k)!r}"
        for k, types in _OPTIONAL_FILE_FIELDS.items():
            if k in f and not isinstance(f[k], types):
                return f"index_files[{i}].{k} is {f[k]!r}"
    outs = rec.get("output_files", {})
    if not isinstance(outs, dict) or not all(
            isinstance(v, list) and all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                        for x in v) for v in outs.values()):
        return "field 'output_files' is malformed"
    return None


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
            tag = base[len(PREFIX):-len(".json")]
            if is_tag(tag):
                out.add(tag)
    return out


def is_tag(tag: str) -> bool:
    """Whether `tag` is an hour as load_hour values spell it (2026-11-01-05)."""
    try:
        return to_tag(parse_key(tag)) == tag
    except ValueError:
        return False


def read_commit(st: Storage, tag: str) -> dict[str, Any] | None:
    """The commit record of load `tag`, validated; None if the hour is not committed.

    Raises `CommitRecordError` (naming the file, the hour and the fix) for a record that does not
    parse or lacks a required field, instead of handing a half record to the caller.
    """
    path = commit_path(st, tag)
    try:
        text = st.read_text(path)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CommitRecordError(path, tag, f"unreadable: {e}") from e
    try:
        rec = json.loads(text)
    except ValueError as e:
        raise CommitRecordError(path, tag, f"not valid JSON: {e}") from e
    problem = validate_record(rec, tag)
    if problem:
        raise CommitRecordError(path, tag, problem)
    return rec


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
