"""What makes `explain` fast, checked and written again: the hours' key digests
(`engine/keydigest.py`) and the day packs (`engine/daypack.py`).

Neither decides an answer: an hour without a usable digest is searched in its outputs, a day
without a valid pack is read hour by hour, so a lost or altered one costs time, never a wrong
answer. Hence `verify` warns about them (`missing`) and `verify --repair` writes them again
(`repair`) rather than failing (design.md L2d): digests from the committed outputs the records list, then the
packs of every complete day (all 24 hours committed, as a load packs) they no longer match.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import commits, daypack, keydigest
from dedup_pipeline.engine.commit_log import CommitLog
from dedup_pipeline.engine.commits import CommitRecord
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import HourSet, compress_ranges, parse_hour


@dataclass
class Missing:
    """Hours whose key digest is not usable, and days whose packs do not match their hours."""

    digests: list[str] = field(default_factory=list)  # hour tags
    days: list[str] = field(default_factory=list)  # YYYY-MM-DD, every hour of them committed

    def __bool__(self) -> bool:
        return bool(self.digests or self.days)

    def describe(self) -> str:
        """One line: how many of each, with the first ones."""
        hours = compress_ranges([parse_hour(t) for t in self.digests[:24]])
        days = ", ".join(self.days[:5])
        said = [(self.digests, f"hour(s) without a usable key digest ({hours}"),
                (self.days, f"day(s) whose packs do not match their hours ({days}")]
        return "; ".join(f"{len(items)} {text}{', ...' if len(items) > cap else ''})"
                         for (items, text), cap in zip(said, (24, 5), strict=True) if items)


def _digest_ok(st: Storage, tag: str, rec: CommitRecord) -> bool:
    """The hour's record lists a digest whose files are there, of their size and footer."""
    files = keydigest.usable(st, tag, rec)
    if files is None:
        return False
    try:
        return all(e is None or e.footer_sha256 is None or hashlib.sha256(
            keydigest.footer(st, p, e.size)).hexdigest() == e.footer_sha256
            for p, e in files.items())
    except (OSError, ValueError):
        return False


def _complete_days(records: Mapping[str, CommitRecord]) -> dict[str, dict[str, CommitRecord]]:
    """The days all 24 of whose hours are committed (the days a load packs), with their records."""
    by_day: dict[str, dict[str, CommitRecord]] = {}
    for t, r in records.items():
        by_day.setdefault(daypack.day_of(t), {})[t] = r
    return {d: recs for d, recs in sorted(by_day.items()) if len(recs) == 24}


def missing(st: Storage, records: Mapping[str, CommitRecord]) -> Missing:
    """What of the digests of the committed hours `records`, and of the packs of their complete
    days, is missing or stale."""
    return Missing([t for t, r in sorted(records.items()) if not _digest_ok(st, t, r)],
                   [d for d, recs in _complete_days(records).items()
                    if daypack.stale(st, d, recs)])


def repair(spark: SparkSession, ds: DatasetConfig, st: Storage,
           say: Callable[[str], None] = lambda _m: None) -> Missing:
    """Write the missing digests again (each record then names its new digest) and pack every
    day that no longer matches its hours. The caller holds the dataset lock. Returns what was
    written."""
    log = CommitLog(st)
    committed: HourSet = log.committed()
    records = {}
    for t in committed:
        try:
            if (r := log.read(t)) is not None:
                records[t] = r
        except commits.CommitRecordError as e:
            say(f"{ds.name}: hour {t} skipped: {e}")
    todo = missing(st, records)
    if todo.digests:
        log.drop_summary()  # records are rewritten in place: the next check reads them again
    for i, t in enumerate(todo.digests, 1):
        records[t] = keydigest.rebuild(spark, ds, st, records[t])
        log.write(records[t])
        if i % 24 == 0 or i == len(todo.digests):
            say(f"{ds.name}: key digests written again: {i}/{len(todo.digests)} hour(s)")
    days = [d for d, recs in _complete_days(records).items()
            if daypack.stale(st, d, recs) and daypack.pack_day(st, d, recs) is not None]
    if days:
        say(f"{ds.name}: day packs written: {len(days)} day(s)")
    return Missing(todo.digests, days)
