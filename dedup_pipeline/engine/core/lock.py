"""The dataset lock: one writer per dataset across processes and hosts (design.md R10, R10a).

A lock file in the dataset's storage (`_lock`), so runs from any process never interleave. On a
local file system it is held for as long as its process lives (`flock` guard, take-over of a dead
pid's lock). On an object store it is a lease (design.md R10b): taken by a conditional create
(``If-None-Match: *``), renewed by a heartbeat and taken over after its expiry by a write
conditional on the ETag read (``If-Match``), released by a conditional delete. Every lease carries
a generation above the one it replaced, written into the commit records; a holder that lost its
lease cannot change a record (`fence`, called by the commit log before each change).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from dedup_pipeline.engine.core.storage import Conflict, Storage, fsync_dir
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import now_stamp


class DatasetLockedError(UserError, RuntimeError):
    """Another run holds the dataset's lock (design.md R10)."""

    stage = "the dataset lock (another run of {ds} held it)"
    fix = ("nothing was written; wait for the other run to finish and launch {hours} again only if "
           "it is still not loaded (runs of one dataset queue when the pool limit {pool}=1 is set)")


class LeaseLostError(UserError, RuntimeError):
    """The run's lease on the dataset expired and another run took it over (design.md R10b)."""

    stage = "the dataset lease (this run lost it: paused or cut off past its expiry)"
    fix = ("nothing more was committed by this run; the run that took the lease over goes on. "
           "Launch {hours} again only if they are still not loaded")


# How long a lease on an object store lasts without renewal, and how often its holder renews it.
# A taker waits for the expiry by its own clock: clocks of the hosts sharing a dataset must agree
# to well within LEASE_SECONDS (NTP keeps them within milliseconds).
LEASE_SECONDS = float(os.environ.get("DEDUP_LEASE_SECONDS", "60"))

# The leases this process holds, by dataset root: what `fence` checks before a record changes.
_HELD: dict[str, Lock] = {}


def fence(st: Storage) -> int | None:
    """Before a commit record changes: the generation of this process's lease on `st`'s dataset,
    renewed now at the store (``If-Match``), so a holder that lost it raises `LeaseLostError`
    instead of writing. None where the lock is not a lease (local file systems: a live holder
    never loses its lock) or is not held by this process (a read-only tool)."""
    held = _HELD.get(st.uri_root)
    if held is None:
        return None
    held.renew()
    return held.generation


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
    directory fsynced, and the lock read back to confirm this run owns it. On object stores the
    lock is a lease (the module's docstring).
    """

    storage: Storage
    owner: str
    path: str = ""
    token: str = ""
    lease_s: float = 0.0  # 0: LEASE_SECONDS
    generation: int | None = None  # of the lease held (object stores)
    etag: str = ""  # of the lease as this holder last wrote it
    renewed_at: float = 0.0  # monotonic time of the last renewal the store accepted
    lost: str = ""  # why the lease is no longer this holder's
    _body: dict | None = None
    _beat: threading.Thread | None = None
    _stop: threading.Event | None = None
    _mutex: threading.Lock | None = None

    def acquire(self) -> Lock:
        self.path = self.storage.path("_lock")
        self.token = uuid.uuid4().hex
        me = {"host": socket.gethostname(), "pid": os.getpid(), "owner": self.owner,
              "since": now_stamp(), "token": self.token,
              "started": _process_start(os.getpid())}
        self.storage.makedirs(self.storage.root)
        try:
            if self.storage.local:
                with self._guard() as guarded:
                    held = self._acquire_local(json.dumps(me), guarded)
            else:
                held = self._acquire_lease(me)
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
        if not held or (probe._lease_expired(held) if not storage.local else cls._is_stale(held)):
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
        self._stop_heartbeat()
        _HELD.pop(self.storage.uri_root, None)
        if self.lost:
            return  # another run's lease now: never deleted by this one
        with contextlib.suppress(Conflict):  # taken over meanwhile: the other run's lease stays
            self.storage.delete(self.path, if_match=self.etag)

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

    # -- object stores: a lease -------------------------------------------------------------------
    def _acquire_lease(self, me: dict) -> dict | None:
        """Take the lease: create `_lock` if absent, or replace an expired (or dead local) one
        conditionally on the ETag read; None on success, else what holds it."""
        st = self.storage
        st.check_conditional_writes()
        self.lease_s = self.lease_s or LEASE_SECONDS
        for _ in range(5):  # a racing taker or releaser: read again
            got = st.get(self.path)
            held: dict | None = None
            if got is not None:
                held = _parse(got[0])
                if held is not None and not self._lease_expired(held):
                    return held
            prev = held.get("generation") if held else None
            gen = max(int(prev) + 1 if isinstance(prev, int) else 0, time.time_ns() // 1000)
            sent = time.monotonic()  # the lease runs from before the request, as `expires` does
            body = {**me, "generation": gen, "lease_seconds": self.lease_s,
                    "expires": time.time() + self.lease_s}
            try:
                if got is None:
                    self.etag = st.put(self.path, _dump(body), if_absent=True)
                else:
                    self.etag = st.put(self.path, _dump(body), if_match=got[1])
            except Conflict:
                continue
            self.generation, self.renewed_at, self.lost = gen, sent, ""
            self._body = body
            _HELD[st.uri_root] = self
            self._start_heartbeat()  # renewed while the moves below run, however long they take
            try:
                st.finish_moves()  # a previous holder's directory moves a crash cut short
            except BaseException:
                self.release()  # this run did nothing yet: its lease goes back at once
                raise
            return None
        got = st.get(self.path)
        return (_parse(got[0]) if got else None) or {}

    def _lease_expired(self, held: dict) -> bool:
        exp = held.get("expires")
        if not isinstance(exp, int | float):
            return True  # not a lease this product wrote whole: taken over
        if time.time() > exp:
            return True
        return held.get("host") == socket.gethostname() and self._is_stale(held)

    def renew(self) -> None:
        """Extend the lease at the store (``If-Match`` on the ETag this holder wrote);
        `LeaseLostError` if it is no longer this holder's."""
        if self._mutex is None:
            self._mutex = threading.Lock()
        with self._mutex:
            if self.lost:
                raise LeaseLostError(self.lost)
            if time.monotonic() - self.renewed_at > self.lease_s:
                # expired by this holder's own clock: another run may hold it now even if the
                # renewal below would still be accepted (nobody took it over yet)
                self.lost = (f"the lease on {self.storage.uri_root} expired "
                             f"({time.monotonic() - self.renewed_at:.0f} s since its last renewal, "
                             f"lease {self.lease_s:.0f} s): this run was paused or cut off")
            else:
                sent = time.monotonic()  # a slow answer must not lengthen the lease by this clock
                body = {**(self._body or {}), "expires": time.time() + self.lease_s}
                try:
                    self.etag = self.storage.put(self.path, _dump(body), if_match=self.etag)
                    self._body = body
                    self.renewed_at = sent
                    return
                except Conflict:
                    self.lost = (f"the lease on {self.storage.uri_root} was taken over by another "
                                 "run after it expired")
            raise LeaseLostError(f"dataset at {self.storage.uri_root}: {self.lost}; this run "
                                 "stops before changing any commit record")

    def _start_heartbeat(self) -> None:
        self._stop = threading.Event()
        stop = self._stop

        def beat() -> None:
            while not stop.wait(self.lease_s / 4):
                try:
                    self.renew()
                except LeaseLostError:
                    return
                except Exception:  # noqa: BLE001 - a failed request: the next beat retries
                    continue

        self._beat = threading.Thread(target=beat, name="dedup-lease", daemon=True)
        self._beat.start()

    def _stop_heartbeat(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=5)
        self._beat = self._stop = None

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
        if _is_zombie(pid):  # killed, not yet reaped by its parent: it never runs again
            return True
        # the pid runs, but is it still the owner? A pid reused by another process (after a
        # reboot or wrap-around) has another start time than the one the lock recorded
        started = held.get("started")
        now = _process_start(pid)
        return isinstance(started, int) and now is not None and now != started


def _dump(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True).encode()


def _parse(data: bytes) -> dict | None:
    try:
        held = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return held if isinstance(held, dict) else None


def _is_zombie(pid: int) -> bool:
    """Whether process `pid` has exited and waits for its parent to reap it (state Z; Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


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
