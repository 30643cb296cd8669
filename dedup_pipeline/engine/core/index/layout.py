"""Where the index lives on disk: every directory and file name of it, built and parsed here only.

The index's entry directories are Spark's hive-style partition names (``<column>=<value>``):
a load writes its entries partitioned by `SLICE` and a rebuild by `SLICE` and `LOAD`, so the
names Spark writes are the names read back here. Nothing else names an index path by hand, so a
change of layout is a change of this module (and of `INDEX_FORMAT`).

``{output}/index/``
    ``slice=<n>/load_hour=<tag>/part-*.parquet``  one load's entries of slice n
    ``slice=<n>/compact=<first>_<last>/``          merged loads, with ``_manifest.json``
    ``_staging/load_hour=<tag>/slice=<n>/``         a load's entries before they are published
    ``_damaged.json``                               files found with other content (health)
    ``_retention.json``                             what retention deleted below (live)
``{output}/_compact/slice=<n>/<dir>``               a compacted directory before its rename
``{output}/index_rebuild/``                          a full rebuild, swapped in whole
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from dedup_pipeline.engine.core import formats
from dedup_pipeline.engine.core.columns import LOAD_HOUR_PARTITION
from dedup_pipeline.engine.core.commits import IndexFileEntry
from dedup_pipeline.engine.core.records import Count, Record
from dedup_pipeline.engine.core.storage import Storage

INDEX = "index"
# Version of the entry layout, kept in every commit record and contract: the package's format
INDEX_FORMAT = formats.FORMAT
SLICE = "slice"  # partition column and directory key of a slice
LOAD = LOAD_HOUR_PARTITION  # partition column and directory key of one load's entries (as the outputs')
COMPACT = "compact"  # directory key of merged loads
STAGING = "_staging"  # below index/: a load's entries, staged before they are moved in place
WORK = "_compact"  # below the output root: where compacted directories are written first
REBUILD_STAGING = f"{INDEX}_rebuild"  # below the output root: a full rebuild's new index
MANIFEST = "_manifest.json"  # in a compacted directory: the loads and files it holds
DAMAGED = "_damaged.json"  # below index/: {rel: recorded sha256 or ""} found corrupt
RETENTION_STATE = "_retention.json"  # below index/: {"kept_from": v} after retention deleted


def slice_dir(n: int) -> str:
    return f"{SLICE}={n}"


def load_dir(tag: str) -> str:
    return f"{LOAD}={tag}"


def compact_dir(first: str, last: str) -> str:
    return f"{COMPACT}={first}_{last}"


def load_rel(n: int, tag: str) -> str:
    """Load `tag`'s directory of slice `n`, below the index (or a rebuild's staging) directory."""
    return f"{slice_dir(n)}/{load_dir(tag)}"


def staging_rel(tag: str) -> str:
    """Where load `tag` stages its entries, below the index directory."""
    return f"{STAGING}/{load_dir(tag)}"


def is_slice_dir(name: str) -> bool:
    """Whether `name` is spelled as a slice directory (its number may still not parse)."""
    return name.startswith(f"{SLICE}=")


def slice_number(name: str) -> int | None:
    """n of a ``slice=n`` directory name; None for anything else (a stray directory)."""
    if not is_slice_dir(name):
        return None
    try:
        return int(name.split("=", 1)[1])
    except ValueError:
        return None


def load_tag(name: str) -> str | None:
    """The tag of a ``load_hour=<tag>`` directory name; None for any other directory."""
    key, _, tag = name.partition("=")
    return tag if key == LOAD else None


def is_compact_dir(name: str) -> bool:
    return name.startswith(f"{COMPACT}=")


def rel_load(rel: str) -> str | None:
    """The load of a per-load file, from its path below the index (``slice=n/load_hour=T/f``)."""
    parts = rel.split("/")
    return load_tag(parts[1]) if len(parts) > 1 else None


# An index file's path below index/ as a Hadoop error message names it (inside a longer path)
CHECKSUM_PATH = re.compile(
    rf"({SLICE}=-?\d+/(?:{LOAD}|{COMPACT})=[^/\s]+/[^/\s]+?\.parquet)")


class IndexFile(IndexFileEntry):
    """An index file with the load(s) whose entries it holds: its place below the index."""

    tag: str  # the (earliest) load whose entries it holds
    dir: str = ""  # directory below the slice: "load_hour=<tag>" (default) or "compact=<a>_<b>"
    loads: tuple[str, ...] = ()  # every load it holds entries of (default: just `tag`)

    @classmethod
    def of(cls, entry: IndexFileEntry, tag: str, dir: str = "",
           loads: tuple[str, ...] = ()) -> IndexFile:
        """A listed file where it lies: of load `tag` (or, in a compacted directory `dir`, of
        `loads`)."""
        return cls(tag=tag, dir=dir, loads=loads, slice=entry.slice, name=entry.name,
                   size=entry.size, rows=entry.rows, sha256=entry.sha256)

    @property
    def rel(self) -> str:
        """Path below the index directory."""
        return f"{slice_dir(self.slice)}/{self.dir or load_dir(self.tag)}/{self.name}"

    @property
    def holds(self) -> tuple[str, ...]:
        return self.loads or (self.tag,)


class ManifestFile(Record):
    """One file of a compacted directory as its manifest lists it (the slice is the directory's)."""

    name: str
    size: Count
    rows: Count
    sha256: str


class Manifest(Record):
    """A compacted directory's ``_manifest.json``: the loads it merged and its files."""

    format: Literal[1] = formats.FORMAT
    slice: int
    loads: tuple[str, ...]
    files: tuple[ManifestFile, ...]


@dataclass(frozen=True)
class Compacted:
    """One compacted directory, as its manifest describes it."""

    slice: int
    dir: str  # "compact=<first>_<last>"
    loads: tuple[str, ...]  # empty if the manifest is missing (a damaged directory)
    files: tuple[ManifestFile, ...]
    other_format: str | None = None  # the line refusing a manifest of another format

    @property
    def rel(self) -> str:
        return f"{slice_dir(self.slice)}/{self.dir}"

    def index_files(self) -> list[IndexFile]:
        """Its files as index files holding every load it merged."""
        return [IndexFile(tag=min(self.loads, default=""), slice=self.slice, name=f.name,
                          size=f.size, rows=f.rows, dir=self.dir, loads=self.loads,
                          sha256=f.sha256)
                for f in self.files]


def list_compacted(st: Storage) -> list[Compacted]:
    out = []
    for sdir in st.list_dirs(st.path(INDEX)):
        n = slice_number(sdir)
        if n is None:
            continue
        for d in st.list_dirs(st.path(INDEX, sdir)):
            if not is_compact_dir(d):
                continue
            # missing, damaged or of another format: the directory is damaged (rebuilt from
            # unique, which deletes it)
            path = st.path(INDEX, sdir, d, MANIFEST)
            try:
                text = st.read_text(path)
            except (FileNotFoundError, UnicodeDecodeError):
                out.append(Compacted(n, d, (), ()))
                continue
            other = formats.problem_in_text(path, text, formats.REBUILD)
            if other is not None:
                out.append(Compacted(n, d, (), (), other.line))
                continue
            try:
                m = Manifest.read_json(text)
            except ValueError:
                out.append(Compacted(n, d, (), ()))
                continue
            out.append(Compacted(n, d, m.loads, m.files))
    return out


def covered(compacted: list[Compacted]) -> set[tuple[int, str]]:
    """(slice, load) pairs whose entries live in a compacted directory."""
    return {(c.slice, t) for c in compacted for t in c.loads}
