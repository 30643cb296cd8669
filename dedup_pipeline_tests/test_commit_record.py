"""The commit record is what a load reports: one type, every figure in it, records of
earlier versions still read, unknown fields kept."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pyspark.sql import SparkSession

from dedup_pipeline.engine.commits import CommitRecord, commit_path, read_commit, write_commit
from dedup_pipeline.engine.load import LoadResult, load_hours
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline_tests.conftest import dataset_config, write_hour

HOURS = [f"2026-11-01-{h:02d}:00" for h in range(4)]
TAG = "2026-11-01-00"


def _ev(eid: str, h: int, m: int) -> dict[str, str]:
    return {"event_id": eid, "user_id": "u", "event_time": f"2026-11-01T{h:02d}:{m:02d}:00Z",
            "url": f"/{eid}"}


def test_the_record_holds_every_figure_the_load_reports(spark: SparkSession,
                                                        tmp_path: Path) -> None:
    """Retention and compaction run after the commit; their figures reach the record too (the
    CLI's `secs` column and the restated checks read records, not results)."""
    ds = dataset_config(tmp_path, expiry={"column": "event_time", "period": "1h"},
                        fingerprint=["url"],
                        index={"slice_span": "30m", "retention_lag_hours": 0, "compact_after": 2})
    for h, hour in enumerate(HOURS):
        write_hour(ds, hour, [_ev(f"k{h}", h, 10), _ev(f"k{h}", h, 20), _ev(f"n{h}", h, 40),
                              _ev("old", 0, 0), "{broken"])
    results = load_hours(spark, ds, HOURS)
    st = Storage(ds.output)
    for r in results:
        assert isinstance(r, CommitRecord) and LoadResult is CommitRecord
        assert read_commit(st, r.load_hour) == r
        assert {"parse", "classify", "write_outputs", "write_index", "checks", "commit",
                "retention", "compact", "total"} <= set(r.seconds)
        others = sum(v for k, v in r.seconds.items() if k != "total")
        assert r.seconds["total"] >= others - 0.01
    assert sum(r.index_slices_deleted for r in results) > 0  # set after the first write
    for r in results:  # each input with its size and the SHA-256 of the content it had
        assert r.inputs and all(f.sha256 == hashlib.sha256(Path(f.path).read_bytes()).hexdigest()
                                and f.size == Path(f.path).stat().st_size for f in r.inputs)
    assert [(r.rows_in, r.unique, r.duplicates, r.rejected) for r in results[1:]] == [
        (5, 2, 1, 1)] * 3
    for r in results:  # the key digest it wrote, by name and size (engine/keydigest.py)
        assert r.key_digest and all(
            (Path(ds.output) / "_keys" / f"load_hour={r.load_hour}" / f.name).stat().st_size
            == f.size for f in r.key_digest)


def test_records_of_earlier_versions_read_and_keep_their_fields(tmp_path: Path) -> None:
    """A first-release record: no check figures, index format, output files, rows or hashes."""
    st = Storage(str(tmp_path / "w"))
    old = {
        "dataset": "clicks", "partition_key": "2026-11-01-00:00", "load_hour": TAG, "rows_in": 3,
        "unique": 2, "duplicates": 1, "expired": 0, "rejected": 0, "conflicts": 1,
        "latest_point": 1_761_955_200_000_000, "expiry_point": None, "files_in": 1,
        "index_rows_written": 2, "index_rows_read": 0, "index_bytes_read": 0,
        "index_files_read": 0, "index_slices_written": [3], "index_slices_deleted": 0,
        "files_written": 5, "seconds": {"parse": 0.5, "total": 1.5},
        "committed_at": "2026-11-22T10:00:00Z", "index_checksum": {"xor_h1": 1, "xor_h2": -2},
        "inputs": [{"path": "/l/part-0.jsonl", "size": 10, "mtime": 1.5}],
        "index_files": [{"slice": 3, "name": "part-0.parquet", "size": 100}],
        "operator_note": {"x": 1},
    }
    st.write_json_atomic(commit_path(st, TAG), old)
    rec = read_commit(st, TAG)
    assert rec is not None
    assert (rec.check_figures, rec.index_format, rec.output_files, rec.key_digest) == (
        {}, 1, None, None)
    assert rec.index_files[0].rows is None and rec.index_files[0].sha256 is None
    assert rec.inputs is not None and rec.inputs[0].size == 10
    assert rec.inputs[0].sha256 is None  # inputs without a content hash (before 2026-11-27)
    assert rec.duplicate_rate == 1 / 3
    write_commit(st, rec.with_(index_slices_deleted=2))
    again = json.loads(Path(commit_path(st, TAG)).read_text())
    assert again == {**old, "index_slices_deleted": 2, "check_figures": {}, "index_format": 1}
    assert CommitRecord.from_json(rec.to_json(), TAG) == rec
