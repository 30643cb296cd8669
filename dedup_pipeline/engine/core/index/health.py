"""Is the index what the commit records say it is? Detecting damage cheaply, and the manifests
that make that possible (design.md R12, R12a).

Each commit record lists the index files its load wrote (`index_file_manifest`: name, size, rows,
SHA-256), each compacted directory its own. Damage detection has two levels (docs/operations.md,
"Index recovery"):
- listing (`check_index`, before every load, by the recovery sensor): a committed load whose files
  are missing, have another size, or are joined by files nobody committed is damaged (slices
  deleted by retention excepted); so is a load whose commit record does not parse (`bad_records`),
  and a file a load or `verify` found with other content (recorded in ``index/_damaged.json``);
- content (`content_damage`): the SHA-256 of exactly the files a load is about to probe is compared
  with the recorded one before the probe, so the cost follows what the load reads, not history.
  `check_index(content=True)` (verify) hashes every index file; `scrub` a bounded share per tick.
What a load does about damage (fail, or rebuild first) is `engine.rebuild`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.commit_log import CommitLog, KeptRecord, Summary
from dedup_pipeline.engine.core.commits import IndexFileEntry
from dedup_pipeline.engine.core.formats import rebuild_command
from dedup_pipeline.engine.core.index.layout import (
    CHECKSUM_PATH,
    DAMAGED,
    INDEX,
    IndexFile,
    covered,
    is_compact_dir,
    is_slice_dir,
    list_compacted,
    load_rel,
    load_tag,
    rel_load,
    slice_number,
)
from dedup_pipeline.engine.core.index.live import kept_from, min_slice
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import format_tag, parse_hour, to_tag


class IndexDamagedError(UserError, RuntimeError):
    """The index disagrees with the commit records; loads refuse to run on it (R12)."""

    stage = "the index health check"
    fix = "launch job {rebuild_job} (or set on_damaged_index: rebuild), then rerun {hours}"


@dataclass
class IndexDamage:
    """What is wrong with the index of a dataset; empty means healthy."""

    missing: dict[str, list[str]] = field(default_factory=dict)  # load tag -> missing/changed files
    unexpected: list[str] = field(default_factory=list)  # files a committed load did not write
    # every index file the commit records list (retention's deletions excepted), by path below
    # index/: when healthy, exactly what is on disk, so a load needs no listing of its own
    files: dict[str, IndexFile] = field(default_factory=dict)
    bad_compacted: list[str] = field(default_factory=list)  # compacted dirs a rebuild must drop
    other_format: list[str] = field(default_factory=list)  # manifests of another format: why
    corrupt: dict[str, list[str]] = field(default_factory=dict)  # load -> files of other content
    bad_records: dict[str, str] = field(default_factory=dict)  # load -> what is wrong with record
    # the commit log's summary this check built (`CommitLog.save_summary` writes it once the
    # log follows it), and so the committed hours (`state.committed`); None only for an
    # IndexDamage no check built
    state: Summary | None = field(default=None, repr=False, compare=False)

    @property
    def index_ok(self) -> bool:
        return not (self.missing or self.unexpected or self.other_format or self.corrupt)

    @property
    def ok(self) -> bool:
        return self.index_ok and not self.bad_records

    @property
    def damaged_loads(self) -> list[str]:
        """Loads whose entries must be rebuilt: missing/changed files or stray files in their dirs.

        Loads with a damaged commit record are not among them: a rebuild cannot restore a record
        (its counts and expiry point); rerunning the hour does.
        """
        strays = {t for t in map(rel_load, self.unexpected) if t is not None}
        return sorted((set(self.missing) | strays | set(self.corrupt))
                      - set(self.bad_records))

    def summary(self) -> str:
        parts = list(self.other_format)
        for tag, problem in sorted(self.bad_records.items()):
            parts.append(f"hour {format_tag(tag)}: {problem}")
        if self.corrupt:
            first = sorted(self.corrupt)[0]
            parts.append(f"index files whose content differs from what was recorded when they "
                         f"were written (SHA-256), of "
                         f"{len(self.corrupt)} load(s): "
                         f"{', '.join(format_tag(t) for t in sorted(self.corrupt)[:5])}, e.g. "
                         f"{INDEX}/{self.corrupt[first][0]}")
        if self.missing:
            hours = ", ".join(format_tag(t) for t in self.damaged_loads[:5])
            more = f" (+{len(self.missing) - 5} more)" if len(self.missing) > 5 else ""
            parts.append(f"index files missing or changed for {len(self.missing)} committed "
                         f"load(s): {hours}{more}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} index file(s) not written by their load, "
                         f"e.g. {self.unexpected[0]}")
        return "; ".join(parts) or "index healthy"


# -- the damaged marker: content damage found by a load or verify, until a rebuild replaces it ---
def _marker(st: Storage) -> dict[str, str]:
    try:
        m = st.read_json(st.path(INDEX, DAMAGED))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return {}
    return {k: v for k, v in m.items() if isinstance(v, str)} if isinstance(m, dict) else {}


def record_damage(st: Storage, found: dict[str, str]) -> None:
    """Remember index files found with other content, so check_index (every later load, the
    recovery sensor) reports them until a rebuild replaces them."""
    st.write_json_atomic(st.path(INDEX, DAMAGED), {**_marker(st), **found})


def prune_marker(st: Storage, files: dict[str, IndexFile]) -> None:
    """Forget marked files that a rebuild replaced (another hash recorded now, or gone)."""
    m = _marker(st)
    keep = {rel: h for rel, h in m.items() if rel in files and files[rel].sha256 == h}
    if keep != m:
        if keep:
            st.write_json_atomic(st.path(INDEX, DAMAGED), keep)
        else:
            st.remove(st.path(INDEX, DAMAGED))


# -- checks ----------------------------------------------------------------------------------
def content_damage(st: Storage, files: Iterable[IndexFile]) -> dict[str, str]:
    """The files (rel -> recorded hash) whose bytes do not hash to the recorded SHA-256.

    A Hadoop ChecksumException while Spark reads a file is the same damage (load.py).
    """
    todo = list(files)
    root = st.path(INDEX)

    def bad(f: IndexFile) -> bool:
        path = f"{root}/{f.rel}"
        try:
            return st.sha256(path) != f.sha256
        except OSError:
            return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        flags = list(pool.map(bad, todo))
    return {f.rel: f.sha256 for f, b in zip(todo, flags, strict=True) if b}


def scrub(st: Storage, damage: IndexDamage, cursor: str, budget_bytes: int) -> str:
    """Hash the next index files after `cursor` (by path, wrapping) up to `budget_bytes`; add what
    differs to `damage.corrupt`; return the new cursor. The recovery sensor's rolling content
    check: a bounded cost per tick, the whole index covered over successive ticks."""
    order = sorted(damage.files)
    if not order:
        return ""
    start = next((i for i, rel in enumerate(order) if rel > cursor), 0)
    chosen: list[IndexFile] = []
    size = 0
    for rel in order[start:] + order[:start]:
        if chosen and size + damage.files[rel].size > budget_bytes:
            break
        chosen.append(damage.files[rel])
        size += damage.files[rel].size
    for rel in sorted(content_damage(st, chosen)):
        for t in damage.files[rel].holds:
            if rel not in damage.corrupt.get(t, []):
                damage.corrupt.setdefault(t, []).append(rel)
    return chosen[-1].rel


def check_index(st: Storage, ds: DatasetConfig, content: bool = False,
                full: bool = False, log: CommitLog | None = None) -> IndexDamage:
    """Compare the index files on disk with what the commit records and compaction manifests say.

    Lists files and reads no data, unless `content` (verify): then every file is hashed too.
    Reads only the records the commit log's summary does not cover or keeps, the latter only if
    their size or mtime changed, and lists the record names only if the ``_commits`` directory
    changed since: O(live) requests and driver time. `full` or `content` read every record.
    """
    damage = IndexDamage()
    kept = kept_from(st)
    lo = min_slice(ds, kept) if kept is not None else None
    log = log or CommitLog(st)
    view = log.to_check(full=full or content)
    committed, todo, prior = view.committed, view.todo, view.prior
    compacted = [c for c in list_compacted(st) if lo is None or c.slice >= lo]
    merged = covered(compacted)
    start = to_tag(parse_hour(ds.start))
    state = Summary(committed, commits_mtime=view.mtime)
    newest = committed.max()
    for tag in sorted(todo):
        if tag < start:  # no load writes it: a copied or misnamed file, and no rerun can replace it
            path = commits.commit_path(st, tag)
            damage.bad_records[tag] = (
                f"commit record {path} is of hour {format_tag(tag)}, before the dataset's start "
                f"{ds.start}: no load writes such a record (a copied or misnamed file). Delete "
                f"{path}")
            state.uncovered.add(tag)
            continue
        sig = log.signature(tag)
        if sig is None:
            committed.discard(tag)  # deleted since the listing
            continue
        cached = prior.kept.get(tag) if prior is not None else None
        if cached is not None and cached.sig == sig:
            listed = list(cached.index_files)
        else:
            try:
                rec = log.read(tag)
            except commits.CommitRecordError as e:
                damage.bad_records[tag] = str(e)
                state.uncovered.add(tag)
                continue
            if rec is None:
                committed.discard(tag)
                continue
            listed = list(rec.index_files)
        live = False
        for f in listed:
            if (lo is not None and f.slice < lo) or (f.slice, tag) in merged:
                continue  # deleted by retention, or merged by compaction, as intended
            entry = IndexFile.of(f, tag)
            damage.files[entry.rel] = entry
            live = True
        if live or tag == newest:
            state.kept[tag] = KeptRecord(sig=sig, index_files=tuple(listed))
    damage.state = state
    for c in compacted:
        if c.other_format is not None:
            damage.other_format.append(c.other_format)
        for entry in c.index_files():
            damage.files[entry.rel] = entry
    actual: dict[str, int] = {}
    root = st.path(INDEX)
    for path, size in st.file_sizes(root, ".parquet").items():
        rel = path[len(root) + 1:]
        parts = rel.split("/")
        if len(parts) != 3 or not is_slice_dir(parts[0]):
            continue  # staging or compaction work areas (a load reads only listed files)
        n, tag = slice_number(parts[0]), load_tag(parts[1])
        if n is None:
            actual[rel] = size  # reported as unexpected
            continue
        if tag is not None and (tag not in state.committed or (n, tag) in merged
                                or tag in damage.bad_records):
            continue  # leftovers of an interrupted attempt or compaction (their rerun clears them)
        actual[rel] = size
    for rel, f in damage.files.items():
        if actual.get(rel) != f.size:
            for t in f.holds:
                damage.missing.setdefault(t, []).append(rel)
    damage.unexpected = sorted(set(actual) - set(damage.files))
    found = {rel: h for rel, h in _marker(st).items()
             if rel in damage.files and damage.files[rel].sha256 == h}
    if content:
        found |= content_damage(st, [f for rel, f in damage.files.items()
                                     if actual.get(rel) == f.size])
    for rel in sorted(found):
        for t in damage.files[rel].holds:
            damage.corrupt.setdefault(t, []).append(rel)
    bad = {rel.rsplit("/", 1)[0] for rel in damage.unexpected}
    bad |= {f.rel.rsplit("/", 1)[0] for f in damage.files.values()
            if f.loads and (actual.get(f.rel) != f.size or f.rel in found)}
    bad |= {c.rel for c in compacted if not c.loads}
    damage.bad_compacted = sorted(d for d in bad if is_compact_dir(d.rsplit("/", 1)[-1]))
    return damage


def index_file_manifest(st: Storage, tag: str, slices: list[int],
                        root: str | None = None) -> list[IndexFileEntry]:
    """The index files of load `tag` (slice, name, size, rows, SHA-256), for its commit record.

    `root` is the index directory (default) or a rebuild's staging directory of the same layout.
    """
    base = root or st.path(INDEX)
    out = []
    for n in slices:
        for p in st.list_files(f"{base}/{load_rel(n, tag)}", ".parquet"):
            out.append(IndexFileEntry(slice=n, name=p.rsplit("/", 1)[1],
                                      size=int(st.fs.info(p).get("size") or 0),
                                      rows=st.parquet_rows(p), sha256=st.sha256(p)))
    return out


def damaged_message(ds: DatasetConfig, what: str) -> str:
    return (f"dataset {ds.name!r}: the key index is damaged ({what}); loads will not run "
            f"on it. Rebuild it from unique: {rebuild_command(ds.name)} (or, in Dagster, launch "
            "the dataset's index rebuild job; or set on_damaged_index: rebuild)")


@dataclass(frozen=True)
class IndexReadFailure:
    """An index file a Spark read failed on: `rel` (path below index/), and `kind`: "checksum"
    (a Hadoop ChecksumException: other bytes) or "missing" (the file went away after the load
    listed it, e.g. the index directory deleted under a running load)."""

    rel: str
    kind: Literal["checksum", "missing"]

    def describe(self) -> str:
        return (f"index/{self.rel} fails its checksum when read" if self.kind == "checksum" else
                f"index/{self.rel} disappeared while the load read it")


# what Spark's error text says for each kind of failed index read
_READ_FAILURES: tuple[tuple[Literal["checksum", "missing"], tuple[str, ...]], ...] = (
    ("checksum", ("ChecksumException",)),
    ("missing", ("FILE_NOT_EXIST", "FileNotFoundException")))


def index_read_failure(error: BaseException) -> IndexReadFailure | None:
    """The index file a failed Spark read names, if the failure is damage to an index file
    (checksum mismatch or a file gone since it was listed); None for any other error."""
    text = str(error)
    for kind, marks in _READ_FAILURES:
        at = min((text.index(m) for m in marks if m in text), default=-1)
        if at < 0:
            continue
        m = CHECKSUM_PATH.search(text[at:]) or (CHECKSUM_PATH.search(text) if kind == "checksum"
                                                 else None)
        if m:
            return IndexReadFailure(m.group(1), kind)
    return None
