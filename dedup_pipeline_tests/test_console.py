"""The installed `dedup-pipeline` command as a process (`dedup_pipeline.console`): it skips the
interpreter's teardown, so what a normal exit guarantees is checked here on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dedup_pipeline_tests.spark_services import VENV_BIN

COMMAND = str(VENV_BIN / "dedup-pipeline")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a new interpreter whose piped stdout is block-buffered, as a user's would be."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)


def test_leave_keeps_what_a_normal_exit_guarantees() -> None:
    """Exit code, output still in the (piped, so block-buffered) stdout buffer, a non-daemon
    thread's work and the atexit handlers all survive the early exit."""
    r = _python(
        "import atexit, threading, time\n"
        "from dedup_pipeline import console\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "def late():\n"
        "    time.sleep(0.5)\n"
        "    print('thread finished')\n"
        "threading.Thread(target=late).start()\n"
        "print('buffered line')\n"
        "console.leave(3)\n")
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines() == ["buffered line", "thread finished", "atexit ran"]


def test_exit_codes_follow_system_exit() -> None:
    r = _python("from dedup_pipeline.console import exit_code\n"
                "print(exit_code(None), exit_code(0), exit_code(2))\n"
                "print(exit_code('bad thing'))\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0", "2", "1"]
    assert r.stderr.strip() == "bad thing"


def test_the_command_writes_everything_and_exits_with_its_code(tmp_path: Path) -> None:
    out = tmp_path / "landing"
    r = subprocess.run([COMMAND, "generate", "--out", str(out), "--hours", "2",
                        "--rows-per-hour", "50", "--start", "2026-11-01-00:00"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().splitlines()[-1] == f"config: {out / 'dedup.yaml'}"
    lines = sum(len(p.read_text().splitlines()) for p in (out / "landing").rglob("*.jsonl"))
    assert lines >= 100  # 50 per hour plus the duplicates it adds: the files were closed

    r = subprocess.run([COMMAND, "run", "--config", str(out / "dedup.yaml"),
                        "--from", "2026-10-31-23:00", "--to", "2026-10-31-23:00"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "before the dataset's start" in r.stderr


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    r = subprocess.run(f"{COMMAND} --help | head -n 1", shell=True, capture_output=True,
                       text=True, timeout=120)
    assert r.stdout.startswith("Usage: dedup-pipeline")
    assert "Traceback" not in r.stderr


def test_an_idle_thread_pool_does_not_hold_the_exit() -> None:
    """A pool's idle worker is a non-daemon thread that waits for work until the interpreter's
    exit tells the pool to stop (the Spark Connect client keeps such a pool)."""
    r = _python("from concurrent.futures import ThreadPoolExecutor\n"
                "from dedup_pipeline import console\n"
                "pool = ThreadPoolExecutor(2)\n"
                "print(pool.submit(lambda: 'work done').result())\n"
                "console.leave(0)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["work done"]
