"""The commit log of a dataset: which hours are committed, and the one way records change.

A dataset's commit state is its commit records (``_commits/load_hour=H.json``, `engine.commits`)
and the log's summary (``_commit_log.json`` beside them, like a Delta log checkpoint): the record
names as ranges of hours, and what the index check needs of the records it still reads. Everything
that asks "which hours are committed?" (loads, sensors, schedules, checks, `verify`, rebuild,
explain) asks `CommitLog.committed`, so there is one answer; a lock holder changes records only
through `write` and `forget`, which keep the summary true.

The summary is derived data: missing, damaged or of another format (`engine.formats`), it is
not read but rebuilt from every record (once, O(history)); deleting it is always safe. It lives
outside ``_commits/`` because that directory's mtime is what tells whether the names it holds are
still valid.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from dedup_pipeline.engine.core import commits, formats
from dedup_pipeline.engine.core.commits import CommitRecord, IndexFileEntry
from dedup_pipeline.engine.core.lock import LeaseLostError, fence
from dedup_pipeline.engine.core.records import Record
from dedup_pipeline.engine.core.storage import Conflict, Storage
from dedup_pipeline.hours import HourSet, is_tag

SUMMARY = "_commit_log.json"  # at the output root, beside _commits/


class KeptRecord(Record):
    """What an index check uses of a commit record, with the record's size and mtime when read
    (`sig`): an equal signature later means the record was not edited since."""

    sig: tuple[int, str]
    index_files: tuple[IndexFileEntry, ...]


class SummaryFile(Record):
    """``_commit_log.json`` as stored (`Summary` is it in memory)."""

    format: Literal[1]
    commits_mtime: str | None
    committed: tuple[tuple[str, str], ...]  # ranges of hours, first and last tag
    uncovered: tuple[str, ...]
    kept: dict[str, KeptRecord]


@dataclass
class Summary:
    """The commit records as a check last saw them, so the next check need not read them all.

    `committed`: every record name, as ranges of hours. `uncovered`: of those, records every
    check reads again (damaged ones). `kept`: of the others, the records a check still needs
    (they list index files in live slices, or are the newest); a
    covered record that is not kept lists nothing a load reads (its files were deleted by
    retention or merged by compaction), so it is not read again. `commits_mtime`: the
    ``_commits`` directory's mtime the names were valid at; another mtime now means records were
    added, removed or replaced by name since, and the names are listed again.
    """

    committed: HourSet = field(default_factory=HourSet)
    uncovered: set[str] = field(default_factory=set)
    kept: dict[str, KeptRecord] = field(default_factory=dict)
    commits_mtime: str | None = None

    @classmethod
    def of(cls, stored: SummaryFile) -> Summary | None:
        if not all(is_tag(a) and is_tag(b) and a <= b for a, b in stored.committed):
            return None
        return cls(HourSet.of_ranges(stored.committed), set(stored.uncovered), dict(stored.kept),
                   stored.commits_mtime)

    def stored(self) -> SummaryFile:
        return SummaryFile(format=formats.FORMAT, commits_mtime=self.commits_mtime,
                           committed=self.committed.ranges(),
                           uncovered=tuple(sorted(self.uncovered)),
                           kept=dict(sorted(self.kept.items())))


@dataclass
class ToCheck:
    """What an index check reads of the log: the committed hours, the records it must read
    (`todo`), the summary it may take the rest from (`prior`), and the mtime they are valid at."""

    committed: HourSet
    todo: set[str]
    prior: Summary | None
    mtime: str | None


class CommitLog:
    """The commit records of one dataset's output (`st`), and their summary.

    Reading needs no lock. Changing (`write`, `forget`, `save_summary`, `drop_summary`) is for the
    holder of the dataset lock, which first `follow`s the state of its latest index check: each
    own change compares the ``_commits`` directory's mtime with the one expected, so a change by
    anybody else since (an operator deleting a record by hand) makes the next summary save no
    mtime, and the next check lists the names again.
    """

    def __init__(self, st: Storage):
        self.st = st
        self.state: Summary | None = None  # the latest check's view, which the next save extends
        self.expected: str | None = None  # the _commits mtime after this holder's last change
        self.etags: dict[str, str] = {}  # records this holder wrote: the ETag of its version

    # ---------------------------------------------------------------- reading
    def path(self, tag: str) -> str:
        return commits.commit_path(self.st, tag)

    def read(self, tag: str) -> CommitRecord | None:
        """The validated record of `tag`; None if not committed (`CommitRecordError` if bad)."""
        return commits.read_commit(self.st, tag)

    def read_intact(self, tag: str) -> CommitRecord | None:
        """`read`, a damaged record read as none: for callers whose own check, or another
        command's, names the damage (`verify`, the index check, a rerun of that hour)."""
        try:
            return self.read(tag)
        except commits.CommitRecordError:
            return None

    def mtime(self) -> str | None:
        return self.st.dir_mtime(self.st.path(commits.COMMITS))

    def committed(self) -> HourSet:
        """The committed hours: the summary's when ``_commits`` has not changed since it was
        saved, else one listing of the record names (no request per record)."""
        return self.to_check().committed

    def to_check(self, full: bool = False) -> ToCheck:
        """The records an index check must read: those the summary does not cover or keeps (or
        every one if `full`), and the hours committed, as of the mtime sampled first."""
        mtime = self.mtime()  # before anything is read: conservative
        prior = None if full else self.summary()
        if prior is not None and mtime is not None and prior.commits_mtime == mtime:
            return ToCheck(prior.committed.copy(), set(prior.uncovered) | set(prior.kept), prior,
                           mtime)
        names = commits.committed_tags(self.st)
        todo = set(names) if prior is None else (
            {t for t in names if t not in prior.committed or t in prior.uncovered}
            | (set(prior.kept) & names))
        return ToCheck(HourSet.of(names), todo, prior, mtime)

    def signature(self, tag: str) -> tuple[int, str] | None:
        """Size and modification time of a record: what tells a cached record from an edited
        one (None: no record)."""
        try:
            info = self.st.fs.info(self.path(tag))
        except FileNotFoundError:
            return None
        mtime = info.get("mtime", info.get("LastModified", info.get("last_modified")))
        return int(info.get("size") or 0), str(mtime)

    def summary(self) -> Summary | None:
        """The saved summary; None if there is none, or it is unreadable, damaged or of another
        format (derived data: then it is rebuilt from the records)."""
        path = self.st.path(SUMMARY)
        try:
            text = self.st.read_text(path)
        except (OSError, UnicodeDecodeError):  # none (FileNotFoundError) or unreadable
            return None
        if formats.problem_in_text(path, text, "") is not None:
            return None
        try:
            return Summary.of(SummaryFile.read_json(text))
        except ValueError:
            return None

    # ---------------------------------------------------------------- changing (lock holder)
    def follow(self, state: Summary | None) -> None:
        """Continue from a fresh check's state (true as of its own mtime sample)."""
        self.state = state
        self.expected = state.commits_mtime if state is not None else None

    def _change(self, fn: Any, *args: Any) -> None:
        if self.expected is not None and self.mtime() != self.expected:
            self.expected = None  # somebody else changed records since
        fn(*args)
        self._stamp()

    def _stamp(self) -> None:
        if self.expected is not None:
            # stamped, so a change by anybody else later, even within the same tick, shows
            self.expected = self.st.stamp_dir(self.st.path(commits.COMMITS))

    def write(self, record: CommitRecord, *, new: bool = False) -> CommitRecord:
        """Write (or atomically replace) the record of `record.load_hour`: H is committed. The
        record carries the generation of the dataset lease (object stores), renewed first: a
        holder that lost its lease raises `LeaseLostError` and writes nothing (design.md R10b). A
        `new` record (a load's: it forgot the hour first) is created only if still absent, one
        this holder wrote is replaced only over its own version: another writer's record is never
        overwritten. Returns the record as written."""
        tag = record.load_hour
        generation = fence(self.st)
        if generation is not None:
            record = record.with_(lock_generation=generation)
        if self.expected is not None and self.mtime() != self.expected:
            self.expected = None
        try:
            self.etags[tag] = commits.write_commit(
                self.st, record, if_absent=new and tag not in self.etags,
                if_match=self.etags.get(tag))
        except Conflict as e:
            seen = "wrote it" if tag in self.etags else "found it absent"
            raise LeaseLostError(
                f"the commit record of {tag} was changed by another run since this one {seen} "
                f"({e}): this run no longer holds the dataset; it stops without overwriting that "
                "record") from None
        self._stamp()
        return record

    def forget(self, tag: str) -> None:
        """Delete the record of `tag`: from now on the hour is not loaded."""
        fence(self.st)
        self._change(commits.invalidate, self.st, tag)
        self.etags.pop(tag, None)

    def save_summary(self, drop: Iterable[str] = (), add: CommitRecord | None = None) -> None:
        """Save the followed state without the hours in `drop`, with the record `add` (just
        written by this holder), valid at the expected mtime (None: names are listed again).

        A holder never leaves a record it will rewrite under the same name covered: a load drops
        its own hour before its record is written and adds it after its last write; a rebuild
        deletes the summary before rewriting records (`drop_summary`). So a crash anywhere leaves
        a summary that is true of every hour it covers.
        """
        s = self.state
        if s is None:
            return
        gone = set(drop)
        committed = s.committed.copy()
        for t in gone:
            committed.discard(t)
        kept = {t: k for t, k in s.kept.items() if t not in gone}
        uncovered = s.uncovered - gone
        if add is not None:
            sig = self.signature(add.load_hour)
            if sig is None:
                return
            committed.add(add.load_hour)
            uncovered.discard(add.load_hour)
            kept[add.load_hour] = KeptRecord(sig=sig, index_files=add.index_files)
        saved = Summary(committed, uncovered, kept, self.expected).stored()
        self.st.write_text_atomic(self.st.path(SUMMARY), saved.model_dump_json())

    def drop_summary(self) -> None:
        """Delete the summary before records are rewritten in place (a rebuild)."""
        self.st.remove(self.st.path(SUMMARY))
