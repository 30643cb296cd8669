"""Index compaction never changes results (design.md R4, R7, R10, R12).

The same landing data is loaded twice, with compaction after every 2 per-load directories and
without compaction. Every output of every hour and the whole set of index entries must be equal;
so must they after a rerun of an hour whose entries sit inside a compacted directory, and after a
compacted file is lost and the index is rebuilt from unique.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.columns import ENTRY_LOAD_HOUR
from dedup_pipeline.engine.core.index import compaction, store
from dedup_pipeline.engine.core.index.health import check_index
from dedup_pipeline.engine.core.index.live import live_files
from dedup_pipeline.engine.core.index.rebuild import rebuild_index
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.hours import parse_hour, to_tag
from dedup_pipeline_tests.conftest import dataset_config, write_hour

HOURS = [f"2026-11-01-{h:02d}:00" for h in range(6)]
OUTPUTS = ("unique", "duplicates", "expired", "rejected")
SCHEMA = {"event_id": "string", "user_id": "string", "event_time": "timestamp", "url": "string"}


def _landing(ds: DatasetConfig) -> None:
    """Fresh keys every hour, replays of the two hours before, a conflict, a late record."""
    for h, key in enumerate(HOURS):
        rows: list[Any] = []
        for j in range(8):
            rows.append({"event_id": f"k{h}-{j}", "user_id": f"u{j}", "url": "/a",
                         "event_time": f"{key[:10]}T{key[11:13]}:{10 + j}:00Z"})
        for back in (1, 2):
            if h >= back:
                rows.append({"event_id": f"k{h - back}-{h}", "user_id": f"u{h}", "url": "/a",
                             "event_time": f"{HOURS[h - back][:10]}T{HOURS[h - back][11:13]}:1{h}:00Z"})
        if h:
            rows.append({"event_id": f"k{h - 1}-0", "user_id": "u0", "url": "/changed",
                         "event_time": f"{key[:10]}T{key[11:13]}:30:00Z"})
            rows.append({"event_id": f"late{h}", "user_id": "u9", "url": "/late",
                         "event_time": f"{HOURS[h - 1][:10]}T{HOURS[h - 1][11:13]}:59:00Z"})
        write_hour(ds, key, rows)


def _datasets(tmp: Path, expiry: bool) -> tuple[DatasetConfig, DatasetConfig]:
    common: dict[str, Any] = {"source": {"path": "landing", "format": "jsonl", "schema": SCHEMA},
                              "fingerprint": ["user_id", "url"], "order_by": "event_time"}
    index: dict[str, Any] = {"buckets": 2}
    if expiry:
        common["expiry"] = {"column": "event_time", "period": "3h"}
        index = {"slice_span": "1h"}
    on = dataset_config(tmp, output="compacted", index={**index, "compact_after": 2}, **common)
    off = dataset_config(tmp, output="plain", index={**index, "compact_after": 0}, **common)
    return on, off


def _rows(ds: DatasetConfig) -> dict[str, list[tuple]]:
    """Every output (all hours, with the hour) and every index entry, as sorted tuples. An output
    is read through its Delta table: after a rerun the replaced files stay on disk until a vacuum."""
    out: dict[str, list[tuple]] = {}
    for name in OUTPUTS:
        t = DeltaTable(str(Path(ds.output) / name)).to_pyarrow_table()
        out[name] = sorted(zip(*[t.column(c).to_pylist() for c in sorted(t.column_names)],
                               strict=True), key=repr)
    files = Storage(ds.output).list_files(str(Path(ds.output) / "index"), ".parquet")
    entries: list[tuple] = []
    for f in files:
        t = pq.read_table(f)
        entries += zip(*[t.column(c).to_pylist() for c in sorted(t.column_names)], strict=True)
    out["index"] = sorted(entries, key=repr)
    return out


def _entries_read_by(spark: SparkSession, ds: DatasetConfig, hour: str) -> list[dict[str, Any]]:
    """The index entries a (re)load of `hour` probes, before the expiry filter (every slice)."""
    st = Storage(ds.output)
    tag = to_tag(parse_hour(hour))
    readable = {t for t in commits.committed_tags(st) if t < tag}
    live = live_files(ds, check_index(st, ds).files, readable, None)
    df = store.read_live(spark, ds, st, live, tag)
    return [] if df is None else sorted((r.asDict() for r in df.collect()), key=repr)


@pytest.mark.parametrize("expiry", [False, True], ids=["no_expiry", "expiry"])
def test_compaction_never_changes_results(spark: SparkSession, tmp_path: Path, expiry: bool) -> None:
    on, off = _datasets(tmp_path, expiry)
    _landing(on)
    load_hours(spark, on, HOURS[:5])
    load_hours(spark, off, HOURS[:5])

    st = Storage(on.output)
    merged = compaction.list_compacted(st)
    assert merged, "compaction should have merged per-load directories"
    assert not compaction.list_compacted(Storage(off.output))
    assert check_index(st, on).ok
    assert _rows(on) == _rows(off)
    # a (re)load of any hour probes exactly the entries of earlier loads, compacted or not: a
    # compacted directory can also hold the hour's own and later loads, which it must not see (R10)
    tags = {h: to_tag(parse_hour(h)) for h in HOURS[:5]}
    straddled = [h for h in HOURS[:5] if any(min(c.loads) < tags[h] <= max(c.loads) for c in merged)]
    assert straddled, "no compacted directory holds both earlier and later loads: nothing tested"
    for h in HOURS[:5]:
        seen = _entries_read_by(spark, on, h)
        assert seen == _entries_read_by(spark, off, h), h
        assert all(e[ENTRY_LOAD_HOUR] < tags[h] for e in seen), h

    # a rerun of an hour whose entries are inside a compacted directory
    inside = sorted({t for c in merged for t in c.loads})[1]
    rerun = f"{inside[:10]}-{inside[11:13]}:00"
    load_hours(spark, on, [h for h in HOURS[:5] if parse_hour(h) >= parse_hour(rerun)])
    assert check_index(st, on).ok
    assert _rows(on) == _rows(off)

    # a lost compacted file: detected, its loads rebuilt from unique, later loads unaffected
    victim = compaction.list_compacted(st)[0]  # as it is now: the rerun took its hour out
    lost = next(iter(st.list_files(st.path("index", victim.rel), ".parquet")))
    Path(lost).unlink()
    damage = check_index(st, on)
    assert not damage.ok and set(victim.loads) <= set(damage.damaged_loads)
    rebuild_index(spark, on, damage.damaged_loads)
    assert check_index(st, on).ok
    load_hours(spark, on, [HOURS[5]])
    load_hours(spark, off, [HOURS[5]])
    a, b = _rows(on), _rows(off)
    assert {k: v for k, v in a.items() if k != "index"} == {k: v for k, v in b.items() if k != "index"}
    # the rebuilt entries equal the lost ones (rebuild files are per load, not compacted: compare sets)
    assert a["index"] == b["index"]
