"""The commit record is what a load reports: one type, every figure in it, records of
earlier versions still read, unknown fields kept, damaged ones named with their fix.

`fixtures/records/` holds records real loads wrote (hour 2026-11-01-01 of a two-hour load with
expiry and a fingerprint): `first_release.json` by the first release (ef09954, 2026-11-22: no
index files, hashes, output files, contract, key digest or publish token) and `current.json` by
0255d9f (2026-11-27, Delta outputs: every field)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from dedup_pipeline.engine.core.commits import (
    CommitRecord,
    CommitRecordError,
    DigestFileEntry,
    IndexFileEntry,
    OutputFileEntry,
    commit_path,
    read_commit,
    write_commit,
)
from dedup_pipeline.engine.core.parse import InputFile
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
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
        assert isinstance(r, CommitRecord)
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


FIXTURES = Path(__file__).parent / "fixtures" / "records"
FIXTURE_TAG = "2026-11-01-01"
# what this version writes for a field the record lacks (as every version since it was added)
WRITTEN_DEFAULTS = {"check_figures": {}, "index_format": 1, "index_files": []}


def _stored(tmp_path: Path, doc: object) -> tuple[Storage, Path]:
    st = Storage(str(tmp_path / "w"))
    path = Path(commit_path(st, FIXTURE_TAG))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return st, path


@pytest.mark.parametrize("name", ["first_release", "current"])
def test_records_real_loads_wrote_read_and_rewrite_with_their_own_keys(name: str,
                                                                       tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    st, path = _stored(tmp_path, doc)
    rec = read_commit(st, FIXTURE_TAG)
    assert rec is not None
    assert (rec.load_hour, rec.partition_key, rec.dataset) == (FIXTURE_TAG, "2026-11-01-01:00",
                                                               "clicks")
    assert (rec.rows_in, rec.unique, rec.duplicates, rec.expired, rec.rejected) == (5, 2, 1, 1, 1)
    assert rec.rates == {"duplicate_rate": round(1 / 3, 6), "conflict_rate": 0.0,
                         "rejected_rate": 0.2}
    assert rec.latest_point == doc["latest_point"] and isinstance(rec.latest_point, int)
    write_commit(st, rec)
    again = json.loads(path.read_text())
    assert again == {**WRITTEN_DEFAULTS, **doc}  # every key kept, none added but the defaults
    assert CommitRecord.from_json(again, FIXTURE_TAG) == rec


def test_a_first_release_record_reads_without_any_later_field(tmp_path: Path) -> None:
    st, _ = _stored(tmp_path, (FIXTURES / "first_release.json").read_text())
    rec = read_commit(st, FIXTURE_TAG)
    assert rec is not None
    assert (rec.index_files, rec.index_format, rec.check_figures, rec.output_files,
            rec.contract_version, rec.key_digest, rec.publish_token) == ((), 1, {}, None, None,
                                                                          None, None)
    assert rec.inputs is not None and [(f.size, f.sha256) for f in rec.inputs] == [(358, None)]
    # the least a record ever held: its hour and its counts
    least = {"load_hour": FIXTURE_TAG, "rows_in": 5, "unique": 2, "duplicates": 1, "expired": 1,
             "rejected": 1}
    st, path = _stored(tmp_path / "least", least)
    rec = read_commit(st, FIXTURE_TAG)
    assert rec is not None and (rec.dataset, rec.partition_key, rec.inputs) == (
        "", "2026-11-01-01:00", None)
    write_commit(st, rec)
    assert set(json.loads(path.read_text())) == {  # the unset optional fields left out
        *least, "dataset", "partition_key", "conflicts", "latest_point", "expiry_point",
        "files_in", "index_rows_written", "index_rows_read", "index_bytes_read",
        "index_files_read", "index_slices_written", "index_slices_deleted", "files_written",
        "seconds", "check_figures", "index_files", "index_format"}


def test_a_current_record_has_one_entry_type_per_file_kind(tmp_path: Path) -> None:
    st, _ = _stored(tmp_path, (FIXTURES / "current.json").read_text())
    rec = read_commit(st, FIXTURE_TAG)
    assert rec is not None and rec.inputs and rec.output_files and rec.key_digest
    assert all(isinstance(f, IndexFileEntry) and f.sha256 and f.rows == 1 for f in rec.index_files)
    assert [f.slice for f in rec.index_files] == list(rec.index_slices_written)
    assert all(isinstance(f, InputFile) and f.sha256 for f in rec.inputs)
    assert set(rec.output_files) == {"unique", "duplicates", "expired", "rejected"}
    assert all(isinstance(f, OutputFileEntry) and f.size for fs in rec.output_files.values()
               for f in fs)
    assert all(isinstance(f, DigestFileEntry) and f.footer_sha256 for f in rec.key_digest)
    assert (rec.contract_version, rec.index_format) == (1, 2) and rec.publish_token
    with pytest.raises(ValueError):  # frozen: a changed record is a new one
        rec.rows_in = 6  # type: ignore[misc]
    assert rec.with_(rows_in=6).rows_in == 6 and rec.rows_in == 5


def _index_file(doc: dict, **change: object) -> dict:
    return {**doc, "index_files": [{**doc["index_files"][0], **change}, *doc["index_files"][1:]]}


CURRENT = json.loads((FIXTURES / "current.json").read_text())
DAMAGED = [  # (the record, what the error must say is wrong)
    ({**CURRENT, "rows_in": "5"}, "field 'rows_in' is '5', expected a count"),
    ({**CURRENT, "unique": True}, "field 'unique' is True, expected a count"),
    ({**CURRENT, "duplicates": -1}, "field 'duplicates' is -1, expected a count"),
    ({k: v for k, v in CURRENT.items() if k != "expired"}, "field 'expired' is missing"),
    ({**CURRENT, "load_hour": "2026-11-01-02"},
     "load_hour is '2026-11-01-02', expected '2026-11-01-01'"),
    ({**CURRENT, "latest_point": "garbage"},
     "field 'latest_point' is 'garbage', expected a number or null"),
    ({**CURRENT, "dataset": 7}, "field 'dataset' is 7, expected a string"),
    ({**CURRENT, "index_slices_written": [1992772, "x"]},
     "field 'index_slices_written[1]' is 'x', expected an integer"),
    (_index_file(CURRENT, size=-1512), "field 'index_files[0].size' is -1512, expected a count"),
    ({**CURRENT, "index_files": [{"slice": 1, "name": "p"}]}, "field 'index_files[0].size' is missing"),
    ({**CURRENT, "inputs": [{**CURRENT["inputs"][0], "mtime": "yesterday"}]},
     "field 'inputs[0].mtime' is 'yesterday', expected a number"),
    ({**CURRENT, "output_files": {"unique": [{"size": 4003}]}},
     "field 'output_files.unique[0].name' is missing"),
    ({**CURRENT, "key_digest": {"name": "x"}}, "field 'key_digest' is {'name': 'x'}, expected a list"),
    ({**CURRENT, "seconds": {"parse": "slow"}}, "field 'seconds.parse' is 'slow', expected a number"),
    ({**CURRENT, "publish_token": -3}, "field 'publish_token' is -3, expected a count"),
    ([CURRENT], "not a JSON object but list"),
    (json.dumps(CURRENT)[:-40], "not valid JSON: "),
]


@pytest.mark.parametrize(("doc", "problem"), DAMAGED)
def test_a_damaged_record_is_named_with_what_is_wrong_and_the_fix(doc: object, problem: str,
                                                                 tmp_path: Path) -> None:
    st, path = _stored(tmp_path, doc)
    with pytest.raises(CommitRecordError) as ei:
        read_commit(st, FIXTURE_TAG)
    assert str(ei.value).startswith(
        f"commit record {path} of hour 2026-11-01-01:00 is damaged ({problem}")
    assert str(ei.value).endswith(
        "the hour's state cannot be trusted. Rerun that hour (dedup-pipeline run --from "
        "2026-11-01-01:00 --to 2026-11-01-01:00): it deletes the record and loads the hour "
        "afresh, with the same result")


def test_the_commit_log_gives_one_answer_and_sees_changes_made_by_hand(tmp_path: Path) -> None:
    """`CommitLog.committed` (what loads, sensors, checks and verify ask) answers from the saved
    summary only while `_commits/` is as it was when saved; a record deleted or added by hand is
    seen at once, a summary that does not parse is read around, and the first save removes the
    summary of the old location (`index/_live.json`)."""
    from dedup_pipeline.engine.core.commit_log import LEGACY_SUMMARY, SUMMARY, CommitLog
    from dedup_pipeline.engine.core.commits import committed_tags
    from dedup_pipeline.hours import HourSet

    rec = CommitRecord.from_json(json.loads((FIXTURES / "current.json").read_text()), FIXTURE_TAG)
    st = Storage(str(tmp_path / "w"))
    Path(st.path("_commits")).mkdir(parents=True)
    legacy = Path(st.path(*LEGACY_SUMMARY))
    legacy.parent.mkdir(parents=True)
    legacy.write_text("{}")
    tags = ["2026-11-01-00", "2026-11-01-01", "2026-11-01-02"]
    log = CommitLog(st)
    assert log.summary() is None
    for t in tags[:2]:
        log.write(rec.with_(load_hour=t, partition_key=f"{t}:00"))
    assert set(log.committed()) == set(tags[:2]) == committed_tags(st)

    # a lock holder's state: the two records, valid at the mtime its last own change stamped
    from dedup_pipeline.engine.core.commit_log import Summary

    holder = CommitLog(st)
    holder.summary()
    holder.follow(Summary(HourSet.of(tags[:2]), commits_mtime=holder.mtime()))
    holder.forget("2026-11-01-09")  # own change (nothing there): stamps _commits/
    holder.save_summary()
    assert not legacy.exists()
    saved = CommitLog(st).summary()
    assert saved is not None and saved.commits_mtime == CommitLog(st).mtime()
    assert set(CommitLog(st).committed()) == set(tags[:2])

    # by hand: a record added, then one deleted; each is seen although the summary lists two
    write_commit(st, rec.with_(load_hour=tags[2], partition_key=f"{tags[2]}:00"))
    assert set(CommitLog(st).committed()) == set(tags) == committed_tags(st)
    Path(commit_path(st, tags[0])).unlink()
    assert set(CommitLog(st).committed()) == set(tags[1:]) == committed_tags(st)
    Path(st.path(SUMMARY)).write_text("{garbage")
    assert CommitLog(st).summary() is None
    assert set(CommitLog(st).committed()) == set(tags[1:])
