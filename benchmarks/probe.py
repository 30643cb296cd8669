"""What one measured step cost: wall seconds, CPU seconds and peak memory of the driver.

In local mode the executors are threads of the driver JVM, so the JVM's CPU time is the work done
by Spark and the Python process's is the driver-side Python (plan building, file listing). Peak
memory is the high-water mark of the resident set (VmHWM) of the JVM plus the Python process;
Linux lets a process's own user reset that mark (`echo 5 > /proc/PID/clear_refs`), so each step
gets its own peak instead of the lifetime's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its waited-for children, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[11..14] = utime, stime, cutime, cstime (fields numbered from state = 0)
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def _peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def jvm_pid(spark: Any) -> int | None:
    """The driver JVM's pid (classic PySpark only; None on Spark Connect)."""
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # noqa: BLE001 - Connect has no JVM handle; measure Python only
        return None


@dataclass
class Cost:
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    peak_is_per_step: bool = True  # False when the peak could not be reset (lifetime peak)


def settle(spark: Any, inputs: Iterable[str] = ()) -> None:
    """Start every measured step from the same state: dirty pages written, JVM garbage collected,
    the hour's landing files in the page cache.

    Without it a step pays for the one before: after the recompute peer rewrote a 1.4 GB table,
    the next pipeline load ran 40% slower (page write-back and a full GC inside its window). And
    whichever system read an hour first would read it from disk, the next from memory (the plain
    copy ran right after the pipeline on the same files): every system now starts warm.
    """
    for path in inputs:
        with open(path.removeprefix("file:"), "rb") as f:
            while f.read(1 << 24):
                pass
    os.sync()
    with contextlib.suppress(Exception):  # no JVM handle on Spark Connect
        spark.sparkContext._jvm.java.lang.System.gc()


@contextmanager
def measured(spark: Any, inputs: Iterable[str] = ()) -> Iterator[Cost]:
    """Measure the body: `with measured(spark, files) as cost: ...`; cost is filled in on exit.

    `inputs` are the landing files the step reads (read once beforehand: see `settle`)."""
    settle(spark, inputs)
    pids = [p for p in (os.getpid(), jvm_pid(spark)) if p is not None]
    resettable = all(_reset_peak(p) for p in pids)
    cpu0 = sum(_cpu_seconds(p) for p in pids)
    t0 = time.perf_counter()
    cost = Cost()
    try:
        yield cost
    finally:
        cost.seconds = time.perf_counter() - t0
        cost.cpu_seconds = sum(_cpu_seconds(p) for p in pids) - cpu0
        cost.peak_rss_bytes = sum(_peak_rss_bytes(p) for p in pids)
        cost.peak_is_per_step = resettable


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _descendants(pid: int) -> list[int]:
    out = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out += [int(child), *_descendants(int(child))]
    return out


def run_process(cmd: list[str], env: dict[str, str] | None = None, log: str | None = None,
                poll: float = 0.2) -> tuple[int, float, int]:
    """Run a whole process (a `dedup-pipeline run`, say): its exit code, wall seconds and peak
    memory, the high-water mark of the process plus that of its largest descendant (the driver
    JVM a PySpark process starts; Spark's short shell helpers are left out). Polled every `poll`
    seconds while it runs, as the marks vanish with the processes."""
    hwm: dict[int, int] = {}
    t0 = time.perf_counter()
    with open(log or os.devnull, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            for pid in [proc.pid, *_descendants(proc.pid)]:
                with contextlib.suppress(OSError):
                    hwm[pid] = max(hwm.get(pid, 0), _peak_rss_bytes(pid))
            time.sleep(poll)
    took = time.perf_counter() - t0
    own = hwm.pop(proc.pid, 0)
    return proc.returncode, took, own + max(hwm.values(), default=0)


def save_report(name: str, report: dict[str, Any]) -> Path:
    """Write a standalone measurement's report to benchmarks/results/<name>-<stamp>.json."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(__file__).resolve().parent / "results" / f"{name}-{stamp}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    return out


def read_answer(proc: subprocess.Popen[str], who: str, what: str, log: Path) -> dict[str, Any]:
    """A worker process's answer: one JSON line on its stdout; an error (or its death) raised,
    naming the worker and its log."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the {who} worker died {what}; its log: {log}")
    answer = json.loads(line)
    if "error" in answer:
        raise RuntimeError(f"the {who} worker failed {what}:\n{answer['error']}")
    return answer


def exit_status(failures: list[str]) -> int:
    """A benchmark's exit status: 1, with the failures on stderr, if a result was wrong."""
    if failures:
        print("CORRECTNESS FAILURES:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    return 0
