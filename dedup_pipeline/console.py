"""The `dedup-pipeline` console script: the CLI (`cli.main`) as a short-lived process.

Two process-level settings that only suit a process which ends with its command, so they live
here and not in `cli` (tests and `dagster dev` import `cli` into long-lived processes):

- Python's cyclic collector runs less often. With its default thresholds, collecting while the
  CLI imports Dagster, Spark Connect, pandas and Arrow (~430,000 objects that live until exit)
  cost 0.2-0.4 s of a fresh run's ~1.5 s of imports (measured 2026-11-26, 1a315b8).
- The process ends without the interpreter's teardown of those modules, which took ~0.75 s of
  a fresh 1e5-row `run`'s ~6 s; by then the command has closed what it opened (its Dagster
  instance, commit records and outputs are written before it returns). The exit still does what
  a normal one does that matters, by the interpreter's own calls: stops thread pools and waits
  for non-daemon threads, runs the `atexit` handlers (logging's flush, temporary directories,
  the Spark Connect client's clean-up), and flushes stdout and stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading
from typing import NoReturn

# Collect young objects every 10,000 net allocations, not 700: no full collection during the
# imports, and still a bounded amount of uncollected garbage in a long backfill run.
GC_THRESHOLDS = (10_000, 10, 10)


def exit_code(code: object) -> int:
    """What the interpreter would exit with for `SystemExit(code)` (printing a text code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def leave(code: int) -> NoReturn:
    """End the process as a normal exit would, minus the module teardown."""
    # The interpreter's own exit steps, in its order: stop thread pools and wait for non-daemon
    # threads (joining them directly would wait forever on an idle pool's workers), then atexit.
    threading._shutdown()  # type: ignore[attr-defined]  # noqa: SLF001
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: no one left to tell
            stream.flush()
    os._exit(code)


def entry() -> NoReturn:
    gc.set_threshold(*GC_THRESHOLDS)
    from dedup_pipeline.cli import main

    try:
        main.main()
        code = 0
    except SystemExit as e:
        code = exit_code(e.code)
    leave(code)
