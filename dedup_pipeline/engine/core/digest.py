"""Key digest (design.md R2) and fingerprint hash (R5), from Spark built-ins only.

Spark's multi-column hash/xxhash64 skip NULLs and concat_ws drops them, so ("a", null, "b") and
("a", "b", null) would collide. We first build a canonical encoding of the key tuple: per column a
type tag, the value's length, ':' and the value as text, or 'N' for a null. It is unambiguous
(("ab","c") != ("a","bc")), type-aware (long 1 -> "l1:1", string "1" -> "s1:1") and null-explicit.
A double is spelled as Spark compares it in a group or a join: `-0.0` as `0.0`, a NaN as `NaN`.
The digest is two 64-bit XXH64 hashes of that encoding under two different seeds: 128 bits.
`engine/core/keys.py` computes the same digest of one key in Python (explain, no Spark).
Collision bound (birthday): p ~ n^2 / 2^129, below 1.5e-19 at n = 1e10 keys.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

from dedup_pipeline.engine.core.columns import FP, H1, H2
from dedup_pipeline.engine.core.keys import SEED_1, SEED_2, SEED_FP, TAGS

__all__ = ["FP", "H1", "H2", "SEED_1", "SEED_2", "digest_columns", "encode", "fingerprint_column"]


def canonical_text(col: Column, typ: str) -> Column:
    """The value as canonical text: exact, stable across Spark versions for the types we allow."""
    if typ == "string":
        return col
    if typ == "timestamp":
        return F.unix_micros(col).cast("string")
    if typ == "date":
        return F.unix_date(col).cast("string")
    if typ == "boolean":
        return F.when(col, F.lit("1")).otherwise(F.lit("0"))
    if typ == "double":
        # keys compare as Spark groups and joins them (docs/design.md, R2): -0.0 is 0.0, and
        # every NaN is one value (`cast` already spells each NaN `NaN`)
        return F.when(col == F.lit(0.0), F.lit("0.0")).otherwise(col.cast("string"))
    return col.cast("string")  # long


def encode(columns: Sequence[str], schema: dict[str, str]) -> Column:
    """Canonical, length-prefixed, null-explicit, type-tagged encoding of a column tuple."""
    parts = []
    for name in columns:
        c = F.col(name)
        text = canonical_text(c, schema[name])
        part = F.concat(F.lit(TAGS[schema[name]]), F.length(text).cast("string"), F.lit(":"), text)
        parts.append(F.when(c.isNull(), F.lit("N")).otherwise(part))
    return F.concat(*parts)


def digest_columns(columns: Sequence[str], schema: dict[str, str]) -> tuple[Column, Column]:
    """The two 64-bit halves of the 128-bit key digest."""
    enc = encode(columns, schema)
    return F.xxhash64(F.lit(SEED_1), enc), F.xxhash64(F.lit(SEED_2), enc)


def fingerprint_column(columns: Sequence[str], schema: dict[str, str]) -> Column:
    """32-bit hash (Murmur3) of the fingerprint columns: it only decides natural vs conflict.

    32 bits, not 64: the index stores it for every live key, and 4 bytes less per entry is 14% of
    the bytes a load reads without expiry (16 for the digest + 4). The price: a conflict (same key,
    different content) is reported as natural with probability 2^-32 (2.3e-10) per duplicate.
    """
    return F.hash(F.lit(SEED_FP), encode(columns, schema))
