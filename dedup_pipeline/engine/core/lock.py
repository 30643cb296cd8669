"""The dataset lock: one writer per dataset across processes and hosts (design.md R10, R10a).

A lock file in the dataset's storage (`_lock`), so runs from any process never interleave.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from dedup_pipeline.engine.core.storage import Storage, fsync_dir
from dedup_pipeline.errors import UserError


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
