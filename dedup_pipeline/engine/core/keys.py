"""A key's values in plain Python, without Spark (docs/design.md R2, E4).

- `cast`: landing text typed exactly as a load's `try_cast` types it (`engine/core/parse.py`): Spark's
  string to long / double / boolean / timestamp / date rules, ported (trimmed ASCII whitespace and
  controls, signs, ISO-8601 forms, offsets and zone names, UTC when none is given).
- `key_digests`: the 128-bit key digest of `engine/core/digest.py` (the same canonical encoding and
  Spark's XXH64) for every key type.
- `key_text` / `fmt`: a value as `--key` text and as a person reads it.
Values are canonical: timestamps in unix micros, dates in unix days.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import xxhash

TAGS = {"string": "s", "long": "l", "double": "d", "boolean": "b", "timestamp": "t", "date": "D"}
SEED_1 = "dedup_pipeline/digest/1"
SEED_2 = "dedup_pipeline/digest/2"
SEED_FP = "dedup_pipeline/fingerprint"

_TRIM = "".join(map(chr, [*range(33), 127]))  # Spark's trimAll: ASCII whitespace and controls
_LONG = re.compile(r"[+-]?[0-9]+")
_DEC = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_HEX = r"0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+"
_DOUBLE = re.compile(rf"([+-]?)(?:(NaN)|(Infinity)|({_DEC})[fFdD]?|({_HEX})[fFdD]?)")
_SPECIAL = {"inf": math.inf, "+inf": math.inf, "infinity": math.inf, "+infinity": math.inf,
            "-inf": -math.inf, "-infinity": -math.inf, "nan": math.nan}
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:\r\n|[\n\r\x85\u2028\u2029])?\Z")
_DAY_PREFIX = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ]")
_OFFSET = re.compile(r"([+-])([0-9])|([+-])([0-9]{2})(?:(:?)([0-9]{2})(?:\5([0-9]{2}))?)?")
_SHORT_IDS = {  # java.time.ZoneId.SHORT_IDS
    "ACT": "Australia/Darwin", "AET": "Australia/Sydney", "AGT": "America/Argentina/Buenos_Aires",
    "ART": "Africa/Cairo", "AST": "America/Anchorage", "BET": "America/Sao_Paulo",
    "BST": "Asia/Dhaka", "CAT": "Africa/Harare", "CNT": "America/St_Johns",
    "CST": "America/Chicago", "CTT": "Asia/Shanghai", "EAT": "Africa/Addis_Ababa",
    "ECT": "Europe/Paris", "IET": "America/Indiana/Indianapolis", "IST": "Asia/Kolkata",
    "JST": "Asia/Tokyo", "MIT": "Pacific/Apia", "NET": "Asia/Yerevan", "NST": "Pacific/Auckland",
    "PLT": "Asia/Karachi", "PNT": "America/Phoenix", "PRT": "America/Puerto_Rico",
    "PST": "America/Los_Angeles", "SST": "Pacific/Guadalcanal", "VST": "Asia/Ho_Chi_Minh",
    "EST": "-05:00", "MST": "-07:00", "HST": "-10:00"}
_INT64 = 1 << 63


# --------------------------------------------------------------------------------------------
# typing text as a load does
# --------------------------------------------------------------------------------------------


def cast(typ: str, text: str) -> Any:
    """`text` cast to `typ` as Spark's `try_cast` in a load casts it (with parse.py's date rule);
    None where the load gets a null."""
    if typ == "string":
        return text
    if typ == "long":
        t = text.strip(_TRIM)
        return int(t) if _LONG.fullmatch(t) and -_INT64 <= int(t) < _INT64 else None
    if typ == "double":
        return _double(text)
    if typ == "boolean":
        t = text.strip(_TRIM).lower()
        return True if t in ("t", "true", "y", "yes", "1") else \
            False if t in ("f", "false", "n", "no", "0") else None
    if typ == "timestamp":
        return _timestamp(text)
    if typ == "date":  # parse.py: `YYYY-MM-DD`, or a timestamp whose date is read as written
        day = text.strip(" ")
        if _DAY.match(day) or (_DAY_PREFIX.match(day) and _timestamp(text) is not None):
            return _date(text)
        return None
    raise ValueError(f"unknown type {typ!r}")


def _double(text: str) -> float | None:
    """Java's `Double.parseDouble`, then Spark's special literals (`inf`, `nan`, ...)."""
    t = text.strip("".join(map(chr, range(33))))
    m = _DOUBLE.fullmatch(t)
    if m is None:
        return _SPECIAL.get(t.lower())
    sign = -1.0 if m.group(1) == "-" else 1.0
    if m.group(2):
        return math.nan
    if m.group(3):
        return sign * math.inf
    if m.group(4):
        return sign * float(m.group(4))
    return sign * float.fromhex(m.group(5))


def _valid_digits(segment: int, digits: int) -> bool:
    return (segment == 6 or (segment == 0 and 4 <= digits <= 6) or (segment == 7 and digits <= 2)
            or (segment not in (0, 6, 7) and 0 < digits <= 2))


def _trimmed(text: str) -> tuple[bytes, int]:
    """The text's UTF-8 bytes without leading / trailing ASCII whitespace and controls, and how
    many bytes led."""
    raw = text.encode("utf-8", "surrogatepass")
    b = raw.strip(bytes([*range(33), 127]))
    return b, (raw.index(b) if b else 0)


def _timestamp(text: str) -> int | None:
    """Spark's `DateTimeUtils.stringToTimestamp` (session time zone UTC): micros or None."""
    b, lead = _trimmed(text)
    seg = [1, 1, 1, 0, 0, 0, 0, 0, 0]
    i = value = digits = millis = 0
    just_time, sign, tz = False, 1, None
    j = 0
    if b[:1] in (b"-", b"+"):
        sign, j = (-1 if b[:1] == b"-" else 1), 1
    signed = j == 1
    while j < len(b):
        c = b[j]
        if 48 <= c <= 57:
            if i == 6:
                millis += 1
            if i != 6 or digits < 6:
                value = value * 10 + c - 48
            digits += 1
            j += 1
            continue
        if j + lead == 0 and c == ord("T"):
            just_time, i = True, i + 3
        elif i < 2:
            if c == ord("-"):
                if not _valid_digits(i, digits):
                    return None
                seg[i], value, digits, i = value, 0, 0, i + 1
            elif i == 0 and c == ord(":") and not signed:
                if not _valid_digits(3, digits):
                    return None
                just_time, seg[3], value, digits, i = True, value, 0, 0, 4
            else:
                return None
        elif i == 2:
            if c not in b" T" or not _valid_digits(i, digits):
                return None
            seg[i], value, digits, i = value, 0, 0, i + 1
        elif i in (3, 4):
            if c != ord(":") or not _valid_digits(i, digits):
                return None
            seg[i], value, digits, i = value, 0, 0, i + 1
        elif i in (5, 6):
            if not _valid_digits(i, digits):
                return None
            seg[i], value, digits = value, 0, 0
            if not (c == ord(".") and i == 5):
                tz = b[j:].decode("utf-8", "surrogatepass")
                j = len(b) - 1
            i += 1
            if i == 6 and c != ord("."):
                i += 1
        else:
            if not (i < len(seg) and c in b": ") or not _valid_digits(i, digits):
                return None
            seg[i], value, digits, i = value, 0, 0, i + 1
        j += 1
    if not _valid_digits(i, digits):
        return None
    seg[i] = value
    seg[6] *= 10 ** max(0, 6 - millis)
    zone = _zone(tz.strip("".join(map(chr, range(33))))) if tz is not None else UTC
    if zone is None:
        return None
    year, month, day = sign * seg[0], seg[1], seg[2]
    if just_time:
        today = datetime.now(zone).date()
        year, month, day = today.year, today.month, today.day
    if not (_valid_day(year, month, day) and seg[3] < 24 and seg[4] < 60 and seg[5] < 60):
        return None
    local = _days(year, month, day) * 86400 + seg[3] * 3600 + seg[4] * 60 + seg[5]
    if isinstance(zone, timezone):
        offset = zone.utcoffset(None).total_seconds()
    elif 1 <= year <= 9999:
        offset = datetime(year, month, day, seg[3], seg[4], seg[5], tzinfo=zone) \
            .utcoffset().total_seconds()  # type: ignore[union-attr]
    else:
        return None
    micros = (local - int(offset)) * 1_000_000 + seg[6]
    return micros if -_INT64 <= micros < _INT64 else None


def _zone(name: str) -> timezone | ZoneInfo | None:
    """`ZoneId.of(name, SHORT_IDS)` after Spark's `getZoneId` touch-ups; None when invalid."""
    name = re.sub(r"([+-])(\d):", r"\g<1>0\2:", name, count=1)
    name = re.sub(r"([+-])(\d\d):(\d)$", r"\1\2:0\3", name, count=1)
    name = _SHORT_IDS.get(name, name)
    if name in ("", "Z", "UTC", "GMT", "UT"):
        return UTC
    for prefix in ("UTC", "GMT", "UT", ""):
        rest = name[len(prefix):]
        if name.startswith(prefix) and rest[:1] in ("+", "-"):
            return _offset(rest)
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9~/._+-]+", name):
        return None
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, ZoneInfoNotFoundError):  # no such zone: Spark's cast gives null
        return None


def _offset(text: str) -> timezone | None:
    """`ZoneOffset.of`: +h, +hh, +hh:mm, +hhmm, +hh:mm:ss, +hhmmss (at most 18 hours)."""
    m = _OFFSET.fullmatch(text)
    if m is None:
        return None
    sign, h, mi, s = m.group(1) or m.group(3), m.group(2) or m.group(4), m.group(6), m.group(7)
    h, mi, s = int(h), int(mi or 0), int(s or 0)
    total = h * 3600 + mi * 60 + s
    if h > 18 or mi > 59 or s > 59 or total > 18 * 3600:
        return None
    return timezone(timedelta(seconds=total if sign == "+" else -total))


def _date(text: str) -> int | None:
    """Spark's `DateTimeUtils.stringToDate`: unix days or None."""
    b, _ = _trimmed(text)
    if not b:
        return None
    seg, sign, i, value, digits, j = [1, 1, 1], 1, 0, 0, 0, 0
    if b[:1] in (b"-", b"+"):
        sign, j = (-1 if b[:1] == b"-" else 1), 1
    while j < len(b) and i < 3 and b[j] not in b" T":
        c = b[j]
        if i < 2 and c == ord("-"):
            if not _valid_digits(i, digits):
                return None
            seg[i], value, digits, i = value, 0, 0, i + 1
        elif 48 <= c <= 57:
            value, digits = value * 10 + c - 48, digits + 1
        else:
            return None
        j += 1
    if not _valid_digits(i, digits) or (i < 2 and j < len(b)):
        return None
    seg[i] = value
    year = sign * seg[0]
    return _days(year, seg[1], seg[2]) if _valid_day(year, seg[1], seg[2]) else None


def _valid_day(y: int, m: int, d: int) -> bool:
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    return 1 <= m <= 12 and 1 <= d <= (29 if m == 2 and leap else
                                       [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m - 1])


def _days(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


# --------------------------------------------------------------------------------------------
# the digest (R2)
# --------------------------------------------------------------------------------------------


def java_doubles(x: float) -> list[str]:
    """The spellings Spark's cast of a double to string may give (Java's `Double.toString`), the
    shortest first: Java 17 sometimes prints other digits than the shortest that round-trip
    (5.906163089574651E16 as 5.9061630895746512E16, 5e-324 as 4.9E-324), so every form of up to
    18 digits, rounded or cut, that reads back as the same double is a candidate too."""
    if math.isnan(x):
        return ["NaN"]
    if math.isinf(x):
        return ["Infinity" if x > 0 else "-Infinity"]
    if x == 0:
        return ["-0.0" if math.copysign(1, x) < 0 else "0.0"]
    exact = Decimal(abs(x))
    forms = [Decimal(repr(abs(x)))]
    for n in range(1, 19):
        for rounding in ("ROUND_HALF_EVEN", "ROUND_DOWN"):
            q = Decimal(f"1E{exact.adjusted() - n + 1}")
            forms.append(exact.quantize(q, rounding=rounding))
    out: list[str] = []
    for f in forms:
        text = _java_form(f, "-" if x < 0 else "")
        if text not in out and float(text.replace("E", "e")) == x:
            out.append(text)
    return out


def _java_form(d: Decimal, sign: str) -> str:
    _, digits, exp = d.normalize().as_tuple()
    ds = "".join(map(str, digits))
    sci = len(ds) - 1 + int(exp)
    if -3 <= sci < 7:
        if sci < 0:
            return f"{sign}0.{'0' * (-sci - 1)}{ds}"
        return f"{sign}{ds[:sci + 1].ljust(sci + 1, '0')}.{ds[sci + 1:] or '0'}"
    return f"{sign}{ds[0]}.{ds[1:] or '0'}E{sci}"


def canonical_text(value: Any, typ: str) -> str:
    """`digest.canonical_text` of one canonical value."""
    if typ == "string":
        return value
    if typ == "boolean":
        return "1" if value else "0"
    if typ == "double":
        return "0.0" if value == 0 else java_doubles(value)[0]
    return str(int(value))


def spark_xxhash64(*values: str) -> int:
    """Spark's `xxhash64(v1, v2, ...)` of strings: each argument's UTF-8 bytes hashed with the
    previous result as seed (Spark's 42 first), as a signed 64-bit integer."""
    h = 42
    for v in values:
        h = xxhash.xxh64_intdigest(v.encode("utf-8", "surrogatepass"), seed=h)
    return h - (1 << 64) if h >= 1 << 63 else h


def key_digests(values: Sequence[Any], types: Sequence[str]) -> list[tuple[int, int]]:
    """`digest.digest_columns` of one key (canonical values, None for a null): one digest, or
    for a key with a double column one per spelling Java may give it (`java_doubles`), the
    shortest first."""
    options = [["N"] if v is None else
               [f"{TAGS[t]}{len(x)}:{x}" for x in
                (java_doubles(v) if t == "double" and v != 0 else [canonical_text(v, t)])]
               for v, t in zip(values, types, strict=True)]
    out = []
    for parts in itertools.product(*options):
        enc = "".join(parts)
        out.append((spark_xxhash64(SEED_1, enc), spark_xxhash64(SEED_2, enc)))
    return out


# --------------------------------------------------------------------------------------------
# a value for a person and for `--key`
# --------------------------------------------------------------------------------------------


def fmt(typ: str, value: Any) -> str:
    """Timestamps as ISO-8601 UTC, dates ISO, text in JSON quotes."""
    if value is None:
        return "null"
    if typ == "timestamp":
        dt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(value))
        text = dt.strftime("%Y-%m-%dT%H:%M:%S")
        if dt.microsecond:
            text += f".{dt.microsecond:06d}".rstrip("0")
        return text + "Z"
    if typ == "date":
        return (date(1970, 1, 1) + timedelta(days=int(value))).isoformat()
    if typ == "string":
        return json.dumps(value, ensure_ascii=False)
    if typ == "boolean":
        return "true" if value else "false"
    return str(value)


def key_text(typ: str, value: Any) -> str | None:
    """A canonical value as `--key` text (None: a null)."""
    if value is None:
        return None
    return value if typ == "string" else fmt(typ, value)
