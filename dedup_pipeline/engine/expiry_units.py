"""The units of the expiry value v (SPEC R6), in pure Python: the Spark-free half of `expiry`.

`engine/expiry.py` holds the rule (v as a column, L_H, X_H); this module holds what the config
needs of it without importing pyspark (the Dagster code location loads the config at definitions
load): which kind of value v is, how a period written in the YAML reads in v's units, and the
default width of an index slice. Both import it, so the units are defined once.

v, by kind: microseconds since the epoch (timestamp), days since the epoch (date), the number
itself (long, double), the position in the declared `categories` (category).
"""

from __future__ import annotations

from typing import Literal, get_args

ExpiryKind = Literal["timestamp", "date", "long", "double", "category"]
DURATION_KINDS = ("timestamp", "date")  # their periods are written as durations ("24h", "7d")
MICROS_PER_SECOND = 1_000_000
MICROS_PER_DAY = 86_400 * MICROS_PER_SECOND


def kind_of(column_type: str, categorical: bool) -> ExpiryKind | None:
    """The kind of v for an expiry column of this declared type; None if it cannot expire."""
    if categorical:
        return "category" if column_type == "string" else None
    return column_type if column_type in get_args(ExpiryKind) else None  # type: ignore[return-value]


def duration_in_units(kind: ExpiryKind, micros: int) -> float:
    """A duration in v's units: micros for a timestamp, whole days for a date."""
    if kind == "date":
        if micros % MICROS_PER_DAY:
            raise ValueError("a date column needs a whole number of days (7d)")
        return float(micros // MICROS_PER_DAY)
    return float(micros)


def default_slice_span(kind: ExpiryKind, period: float) -> float:
    """Width of one index slice (Apex's bucket span) when none is configured.

    A quarter of the expiry period, so a load reads at most ~5 slices of which one is partly
    expired, and late data spreads a load's entries over few files; whole units (at least a second
    for timestamps) for integral kinds.
    """
    if kind == "timestamp":
        return float(max(MICROS_PER_SECOND, int(period // 4)))
    if kind in ("date", "long", "category"):
        return float(max(1, int(period // 4)))
    return period / 4 if period > 0 else 1.0
