"""Integrity of the pipeline's own state (issue 22): the lock, index content, commit records,
verify on a damaged warehouse, durability of the small state files."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import time
from pathlib import Path

from dedup_pipeline.engine.storage import Lock, Storage
from dedup_pipeline_tests import lock_worker


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_stale_lock_takeover_is_exclusive_under_races(tmp_path: Path) -> None:
    """R10: 3 processes x 300 trials race for a stale lock of a dead pid: exactly one wins each."""
    workers, trials = 3, 300
    root = str(tmp_path / "warehouse")
    os.makedirs(root)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    got = ctx.Array("b", workers * trials, lock=False)
    procs = [ctx.Process(target=lock_worker.race, args=(root, w, trials, barrier, got, workers))
             for w in range(workers)]
    for p in procs:
        p.start()
    stale = json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "owner": "a killed run",
                        "since": "2026-01-01T00:00:00Z"})
    t0 = time.perf_counter()
    try:
        for _ in range(trials):
            Path(root, "_lock").write_text(stale)
            barrier.wait(timeout=60)
            barrier.wait(timeout=60)
            barrier.wait(timeout=60)
    finally:
        for p in procs:
            p.join(timeout=60)
    elapsed = time.perf_counter() - t0
    assert all(p.exitcode == 0 for p in procs)
    winners = [sum(got[t * workers:(t + 1) * workers]) for t in range(trials)]
    doubles = [t for t, n in enumerate(winners) if n > 1]
    assert doubles == [], f"{len(doubles)} of {trials} trials had two holders ({elapsed:.1f}s)"
    assert winners == [1] * trials  # and the stale lock is always taken over
    assert not Path(root, "_lock").exists()


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    st = Storage(str(tmp_path / "w"))
    a = Lock(st, "a").acquire()
    try:
        b = Lock(st, "b")
        try:
            b.acquire()
            raise AssertionError("second acquire of a live lock succeeded")
        except Exception as e:  # noqa: BLE001
            assert type(e).__name__ == "DatasetLockedError"
            assert "locked by a (pid" in str(e)
    finally:
        a.release()
    assert not (tmp_path / "w" / "_lock").exists()
    # an unreadable lock (a write cut short) is not held by anyone alive: taken over
    (tmp_path / "w" / "_lock").write_text('{"host": "')
    with Lock(st, "c"):
        assert json.loads((tmp_path / "w" / "_lock").read_text())["owner"] == "c"
