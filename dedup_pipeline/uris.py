"""Dataset paths: a local path, a ``file:`` URI or a remote URI (``s3://``, ``hdfs://``), spelled one
way here for the config (resolving, overlap and file checks) and for `engine/core/storage.py` (fsspec
and Spark).

Pure Python, below both.
"""

from __future__ import annotations

import os
from pathlib import Path


def normalize_uri(uri: str) -> str:
    """Spell local URIs the way fsspec reads them: ``file://localhost/x`` -> ``file:///x``.

    fsspec takes the host of ``file://host/x`` for the first path segment; a file URI naming
    another host cannot be honoured by either fsspec or Spark, so it is refused here.
    """
    if uri.startswith("file://") and not uri.startswith("file:///"):
        host, _, rest = uri[len("file://"):].partition("/")
        if host not in ("", "localhost"):
            raise ValueError(f"{uri!r}: a file:// URI must be local (file:///path); use a shared "
                             "mount, hdfs:// or an object store for data on other hosts")
        return f"file:///{rest}"
    return uri


def local_path(uri: str) -> str | None:
    """The local path a dataset path names, or None for a non-local URI (a remote scheme, or a
    ``file://`` URI of another host)."""
    try:
        uri = normalize_uri(uri)
    except ValueError:
        return None
    if uri.startswith("file:"):
        rest = uri[len("file:"):]
        if rest.startswith("//"):  # file:///x
            rest = rest[2:]
        return os.path.normpath(rest) if rest else None
    if "://" in uri:
        return None
    return os.path.normpath(uri)


def resolve_path(base: Path | None, p: str) -> str:
    """A dataset path as configured: a URI as written, a local path absolute (relative to `base`,
    the config file's directory, when given)."""
    if "://" in p or p.startswith("file:"):
        return p
    return os.path.abspath(p) if os.path.isabs(p) or base is None else str((base / p).resolve())


def file_in_the_way(output: str) -> str | None:
    """Why output root `output` cannot be a directory (it, or a parent, is a file), else None."""
    local = local_path(output)
    if local is None:
        return None
    p = Path(local)
    for q in (p, *p.parents):
        if q.exists():
            if q.is_dir():
                return None
            what = "is a file" if q == p else f"lies under {q}, which is a file"
            return f"{output} {what}, not a directory"
    return None


def comparable_root(uri: str) -> str:
    """`uri` spelled so that one root equal to or inside another is a string prefix of it."""
    local = local_path(uri)
    return (local if local is not None else uri).rstrip("/") + "/"
