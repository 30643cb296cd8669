"""Commit records: the dataset's own memory of which hours are loaded (design.md R10, R11).

A load of hour H is committed iff ``{output}/_commits/load_hour=H.json`` exists. It is written
last (atomically), after the outputs and the index, and removed first when H is loaded again, so a
crash at any point leaves H either fully committed or visibly not loaded. The load order rule reads
these records, never the Dagster instance, so it holds whichever instance runs the load.

`CommitRecord` (a frozen pydantic model, with one entry type per file kind: `IndexFileEntry`,
`OutputFileEntry`, `InputFile`, `DigestFileEntry`) is the only way a record is written or read
(validated by the model); the product does both through `engine.commit_log.CommitLog` (`write`,
`read`), which keeps the log's summary true. A record carries ``"format": 1``
(`engine.formats`); one of another format, or without one, is refused (`RecordFormatError`).
"""

from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import formats
from dedup_pipeline.engine.core.records import Count, Number, NumberOrNull, Record, optional
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import (
    HOUR,
    HourSet,
    compress_ranges,
    format_hour,
    format_tag,
    is_tag,
    parse_hour,
    to_tag,
)

COMMITS = "_commits"
PREFIX = "load_hour="


class CommitRecordError(UserError, RuntimeError):
    """A commit record that does not parse or lacks required fields: damage of that hour."""

    stage = "reading a commit record (damaged or truncated)"
    fix = ("rerun the hour the error names (its rerun rewrites the record), or dedup-pipeline "
           "rebuild-index; then rerun {hours}")

    def __init__(self, path: str, tag: str, problem: str):
        self.path, self.tag, self.problem = path, tag, problem
        super().__init__(
            f"commit record {path} of hour {format_tag(tag)} is damaged ({problem}); the hour's state "
            f"cannot be trusted. Rerun that hour ({formats.run_command(format_tag(tag), format_tag(tag))}): "
            "it deletes the record and loads the hour afresh, with the same result"
        )


class InputFile(Record):
    """One landing file as listed (path, size, mtime) and as a commit record keeps it."""

    path: str
    size: Count
    mtime: Annotated[float, Field(allow_inf_nan=False)]
    # the SHA-256 of the content, set where a commit record's inputs are built; None while only
    # listed, and for a file that could not be read (vanished, no permission)
    sha256: str | None = optional()



class RecordFormatError(CommitRecordError):
    """A commit record of another format (or without one): written by another version."""

    stage = "reading a commit record of another format"
    fix = formats.RELOAD

    def __init__(self, found: formats.FormatProblem, tag: str):
        self.path, self.tag, self.problem = found.path, tag, found.line
        RuntimeError.__init__(self, found.line)


class OutputFileEntry(Record):
    """One Parquet file of an output partition: the files a rebuild and `verify` trust."""

    name: str
    size: Count


class IndexFileEntry(Record):
    """One index file as its load's commit record (or a compacted directory's manifest) lists
    it: what the index health check compares the disk with (`engine.index.layout.IndexFile` is
    one where it lies)."""

    slice: int
    name: str
    size: Count
    rows: Count
    sha256: str  # of the content, recorded when written


def rate(part: int, whole: int) -> float:
    """`part` / `whole`, 0 for an empty whole: every rate of a load (`CommitRecord.rates`, totals)."""
    return part / whole if whole else 0.0


class DigestFileEntry(Record):
    """One file of an hour's key digest (engine/keydigest.py): its pages carry CRCs, and the
    SHA-256 of its footer covers the row-group statistics a lookup prunes by."""

    name: str
    size: Count
    footer_sha256: str


class RecordProblem(ValueError):
    """What is wrong with a record's JSON (read_commit turns it into a `CommitRecordError`)."""


class RecordFormatProblem(RecordProblem):
    """A record of another format (read_commit turns it into a `RecordFormatError`)."""

    def __init__(self, found: formats.FormatProblem):
        self.found = found
        super().__init__(found.line)


class CommitRecord(Record):
    """Everything one load of an hour did and vouches for; also what `run_load` returns.

    The load's figures and the record are one type, so nothing a load reports can be missing from
    its record (`index_slices_deleted` and the housekeeping timings were once set after the record
    was written). Frozen: a changed record is a new one (`with_`), written again. Every field a
    load writes is required when a record is read (`from_text`); fields this package does not
    know (an operator's note) are kept on rewrite.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    format: Literal[1] = formats.FORMAT
    dataset: str
    partition_key: str
    load_hour: str
    rows_in: Count
    unique: Count
    duplicates: Count
    expired: Count
    rejected: Count
    conflicts: Count
    latest_point: NumberOrNull  # L_H, a running max (R6); None without expiry
    expiry_point: NumberOrNull  # X_H
    files_in: Count
    index_rows_written: Count
    index_rows_read: Count
    index_bytes_read: Count
    index_files_read: Count
    index_slices_written: tuple[int, ...]
    index_slices_deleted: Count
    files_written: Count
    seconds: dict[str, Number]  # per stage, and "total"
    check_figures: dict[str, Any]
    committed_at: str
    index_checksum: dict[str, Any]  # XOR of the unique rows' digests
    # the landing files read, as they were then (the landing check compares them with now):
    # path, size, mtime and the SHA-256 of the content
    inputs: tuple[InputFile, ...]
    index_files: tuple[IndexFileEntry, ...]
    index_format: Literal[1]  # the index layout (engine/core/index/layout.py INDEX_FORMAT)
    output_files: dict[str, tuple[OutputFileEntry, ...]]
    contract_version: Count  # the dataset contract version loaded under (engine/contract.py)
    # the hour's key digest files (engine/keydigest.py); None: the load wrote none
    key_digest: tuple[DigestFileEntry, ...] | None = optional()
    # the Delta idempotency token of this load's publish (engine/lake.py): microseconds since the
    # epoch at commit, so a later load of the hour has a larger one; None: loaded with
    # output_format: parquet
    publish_token: Count | None = optional()
    # the generation of the dataset lease the load held (object stores, design.md R10b)
    lock_generation: Count | None = optional()

    @field_validator("load_hour")
    @classmethod
    def _of_its_hour(cls, v: str, info: ValidationInfo) -> str:
        """Read as the record of hour `tag` (`read_commit`), it must say that hour."""
        tag = (info.context or {}).get("tag")
        if tag is not None and v != tag:
            raise PydanticCustomError("other_hour", "load_hour is {found}, expected {tag}",
                                      {"found": repr(v), "tag": repr(tag)})
        return v

    @property
    def duplicate_rate(self) -> float:
        """Duplicates among the valid rows (unique + duplicates); 0 without any."""
        return rate(self.duplicates, self.unique + self.duplicates)

    @property
    def conflict_rate(self) -> float:
        """Conflict duplicates (same key, other content) among the valid rows; 0 without any."""
        return rate(self.conflicts, self.unique + self.duplicates)

    @property
    def rejected_rate(self) -> float:
        """Rejected rows among the rows read; 0 without any."""
        return rate(self.rejected, self.rows_in)

    @property
    def rates(self) -> dict[str, float]:
        """The three rates as the hour's metadata shows them and its checks compare them (rounded to
        6 decimals), by name: duplicate_rate, conflict_rate, rejected_rate."""
        return {name: round(getattr(self, name), 6)
                for name in ("duplicate_rate", "conflict_rate", "rejected_rate")}

    def with_(self, **changes: Any) -> CommitRecord:
        return self.model_copy(update=changes)

    @classmethod
    def from_text(cls, text: str | bytes, tag: str, path: str = "") -> CommitRecord:
        """The record of load `tag` (stored at `path`) from its JSON; `RecordFormatProblem` if it
        is of another format, `RecordProblem` saying what is wrong if it is damaged."""
        other = formats.problem_in_text(path or f"the commit record of {tag}", text, formats.RELOAD)
        if other is not None:
            raise RecordFormatProblem(other)
        try:
            return cls.read_json(text, {"tag": tag})
        except ValueError as e:
            raise RecordProblem(str(e)) from None

    @classmethod
    def from_json(cls, doc: Any, tag: str) -> CommitRecord:
        """The record of load `tag` from its parsed JSON (`to_json`'s); `RecordProblem` if bad."""
        return cls.from_text(json.dumps(doc), tag)


class LoadOrderError(UserError, RuntimeError):
    """Load H was asked for before every earlier hour since `start` was loaded (R11)."""

    stage = "the order check (an earlier hour is not loaded)"
    fix = ("load the missing earlier hours first (the command is in the error), then this range; "
           "nothing was written")


def commit_path(st: Storage, tag: str) -> str:
    return st.path(COMMITS, f"{PREFIX}{tag}.json")


def committed_tags(st: Storage) -> set[str]:
    """The hours with a commit record: one listing of names (no request per record). Callers
    ask `CommitLog.committed`, which lists only when ``_commits/`` changed since its summary
    (docs/notes.md, "Bookkeeping is O(live)")."""
    out = set()
    for base in st.list_names(st.path(COMMITS)):
        if base.startswith(PREFIX) and base.endswith(".json"):
            tag = base[len(PREFIX):-len(".json")]
            if is_tag(tag):
                out.add(tag)
    return out


def read_commit(st: Storage, tag: str) -> CommitRecord | None:
    """The commit record of load `tag`, validated; None if the hour is not committed.

    Raises `CommitRecordError` (naming the file, the hour, what is wrong and the fix) for a record
    that does not parse or lacks a required field, instead of handing a half record to the caller.
    """
    path = commit_path(st, tag)
    try:
        text = st.read_text(path)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CommitRecordError(path, tag, f"unreadable: {e}") from e
    try:
        return CommitRecord.from_text(text, tag, path)
    except RecordFormatProblem as e:
        raise RecordFormatError(e.found, tag) from None
    except RecordProblem as e:
        raise CommitRecordError(path, tag, str(e)) from None


def write_commit(st: Storage, record: CommitRecord, *, if_absent: bool = False,
                 if_match: str | None = None) -> str:
    """Write (or atomically replace) the record of `record.load_hour`; its ETag. `if_absent`: a
    new record (a load's, after it forgot the hour); `if_match`: over the version this writer
    wrote (design.md L5): a record another run wrote meanwhile is never overwritten."""
    text = json.dumps(record.to_json(), indent=2, sort_keys=True)
    return st.put(commit_path(st, record.load_hour), text.encode(), if_absent=if_absent,
                  if_match=if_match)


def invalidate(st: Storage, tag: str) -> None:
    st.remove(commit_path(st, tag))


def missing_before(ds: DatasetConfig, hour: datetime,
                   committed: AbstractSet[str] | HourSet) -> list[datetime]:
    """Hours from the dataset's start up to (excluding) `hour` that have no commit record."""
    cur, out = parse_hour(ds.start), []
    first, last = to_tag(cur), to_tag(hour)
    expected = int((hour - cur) / HOUR)
    # the usual case, all there, without formatting every hour since the start (O(history))
    found = (committed.count_between(first, last) if isinstance(committed, HourSet)
             else sum(1 for t in committed if first <= t < last))
    if expected <= 0 or found == expected:
        return []
    while cur < hour:
        if to_tag(cur) not in committed:
            out.append(cur)
        cur += HOUR
    return out


def check_order(ds: DatasetConfig, hour: datetime,
                committed: AbstractSet[str] | HourSet) -> None:
    start = parse_hour(ds.start)
    if hour < start:
        raise LoadOrderError(
            f"dataset {ds.name!r}: hour {format_hour(hour)} is before the dataset's start {ds.start}"
        )
    missing = missing_before(ds, hour, committed)
    if missing:
        raise LoadOrderError(
            f"dataset {ds.name!r}: cannot load {format_hour(hour)} before the earlier hours are loaded; "
            f"missing {len(missing)} hour(s): {compress_ranges(missing)}. Load from "
            f"{format_hour(missing[0])} on (e.g. "
            f"{formats.run_command(format_hour(missing[0]), format_hour(hour), ds.name)})."
        )


class LaterHoursLoadedError(LoadOrderError):
    """Hour H was asked for while later hours are loaded and not in the same run (R10, R11)."""

    stage = "the rerun rule (hours after the first one of {hours} are loaded and not in this run)"
    fix = ("reload from the first hour through the latest loaded hour in one run: a backfill of that "
           "range (the error names it) or dedup-pipeline run --from ... --to ... (or --cascade); "
           "nothing was written")


def later_loaded(committed: HourSet, hour: datetime, run_tags: AbstractSet[str],
                 damaged: AbstractSet[str] = frozenset()) -> list[datetime]:
    """Committed hours after `hour` that this run does not load again; `damaged` records (a
    copied or truncated file, not a load) are not loads."""
    tag, latest = to_tag(hour), committed.max()
    if latest is None or latest <= tag:  # the usual case: H is the newest hour
        return []
    return [parse_hour(t) for t in committed.tags_after(tag)
            if t not in run_tags and t not in damaged]


def check_later_hours(ds: DatasetConfig, hour: datetime, committed: HourSet,
                      run_tags: AbstractSet[str],
                      damaged: AbstractSet[str] = frozenset()) -> None:
    """A (re)load of H while later hours are loaded must reload them in the same run (design.md
    R11a; R10, R11).

    Each later hour was classified against the index as H left it: a reload of H alone that
    changes H's rows (late or removed files) would leave a key unique in H and again in a later
    hour, or a later duplicate pointing at a first load H no longer holds. So the load is refused,
    naming the later hours and both fixes, before anything is written; a run over H..latest (the
    CLI's `--from H --to latest` or `--cascade`, a UI backfill of that range, the reconcile
    schedule) reloads them in order.
    """
    later = later_loaded(committed, hour, run_tags, damaged)
    if not later:
        return
    first, last = format_hour(hour), format_hour(max(later))
    raise LaterHoursLoadedError(
        f"dataset {ds.name!r}: cannot load {first} without the later hours already loaded after "
        f"it ({compress_ranges(later)}): they were classified against the keys of {first} as "
        f"loaded then, and reloading it alone would leave them stale (a key unique twice, a "
        f"duplicate pointing at a first load that is gone). Reload {first} through the latest "
        f"loaded hour in one run: {formats.run_command(first, last, ds.name)} (or add --cascade), or in "
        "the UI a backfill of "
        f"{first}...{last}. Nothing was written."
    )
