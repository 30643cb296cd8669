"""Named points of a load and a migration where a test may act: kill the process (the crash
tests, design.md R10, L3) or alter a frame before it is written (the blocking-check tests, D4).

The product calls `at(point)` and `frame(df, what)`; by default they do nothing. A test installs
its own `Hooks` with `install` (dedup_pipeline_tests/faults.py); nothing here reads the
environment or knows a fault. `Progress` is the other thing a caller may pass in: where a load,
a publish or an upkeep reports its steps, one line each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the hooks' frames are Spark's; importing the hooks never imports Spark
    from pyspark.sql import DataFrame

Progress = Callable[[str], None]  # receives one line of progress (the CLI prints it, Dagster logs it)


class Hooks:
    """Do nothing: the product's own behaviour."""

    def at(self, point: str) -> None:
        """Reached at `point` (e.g. `after_outputs`, `before_commit`, `after_publish:unique`)."""

    def frame(self, df: DataFrame, what: str, stale: DataFrame | None = None) -> DataFrame:
        """`df` about to be written as `what` (an output's name, or `index`); `stale`: rows of
        keys an earlier load kept."""
        return df


_installed = Hooks()


def install(hooks: Hooks) -> Hooks:
    """Make `hooks` the ones every later call reaches; returns the ones they replace."""
    global _installed
    previous, _installed = _installed, hooks
    return previous


def at(point: str) -> None:
    _installed.at(point)


def frame(df: DataFrame, what: str, stale: DataFrame | None = None) -> DataFrame:
    return _installed.frame(df, what, stale)
