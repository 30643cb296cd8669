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

from dedup_pipeline.engine import formats
from dedup_pipeline.engine.columns import LOAD_HOUR_PARTITION
from dedup_pipeline.engine.commits import IndexFileEntry

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
    def of(cls, entry: IndexFileEntry, tag: str) -> IndexFile:
        """The file a commit record's `entry` lists, where it lies: of load `tag`."""
        return cls(tag=tag, slice=entry.slice, name=entry.name, size=entry.size, rows=entry.rows,
                   sha256=entry.sha256)

    @property
    def rel(self) -> str:
        """Path below the index directory."""
        return f"{slice_dir(self.slice)}/{self.dir or load_dir(self.tag)}/{self.name}"

    @property
    def holds(self) -> tuple[str, ...]:
        return self.loads or (self.tag,)
