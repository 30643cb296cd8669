"""Every list, rename and delete of the dataset's files goes through here (fsspec), not the JVM.

Why fsspec: the same calls work from a Spark Connect client (no JVM) and on object stores.
A root may be a plain path, a ``file://`` URI or any URI that both Spark and fsspec understand
(``hdfs://namenode:8020/lake`` through pyarrow's HDFS client, ``s3a://bucket/lake`` through s3fs).
fsspec strips the scheme (and for HDFS the namenode) from the paths it returns; `to_uri` puts the
root's own back, so what Spark is given always names the same file system the root did.
Atomicity (SPEC L3): on a local Linux file system a partition is swapped in with
``renameat2(RENAME_EXCHANGE)``, so a reader sees the old complete directory or the new one, never
neither. Elsewhere it is two renames (old aside, new in): readers may briefly see no partition, never
a mix (HDFS renames a directory atomically). On object stores a "rename" is copy+delete and is not
atomic at all (see deploy/README.md, "Where data lives").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

_RENAME_EXCHANGE = 2
TRASH = "_trash"
_AT_FDCWD = -100


def _libc() -> Any | None:
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return lib if hasattr(lib, "renameat2") else None
    except OSError:
        return None


_LIBC = _libc()


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


class Storage:
    """A dataset output root plus the file system it lives on."""

    def __init__(self, root: str):
        root = normalize_uri(root)
        self.fs, self.root = fsspec.core.url_to_fs(root)
        self.root = self.root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        self.uri_root = root.rstrip("/")

    # -- paths ---------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def spark_path(self, *parts: str) -> str:
        """A path Spark can write to (local paths stay plain; URIs keep their scheme)."""
        if self.local:
            return self.path(*parts)
        return "/".join([self.uri_root, *parts])

    def to_uri(self, path: str) -> str:
        """The name Spark needs for `path`, a path under the root as this module returns it.

        Local paths stay plain. Elsewhere the root's own URI prefix replaces the stripped root,
        so ``s3a://`` stays ``s3a://`` (fsspec's `unstrip_protocol` would say ``s3://``, which
        Hadoop does not map by default) and ``hdfs://namenode:8020`` keeps its namenode.
        """
        if self.local or "://" in path:
            return path
        if path == self.root or path.startswith(self.root + "/"):
            return self.uri_root + path[len(self.root):]
        return self.fs.unstrip_protocol(path)

    # -- queries -------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def list_dirs(self, path: str) -> list[str]:
        """Names (not paths) of the sub-directories of `path`; [] if it does not exist."""
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        return sorted(os.path.basename(e["name"].rstrip("/")) for e in entries
                      if e["type"] == "directory")

    def list_files(self, path: str, suffix: str = "") -> list[str]:
        """Full paths of data files in `path` (recursive), skipping hidden and _-prefixed ones."""
        try:
            found = self.fs.find(path)
        except FileNotFoundError:
            return []
        out = []
        for f in found:
            base = os.path.basename(f)
            if base.startswith((".", "_")) or not base.endswith(suffix):
                continue
            out.append(f)
        return sorted(out)

    def parquet_rows(self, path: str) -> int:
        """Rows of a Parquet file, or of every Parquet file below a directory, from the footers."""
        files = [path] if path.endswith(".parquet") else self.list_files(path, ".parquet")
        total = 0
        for f in files:
            with self.fs.open(f, "rb") as fh:
                total += pq.ParquetFile(fh).metadata.num_rows
        return total

    def read_text(self, path: str) -> str:
        with self.fs.open(path, "r") as f:
            return f.read()

    def read_json(self, path: str) -> Any:
        return json.loads(self.read_text(path))

    # -- mutations -----------------------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def remove(self, path: str) -> None:
        """Remove a file or directory tree if present."""
        try:
            if self.fs.isdir(path):
                self.fs.rm(path, recursive=True)
            elif self.fs.exists(path):
                self.fs.rm(path)
        except FileNotFoundError:
            pass

    def write_text_atomic(self, path: str, text: str) -> None:
        """Write via a temp file and a rename, so readers never see half a file."""
        parent = path.rsplit("/", 1)[0]
        self.makedirs(parent)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        with self.fs.open(tmp, "w") as f:
            f.write(text)
        if self.local:
            os.replace(tmp, path)
        else:
            self.fs.mv(tmp, path)

    def write_json_atomic(self, path: str, obj: Any) -> None:
        self.write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True))

    def move(self, src: str, dst: str) -> None:
        """Rename src to dst (dst must not exist)."""
        self.makedirs(dst.rsplit("/", 1)[0])
        if self.local:
            os.rename(src, dst)
        else:
            self.fs.mv(src, dst, recursive=True)

    def replace_dir(self, new: str, target: str) -> None:
        """Make directory `new` become `target`, replacing any old `target` (SPEC L3).

        The replaced version is parked in `{root}/_trash/` rather than deleted, so a reader that
        resolved the old directory just before the swap can still finish reading it; `purge_trash`
        deletes parked versions once they are old enough.
        """
        self.makedirs(target.rsplit("/", 1)[0])
        parked = self.path(TRASH, f"{int(time.time())}-{uuid.uuid4().hex}")
        if self.local and os.path.isdir(target) and _LIBC is not None:
            rc = _LIBC.renameat2(_AT_FDCWD, new.encode(), _AT_FDCWD, target.encode(),
                                 _RENAME_EXCHANGE)
            if rc == 0:
                self.move(new, parked)  # `new` now holds the old contents
                return
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise OSError(err, os.strerror(err), target)
        if self.exists(target):
            self.move(target, parked)
        self.move(new, target)

    def purge_trash(self, older_than_s: float = 600.0) -> int:
        """Delete replaced partition versions parked more than `older_than_s` seconds ago."""
        now = time.time()
        purged = 0
        for name in self.list_dirs(self.path(TRASH)):
            parked_at = name.split("-", 1)[0]
            if not parked_at.isdigit() or now - int(parked_at) >= older_than_s:
                self.remove(self.path(TRASH, name))
                purged += 1
        return purged


class DatasetLockedError(RuntimeError):
    """Another run holds the dataset's lock (SPEC R10)."""


@dataclass
class Lock:
    """An exclusive lock file in the dataset's storage, so runs from any process never interleave.

    A lock whose owner process is gone (same host, dead pid) is stale and taken over, so a killed
    run needs no manual clean-up. Locks from other hosts are honoured until removed.
    """

    storage: Storage
    owner: str
    path: str = ""

    def acquire(self) -> Lock:
        self.path = self.storage.path("_lock")
        me = {"host": socket.gethostname(), "pid": os.getpid(), "owner": self.owner,
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for _ in range(2):
            if self._try_create(json.dumps(me)):
                return self
            held = self._read()
            if held is not None and self._is_stale(held):
                self.storage.remove(self.path)
                continue
            who = (f"{held.get('owner')} (pid {held.get('pid')} on {held.get('host')}, since "
                   f"{held.get('since')})" if held else "another run")
            raise DatasetLockedError(
                f"dataset at {self.storage.uri_root} is locked by {who}; two loads of one dataset "
                f"never run at once. If that run is dead on another host, delete {self.path}."
            )
        raise DatasetLockedError(f"could not acquire {self.path}")

    def release(self) -> None:
        held = self._read()
        if held and held.get("pid") == os.getpid() and held.get("host") == socket.gethostname():
            self.storage.remove(self.path)

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.release()
            return
        try:  # the body's own error is the one to report, never the release's (issue 21)
            self.release()
        except Exception as e:  # noqa: BLE001 - e.g. the same full or read-only disk
            exc.add_note(f"the dataset lock {self.path} could not be released either: {e}")

    def _try_create(self, text: str) -> bool:
        self.storage.makedirs(self.storage.root)
        if self.storage.local:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return True
        if self.storage.exists(self.path):
            return False
        with self.storage.fs.open(self.path, "w") as f:  # best effort on object stores
            f.write(text)
        return True

    def _read(self) -> dict | None:
        try:
            return json.loads(self.storage.read_text(self.path))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    @staticmethod
    def _is_stale(held: dict) -> bool:
        if held.get("host") != socket.gethostname():
            return False
        pid = held.get("pid")
        if not isinstance(pid, int):
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
