"""`engine/core/keys.py` types key text and digests keys in Python exactly as a load does in Spark
(design.md E4, R2): generated texts go through the load's own `parse.type_and_reject`, generated
values through `digest.digest_columns`, each batch in one Spark job of the shared session."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.engine.core import keys
from dedup_pipeline.engine.core.digest import digest_columns
from dedup_pipeline.engine.core.parse import META_COLS, PRE, SPARK_TYPES, type_and_reject
from dedup_pipeline_tests.conftest import dataset_config, dataset_raw, source_raw

SCHEMA = {"k": "string", "n": "long", "x": "double", "b": "boolean", "t": "timestamp",
          "d": "date"}
BATCH = settings(max_examples=6, deadline=None, derandomize=True, database=None,
                 phases=(Phase.explicit, Phase.generate),  # a Spark job per example: no shrinking
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])
WS = st.sampled_from(["", "", " ", "\t", "\n", "\r\n", "\x0b", "\x1f", "\x7f", "\u00a0", "\u3000"])
DIGITS = st.integers(0, 10**20).map(str)


def _stamp(d: datetime, sep: str, frac: str, zone: str) -> str:
    return d.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + frac + zone


ZONES = st.sampled_from(["", "Z", "+02:00", "-0230", "+5", "-05:30", " UTC", "UTC+1", "GMT+01:00",
                         "Europe/Berlin", " America/New_York", "+19:00", "Mars/Base", "+02:3",
                         "PST", "z"])
STAMPS = st.builds(_stamp, st.datetimes(datetime(1, 1, 1), datetime(9999, 12, 31)),
                   st.sampled_from(["T", " ", "t", "_"]),
                   st.sampled_from(["", ".5", ".123456", ".1234567891", "."]), ZONES)
NUMBERS = st.one_of(st.floats(allow_nan=True).map(repr), st.integers(-2**64, 2**64).map(str),
                    st.sampled_from(["NaN", "-Infinity", "inf", "+nan", "-NaN", "1e309", "1.", ".5", ".",
                                     "1d", "1.5F", "0x1p3", "1_000", "+", "-0", "1e", "e5",
                                     "١٢", "0.0", "-0.0", "9223372036854775808"]))
WORDS = st.sampled_from(["true", "FALSE", "t", "f", "y", "N", "yes", "no", "1", "0", "on", "",
                         "2026-11-27", "2026-02-29", "2024-02-29", "2026-1-2", "+2026-11-27",
                         "-0001-01-01", "12345-01-01", "2026", "2026-11", "2026-11-27T",
                         "2026-11-27T07", "2026-11-27 07:15", "2026-11-27T24:00", "20261127",
                         "2026-11-27Z", "T07:15", "07:15:00"])
TEXT = st.builds(lambda a, t, b: a + t + b, WS, st.one_of(STAMPS, NUMBERS, WORDS,
                                                          st.text(max_size=8)), WS)


@BATCH
@given(st.lists(TEXT, min_size=60, max_size=120))
@example(["2026-11-27T07:15:00+02:00", " 2026-11-27 ", "\t5\n", "-0.0", "1.5D", "1e-400",
          "2026-11-27T07:15:00 Europe/Berlin", "9999-12-31T23:59:59.999999Z", "0001-01-01"])
def test_key_text_is_typed_as_a_load_types_landing_text(spark: SparkSession, tmp_path_factory,
                                                       texts: list[str]) -> None:
    ds = dataset_config(tmp_path_factory.mktemp("k"), **dataset_raw(
        key=["k"], source=source_raw(schema=SCHEMA)))
    raw = spark.createDataFrame(
        [(i, *[t] * 6, "f", 0, i, t, None, False) for i, t in enumerate(texts)],
        T.StructType([T.StructField("i", T.LongType()),
                      *[T.StructField(c, T.StringType()) for c in SCHEMA],
                      *[T.StructField(c, T.StringType() if c in ("_source_file", "_raw")
                                      else T.LongType()) for c in META_COLS],
                      T.StructField(PRE, T.StringType()),
                      T.StructField("_malformed", T.BooleanType())]))
    typed = type_and_reject(raw.drop("i"), ds).withColumn("i", F.col("_rid"))
    rows = typed.select("i", "n", "x", "b", F.unix_micros("t").alias("t"),
                        F.unix_date("d").alias("d")).collect()
    for r in rows:
        text = texts[r["i"]]
        for c, typ in SCHEMA.items():
            if c == "k":
                continue
            got, want = keys.cast(typ, text), r[c]
            same = got == want or (isinstance(got, float) and isinstance(want, float)
                                   and math.isnan(got) and math.isnan(want))
            assert same and type(got) is type(want), (typ, text, got, want)


VALUES = {
    "string": st.text(max_size=12),
    "long": st.integers(-2**63, 2**63 - 1),
    "double": st.one_of(st.floats(), st.sampled_from([0.0, -0.0, math.nan, 1e7, 1e-3, 9.999e-4,
                                                      123456789.0, 2.0261127e7, 5e-324])),
    "boolean": st.booleans(),
    "timestamp": st.integers(-62135596800000000, 253402300799999999),
    "date": st.integers(-719162, 2932896),
}
ROW = st.tuples(*[st.one_of(st.none(), VALUES[t]) for t in SCHEMA.values()])


@BATCH
@given(st.lists(ROW, min_size=60, max_size=120))
def test_python_digest_equals_sparks_for_every_type(spark: SparkSession, rows: list[tuple]) -> None:
    def typed(v: object, t: str) -> object:
        if v is None:
            return None
        if t == "timestamp":
            return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=v)
        return date.fromordinal(719163 + v) if t == "date" else v

    schema = T.StructType([T.StructField(c, SPARK_TYPES[t]) for c, t in SCHEMA.items()])
    df = spark.createDataFrame([tuple(typed(v, t) for v, t in zip(r, SCHEMA.values(), strict=True))
                                for r in rows], schema)
    h1, h2 = digest_columns(list(SCHEMA), SCHEMA)
    got = [(r[0], r[1]) for r in df.select(h1, h2).collect()]
    want = [keys.key_digests(r, list(SCHEMA.values())) for r in rows]
    assert [g in w for g, w in zip(got, want, strict=True)] == [True] * len(rows)
    # one digest unless a double may be spelled more ways; the shortest spelling usually
    assert sum(g == w[0] for g, w in zip(got, want, strict=True)) >= len(rows) * 0.8
    one = [("abc",), ("",), ("Grüße, 東京 😀",), ('a,"b"',), ("x" * 300,)]
    df = spark.createDataFrame(one, "k string")
    h1, h2 = digest_columns(["k"], {"k": "string"})
    assert [(r[0], r[1]) for r in df.select(h1, h2).collect()] == \
        [keys.key_digests(r, ["string"])[0] for r in one]
