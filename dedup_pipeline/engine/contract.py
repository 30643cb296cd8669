"""A dataset's contract: the config terms its history was loaded under, pinned (docs/design.md,
"The dataset contract").

The index and the outputs of every loaded hour were derived under some key, fingerprint, order,
expiry, index layout, source schema and digest version. A later load that used other terms would
silently disagree with them (a new key's digests never match the old index), so those terms are
recorded and a load, a rebuild and `verify` refuse a config that breaks them, before anything is
written, naming the field, both values, since when, and the command that migrates.

Storage: ``{output}/_contract/v0001.json``, ``v0002.json``, ... one immutable file per version,
written atomically and fsynced like a commit record (`Storage.write_json_atomic`), validated when
read (a damaged file is a `ContractError` naming it). Every commit record names the version its
hour was loaded under (`CommitRecord.contract_version`).

- A new version is written just before the commit record of the first hour loaded under it
  (`effective_from`). A version whose first hour never committed (a crash in between) is
  *tentative*: ignored, and overwritten by the next load. So a crash leaves no contract that no
  hour obeys.
- A migration (`engine/migrate.py`) writes its version first: that file is the migration's commit
  point. Its index rebuild follows; until the ``v000N.done`` marker beside it exists, every path
  refuses with "finish the migration".
- Each version carries ``"format": 1`` (`engine.formats`); a version of another format is
  refused, naming the file and the migrate command, which records the current config as the
  contract in its place.

Which config field is free, evolvable or breaking is `FIELDS` (one table; docs/design.md repeats
it with the argument for each). Pure Python: no Spark, no Dagster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import formats
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.index.layout import INDEX_FORMAT
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import HourSet, format_tag, now_stamp, parse_hour, to_tag
from dedup_pipeline.units import MICROS_PER_DAY, MICROS_PER_SECOND

CONTRACT = "_contract"
# The version of the key digest and fingerprint encoding (engine/core/digest.py): a change of that
# encoding makes every stored digest unmatchable, so it is a term of the contract.
DIGEST_VERSION = 1
_NAME = re.compile(r"^v(\d{4,})\.json$")
_DONE = re.compile(r"^v(\d{4,})\.done$")

Kind = Literal["free", "evolvable", "breaking"]


@dataclass(frozen=True)
class Rule:
    kind: Kind
    why: str


# Every config field, and what a change of it does to a dataset's loaded history. The one table
# (docs/design.md, "The dataset contract", repeats it with the arguments); a test checks that
# every field of DatasetConfig is here.
FIELDS: dict[str, Rule] = {
    "name": Rule("free", "names the Dagster assets; the history lives under `output`"),
    "asset_key_prefix": Rule("free", "names the Dagster assets; the history lives under `output`"),
    "start": Rule("free", "guarded by the load order rule (R11): an earlier start needs the earlier "
                  "hours loaded first; verify reports hours before a later one"),
    "source.path": Rule("free", "where landing files are read; values and digests do not change"),
    "source.format": Rule("free", "how landing files are parsed; typed values do not change"),
    "source.csv.header": Rule("free", "how CSV files are parsed"),
    "source.csv.delimiter": Rule("free", "how CSV files are parsed"),
    "source.schema": Rule("evolvable", "a new column at the end is evolvable (never part of a "
                          "digest, null in older hours' outputs, readers merge by name); a column "
                          "removed, renamed, reordered, inserted before others, or of another type "
                          "is breaking"),
    "key": Rule("breaking", "the index holds digests of the key: a new key matches none"),
    "fingerprint": Rule("breaking", "the index holds fingerprints: other columns flip natural "
                        "and conflict duplicates"),
    "order_by": Rule("breaking", "decides which copy of a key is unique (R3); the stored rows, "
                     "expiry values and fingerprints follow from it"),
    "expiry": Rule("breaking", "adding or removing expiry changes the index layout"),
    "expiry.column": Rule("breaking", "the index slices and stores the expiry value of this column"),
    "expiry.basis": Rule("breaking", "changes X_H of every hour"),
    "expiry.categories": Rule("breaking", "the expiry value of a category is its position"),
    "expiry.period": Rule("evolvable", "shortened: X_H only rises, the index holds a superset of "
                          "what a load reads; lengthened: evolvable while the index still holds "
                          "every entry the longer window reaches (nothing deleted below it by "
                          "retention), else breaking. The slice span follows the period unless "
                          "index.slice_span is set"),
    "output": Rule("free", "the table itself: another output is another table with its own "
                   "contract"),
    "index.store_keys": Rule("breaking", "changes the index entries' columns"),
    "index.buckets": Rule("breaking", "without expiry, an entry's bucket is its digest modulo "
                          "buckets: a load would probe the wrong bucket (free with expiry)"),
    "index.slice_span": Rule("breaking", "an entry's slice is floor(v / span): a load would skip "
                             "live slices"),
    "index.retention_lag_hours": Rule("free", "how long expired slices are kept; a load never "
                                      "reads below X_H, and a rerun that needs deleted slices "
                                      "is refused by the retention check"),
    "index.compact_after": Rule("free", "compaction never changes a result"),
    "landing": Rule("free", "when an hour is complete; not how it is deduplicated"),
    "checks": Rule("free", "warning thresholds of the asset checks"),
    "on_damaged_index": Rule("free", "what a load does on index damage"),
    "output_format": Rule("free", "how the same Parquet files are published: parquet to delta "
                          "publishes every committed hour at the next load; delta to parquet "
                          "leaves the Delta log behind (delete `_delta_log` in each output)"),
    "spark": Rule("free", "where and how Spark runs (file-level section)"),
    "index format": Rule("breaking", "a package version with another index layout: migrate "
                         "re-derives the index in it"),
    "digest version": Rule("breaking", "a package version with another digest: migrate "
                           "re-derives the index"),
}


class ContractError(UserError, RuntimeError):
    """A config that breaks the dataset's recorded contract, or an unreadable contract file."""

    stage = ("the dataset contract check (the config breaks what the loaded history was loaded "
             "under)")
    fix = ("nothing was written; revert the config change, or run the migrate command the error "
           "names (or launch job {rebuild_job} with `migrate: true` in its op config), then "
           "rerun {hours}")


# --- the terms ------------------------------------------------------------------------------------

class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ExpiryTerms(_Frozen):
    column: str
    period: float  # in the expiry value's units
    period_text: str  # as written
    basis: str
    categories: tuple[str, ...] | None = None


class IndexTerms(_Frozen):
    store_keys: bool
    buckets: int | None  # only without expiry
    slice_span: float | None  # effective, in expiry-value units; only with expiry
    format: int


class Terms(_Frozen):
    """What a loaded hour obeys: every contract term of a DatasetConfig."""

    key: tuple[str, ...]
    fingerprint: tuple[str, ...]
    order_by: str | None
    expiry: ExpiryTerms | None
    index: IndexTerms
    schema_: tuple[tuple[str, str], ...] = Field(alias="schema")  # declared, in order
    digest_version: int

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @classmethod
    def of(cls, ds: DatasetConfig) -> Terms:
        e = ds.expiry
        return cls(
            key=ds.key, fingerprint=ds.fingerprint, order_by=ds.order_by,
            expiry=None if e is None else ExpiryTerms(
                column=e.column, period=ds.expiry_period, period_text=e.period_text, basis=e.basis,
                categories=e.categories),
            index=IndexTerms(store_keys=ds.index.store_keys,
                             buckets=ds.index.buckets if e is None else None,
                             slice_span=ds.slice_span if e is not None else None,
                             format=INDEX_FORMAT),
            schema=tuple(ds.source.schema.items()),
            digest_version=DIGEST_VERSION,
        )


class Migration(_Frozen):
    from_version: int | None  # None: from a history without a recorded contract
    changes: tuple[str, ...]
    # L_H of every committed hour re-derived under the migrated terms (with expiry, basis event):
    # a load whose previous hour was loaded under an older version continues from these
    latest_points: dict[str, int | float | None] | None = None


class Contract(_Frozen):
    """One version of a dataset's contract, as stored in ``_contract/v000N.json``."""

    format: Literal[1] = formats.FORMAT
    dataset: str
    version: int = Field(ge=1)
    effective_from: str  # partition key of the first hour loaded under it
    recorded_at: str
    changes: tuple[str, ...] = ()  # the evolvable changes from the version before
    migration: Migration | None = None
    terms: Terms

    def to_json(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)


def contract_path(st: Storage, version: int) -> str:
    return st.path(CONTRACT, f"v{version:04d}.json")


def done_path(st: Storage, version: int) -> str:
    return st.path(CONTRACT, f"v{version:04d}.done")


@dataclass(frozen=True)
class History:
    """The contract versions in force (tentative ones dropped) and the migration markers."""

    versions: tuple[Contract, ...]
    done: frozenset[int]
    # versions of another format, by path (only `read_history(..., other_formats=True)` keeps
    # them here; otherwise they are refused)
    other_formats: tuple[str, ...] = ()

    @property
    def current(self) -> Contract | None:
        return self.versions[-1] if self.versions else None

    def version(self, n: int | None) -> Contract | None:
        return next((c for c in self.versions if c.version == n), None)

    @property
    def pending(self) -> Contract | None:
        """The latest version if it is a migration whose index rebuild did not finish."""
        c = self.current
        return c if c is not None and c.migration is not None and c.version not in self.done \
            else None


def read_history(st: Storage, last_committed: str | None, other_formats: bool = False) -> History:
    """Every contract version, validated; versions whose first hour has not committed (written
    by a load that then crashed) are tentative and dropped. `last_committed` is the latest
    committed hour's tag (None: none). A version of another format is refused in one line
    (`ContractError`), unless `other_formats` (migrate, which replaces them): then it is left
    out and named in `History.other_formats`."""
    names = st.list_names(st.path(CONTRACT))
    found: list[Contract] = []
    done = set()
    others: list[str] = []
    for name in sorted(names):
        if (m := _DONE.match(name)) is not None:
            done.add(int(m.group(1)))
        if (m := _NAME.match(name)) is None:
            continue
        path = st.path(CONTRACT, name)
        try:
            doc = json.loads(st.read_text(path))
            other = formats.problem(path, doc, formats.MIGRATE)
            if other is not None:
                if other_formats:
                    others.append(path)
                    continue
                raise ContractError(f"contract error: {other.line}")
            c = Contract.model_validate(doc)
        except (OSError, UnicodeDecodeError, ValueError, ValidationError) as e:
            first = str(e).splitlines()[0][:200]
            raise ContractError(
                f"contract error: {path} is damaged ({type(e).__name__}: {first}); restore it "
                f"from a backup, or delete it and run dedup-pipeline migrate to record the "
                f"current config as the contract") from None
        if c.version != int(m.group(1)):
            raise ContractError(f"contract error: {path} holds version {c.version}; restore it "
                                "from a backup")
        found.append(c)
    found.sort(key=lambda c: c.version)
    kept: list[Contract] = []
    for c in found:
        if c.version != len(kept) + 1:
            break  # a gap: what follows was never in force
        kept.append(c)
    while kept and _tentative(kept[-1], last_committed):
        kept.pop()
    return History(tuple(kept), frozenset(done), tuple(others))


def migrated_since(hist: History, version: int) -> Contract | None:
    """The newest migration after contract `version`:
    what an hour loaded under `version` derived (its L_H, its X_H) is not in the terms in force,
    and the migration re-derived it."""
    for c in reversed(hist.versions):
        if c.migration is not None and c.version > version:
            return c
    return None


def _tentative(c: Contract, last_committed: str | None) -> bool:
    if c.migration is not None:
        return False
    return last_committed is None or to_tag_of(c.effective_from) > last_committed


def to_tag_of(partition_key: str) -> str:
    return to_tag(parse_hour(partition_key))


# --- comparing terms ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    field: str
    old: str
    new: str
    kind: Kind
    hint: str = ""

    def describe(self) -> str:
        return f"{self.field} changed from {self.old} to {self.new}"


def _list(cols: Iterable[str]) -> str:
    return "[" + ", ".join(cols) + "]"


def _span(kind: str | None, v: float | None) -> str:
    if v is None:
        return "none"
    if kind == "timestamp":
        for unit, n in (("d", MICROS_PER_DAY), ("h", 3600 * MICROS_PER_SECOND),
                        ("m", 60 * MICROS_PER_SECOND), ("s", MICROS_PER_SECOND)):
            if v % n == 0:
                return f"{int(v // n)}{unit}"
        return f"{v:g}us"
    if kind == "date":
        return f"{int(v)}d"
    return f"{v:g}"


def compare(old: Terms, new: Terms, *, expiry_kind: str | None = None,
            window_held: bool = True) -> list[Change]:
    """Every difference between recorded and configured terms, classified (FIELDS).

    `window_held`: whether the index still holds every entry a lengthened period reaches (only
    read when the period is lengthened; see `period_window_held`).
    """
    out: list[Change] = []

    def brk(fld: str, a: str, b: str, hint: str = "") -> None:
        out.append(Change(fld, a, b, "breaking", hint))

    if old.key != new.key:
        brk("key", _list(old.key), _list(new.key))
    if old.fingerprint != new.fingerprint:
        brk("fingerprint", _list(old.fingerprint), _list(new.fingerprint))
    if old.order_by != new.order_by:
        brk("order_by", str(old.order_by), str(new.order_by))
    oe, ne = old.expiry, new.expiry
    if (oe is None) != (ne is None):
        brk("expiry", "none" if oe is None else f"on {oe.column}",
            "none" if ne is None else f"on {ne.column}")
    elif oe is not None and ne is not None:
        if oe.column != ne.column:
            brk("expiry.column", oe.column, ne.column)
        if oe.basis != ne.basis:
            brk("expiry.basis", oe.basis, ne.basis)
        if oe.categories != ne.categories:
            brk("expiry.categories", _list(oe.categories or ()), _list(ne.categories or ()))
        if oe.column == ne.column and oe.period != ne.period:
            shortened = ne.period < oe.period
            ok = shortened or window_held
            out.append(Change("expiry.period", oe.period_text, ne.period_text,
                              "evolvable" if ok else "breaking",
                              "" if ok else "the index no longer holds the entries the longer "
                              "window reaches (retention deleted them)"))
    oi, ni = old.index, new.index
    if oi.store_keys != ni.store_keys:
        brk("index.store_keys", str(oi.store_keys).lower(), str(ni.store_keys).lower())
    if oi.buckets != ni.buckets and oe is None and ne is None:
        brk("index.buckets", str(oi.buckets), str(ni.buckets))
    if oi.slice_span != ni.slice_span and oe is not None and ne is not None \
            and oe.column == ne.column:
        brk("index.slice_span", _span(expiry_kind, oi.slice_span), _span(expiry_kind, ni.slice_span),
            f"index.slice_span follows expiry.period unless set; to keep the layout set "
            f"index.slice_span: {_span(expiry_kind, oi.slice_span)}")
    if oi.format != ni.format:
        brk("index format", str(oi.format), str(ni.format))
    if old.digest_version != new.digest_version:
        brk("digest version", str(old.digest_version), str(new.digest_version))
    out.extend(_schema_changes(dict(old.schema_), dict(new.schema_)))
    return out


def _schema_changes(old: dict[str, str], new: dict[str, str]) -> list[Change]:
    out: list[Change] = []
    for col, typ in old.items():
        if col not in new:
            out.append(Change("source.schema", f"{col}: {typ}", "absent", "breaking",
                              f"column {col!r} removed or renamed"))
        elif new[col] != typ:
            out.append(Change(f"source.schema.{col}", typ, new[col], "breaking",
                              "a column's type is part of its digest and of its outputs' Parquet "
                              "type"))
    if not out:
        kept = [c for c in new if c in old]
        if kept != list(old):
            out.append(Change("source.schema", _list(old), _list(kept), "breaking",
                              "existing columns reordered"))
        elif list(new)[:len(old)] != list(old):
            first = next(c for c in new if c not in old)
            out.append(Change("source.schema", _list(old), _list(new), "breaking",
                              f"new column {first!r} inserted before existing ones; add new "
                              "columns at the end"))
        else:
            for col in list(new)[len(old):]:
                out.append(Change("source.schema", "absent", f"{col}: {new[col]}", "evolvable",
                                  f"new column {col!r} at the end"))
    return out


# --- the check ------------------------------------------------------------------------------------

def breaking_message(ds: DatasetConfig, c: Change, since: Contract) -> str:
    """The one line every path refuses with: dataset, field, both values, since when, the fix."""
    hint = f" ({c.hint})" if c.hint else ""
    verb = "to re-key the history" if c.field == "key" else "to re-derive the index under it"
    return (f"contract error: dataset {ds.name!r}: {c.describe()}{hint} since "
            f"{since.effective_from} (contract v{since.version}); revert the change, or {verb} "
            f"run: {formats.migrate_command(ds.name, ds.config_file)}")


@dataclass(frozen=True)
class Verdict:
    """What the check found: the contract in force, and the version to record before the
    commit record of the hour being loaded (None: the one in force applies)."""

    current: Contract | None
    new: Contract | None
    changes: tuple[Change, ...] = ()

    @property
    def version(self) -> int:
        return (self.new or self.current).version  # type: ignore[union-attr]


def _kept_from_state(st: Storage) -> float | None:
    try:
        state = st.read_json(st.path("index", "_retention.json"))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    v = state.get("kept_from") if isinstance(state, dict) else None
    return v if isinstance(v, int | float) else None


def period_window_held(st: Storage, last_latest: float | None, new_period: float) -> bool:
    """Whether the index holds every entry a window of `new_period` reaches from now on: nothing
    was deleted by retention, or only below L_last - new_period (L only rises, and retention never
    deletes at or above the load's own X_H)."""
    kept = _kept_from_state(st)
    return kept is None or (last_latest is not None and last_latest - new_period >= kept)


def check(st: Storage, ds: DatasetConfig, hour_key: str, committed: Collection[str] | None,
          last_committed: str | None = None, *, latest_of_last: float | None = None) -> Verdict:
    """The config against the recorded contract, before anything is written; raises
    `ContractError` on a breaking change or an unfinished migration.

    `committed`: the committed hours (only its emptiness and max are read; pass
    `last_committed` instead when known). `hour_key`: the partition key of the first hour the
    caller will load (the effective hour of a new version). Reads the `_contract` listing and its
    files (a few KB); the last committed record only when a lengthened period must be checked.
    """
    first_committed = None
    if committed:
        ranges = committed.ranges() if isinstance(committed, HourSet) else None
        first_committed = ranges[0][0] if ranges else min(committed)
        if last_committed is None:
            last_committed = ranges[-1][1] if ranges else max(committed)
    hist = read_history(st, last_committed)
    pending = hist.pending
    if pending is not None:
        raise ContractError(
            f"contract error: dataset {ds.name!r}: the migration to contract v{pending.version} "
            f"({'; '.join(pending.migration.changes) or 'no change'}) did not finish; finish it: "  # type: ignore[union-attr]
            f"{formats.migrate_command(ds.name, ds.config_file)}")
    terms = Terms.of(ds)
    now = now_stamp()
    cur = hist.current
    if cur is None:
        if last_committed is not None:  # hours loaded, their contract gone: nothing to check against
            since = format_tag(first_committed or last_committed)
            raise ContractError(
                f"contract error: dataset {ds.name!r}: hours since {since} are loaded but "
                f"{st.path(CONTRACT)} holds no contract; restore it from a backup, or record the "
                "current config as the history's contract: "
                f"{formats.migrate_command(ds.name, ds.config_file)}")
        # the first load: the dataset's contract is this config
        return Verdict(None, Contract(dataset=ds.name, version=1, effective_from=hour_key,
                                      recorded_at=now, terms=terms))
    if cur.terms == terms:
        return Verdict(cur, None)
    held = True
    if (cur.terms.expiry is not None and terms.expiry is not None
            and terms.expiry.period > cur.terms.expiry.period):
        held = period_window_held(st, latest_of_last if latest_of_last is not None
                                  else _last_latest(st, last_committed), terms.expiry.period)
    changes = compare(cur.terms, terms, expiry_kind=ds.expiry_type, window_held=held)
    bad = [c for c in changes if c.kind == "breaking"]
    if bad:
        raise ContractError(breaking_message(ds, bad[0], cur))
    if not changes:  # only what the contract does not compare (e.g. period_text spelled anew)
        return Verdict(cur, None)
    return Verdict(cur, Contract(
        dataset=ds.name, version=cur.version + 1, effective_from=hour_key, recorded_at=now,
        changes=tuple(f"{c.field}: {c.old} -> {c.new}" for c in changes), terms=terms),
        tuple(changes))


def _last_latest(st: Storage, last_committed: str | None) -> float | None:
    if last_committed is None:
        return None
    rec = CommitLog(st).read(last_committed)
    return rec.latest_point if rec is not None else None


def record(st: Storage, verdict: Verdict) -> None:
    """Write the verdict's new version (atomically, fsynced); a no-op when none is due."""
    if verdict.new is not None:
        st.write_json_atomic(contract_path(st, verdict.new.version), verdict.new.to_json())


def describe_new(v: Verdict) -> str | None:
    """One line for the load's log when it records a new version."""
    n = v.new
    if n is None:
        return None
    if n.version == 1:
        return f"contract v1 recorded, effective from {n.effective_from}"
    return f"contract v{n.version} recorded, effective from {n.effective_from}: " + \
        "; ".join(n.changes)
