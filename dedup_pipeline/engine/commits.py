"""Commit records: the dataset's own memory of which hours are loaded (SPEC R10, R11).

A load of hour H is committed iff ``{output}/_commits/load_hour=H.json`` exists. It is written
last (atomically), after the outputs and the index, and removed first when H is loaded again, so a
crash at any point leaves H either fully committed or visibly not loaded. The load order rule reads
these records, never the Dagster instance, so it holds whichever instance runs the load.

`CommitRecord` is the only way a record is written (`write_commit`) or read (`read_commit`,
validated); the JSON keeps the field names of every earlier version, and records those versions
wrote (without hashes, row counts, inputs, output files, index format, check figures) still read.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.parse import InputFile
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import HOUR, compress_ranges, is_tag, key_of, parse_key, to_key, to_tag

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
            f"commit record {path} of hour {key_of(tag)} is damaged ({problem}); the hour's state "
            f"cannot be trusted. Rerun that hour (dedup-pipeline run --from {key_of(tag)} --to "
            f"{key_of(tag)}): it deletes the record and loads the hour afresh, with the same result"
        )


@dataclass(frozen=True)
class IndexFileEntry:
    """One index file a load published: what `check_index` compares the disk with."""

    slice: int
    name: str
    size: int
    rows: int | None = None  # None in records written before rows were recorded
    sha256: str | None = None  # None in records written before content hashes were recorded

    @classmethod
    def from_json(cls, f: dict[str, Any]) -> IndexFileEntry:
        """From a validated record's entry, or a manifest entry (`index_file_manifest`)."""
        return cls(int(f["slice"]), f["name"], int(f["size"]), f.get("rows"), f.get("sha256"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"slice": self.slice, "name": self.name, "size": self.size}
        if self.rows is not None:  # absent, as the versions before it wrote it
            out["rows"] = self.rows
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out


@dataclass(frozen=True)
class OutputFileEntry:
    """One Parquet file of an output partition: the files a rebuild and `verify` trust."""

    name: str
    size: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name} if self.size is None else {"name": self.name, "size": self.size}


def rate(part: int, whole: int) -> float:
    """`part` / `whole`, 0 for an empty whole: every rate of a load (`CommitRecord.rates`, totals)."""
    return part / whole if whole else 0.0


@dataclass(frozen=True)
class DigestFileEntry:
    """One file of an hour's key digest (engine/keydigest.py): its pages carry CRCs, and the
    SHA-256 of its footer covers the row-group statistics a lookup prunes by."""

    name: str
    size: int
    footer_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "size": self.size}
        if self.footer_sha256 is not None:
            out["footer_sha256"] = self.footer_sha256
        return out


@dataclass(frozen=True)
class CommitRecord:
    """Everything one load of an hour did and vouches for; also what `run_load` returns.

    The load's figures and the record are one type, so nothing a load reports can be missing from
    its record (`index_slices_deleted` and the housekeeping timings were once set after the record
    was written). Frozen: a changed record is a new one (`with_`), written again.
    """

    dataset: str
    partition_key: str
    load_hour: str
    rows_in: int
    unique: int
    duplicates: int
    expired: int
    rejected: int
    conflicts: int = 0
    latest_point: float | None = None  # L_H, a running max (R6); None without expiry
    expiry_point: float | None = None  # X_H
    files_in: int = 0
    index_rows_written: int = 0
    index_rows_read: int = 0
    index_bytes_read: int = 0
    index_files_read: int = 0
    index_slices_written: tuple[int, ...] = ()
    index_slices_deleted: int = 0
    files_written: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # per stage, and "total"
    check_figures: dict[str, Any] = field(default_factory=dict)
    committed_at: str | None = None
    index_checksum: dict[str, Any] | None = None  # XOR of the unique rows' digests
    # the landing files read, as they were then (the landing check compares them with now):
    # path, size, mtime and, since 2026-11-27, the SHA-256 of the content (absent in older
    # records); None: written before inputs were recorded
    inputs: tuple[InputFile, ...] | None = None
    index_files: tuple[IndexFileEntry, ...] = ()
    index_format: int = 1  # records without one predate index format 2
    output_files: dict[str, tuple[OutputFileEntry, ...]] | None = None  # None: before files were listed
    # the dataset contract version the hour was loaded under (engine/contract.py); None: loaded
    # before contracts were recorded
    contract_version: int | None = None
    # the hour's key digest files (engine/keydigest.py); None: loaded before key digests
    key_digest: tuple[DigestFileEntry, ...] | None = None
    # the Delta idempotency token of this load's publish (engine/lake.py): microseconds since the
    # epoch at commit, so a later load of the hour has a larger one; None: before outputs were
    # published as Delta tables
    publish_token: int | None = None
    # fields this version does not know (a newer version's, an operator's note): kept on rewrite
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

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
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The record as stored: the field names of every earlier version; unset optionals left
        out, as the versions that did not have them wrote it."""
        out: dict[str, Any] = dict(self.extra)
        for f in fields(self):
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if v is None and f.name in _OMIT_IF_NONE:
                continue
            out[f.name] = v
        out["index_slices_written"] = list(self.index_slices_written)
        out["index_files"] = [f.to_json() for f in self.index_files]
        if self.inputs is not None:  # sha256 only where known, as records before it wrote them
            out["inputs"] = [{k: v for k, v in asdict(f).items() if v is not None or k != "sha256"}
                             for f in self.inputs]
        if self.output_files is not None:
            out["output_files"] = {k: [f.to_json() for f in v] for k, v in self.output_files.items()}
        if self.key_digest is not None:
            out["key_digest"] = [f.to_json() for f in self.key_digest]
        return out

    @classmethod
    def from_json(cls, rec: Any, tag: str) -> CommitRecord:
        """The record of load `tag` from its parsed JSON; `RecordProblem` saying what is wrong."""
        problem = validate_record(rec, tag)
        if problem:
            raise RecordProblem(problem)
        known = {f.name for f in fields(cls)} - {"extra"}
        files = rec.get("output_files")
        values = {k: v for k, v in rec.items() if k in known}
        values.update(
            dataset=rec.get("dataset") or "",
            partition_key=rec.get("partition_key") or key_of(tag),
            index_slices_written=tuple(rec.get("index_slices_written") or ()),
            seconds=dict(rec.get("seconds") or {}),
            check_figures=dict(rec.get("check_figures") or {}),
            inputs=None if rec.get("inputs") is None else tuple(
                InputFile(f["path"], int(f["size"]), float(f["mtime"]), f.get("sha256"))
                for f in rec["inputs"]),
            index_files=tuple(IndexFileEntry.from_json(f) for f in rec.get("index_files") or ()),
            output_files=None if files is None else {
                k: tuple(OutputFileEntry(f["name"], f.get("size")) for f in v) for k, v in files.items()},
            key_digest=None if rec.get("key_digest") is None else tuple(
                DigestFileEntry(f["name"], f["size"], f.get("footer_sha256"))
                for f in rec["key_digest"]),
            extra={k: v for k, v in rec.items() if k not in known},
        )
        return cls(**values)


_OMIT_IF_NONE = {"committed_at", "index_checksum", "inputs", "output_files", "contract_version",
                 "key_digest", "publish_token"}


class RecordProblem(ValueError):
    """What is wrong with a parsed record (read_commit turns it into a `CommitRecordError`)."""


# Fields every commit record has had since the first release, with their JSON types.
_COUNTS = ("rows_in", "unique", "duplicates", "expired", "rejected")
_OPTIONAL_COUNTS = ("conflicts", "files_in", "index_rows_written", "index_rows_read",
                    "index_bytes_read", "index_files_read", "index_slices_deleted",
                    "files_written", "index_format", "contract_version", "publish_token")
_FILE_FIELDS: dict[str, tuple[type, ...]] = {"slice": (int,), "name": (str,), "size": (int,)}
_OPTIONAL_FILE_FIELDS: dict[str, tuple[type, ...]] = {"rows": (int, type(None)),
                                                       "sha256": (str,)}


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def validate_record(rec: Any, tag: str) -> str | None:
    """What is wrong with a parsed commit record of load `tag`, or None if it is well formed."""
    if not isinstance(rec, dict):
        return f"not a JSON object but {type(rec).__name__}"
    if rec.get("load_hour") != tag:
        return f"load_hour is {rec.get('load_hour')!r}, expected {tag!r}"
    for k in _COUNTS:
        v = rec.get(k)
        if not _is_count(v):
            return f"field {k!r} is {v!r}, expected a count"
    for k in _OPTIONAL_COUNTS:  # later fields: absent in earlier versions' records
        if k in rec and not _is_count(rec[k]):
            return f"field {k!r} is {rec[k]!r}, expected a count"
    for k in ("latest_point", "expiry_point"):  # numbers (expiry values), or null
        v = rec.get(k)
        if v is not None and not _is_number(v):
            return f"field {k!r} is {v!r}, expected a number or null"
    for k in ("dataset", "partition_key", "committed_at"):
        if rec.get(k) is not None and not isinstance(rec[k], str):
            return f"field {k!r} is {rec[k]!r}, expected a string"
    slices = rec.get("index_slices_written", [])
    if not isinstance(slices, list) or not all(isinstance(n, int) and not isinstance(n, bool)
                                               for n in slices):
        return "field 'index_slices_written' is not a list of slice numbers"
    for k in ("seconds", "check_figures", "index_checksum"):
        if rec.get(k) is not None and not isinstance(rec[k], dict):
            return f"field {k!r} is not an object"
    if not all(_is_number(v) for v in (rec.get("seconds") or {}).values()):
        return "field 'seconds' holds a value that is not a number"
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
                                        and (x.get("size") is None or _is_count(x["size"]))
                                        for x in v) for v in outs.values()):
        return "field 'output_files' is malformed"
    digest = rec.get("key_digest", [])
    if not isinstance(digest, list) or not all(
            isinstance(x, dict) and isinstance(x.get("name"), str) and _is_count(x.get("size"))
            and isinstance(x.get("footer_sha256", ""), str) for x in digest):
        return "field 'key_digest' is malformed"
    inputs = rec.get("inputs", [])
    if not isinstance(inputs, list) or not all(
            isinstance(f, dict) and isinstance(f.get("path"), str) and _is_count(f.get("size"))
            and _is_number(f.get("mtime")) and isinstance(f.get("sha256", ""), str)
            for f in inputs):
        return "field 'inputs' is malformed"
    return None


class LoadOrderError(UserError, RuntimeError):
    """Load H was asked for before every earlier hour since `start` was loaded (R11)."""

    stage = "the order check (an earlier hour is not loaded)"
    fix = ("load the missing earlier hours first (the command is in the error), then this range; "
           "nothing was written")


def commit_path(st: Storage, tag: str) -> str:
    return st.path(COMMITS, f"{PREFIX}{tag}.json")


def committed_tags(st: Storage) -> set[str]:
    """The hours with a commit record: one listing of names (no request per record).

    The one part of a load's bookkeeping that is O(history) in names: a single LIST call (on
    object stores one page per 1,000 records), kept because it is what sees a record an operator
    added or deleted by hand (docs/notes.md, "Performance": bookkeeping).
    """
    out = set()
    for base in st.list_names(st.path(COMMITS)):
        if base.startswith(PREFIX) and base.endswith(".json"):
            tag = base[len(PREFIX):-len(".json")]
            if is_tag(tag):
                out.add(tag)
    return out


def read_commit(st: Storage, tag: str) -> CommitRecord | None:
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
    try:
        return CommitRecord.from_json(rec, tag)
    except RecordProblem as e:
        raise CommitRecordError(path, tag, str(e)) from None


def write_commit(st: Storage, record: CommitRecord) -> None:
    """Write (or atomically replace) the record of `record.load_hour`."""
    st.write_json_atomic(commit_path(st, record.load_hour), record.to_json())


def invalidate(st: Storage, tag: str) -> None:
    st.remove(commit_path(st, tag))


def missing_before(ds: DatasetConfig, hour: datetime,
                   committed: AbstractSet[str] | HourSet) -> list[datetime]:
    """Hours from the dataset's start up to (excluding) `hour` that have no commit record."""
    cur, out = parse_key(ds.start), []
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
    return [parse_key(t) for t in committed.tags_after(tag)
            if t not in run_tags and t not in damaged]


def check_later_hours(ds: DatasetConfig, hour: datetime, committed: HourSet,
                      run_tags: AbstractSet[str],
                      damaged: AbstractSet[str] = frozenset()) -> None:
    """A (re)load of H while later hours are loaded must reload them in the same run (R10, R11).

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
    first, last = to_key(hour), to_key(max(later))
    raise LaterHoursLoadedError(
        f"dataset {ds.name!r}: cannot load {first} without the later hours already loaded after "
        f"it ({compress_ranges(later)}): they were classified against the keys of {first} as "
        f"loaded then, and reloading it alone would leave them stale (a key unique twice, a "
        f"duplicate pointing at a first load that is gone). Reload {first} through the latest "
        f"loaded hour in one run: dedup-pipeline run --config <file> --dataset {ds.name} "
        f"--from {first} --to {last} (or add --cascade), or in the UI a backfill of "
        f"{first}...{last}. Nothing was written."
    )


def _tag_time(tag: str) -> datetime:
    """A tag's hour, without strptime (hot: the summary's ranges are walked per check)."""
    return datetime(int(tag[0:4]), int(tag[5:7]), int(tag[8:10]), int(tag[11:13]))


def _time_tag(dt: datetime) -> str:
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}-{dt.hour:02d}"


class HourSet:
    """A set of hour tags held as ranges of consecutive hours: a year of loads is one pair.

    What the records' summary stores of the committed hours, and what a load's order check and
    live-file selection test membership in, so neither walks every hour since the start.
    """

    def __init__(self, ranges: Iterable[Sequence[str]] = ()):
        self._r: list[list[str]] = [[a, b] for a, b in ranges]

    @classmethod
    def of(cls, tags: Iterable[str]) -> HourSet:
        hs = cls()
        for t in sorted(tags):
            if hs._r and _time_tag(_tag_time(hs._r[-1][1]) + HOUR) == t:
                hs._r[-1][1] = t
            elif not hs._r or hs._r[-1][1] != t:
                hs._r.append([t, t])
        return hs

    def ranges(self) -> list[list[str]]:
        return [list(r) for r in self._r]

    def copy(self) -> HourSet:
        return HourSet(self._r)

    def _find(self, tag: str) -> int:
        """Index of the last range starting at or before `tag` (-1 if none)."""
        return bisect.bisect_right(self._r, tag, key=lambda r: r[0]) - 1

    def __contains__(self, tag: object) -> bool:
        if not isinstance(tag, str):
            return False
        i = self._find(tag)
        return i >= 0 and tag <= self._r[i][1] and is_tag(tag)

    def __iter__(self) -> Iterator[str]:
        for a, b in self._r:
            cur, end = _tag_time(a), _tag_time(b)
            while cur <= end:
                yield _time_tag(cur)
                cur += HOUR

    def __len__(self) -> int:
        return sum(int((_tag_time(b) - _tag_time(a)) / HOUR) + 1 for a, b in self._r)

    def count_between(self, first: str, stop: str) -> int:
        """How many hours t with first <= t < stop are in the set."""
        n = 0
        for a, b in self._r:
            lo = max(a, first)
            hi = min(_time_tag(_tag_time(b) + HOUR), stop)
            if lo < hi:
                n += int((_tag_time(hi) - _tag_time(lo)) / HOUR)
        return n

    def max(self) -> str | None:
        return self._r[-1][1] if self._r else None

    def tags_after(self, tag: str) -> Iterator[str]:
        """The hours in the set after `tag`, ascending (ranges before it are skipped)."""
        for a, b in self._r[max(0, self._find(tag)):]:
            cur, end = _tag_time(max(a, tag)), _tag_time(b)
            while cur <= end:
                t = _time_tag(cur)
                if t > tag:
                    yield t
                cur += HOUR

    def add(self, tag: str) -> None:
        if tag in self:
            return
        self._r.append([tag, tag])
        self._r = HourSet.of_ranges(self._r)._r

    def discard(self, tag: str) -> None:
        i = self._find(tag)
        if i < 0 or tag > self._r[i][1]:
            return
        a, b = self._r[i]
        parts = []
        if a < tag:
            parts.append([a, _time_tag(_tag_time(tag) - HOUR)])
        if tag < b:
            parts.append([_time_tag(_tag_time(tag) + HOUR), b])
        self._r[i:i + 1] = parts

    @classmethod
    def of_ranges(cls, ranges: Iterable[Sequence[str]]) -> HourSet:
        """Sorted and merged (overlapping or adjacent ranges become one)."""
        hs = cls()
        for a, b in sorted((list(r) for r in ranges), key=lambda r: r[0]):
            if hs._r and _time_tag(_tag_time(hs._r[-1][1]) + HOUR) >= a:
                hs._r[-1][1] = max(hs._r[-1][1], b)
            else:
                hs._r.append([a, b])
        return hs
