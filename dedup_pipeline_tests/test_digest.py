"""Key digest (design.md R2): unambiguous, type-aware, null-explicit, and stable across Spark versions.

Stability is shown by recomputing the digest without Spark: a pure-Python XXH64 (the published
algorithm) over the documented canonical encoding (`dedup_pipeline.engine.core.digest`): per column a
type tag, the length of the value's text in characters, ':' and the text, or 'N' for a null; the
text of a long is its decimal form, of a timestamp its microseconds since the epoch, of a boolean
1/0, of a date its days since the epoch. The two halves are Spark's
`xxhash64(seed_string, encoding)`, which is
XXH64(utf8(encoding), seed=XXH64(utf8(seed_string), 42)).
"""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from dedup_pipeline.engine.core.digest import SEED_1, SEED_2, digest_columns

# --- XXH64, straight from the specification (github.com/Cyan4973/xxHash/doc/xxhash_spec.md) ----
M64 = (1 << 64) - 1
P1 = 0x9E3779B185EBCA87
P2 = 0xC2B2AE3D27D4EB4F
P3 = 0x165667B19E3779F9
P4 = 0x85EBCA77C2B2AE63
P5 = 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * P2) & M64
    return (_rotl(acc, 31) * P1) & M64


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * P1 + P4) & M64


def xxh64(data: bytes, seed: int) -> int:
    """XXH64 of `data` as an unsigned 64-bit int; `seed` may be negative (taken mod 2^64)."""
    seed &= M64
    n = len(data)
    i = 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            for j in range(4):
                v[j] = _round(v[j], struct.unpack_from("<Q", data, i + 8 * j)[0])
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for lane in v:
            h = _merge(h, lane)
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h ^= _round(0, struct.unpack_from("<Q", data, i)[0])
        h = (_rotl(h, 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h ^= (struct.unpack_from("<I", data, i)[0] * P1) & M64
        h = (_rotl(h, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M64
        h = (_rotl(h, 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


def signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def spark_xxhash64_of_strings(*values: str) -> int:
    """Spark's xxhash64(s1, s2, ...): each argument hashed with the previous result as seed."""
    h = 42
    for s in values:
        h = xxh64(s.encode("utf-8"), h)
    return signed(h)


# --- the documented canonical encoding ----------------------------------------------------------
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TAG = {"string": "s", "long": "l", "double": "d", "boolean": "b", "timestamp": "t", "date": "D"}


def canonical(value: Any, typ: str) -> str:
    if value is None:
        return "N"
    if typ == "string":
        text = value
    elif typ == "long":
        text = str(value)
    elif typ == "timestamp":
        text = str((value - EPOCH) // timedelta(microseconds=1))
    elif typ == "date":
        text = str((value - date(1970, 1, 1)).days)
    elif typ == "boolean":
        text = "1" if value else "0"
    else:
        raise AssertionError(typ)
    return f"{TAG[typ]}{len(text)}:{text}"


def python_digest(values: tuple, types: list[str]) -> tuple[int, int]:
    enc = "".join(canonical(v, t) for v, t in zip(values, types, strict=True))
    return spark_xxhash64_of_strings(SEED_1, enc), spark_xxhash64_of_strings(SEED_2, enc)


# --- helpers -------------------------------------------------------------------------------------
SPARK_TYPES = {"string": T.StringType(), "long": T.LongType(), "timestamp": T.TimestampType(),
               "date": T.DateType(), "boolean": T.BooleanType()}


def spark_digests(spark: SparkSession, schema: dict[str, str], rows: list[tuple]) -> list[tuple]:
    """(_h1, _h2) per row, in input order."""
    st = T.StructType([T.StructField("_pos", T.LongType())]
                      + [T.StructField(c, SPARK_TYPES[t]) for c, t in schema.items()])
    df = spark.createDataFrame([(i, *r) for i, r in enumerate(rows)], st)
    h1, h2 = digest_columns(list(schema), schema)
    out = df.select("_pos", h1.alias("_h1"), h2.alias("_h2")).orderBy("_pos").collect()
    return [(r["_h1"], r["_h2"]) for r in out]


# --- tests ---------------------------------------------------------------------------------------
@pytest.mark.fast
def test_pure_python_xxh64_matches_spark(spark: SparkSession) -> None:
    assert signed(xxh64(b"abc", 42)) == 1423657621850124518  # Spark's documented value
    long_text = "x" * 45 + "é😀"  # > 32 bytes: exercises the stripe loop
    row = spark.sql(
        f"select xxhash64('abc') a, xxhash64('seed', '{long_text}') b, xxhash64('') c"
    ).collect()[0]
    assert row["a"] == signed(xxh64(b"abc", 42))
    assert row["b"] == spark_xxhash64_of_strings("seed", long_text)
    assert row["c"] == signed(xxh64(b"", 42))


@pytest.mark.fast
def test_concatenations_differ(spark: SparkSession) -> None:
    schema = {"k1": "string", "k2": "string"}
    # values that contain the encoding's own tag letters and separators must not line up either
    rows = [("ab", "c"), ("a", "bc"), ("abc", ""), ("", "abc"), ("as", "b"), ("a", "sb"),
            ("s1:a", "b"), ("a", "s1:b"), ("1:a", "1:b"), ("", "s3:1:a")]
    d = spark_digests(spark, schema, rows)
    assert len(set(d)) == len(rows)


@pytest.mark.fast
def test_null_position_matters(spark: SparkSession) -> None:
    schema = {"k1": "string", "k2": "string"}
    d = spark_digests(spark, schema, [(None, "a"), ("a", None), ("a", ""), ("", "a"),
                                      ("N", "a"), (None, None)])
    assert len(set(d)) == 6


@pytest.mark.fast
def test_long_one_differs_from_string_one(spark: SparkSession) -> None:
    (as_long,) = spark_digests(spark, {"k": "long"}, [(1,)])
    (as_string,) = spark_digests(spark, {"k": "string"}, [("1",)])
    assert as_long != as_string
    # and a type confusion inside a tuple does not line up either
    (mixed_a,) = spark_digests(spark, {"a": "long", "b": "string"}, [(12, "3")])
    (mixed_b,) = spark_digests(spark, {"a": "long", "b": "string"}, [(1, "23")])
    assert mixed_a != mixed_b


@pytest.mark.fast
def test_equal_tuples_equal_digests(spark: SparkSession) -> None:
    schema = {"k1": "string", "k2": "long"}
    rows = [("a", 1), ("b", 2), ("a", 1), (None, 7), ("b", 2), (None, 7)]
    d = spark_digests(spark, schema, rows)
    assert d[0] == d[2] and d[1] == d[4] and d[3] == d[5]
    assert len({d[0], d[1], d[3]}) == 3
    assert all(h1 != h2 for h1, h2 in d)  # two independent halves


@pytest.mark.parametrize(
    ("schema", "rows"),
    [
        ({"k": "string"}, [("abc",), ("",), ("Grüße, 東京 😀",), (None,), ("x" * 70,)]),
        ({"k": "long"}, [(1,), (-9223372036854775808,), (0,), (None,), (1234567890123,)]),
        ({"k": "timestamp"}, [(datetime(2026, 11, 1, 0, 30, 0, 123456, tzinfo=UTC),),
                              (datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),),
                              (None,)]),
        ({"a": "string", "b": "long", "c": "timestamp", "d": "boolean", "e": "date"},
         [("é", 7, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), True, date(2026, 11, 1)),
          (None, None, None, None, None),
          ("", -1, datetime(2000, 2, 29, tzinfo=UTC), False, date(1960, 1, 1))]),
    ],
    ids=["string", "long", "timestamp", "mixed"],
)
@pytest.mark.fast
def test_spark_digest_equals_pure_python(spark: SparkSession, schema: dict, rows: list) -> None:
    got = spark_digests(spark, schema, rows)
    want = [python_digest(r, list(schema.values())) for r in rows]
    assert got == want
