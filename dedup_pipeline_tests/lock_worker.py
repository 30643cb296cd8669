"""A process that races for the dataset lock (test_integrity): no Spark, just the lock code."""

from __future__ import annotations

from typing import Any

from dedup_pipeline.engine.core.lock import DatasetLockedError, Lock
from dedup_pipeline.engine.core.storage import Storage


def try_acquire(st: Storage, wid: int) -> tuple[Lock, bool]:
    """One attempt of worker `wid` at the dataset's lock: the lock and whether it was taken."""
    lock = Lock(st, owner=f"worker {wid}")
    try:
        lock.acquire()
    except DatasetLockedError:
        return lock, False
    return lock, True


def race(root: str, wid: int, trials: int, barrier: Any, got: Any, workers: int) -> None:
    """Per trial: wait for the parent's stale lock, try to acquire, report, release when all tried."""
    st = Storage(root)
    for t in range(trials):
        barrier.wait()  # the parent has planted a stale lock
        lock, mine = try_acquire(st, wid)
        got[t * workers + wid] = 1 if mine else 0
        barrier.wait()  # everyone has tried while the winner still holds it
        if mine:
            lock.release()
        barrier.wait()  # released: the parent may plant the next stale lock
