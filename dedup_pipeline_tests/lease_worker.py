"""Processes that hold or race for a dataset's lease on S3 (test_s3_lease): no Spark, just the lock
and the commit log against the real store the test started.

`race` runs in a `multiprocessing` worker. Run as a module, it is one holder the test pauses or
kills: ``python -m dedup_pipeline_tests.lease_worker hold <root> <lease_s> [<record json>]``
prints one JSON line per step on stdout and reads its next command from stdin.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.lock import LeaseLostError, Lock
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline_tests.lock_worker import try_acquire


def race(env: Mapping[str, str], root: str, wid: int, trials: int, barrier: Any, got: Any,
         mine_seen: Any, workers: int) -> None:
    """Per trial: wait for the parent's planted lease (or none), try to acquire, report, release
    when all tried. `got[t, wid]` = 1 if `acquire` returned; `mine_seen[t, wid]` = 1 if, then, the
    store's ``_lock`` carried this worker's token (what a second holder could not also see)."""
    os.environ.update(env)
    st = Storage(root)
    for t in range(trials):
        barrier.wait()  # the parent has planted the trial's lease (or removed it)
        lock, mine = try_acquire(st, wid)
        got[t * workers + wid] = 1 if mine else 0
        if mine:
            held = st.get(lock.path)
            mine_seen[t * workers + wid] = int(
                held is not None and json.loads(held[0]).get("token") == lock.token)
        barrier.wait()  # everyone has tried while the winner still holds it (the parent reads it)
        barrier.wait()
        if mine:
            lock.release()
        barrier.wait()  # released: the parent may plant the next trial's lease


def _say(**what: Any) -> None:
    print(json.dumps(what), flush=True)


def hold(root: str, lease_s: float, record_json: str | None) -> None:
    """Acquire the lease and say so; then obey stdin: ``write <hour>`` (a new commit record of
    that hour through `CommitLog.write`), ``fence``, ``release``, ``exit``."""
    st = Storage(root)
    lock = Lock(st, owner=f"holder {os.getpid()}", lease_s=lease_s).acquire()
    _say(step="held", pid=os.getpid(), generation=lock.generation, token=lock.token,
         etag=lock.etag)
    log = CommitLog(st)
    for line in sys.stdin:
        cmd, *args = line.split()
        t0 = time.monotonic()
        try:
            if cmd == "write":
                assert record_json is not None
                rec = CommitRecord.read_json(record_json).with_(load_hour=args[0], partition_key=args[0])
                written = log.write(rec, new=True)
                _say(step=cmd, ok=True, generation=written.lock_generation)
            elif cmd == "fence":
                lock.renew()
                _say(step=cmd, ok=True, generation=lock.generation)
            elif cmd == "release":
                lock.release()
                _say(step=cmd, ok=True, lost=lock.lost)
            elif cmd == "exit":
                _say(step=cmd, ok=True)
                return
        except LeaseLostError as e:
            _say(step=cmd, ok=False, error="LeaseLostError", message=str(e),
                 seconds=time.monotonic() - t0)


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        hold(sys.argv[2], float(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
