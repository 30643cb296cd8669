"""Units: durations as written in the YAML, and the units of the expiry value v (design.md R6).

Pure Python (no Spark, no Dagster), below both the config and the engine: the config reads a period
or a slice span in v's units when it is loaded, `engine/core/expiry.py` holds the rule (v as a column,
L_H, X_H) and `engine/contract.py` compares periods; all three import the units from here.

v, by kind: microseconds since the epoch (timestamp), days since the epoch (date), the number
itself (long, double), the position in the declared `categories` (category).
"""

from __future__ import annotations

import math
import re
from typing import Literal, get_args

ExpiryKind = Literal["timestamp", "date", "long", "double", "category"]
DURATION_KINDS = ("timestamp", "date")  # their periods are written as durations ("24h", "7d")
MICROS_PER_SECOND = 1_000_000
MICROS_PER_DAY = 86_400 * MICROS_PER_SECOND
DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h|d|w)\s*$")
UNIT_MICROS = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
    "w": 604_800_000_000,
}


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


def parse_duration_micros(text: str) -> int:
    """'90s', '30m', '24h', '7d' -> microseconds. Raises ValueError on anything else.

    The one duration parser: expiry periods, index slice spans and the landing grace use it.
    """
    m = DURATION_RE.match(str(text))
    if not m:
        raise ValueError(f"cannot parse duration {text!r} (use e.g. 30m, 24h, 7d)")
    micros = float(m.group(1)) * UNIT_MICROS[m.group(2)]
    if micros != int(micros):
        raise ValueError(f"duration {text!r} is not a whole number of microseconds")
    return int(micros)


def parse_number(text: str, integral: bool) -> float:
    """A period or span written as a number ('5', '0.5'); ValueError says what is wrong."""
    try:
        num = float(text)
    except ValueError:
        raise ValueError(f"cannot parse period {text!r} as a number") from None
    if not math.isfinite(num) or num < 0:
        raise ValueError(f"period must be a finite number >= 0, got {text!r}")
    if integral and num != int(num):
        raise ValueError(f"period must be a whole number for this column type, got {text!r}")
    return num


def in_units(kind: ExpiryKind, written: str) -> float:
    """A period or slice span as written in the YAML, in the units of the expiry value v."""
    if kind in DURATION_KINDS:
        return duration_in_units(kind, parse_duration_micros(written))
    return parse_number(written, integral=kind != "double")
