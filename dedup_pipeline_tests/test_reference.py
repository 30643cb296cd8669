"""The engine against an independent oracle (`reference.py`), on a generated multi-dataset zone.

Five datasets share one landing zone and one Spark session; each gets six hourly loads with
in-batch and cross-batch duplicates, conflicts, late and expired rows, malformed lines, null keys,
bad values, unknown categories and ties in `order_by` across files, and one hour with no input
directory at all. For every dataset, hour and output the whole multiset of rows written by
`load_hours` must equal the reference's; reruns of some hours must change nothing.

Coverage (dataset x feature):

  dataset   format  key               expiry (basis)            fingerprint  order_by    gap  reruns
  clicks    jsonl   event_id          timestamp 2h (event)      user_id,url  event_time  h3   h2; h3-5
  orders    csv     shop,order_no     long seq 150 (event)      all          -           h4   h2
  logs      jsonl   log_id (long)     -                         -            ts (nulls)  h1   -
  catalog   csv     sku               category 1 (event)        price        rev (long)  h5   h3-5
  sessions  jsonl   session_id        timestamp 3h (processing) user         -           h0   -

`check_coverage` asserts, from the reference's own account, that each dataset really exercises
its features (conflicts, expired rows, rows exactly on the expiry point, keys unique again after
expiring, reject precedence, order_by ties across files, ...). About 37 loads, each a few
seconds of fixed Spark overhead; hence `slow`.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dedup_pipeline.config import DatasetConfig, parse_config
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline_tests.conftest import table_files
from dedup_pipeline_tests.reference import OUTPUTS, HourResult, Reference, micros, normalise_raw

pytestmark = pytest.mark.slow

START = datetime(2026, 11, 1, tzinfo=UTC)
HOURS = 6
HOUR = timedelta(hours=1)
US_HOUR = 3_600_000_000
SEED = 20261101
CATEGORIES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]

DATASETS: list[dict[str, Any]] = [
    {
        "name": "clicks",
        "source": {"format": "jsonl", "schema": {
            "event_id": "string", "user_id": "string", "event_time": "timestamp",
            "url": "string", "amount": "double"}},
        "key": ["event_id"],
        "fingerprint": ["user_id", "url"],
        "order_by": "event_time",
        "expiry": {"column": "event_time", "period": "2h", "basis": "event"},
    },
    {
        "name": "orders",
        "source": {"format": "csv", "schema": {
            "shop": "string", "order_no": "long", "seq": "long", "status": "string",
            "paid": "boolean", "note": "string"}},
        "key": ["shop", "order_no"],
        "fingerprint": "all",
        "expiry": {"column": "seq", "period": 150, "basis": "event"},
    },
    {
        "name": "logs",
        "source": {"format": "jsonl", "schema": {
            "log_id": "long", "host": "string", "ts": "timestamp", "level": "string",
            "bytes": "long"}},
        "key": ["log_id"],
        "order_by": "ts",
    },
    {
        "name": "catalog",
        "source": {"format": "csv", "schema": {
            "sku": "string", "release": "string", "rev": "long", "price": "double",
            "title": "string"}},
        "key": ["sku"],
        "fingerprint": ["price"],
        "order_by": "rev",
        "expiry": {"column": "release", "period": 1, "basis": "event",
                   "categories": CATEGORIES},
    },
    {
        "name": "sessions",
        "source": {"format": "jsonl", "schema": {
            "session_id": "string", "user": "string", "started": "timestamp", "pages": "long"}},
        "key": ["session_id"],
        "fingerprint": ["user"],
        "expiry": {"column": "started", "period": "3h", "basis": "processing"},
    },
]
MISSING_HOUR = {"clicks": 3, "orders": 4, "logs": 1, "catalog": 5, "sessions": 0}
VOCAB = {
    "user_id": ["u1", "u2", "u3", "u4"], "url": ["/", "/a", "/b", "/cart"],
    "status": ["new", "paid", "shipped"], "note": ["", "gift", "rush", "a,b", 'say "hi"'],
    "host": ["web1", "web2", "db1"], "level": ["INFO", "WARN", "ERROR"],
    "title": ["Lamp", "Desk", "Chair, oak", "Mug"], "user": ["ann", "bob", "cy"],
    "shop": ["north", "south", "east", "west"],
}
BAD = {"long": ["abc", "12x", "1.5"], "double": ["abc", "x1.5"], "boolean": ["maybe"],
       "timestamp": ["not-a-time", "2026-13-45T99:00:00Z"]}


def ts_text(us: int) -> str:
    dt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------------------------
# generator: records are dicts column -> wire value (str / int / float / bool / None)
# --------------------------------------------------------------------------------------------


@dataclass
class Gen:
    ds: DatasetConfig
    rng: random.Random
    counter: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # earlier hours' good records
    latest: float | None = None  # the generator's guess of L_H (for rows on the expiry point)

    @property
    def schema(self) -> dict[str, str]:
        return self.ds.source.schema

    def new_key(self) -> dict[str, Any]:
        self.counter += 1
        n, name = self.counter, self.ds.name
        if name == "orders":  # the same order_no in several shops: distinct keys
            return {"shop": self.rng.choice(VOCAB["shop"]), "order_no": n // 2}
        if name == "logs":
            return {"log_id": 1000 + n}
        return {self.ds.key[0]: f"{name[0]}{n:05d}"}

    def time_value(self, hour: int, late: bool = False) -> Any:
        """The expiry / order value of a record of `hour` (late: far behind)."""
        h0 = micros(START) + hour * US_HOUR
        r = self.rng
        name = self.ds.name
        if name in ("clicks", "logs"):
            us = h0 - r.randint(US_HOUR // 2, 4 * US_HOUR) if late else h0 + r.randrange(US_HOUR)
            if r.random() < 0.3:
                us -= us % 1_000_000  # whole seconds too
            return ts_text(us)
        if name == "sessions":
            lo, hi = (h0 - 5 * US_HOUR, h0 - 2 * US_HOUR) if late else (h0 - US_HOUR, h0 + US_HOUR)
            return ts_text(r.randrange(lo, hi))
        if name == "orders":
            return hour * 100 - r.randint(20, 300) if late else hour * 100 + r.randrange(100)
        if name == "catalog":
            i = hour - r.choice([1, 2]) if late else hour + r.choice([0, 0, 1])
            return CATEGORIES[max(0, min(i, len(CATEGORIES) - 1))]
        raise AssertionError(name)

    def other_value(self, col: str) -> Any:
        typ, r = self.schema[col], self.rng
        if col in VOCAB:
            return r.choice(VOCAB[col]) or None
        if typ == "long":
            return r.randrange(0, 6) if col == "rev" else r.randrange(0, 100_000)
        if typ == "double":
            return round(r.uniform(1, 500), 2)
        if typ == "boolean":
            return r.choice([True, False])
        if typ == "timestamp":
            return ts_text(micros(START) + r.randrange(HOURS * US_HOUR))
        return f"v{r.randrange(1000)}"

    def time_col(self) -> str:
        ds = self.ds
        return ds.expiry.column if ds.expiry else ds.order_by  # type: ignore[return-value]

    def fresh(self, hour: int, key: dict[str, Any] | None = None, late: bool = False) -> dict:
        rec = {c: self.other_value(c) for c in self.schema}
        rec.update(key or self.new_key())
        rec[self.time_col()] = self.time_value(hour, late)
        if self.ds.name == "logs" and self.rng.random() < 0.1:
            rec["ts"] = None  # order_by nulls go last
        return rec

    def mutate(self, rec: dict) -> dict:
        """Same key, different content (a conflict when it touches the fingerprint)."""
        out = dict(rec)
        cols = list(self.ds.fingerprint) or [c for c in self.schema if c not in self.ds.key]
        cols = [c for c in cols if self.ds.expiry is None or c != self.ds.expiry.column]
        col = self.rng.choice(cols)
        for _ in range(10):
            out[col] = self.other_value(col)
            if out[col] != rec[col]:
                break
        return out

    def reject(self, hour: int) -> Any:
        """A record with one or two faults, as ("malformed" | "faulty", record)."""
        r = self.rng
        rec = self.fresh(hour)
        faults = r.sample(["malformed", "null_key", "bad_value", "bad_expiry"], r.choice([1, 1, 2]))
        if "malformed" in faults:
            return ("malformed", rec)
        if "null_key" in faults:
            rec[r.choice(self.ds.key)] = None
        if "bad_value" in faults:
            cols = [c for c, t in self.schema.items() if t in BAD
                    and (self.ds.expiry is None or c != self.ds.expiry.column)]
            col = r.choice(cols)
            rec[col] = r.choice(BAD[self.schema[col]])
        if "bad_expiry" in faults and self.ds.expiry is not None:
            col = self.ds.expiry.column
            if self.ds.expiry.categories:
                rec[col] = r.choice(["zulu", "Alpha", "", None])
            else:
                rec[col] = r.choice([None, "abc"])
        return ("faulty", rec)

    def hour_records(self, hour: int) -> list[Any]:
        r = self.rng
        recs: list[Any] = []
        for _ in range(r.randint(200, 400)):
            p = r.random()
            here = [x for x in recs if isinstance(x, dict)]
            if p >= 0.85:
                recs.append(self.reject(hour))
            elif p < 0.45 or not self.history:
                recs.append(self.fresh(hour))
            elif p < 0.60 and here:  # in-batch duplicate
                d = dict(r.choice(here))
                q = r.random()
                if q < 0.3:
                    d = self.mutate(d)
                elif q < 0.5:
                    d[self.time_col()] = self.time_value(hour)
                recs.append(d)
            elif p < 0.72:  # cross-batch replay, exact or mutated; keeps its time
                d = dict(r.choice(self.history))
                recs.append(self.mutate(d) if r.random() < 0.3 else d)
            elif p < 0.77:  # key reused with a fresh time
                old = r.choice(self.history)
                recs.append(self.fresh(hour, {k: old[k] for k in self.ds.key}))
            else:  # late: new key or a replay, far behind
                key = None
                if r.random() < 0.5:
                    key = {k: r.choice(self.history)[k] for k in self.ds.key}
                recs.append(self.fresh(hour, key, late=True))
        recs += self.edge_records(hour, [x for x in recs if isinstance(x, dict)])
        self.history += [x for x in recs if isinstance(x, dict)]
        return recs

    def edge_records(self, hour: int, good: list[dict]) -> list[Any]:
        """Rows on the expiry point (v = X_H kept, one unit less expired), `{}`, blank lines."""
        out: list[Any] = []
        exp = self.ds.expiry
        if exp is not None and exp.categories is None:
            col = exp.column
            ts = self.schema[col] == "timestamp"
            if exp.basis == "processing":
                latest = micros(START) + (hour + 1) * US_HOUR
            else:
                vals = [micros(datetime.fromisoformat(g[col])) if ts else g[col] for g in good
                        if g.get(col) not in (None, "abc") and all(g.get(k) is not None
                                                                 for k in self.ds.key)]
                latest = max([v for v in (self.latest, *vals) if v is not None], default=None)
            self.latest = latest
            if latest is not None:
                x = int(latest - self.ds.expiry_period)
                for v in (x, x - 1):
                    rec = self.fresh(hour)
                    rec[col] = ts_text(v) if ts else v
                    out.append(rec)
        if self.ds.source.format == "jsonl":
            out += ["{}", "", "   "]
        else:
            out.append("")
        return out


def serialize(ds: DatasetConfig, rng: random.Random, rec: Any) -> str:
    schema = ds.source.schema
    if isinstance(rec, str):
        return rec
    malformed = isinstance(rec, tuple) and rec[0] == "malformed"
    if isinstance(rec, tuple):
        rec = rec[1]
    if ds.source.format == "jsonl":
        obj = {c: v for c, v in rec.items() if v is not None or rng.random() < 0.5}
        line = json.dumps(obj)
        if malformed:
            line = rng.choice([line[: len(line) // 2], "not json", "[1, 2]", '"text"', "42",
                               "null"])
        return line
    fields = []
    for c in schema:
        v = rec.get(c)
        fields.append("" if v is None else ("true" if v is True else "false" if v is False
                                            else str(v)))
    if malformed:
        fields = fields[:-1] if rng.random() < 0.5 else [*fields, "extra"]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(fields)
    return buf.getvalue()


def write_landing(ds: DatasetConfig, gen: Gen, hour: int) -> None:
    recs = gen.hour_records(hour)
    if hour == MISSING_HOUR[ds.name]:
        return  # generated (so later hours can replay them) but never delivered: no directory
    rng = gen.rng
    n_files = rng.choice([2, 3])
    files: list[list[str]] = [[] for _ in range(n_files)]
    for rec in recs:
        line = serialize(ds, rng, rec)
        files[rng.randrange(n_files)].append(line)
        if isinstance(rec, dict) and rng.random() < 0.1:  # an exact copy in another file
            files[rng.randrange(n_files)].append(line)
    when = START + hour * HOUR
    d = Path(ds.source.path) / f"date={when:%Y-%m-%d}" / f"hour={when:%H}"
    d.mkdir(parents=True)
    ext = ds.source.format
    for i, lines in enumerate(files):
        rng.shuffle(lines)
        if ext == "csv":
            lines = [",".join(ds.source.schema), *lines]
        (d / f"part-{i}.{ext}").write_text("".join(f"{line}\n" for line in lines))


# --------------------------------------------------------------------------------------------
# reading the engine's outputs in the reference's form
# --------------------------------------------------------------------------------------------


def _pylist(col: pa.ChunkedArray) -> list[Any]:
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("us", tz=col.type.tz)).cast(pa.int64())
    elif pa.types.is_date(col.type):
        col = col.cast(pa.int32())
    return col.to_pylist()


def read_engine(ds: DatasetConfig, output: str, tag: str) -> Counter:
    d = Path(ds.output) / output / f"load_hour={tag}"
    assert d.is_dir(), f"{ds.name}: no {output} partition for {tag}"
    table_dir = Path(ds.output) / output  # a Delta table's files: a rerun's replaced ones stay
    files = (table_files(table_dir, tag) if (table_dir / "_delta_log").is_dir()  # until a vacuum
             else sorted(d.glob("*.parquet")))
    if not files:
        return Counter()
    table = pa.concat_tables([pq.read_table(f) for f in files])
    cols = {name: _pylist(table.column(name)) for name in table.column_names}
    n = table.num_rows
    src = list(ds.source.schema)
    base = [c.rsplit("/", 1)[-1] for c in cols["_source_file"]]
    if output == "rejected":
        rows = [(base[i], cols["_reject_reason"][i],
                 normalise_raw(ds, cols["_reject_reason"][i], cols["_raw"][i])) for i in range(n)]
    else:
        extra = {"unique": [], "duplicates": ["_duplicate_kind", "_first_load_hour"],
                 "expired": ["_expiry_point"]}[output]
        rows = [(*(cols[c][i] for c in src), base[i], *(cols[c][i] for c in extra))
                for i in range(n)]
    return Counter(rows)


def engine_outputs(ds: DatasetConfig) -> dict[str, dict[str, Counter]]:
    tags = [f"{START + i * HOUR:%Y-%m-%d-%H}" for i in range(HOURS)]
    return {t: {o: read_engine(ds, o, t) for o in OUTPUTS} for t in tags}


def diff(expected: Counter, actual: Counter, limit: int = 8) -> str:
    missing = list((expected - actual).elements())[:limit]
    extra = list((actual - expected).elements())[:limit]
    return f"\n  only in reference: {missing}\n  only in engine:    {extra}"


def compare(ds: DatasetConfig, ref: dict[str, HourResult], got: dict[str, dict[str, Counter]],
            ) -> list[str]:
    problems = []
    for tag, res in ref.items():
        for o in OUTPUTS:
            if got[tag][o] != res.rows[o]:
                problems.append(f"{ds.name} {tag} {o}: reference {sum(res.rows[o].values())} "
                                f"rows, engine {sum(got[tag][o].values())}"
                                + diff(res.rows[o], got[tag][o]))
    return problems


# --------------------------------------------------------------------------------------------
# the test
# --------------------------------------------------------------------------------------------


def build_zone(tmp: Path) -> dict[str, DatasetConfig]:
    """Every dataset's landing zone under one root; each dataset has its own seeded generator."""
    raws = []
    for spec in DATASETS:
        raw = json.loads(json.dumps(spec))
        raw["start"] = f"{START:%Y-%m-%d-%H:%M}"
        raw["source"]["path"] = f"landing/{spec['name']}"
        raw["output"] = f"warehouse/{spec['name']}"
        raws.append(raw)
    cfg = parse_config({"datasets": raws}, "test_reference", tmp)
    for ds in cfg.datasets:
        gen = Gen(ds, random.Random(f"{SEED}/{ds.name}"))
        for h in range(HOURS):
            write_landing(ds, gen, h)
    return {ds.name: ds for ds in cfg.datasets}


@pytest.fixture(scope="module")
def zone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DatasetConfig]:
    return build_zone(tmp_path_factory.mktemp("reference_zone"))


# What each dataset must exercise (read from the reference's own account of the hours).
MUST = {
    "all": ["natural", "in_batch_duplicates", "cross_batch_duplicates", "rejected:malformed",
            "rejected:null_key", "rejected:bad_value", "precedence:bad_value"],
    "fingerprint": ["conflict"],
    "expiry": ["expired", "rejected:bad_expiry_value", "unique_again_after_expiry",
               "cross_batch_other_expiry_value", "precedence:null_key"],
    "order_by": ["order_by_ties"],
}
# Reruns (R10) cost a load each (a few seconds of fixed Spark overhead), so only some: hour 2
# through the last (a rerun of an earlier hour reloads every later loaded hour in the same run),
# the last hour alone, and the last three hours (with an hour without input among them).
RERUNS = {"clicks": [[2, 3, 4, 5]], "orders": [[5]], "catalog": [[3, 4, 5]]}


def check_coverage(ds: DatasetConfig, ref: dict[str, HourResult]) -> None:
    stats = sum((r.stats for r in ref.values()), Counter())
    must = list(MUST["all"])
    must += MUST["fingerprint"] if ds.fingerprint else []
    must += MUST["expiry"] if ds.expiry else []
    must += MUST["order_by"] if ds.order_by else []
    if ds.expiry and ds.expiry.categories:
        must.append("rejected:unknown_category")
    elif ds.expiry:
        must.append("kept_at_expiry_point")
    if ds.name == "logs":
        must.append("order_by_nulls_in_group")
    assert not [m for m in must if not stats[m]], (ds.name, dict(stats))
    assert sum(ref[t].rows_in == 0 for t in ref) == 1, ds.name


@pytest.mark.parametrize("name", [d["name"] for d in DATASETS])
def test_engine_matches_reference(spark, zone: dict[str, DatasetConfig], name: str) -> None:
    ds = zone[name]
    keys = [f"{START + i * HOUR:%Y-%m-%d-%H:%M}" for i in range(HOURS)]
    ref = Reference(ds).run(START, HOURS)
    check_coverage(ds, ref)

    results = load_hours(spark, ds, keys)
    got = engine_outputs(ds)
    for res, (tag, r) in zip(results, ref.items(), strict=True):
        out = {o: sum(got[tag][o].values()) for o in OUTPUTS}
        # R8 conservation, against the reference's own count of the input rows
        assert res.rows_in == r.rows_in == sum(out.values()), (ds.name, tag, res, out)
        assert (res.unique, res.duplicates, res.expired, res.rejected) == tuple(
            out[o] for o in OUTPUTS), (ds.name, tag)
        assert (res.latest_point, res.expiry_point) == (r.latest, r.expiry_point), (ds.name, tag)
    problems = compare(ds, ref, got)
    assert not problems, "\n".join(problems)

    # R10: a rerun changes nothing
    for hours in RERUNS.get(name, []):
        load_hours(spark, ds, [keys[h] for h in hours])
        assert engine_outputs(ds) == got, f"{name}: rerun of hours {hours} changed the outputs"
