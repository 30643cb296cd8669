"""Every list, rename and delete of the dataset's files goes through here (fsspec), not the JVM.

Why fsspec: the same calls work from a Spark Connect client (no JVM) and on object stores.
A root may be a plain path, a ``file://`` URI or any URI that both Spark and fsspec understand
(``hdfs://namenode:8020/lake`` through pyarrow's HDFS client, ``s3a://bucket/lake`` through s3fs).
fsspec strips the scheme (and for HDFS the namenode) from the paths it returns; `to_uri` puts the
root's own back, so what Spark is given always names the same file system the root did.
Atomicity (design.md L3): on a local Linux file system a partition is swapped in with
``renameat2(RENAME_EXCHANGE)``, so a reader sees the old complete directory or the new one, never
neither. Elsewhere it is two renames (old aside, new in): readers may briefly see no partition, never
a mix (HDFS renames a directory atomically). On object stores a "rename" is copy+delete and is not
atomic at all (see deploy/README.md, "Where data lives").
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import struct
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from dedup_pipeline.errors import UserError
from dedup_pipeline.uris import normalize_uri

_RENAME_EXCHANGE = 2
TRASH = "_trash"
_AT_FDCWD = -100
# Rows per Parquet file that the load's outputs and compacted index files are cut into.
ROWS_PER_FILE = 1_000_000
# Threads that read small files at once (explain's digests, packs, index entries, rows): pyarrow
# releases the GIL while it reads, so as many as cores; more only contend. One point lookup over
# 720 hours on 2 cores (2026-11-28, medians of 10): 8 threads 0.71 s, 4 0.58 s, 3 0.58 s,
# 2 0.47 s, 1 0.64 s.
READERS = min(8, os.cpu_count() or 2)


# File-system requests made through `Storage`, by kind, process-wide: what the bookkeeping
# benchmark counts, because on an object store each is a billed round trip.
REQUESTS: Counter[str] = Counter()
_COUNTED = frozenset({"ls", "find", "info", "exists", "isdir", "open", "rm", "mv", "makedirs",
                      "cat_file", "pipe_file", "glob", "walk", "du"})


class _CountingFS:
    """The fsspec file system, with each call from this package counted in `REQUESTS`.

    Only the calls this package makes are counted (one `ls` is one request), not the calls an
    fsspec implementation makes internally; local `os` calls in `Storage` count themselves.
    """

    def __init__(self, fs: Any):
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name not in _COUNTED or not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            REQUESTS[name] += 1
            return attr(*args, **kwargs)
        return counted


@contextlib.contextmanager
def count_requests() -> Iterator[Counter[str]]:
    """The requests made inside the `with`, by kind (filled in when it exits)."""
    before = REQUESTS.copy()
    out: Counter[str] = Counter()
    try:
        yield out
    finally:
        out.update(REQUESTS - before)


def _libc() -> Any | None:
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return lib if hasattr(lib, "renameat2") else None
    except OSError:
        return None


_LIBC = _libc()


def fsync_dir(path: str) -> None:
    """fsync a local directory, so a rename or create inside it is durable (POSIX)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:  # some file systems refuse fsync on a directory
        if e.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


_GLOB_CHARS = re.compile(r"([\\\[\]*?{}])")


def glob_escape(path: str) -> str:
    """`path` as a Hadoop glob that matches only itself (`[`, `*`, `{`... escaped).

    Spark globs every path it reads (never a path it writes); any name a file system allows must
    be read as itself, in landing files and output roots alike.
    """
    return _GLOB_CHARS.sub(r"\\\1", path)


class Storage:
    """A dataset output root plus the file system it lives on."""

    def __init__(self, root: str):
        root = normalize_uri(root)
        fs, self.root = fsspec.core.url_to_fs(root)
        self.root = self.root.rstrip("/")
        self.local = isinstance(fs, LocalFileSystem)
        self.fs = _CountingFS(fs)
        self.uri_root = root.rstrip("/")

    # -- paths ---------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def spark_path(self, *parts: str) -> str:
        """A path Spark can write to (local paths stay plain; URIs keep their scheme)."""
        if self.local:
            return self.path(*parts)
        return "/".join([self.uri_root, *parts])

    def read_path(self, *parts: str) -> str:
        """`spark_path` for reading: glob characters in the root or the parts are escaped."""
        return glob_escape(self.spark_path(*parts))

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

    def list_names(self, path: str) -> list[str]:
        """Names of the entries of `path` (one listing, no per-entry metadata); [] if absent.

        Locally ``os.listdir``: fsspec's local `ls` stats every entry even without detail
        (measured 16-20 ms against 4 ms for 8,760 names).
        """
        if self.local:
            REQUESTS["ls"] += 1
            try:
                return os.listdir(path)
            except (FileNotFoundError, NotADirectoryError):
                return []
        try:
            return [n.rstrip("/").rsplit("/", 1)[-1] for n in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []

    def file_sizes(self, path: str, suffix: str = "") -> dict[str, int]:
        """Size of every data file below `path` (recursive, as `list_files` selects them), from
        one recursive listing: no request per file."""
        try:
            found = self.fs.find(path, detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for f, info in found.items():
            base = os.path.basename(f)
            if base.startswith((".", "_")) or not base.endswith(suffix):
                continue
            out[f] = int(info.get("size") or 0)
        return out

    def dir_mtime(self, path: str) -> str | None:
        """A directory's modification time, which changes when an entry is created, removed or
        renamed into it (POSIX, HDFS); None where directories have none (object stores)."""
        if self.local:
            REQUESTS["info"] += 1
            try:
                return str(os.stat(path).st_mtime_ns)
            except OSError:
                return None
        try:
            info = self.fs.info(path)
        except (FileNotFoundError, OSError):
            return None
        m = info.get("mtime")
        return repr(m) if info.get("type") == "directory" and isinstance(m, int | float) else None

    def stamp_dir(self, path: str) -> str | None:
        """Set a local directory's mtime to a value no clock tick produces (the current time
        plus random nanoseconds), so any later change to its entries, even within the same
        coarse clock tick, gives it another mtime; returns the new `dir_mtime`. Elsewhere only
        reads it."""
        if not self.local:
            return self.dir_mtime(path)
        try:
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, time.time_ns() + 1 + (uuid.uuid4().int % 999_983)))
        except OSError:
            return None
        return self.dir_mtime(path)

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

    def parquet_schema(self, path: str) -> pa.Schema:
        """The Arrow schema of a Parquet file, from its footer."""
        with self.fs.open(path, "rb") as fh:
            return pq.ParquetFile(fh).schema_arrow

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
        """Write via a temp file and a rename, so readers never see half a file.

        Locally the file is fsynced before the rename and its directory after it, so once this
        returns the new content survives a power loss (a rename of an unsynced file can leave an
        empty file under the new name). Elsewhere the store's own write semantics apply.
        """
        parent = path.rsplit("/", 1)[0]
        self.makedirs(parent)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        if self.local:
            REQUESTS["put"] += 1
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(parent)
            return
        with self.fs.open(tmp, "w") as f:
            f.write(text)
        self.fs.mv(tmp, path)

    def sync_tree(self, path: str) -> None:
        """fsync every file and directory below `path` and `path`'s parent (local only).

        Spark's writers do not fsync; a load calls this on what it wrote before its commit record,
        so a committed hour's files are on disk before the record that says they are.
        """
        if not self.local or not os.path.exists(path):
            return
        for dirpath, _dirs, files in os.walk(path):
            for name in files:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(dirpath)
        fsync_dir(os.path.dirname(path.rstrip("/")))

    def crc_matches(self, path: str) -> bool | None:
        """Whether a file agrees with its Hadoop ``.crc`` sidecar; None if it has none.

        Format (ChecksumFileSystem): ``crc\\0``, a big-endian int32 bytes-per-checksum, then one
        big-endian CRC-32 (zlib's) per chunk. Used for index files whose records predate hashes.
        """
        d, name = path.rsplit("/", 1)
        try:
            with self.fs.open(f"{d}/.{name}.crc", "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        if len(raw) < 8 or raw[:4] != b"crc\0":
            return False
        step = struct.unpack(">i", raw[4:8])[0]
        if step <= 0:
            return False
        sums = raw[8:]
        i = 0
        with self.fs.open(path, "rb") as f:
            while chunk := f.read(step):
                if sums[4 * i:4 * i + 4] != struct.pack(">I", zlib.crc32(chunk)):
                    return False
                i += 1
        return len(sums) == 4 * i

    def sha256(self, path: str) -> str:
        """Hex SHA-256 of a file's bytes (read as stored: no Hadoop .crc is consulted)."""
        h = hashlib.sha256()
        with self.fs.open(path, "rb") as f:
            while chunk := f.read(4 << 20):
                h.update(chunk)
        return h.hexdigest()

    def write_json_atomic(self, path: str, obj: Any) -> None:
        self.write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True))

    def move(self, src: str, dst: str) -> None:
        """Rename src to dst (dst must not exist)."""
        self.makedirs(dst.rsplit("/", 1)[0])
        if self.local:
            REQUESTS["mv"] += 1
            os.rename(src, dst)
            fsync_dir(dst.rsplit("/", 1)[0])  # the rename itself survives a power loss
            fsync_dir(src.rsplit("/", 1)[0])
        else:
            self.fs.mv(src, dst, recursive=True)

    def replace_dir(self, new: str, target: str) -> None:
        """Make directory `new` become `target`, replacing any old `target` (design.md L3).

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
                fsync_dir(target.rsplit("/", 1)[0])
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


class DatasetLockedError(UserError, RuntimeError):
    """Another run holds the dataset's lock (design.md R10)."""

    stage = "the dataset lock (another run of {ds} held it)"
    fix = ("nothing was written; wait for the other run to finish and launch {hours} again only if "
           "it is still not loaded (runs of one dataset queue when the pool limit {pool}=1 is set)")


@dataclass
class Lock:
    """An exclusive lock file in the dataset's storage, so runs from any process never interleave.

    A lock whose owner process is gone (same host, dead pid) is stale and taken over, so a killed
    run needs no manual clean-up; two takers of one stale lock never both win (design.md R10a).
    Locks from other hosts are honoured until removed.

    Local POSIX file system: every acquire and release runs under an OS lock (``flock``) on the
    guard file ``_lock.guard``, so "read the lock, see it stale, replace it" is one step that no
    other process can interleave with; the OS drops the guard when its holder dies. A new lock is
    written to a temp file, fsynced, and linked (create) or renamed (take-over) into ``_lock``, the
    directory fsynced, and the lock read back to confirm this run owns it. Object stores have no
    create-if-absent: there the lock is best effort (see docs/operations.md, "One run at a time").
    """

    storage: Storage
    owner: str
    path: str = ""
    token: str = ""

    def acquire(self) -> Lock:
        self.path = self.storage.path("_lock")
        self.token = uuid.uuid4().hex
        me = {"host": socket.gethostname(), "pid": os.getpid(), "owner": self.owner,
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "token": self.token,
              "started": _process_start(os.getpid())}
        self.storage.makedirs(self.storage.root)
        try:
            if self.storage.local:
                with self._guard() as guarded:
                    held = self._acquire_local(json.dumps(me), guarded)
            else:
                held = self._acquire_remote(json.dumps(me))
        except OSError as e:  # e.g. `_lock` or `_lock.guard` is a directory, or not writable
            raise DatasetLockedError(
                f"dataset at {self.storage.uri_root}: the lock {self.path} cannot be taken "
                f"({e}); no load runs without it. Check that no run is active, then remove "
                f"{self.path} and {self.path}.guard if they are not plain files") from e
        if held is None:
            return self
        who = (f"{held.get('owner')} (pid {held.get('pid')} on {held.get('host')}, since "
               f"{held.get('since')})" if held else "another run")
        raise DatasetLockedError(
            f"dataset at {self.storage.uri_root} is locked by {who}; two loads of one dataset "
            f"never run at once. If that run is dead (on this host: no process of its pid runs "
            f"it), delete {self.path}."
        )

    @classmethod
    def holder(cls, storage: Storage) -> str | None:
        """Who holds the dataset's lock right now ("owner (pid P on host, since T)"), None if
        nobody does (no lock file, or a stale one: its process is gone). Read only: a caller
        deciding whether to launch a load that would meet the lock (the landing sensor)."""
        probe = cls(storage, owner="")
        probe.path = storage.path("_lock")
        try:
            held = probe._read()
        except OSError:
            return None
        if not held or cls._is_stale(held):
            return None
        return (f"{held.get('owner')} (pid {held.get('pid')} on {held.get('host')}, since "
                f"{held.get('since')})")

    def release(self) -> None:
        if not self.path:
            return
        if self.storage.local:
            with self._guard():
                held = self._read()
                if held and held.get("token") == self.token:
                    os.remove(self.path)
                    fsync_dir(self.storage.root)
            return
        held = self._read()
        if held and held.get("token") == self.token:
            self.storage.remove(self.path)

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.release()
            return
        try:  # the body's own error is the one to report, never the release's
            self.release()
        except Exception as e:  # noqa: BLE001 - e.g. the same full or read-only disk
            exc.add_note(f"the dataset lock {self.path} could not be released either: {e}")

    # -- local: under the guard -----------------------------------------------------------------
    @contextlib.contextmanager
    def _guard(self) -> Iterator[bool]:
        """Hold the OS lock on ``_lock.guard``; yields False where the file system has no flock.

        The guard is locked by inode: if the file was deleted (and maybe recreated) between the
        open and the flock, the lock is on a name nobody else opens, so it is taken again.
        """
        guard = self.path + ".guard"
        while True:
            fd = os.open(guard, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                yield False  # no OS lock here: only the atomic create (link) is safe
                return
            try:
                same = os.fstat(fd).st_ino == os.stat(guard).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            try:
                yield True
            finally:
                os.close(fd)  # closing drops the flock
            return

    def _acquire_local(self, text: str, guarded: bool = True) -> dict | None:
        """Create or take over `_lock`; None on success, else what holds it ({} if unreadable)."""
        tmp = f"{self.path}.tmp-{self.token}"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            try:
                os.link(tmp, self.path)  # atomic create-if-absent, with the whole content
            except FileExistsError:
                held = self._read()
                # under the guard a lock is written whole, so an unreadable one is a dead write
                if held is not None and not self._is_stale(held):
                    return held
                if not guarded:  # without the OS lock, read-stale-then-replace is a race
                    raise DatasetLockedError(
                        f"dataset at {self.storage.uri_root}: the lock {self.path} was left by a "
                        f"run that is gone ({held}), and this file system has no flock to take "
                        f"it over safely; check that no run is active, then delete {self.path}") from None
                os.replace(tmp, self.path)  # take-over: nobody else can act between read and this
            fsync_dir(self.storage.root)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        mine = self._read()
        if not mine or mine.get("token") != self.token:  # cannot happen under the guard; be sure
            return mine or {}
        return None

    # -- elsewhere: best effort -----------------------------------------------------------------
    def _acquire_remote(self, text: str) -> dict | None:
        held = self._read() if self.storage.exists(self.path) else None
        if held is not None and not self._is_stale(held):
            return held
        with self.storage.fs.open(self.path, "w") as f:
            f.write(text)
        time.sleep(0.2)  # a racing writer's object would now be visible: re-read to confirm
        mine = self._read()
        if not mine or mine.get("token") != self.token:
            return mine or {}
        return None

    def _read(self) -> dict | None:
        try:
            held = json.loads(self.storage.read_text(self.path))
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        return held if isinstance(held, dict) else None

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
            pass
        # the pid runs, but is it still the owner? A pid reused by another process (after a
        # reboot or wrap-around) has another start time than the one the lock recorded
        started = held.get("started")
        now = _process_start(pid)
        return isinstance(started, int) and now is not None and now != started


def _process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22; Linux),
    plus the boot id so a reboot changes it too; None where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        ticks = int(stat.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = int(f.read().strip().replace("-", "")[:12], 16)
    except (OSError, ValueError):
        boot = 0
    return boot * 10**15 + ticks
