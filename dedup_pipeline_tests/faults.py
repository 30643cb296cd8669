"""The faults the crash and check tests inject through the engine's hooks (engine/core/hooks.py).

`Faults(name)` kills the process (exit 137, as a SIGKILL leaves it) when a load or migration
reaches point `name`, or, for `lose_row:<what>`, `dup_row:<what>` and `stale_row:<what>`, loses a
row of the frame written as `what`, swaps one for a copy of another, or swaps one for a row of a
key an earlier load kept. A subprocess installs them from `DEDUP_FAULT` (`install_from_env`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame

from dedup_pipeline.engine.core import hooks

FAULT_ENV = "DEDUP_FAULT"


class Faults(hooks.Hooks):
    def __init__(self, fault: str) -> None:
        self.fault = fault

    def at(self, point: str) -> None:
        if point == self.fault:
            os._exit(137)

    def frame(self, df: DataFrame, what: str, stale: DataFrame | None = None) -> DataFrame:
        if self.fault not in (f"lose_row:{what}", f"dup_row:{what}", f"stale_row:{what}"):
            return df
        n = df.count()
        if self.fault.startswith("stale_row:") and stale is not None and n > 0:
            return df.limit(n - 1).unionByName(stale.select(*df.columns).limit(1))
        if self.fault.startswith("lose_row:") and n > 0:
            return df.limit(n - 1)
        if self.fault.startswith("dup_row:") and n > 1:
            return df.limit(n - 1).unionByName(df.limit(1))
        return df


@contextmanager
def injected(h: hooks.Hooks) -> Iterator[None]:
    previous = hooks.install(h)
    try:
        yield
    finally:
        hooks.install(previous)


def install_from_env() -> None:
    """In a test's subprocess: the fault named by `DEDUP_FAULT`, if any."""
    if os.environ.get(FAULT_ENV):
        hooks.install(Faults(os.environ[FAULT_ENV]))
