"""Every list, rename and delete of the dataset's files goes through here (fsspec), not the JVM.

Why fsspec: the same calls work from a Spark Connect client (no JVM) and on object stores.
A root may be a plain path, a ``file://`` URI or any URI that both Spark and fsspec understand
(``hdfs://namenode:8020/lake`` through pyarrow's HDFS client, ``s3a://bucket/lake`` through s3fs).
fsspec strips the scheme (and for HDFS the namenode) from the paths it returns; `to_uri` puts the
root's own back, so what Spark is given always names the same file system the root did.
Atomicity (design.md L3): on a local Linux file system a partition is swapped in with
``renameat2(RENAME_EXCHANGE)``, so a reader sees the old complete directory or the new one, never
neither. Elsewhere it is two renames (old aside, new in): readers may briefly see no partition, never
a mix (HDFS renames a directory atomically).

What each write needs is stated here, and local disk and object stores differ only in this module
(design.md L5, L5a, L5b): `put` writes one object whole, plainly, only if absent (``If-None-Match: *``) or
only over the version it read (``If-Match`` on its ETag); `get` returns the content with that ETag;
`delete` may be conditional on it. An object store has no rename: a directory `move` there is
copy, then delete, journaled in ``_moves/`` first so that the next holder of the dataset lock rolls
an interrupted one forward (`finish_moves`); files whose names start with ``_`` (manifests) are
copied last, so a directory's manifest never vouches for files not yet there.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import re
import time
import uuid
from typing import Any

import fsspec
import fsspec.asyn
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from dedup_pipeline.engine.core import hooks
from dedup_pipeline.objectstore import S3Settings, is_s3
from dedup_pipeline.uris import normalize_uri

_RENAME_EXCHANGE = 2
TRASH = "_trash"
_AT_FDCWD = -100
# Rows per Parquet file that the load's outputs and compacted index files are cut into.
ROWS_PER_FILE = 1_000_000

TMP = "_tmp"  # below the output root: what a load or a migration writes before moving it in
MOVES = "_moves"  # below the output root: the journal of directory moves on an object store


class Conflict(Exception):
    """A conditional write or delete was refused: the object exists (`put(if_absent=True)`), or it
    changed (or went) since the ETag the writer names was read."""


class UnsafeStoreError(RuntimeError):
    """The object store accepted a write it was told to refuse (it ignores conditional headers)."""


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


# (endpoint, bucket) whose conditional writes were checked in this process: one bucket name may
# name buckets of two stores (AWS and an S3-compatible one), and only the one probed is known safe
_PROBED: set[tuple[str | None, str]] = set()


def _etag(data: bytes) -> str:
    """An ETag for content written outside S3 (S3's own for a single-part PUT is its MD5 too)."""
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


def _precondition_failed(e: BaseException) -> bool:
    """Whether s3fs's error `e` is the store's 412 PreconditionFailed (or 409 for a conditional
    write racing another: S3 answers ConditionalRequestConflict)."""
    cause = e.__cause__ or e.__context__
    resp = getattr(cause, "response", None) or {}
    code = (resp.get("Error") or {}).get("Code")
    status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412) \
        or isinstance(e, FileExistsError)


async def _s3_get(fs: Any, bucket: str, key: str) -> tuple[bytes, str]:
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key)  # noqa: SLF001 - s3fs's client
    async with resp["Body"] as body:
        data = await body.read()
    return data, str(resp["ETag"])


def is_hidden(name: str) -> bool:
    """A name the product's data readers skip: bookkeeping (`_commits`, `_delta_log`, `_SUCCESS`,
    `_tmp`) and hidden (`.`) entries, as Spark's and Hive's readers skip them."""
    return name.startswith((".", "_"))


def is_data_file(name: str, suffix: str = "") -> bool:
    return not is_hidden(name) and name.endswith(suffix)


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
        # no listings cache on S3: fsspec shares one s3fs instance per process, and its cached
        # listings and ETags would hide what other processes (runs, Spark) wrote since, so that a
        # later Storage missed new records and read a rewritten one as "no longer exists"
        fs, self.root = fsspec.core.url_to_fs(
            root, **({**S3Settings.from_env().fsspec_options(), "use_listings_cache": False}
                     if is_s3(root) else {}))
        self.root = self.root.rstrip("/")
        self.local = isinstance(fs, LocalFileSystem)
        self.fs = fs
        self.uri_root = root.rstrip("/")
        self.s3 = type(fs).__module__.startswith("s3fs")

    # -- single objects: what each write needs (design.md L5) ------------------------------------
    def put(self, path: str, data: bytes, *, if_absent: bool = False,
            if_match: str | None = None) -> str:
        """Write the object `path` whole and return its new ETag. `if_absent`: only if there is
        none (`Conflict` otherwise); `if_match`: only over the version with that ETag.

        S3: one PUT with ``If-None-Match: *`` / ``If-Match``, decided by the store. Local: a
        fsynced temp file linked (absent) or renamed (otherwise) into place; the ETag is the
        content's MD5, and `if_match` is compared here (one writer per dataset holds the OS lock).
        """
        if self.s3:
            bucket, key, _ = self.fs.split_path(path)
            extra: dict[str, str] = {}
            if if_absent:
                extra["IfNoneMatch"] = "*"
            if if_match is not None:
                extra["IfMatch"] = if_match
            try:
                out = self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **extra)
            except OSError as e:
                if _precondition_failed(e):
                    raise Conflict(f"{self.to_uri(path)}: {'exists' if if_absent else 'changed'}"
                                   ) from None
                raise
            self.fs.invalidate_cache(path)
            return str(out["ETag"])
        parent = path.rsplit("/", 1)[0]
        self.makedirs(parent)
        if not self.local:  # another fsspec store: no conditional writes (design.md L5b)
            if if_absent and self.exists(path):
                raise Conflict(f"{self.to_uri(path)}: exists")
            if if_match is not None and (self.get(path) or (b"", ""))[1] != if_match:
                raise Conflict(f"{self.to_uri(path)}: changed")
            self.fs.pipe_file(path, data)
            return _etag(data)
        if if_match is not None and (self.get(path) or (b"", ""))[1] != if_match:
            raise Conflict(f"{path}: changed")
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if if_absent:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise Conflict(f"{path}: exists") from None
            else:
                os.replace(tmp, path)
            fsync_dir(parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        return _etag(data)

    def get(self, path: str) -> tuple[bytes, str] | None:
        """The object's content and its ETag, from one read; None if there is none."""
        if self.s3:
            bucket, key, _ = self.fs.split_path(path)
            try:
                return fsspec.asyn.sync(self.fs.loop, _s3_get, self.fs, bucket, key)
            except FileNotFoundError:
                return None
        try:
            with self.fs.open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return data, _etag(data)

    def delete(self, path: str, *, if_match: str | None = None) -> None:
        """Delete the object `path` (nothing if absent); with `if_match`, only the version with
        that ETag (`Conflict` if it changed)."""
        if self.s3 and if_match is not None:
            bucket, key, _ = self.fs.split_path(path)
            try:
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=if_match)
            except FileNotFoundError:
                pass
            except OSError as e:
                if not _precondition_failed(e):
                    raise
                if self.get(path) is not None:  # absent: nothing to delete (as on local disk)
                    raise Conflict(f"{self.to_uri(path)}: changed") from None
            self.fs.invalidate_cache(path)
            return
        if if_match is not None:
            got = self.get(path)
            if got is None:
                return
            if got[1] != if_match:
                raise Conflict(f"{self.to_uri(path)}: changed")
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)
        if self.local:
            fsync_dir(path.rsplit("/", 1)[0])

    def check_conditional_writes(self) -> None:
        """Refuse a store that ignores conditional writes (design.md L5b): the same probe key is
        written twice with ``If-None-Match: *``; the second must be refused. Once per process and
        store (S3 only: the OS's own link() is the local check)."""
        if not self.s3:
            return
        store = (getattr(self.fs, "endpoint_url", None), self.fs.split_path(self.root)[0])
        if store in _PROBED:
            return
        probe = self.path(MOVES, f".probe-{uuid.uuid4().hex}")
        self.put(probe, b"1", if_absent=True)
        try:
            self.put(probe, b"2", if_absent=True)
        except Conflict:
            _PROBED.add(store)
            return
        finally:
            self.delete(probe)
        raise UnsafeStoreError(
            f"the object store of {self.uri_root} ignores conditional writes (a second PUT with "
            "If-None-Match: * of one key was accepted): the dataset lock and the commit records "
            "cannot be made safe there. Use a store that honours If-None-Match and If-Match (AWS "
            "S3, MinIO, SeaweedFS >= 4.18, Ceph RGW >= 18, Cloudflare R2), or a local file system")

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
        return {f: int(info.get("size") or 0) for f, info in found.items()
                if is_data_file(os.path.basename(f), suffix)}

    def dir_mtime(self, path: str) -> str | None:
        """A directory's modification time, which changes when an entry is created, removed or
        renamed into it (POSIX, HDFS); None where directories have none (object stores)."""
        if self.local:
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
        return sorted(f for f in found if is_data_file(os.path.basename(f), suffix))

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
        self.put(path, text.encode())  # one home for "written whole" on disk and on a store

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

    def sha256(self, path: str) -> str:
        """Hex SHA-256 of a file's bytes, as stored."""
        h = hashlib.sha256()
        with self.fs.open(path, "rb") as f:
            while chunk := f.read(4 << 20):
                h.update(chunk)
        return h.hexdigest()

    def write_json_atomic(self, path: str, obj: Any) -> None:
        self.write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True))

    def move(self, src: str, dst: str) -> None:
        """Rename src to dst (dst must not exist).

        On an object store a file is copied, then deleted (a crash leaves both: the caller's own
        clean-up owns `src`); a directory's moves are journaled first (`_move_dirs`)."""
        if self.local:
            self.makedirs(dst.rsplit("/", 1)[0])
            os.rename(src, dst)
            fsync_dir(dst.rsplit("/", 1)[0])  # the rename itself survives a power loss
            fsync_dir(src.rsplit("/", 1)[0])
        elif self.fs.isdir(src):
            self._move_dirs([(src, dst)])
        else:
            self.fs.mv(src, dst)

    # -- directory moves on object stores: journaled, rolled forward (design.md L5a) ---------------
    def _move_dirs(self, moves: list[tuple[str, str]]) -> None:
        """Move directories in order as one journaled step: the journal entry is written first,
        then each move copies every file (``_``-named ones last) and deletes the source; the entry
        goes last. A crash in between leaves the entry, which `finish_moves` completes."""
        entry = self.path(MOVES, f"{time.time_ns()}-{uuid.uuid4().hex}.json")
        rel = [(self._rel(a), self._rel(b)) for a, b in moves]
        self.put(entry, json.dumps({"moves": rel}).encode())
        self._do_moves(moves)
        self.delete(entry)

    def _rel(self, path: str) -> str:
        if not (path == self.root or path.startswith(self.root + "/")):
            raise ValueError(f"{path} is not below {self.root}")
        return path[len(self.root) + 1:]

    def _do_moves(self, moves: list[tuple[str, str]]) -> None:
        for src, dst in moves:
            files = self.list_all(src)
            if not files:
                continue  # done before (a rolled-forward entry), or nothing to move
            have = self.list_all(dst)
            order = sorted(files, key=lambda f: (os.path.basename(f).startswith("_"), f))
            for i, f in enumerate(order):
                target = dst + f[len(src):]
                if have.get(target) != files[f]:  # copied before a crash: same size
                    self.fs.copy(f, target)
                if i == 0:
                    hooks.at("move_copied")  # a move cut short: the journal entry finishes it
            self.fs.rm(list(files))
            self.fs.invalidate_cache(src)
            self.fs.invalidate_cache(dst)

    def list_all(self, path: str) -> dict[str, int]:
        """Every object below `path` (hidden and ``_`` ones too) with its size; {} if none."""
        try:
            found = self.fs.find(path, detail=True)
        except FileNotFoundError:
            return {}
        return {f: int(i.get("size") or 0) for f, i in found.items() if i.get("type") != "directory"}

    def finish_moves(self) -> int:
        """Complete the directory moves a crash cut short (object stores; the dataset lock's new
        holder calls it first). Returns how many journal entries were completed."""
        if self.local:
            return 0
        done = 0
        for name in sorted(self.list_names(self.path(MOVES))):
            if not name.endswith(".json"):
                continue
            entry = self.path(MOVES, name)
            got = self.get(entry)
            if got is None:
                continue
            try:
                moves = [(self.path(a), self.path(b)) for a, b in json.loads(got[0])["moves"]]
            except (ValueError, KeyError, TypeError):
                moves = []  # a damaged entry names nothing to finish
            self._do_moves(moves)
            self.delete(entry)
            done += 1
        return done

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
        if not self.local:
            moves = [(target, parked)] if self.exists(target) else []
            self._move_dirs([*moves, (new, target)])
            return
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


def place_files(st: Storage, tmp: str, target: str) -> list[str]:
    """Move the Parquet files Spark wrote to `tmp` into partition directory `target`, beside any
    earlier version's (Spark's file names are unique per write); their new paths."""
    st.makedirs(target)
    out = []
    for f in st.list_files(tmp, ".parquet"):
        dst = f"{target}/{f.rsplit('/', 1)[1]}"
        st.move(f, dst)
        out.append(dst)
    return sorted(out)
