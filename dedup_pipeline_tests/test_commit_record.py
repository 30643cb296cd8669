"""The commit record is what a load reports: one type, every figure in it, format 1 and nothing
else, unknown fields kept, damaged ones named with their fix.

`fixtures/records/format_1.json` is a record of hour 2026-11-01-01 of a two-hour load with expiry,
a fingerprint and Delta outputs, every field set; a load writes exactly its keys (checked by the
first test)."""

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
    RecordFormatError,
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
        assert {"index_health", "before_tables", "before_contract", "before_rerun", "parse",
                "classify", "write_outputs", "write_index", "checks", "commit", "publish",
                "key_digest", "retention", "compact", "total"} <= set(r.seconds)
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
    fixture = json.loads((FIXTURES / "format_1.json").read_text())
    for r in results:  # format 1, with the keys of the fixture (Delta outputs: a publish token)
        assert json.loads(Path(commit_path(st, r.load_hour)).read_text()).keys() == fixture.keys()
        assert r.format == 1 and r.index_format == 1


FIXTURES = Path(__file__).parent / "fixtures" / "records"
FIXTURE_TAG = "2026-11-01-01"


def _stored(tmp_path: Path, doc: object) -> tuple[Storage, Path]:
    st = Storage(str(tmp_path / "w"))
    path = Path(commit_path(st, FIXTURE_TAG))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return st, path


def test_a_format_1_record_reads_and_rewrites_with_its_own_keys(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "format_1.json").read_text())
    doc["operator_note"] = {"x": 1}  # a key the package does not know is kept
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
    assert again == doc  # every key kept, none added
    assert CommitRecord.from_json(again, FIXTURE_TAG) == rec


OTHER_FORMATS = [  # (the "format" value stored, None: the key is absent; how the line says it)
    (None, "no format"), (2, "format 2"), (0, "format 0"), ("1", 'format "1"'), (True, "format true"),
]


@pytest.mark.parametrize(("found", "said"), OTHER_FORMATS)
def test_a_record_of_another_format_is_refused_in_one_line(found: object, said: str,
                                                           tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "format_1.json").read_text())
    if found is None:
        del doc["format"]
    else:
        doc["format"] = found
    st, path = _stored(tmp_path, doc)
    with pytest.raises(RecordFormatError) as ei:
        read_commit(st, FIXTURE_TAG)
    assert str(ei.value) == (
        f"{path} is of {said}, expected format 1; the dataset was loaded by another version: "
        "move its output aside and load it again from its start (dedup-pipeline run --config "
        "<file> --dataset <name> --from <start> --to <latest hour>)")
    assert isinstance(ei.value, CommitRecordError)  # damage of its hour to every check


def test_a_current_record_has_one_entry_type_per_file_kind(tmp_path: Path) -> None:
    st, _ = _stored(tmp_path, (FIXTURES / "format_1.json").read_text())
    rec = read_commit(st, FIXTURE_TAG)
    assert rec is not None and rec.inputs and rec.output_files and rec.key_digest
    assert all(isinstance(f, IndexFileEntry) and f.sha256 and f.rows == 1 for f in rec.index_files)
    assert [f.slice for f in rec.index_files] == list(rec.index_slices_written)
    assert all(isinstance(f, InputFile) and f.sha256 for f in rec.inputs)
    assert set(rec.output_files) == {"unique", "duplicates", "expired", "rejected"}
    assert all(isinstance(f, OutputFileEntry) and f.size for fs in rec.output_files.values()
               for f in fs)
    assert all(isinstance(f, DigestFileEntry) and f.footer_sha256 for f in rec.key_digest)
    assert (rec.format, rec.contract_version, rec.index_format) == (1, 1, 1) and rec.publish_token
    with pytest.raises(ValueError):  # frozen: a changed record is a new one
        rec.rows_in = 6  # type: ignore[misc]
    assert rec.with_(rows_in=6).rows_in == 6 and rec.rows_in == 5


def _index_file(doc: dict, **change: object) -> dict:
    return {**doc, "index_files": [{**doc["index_files"][0], **change}, *doc["index_files"][1:]]}


CURRENT = json.loads((FIXTURES / "format_1.json").read_text())


def _without(doc: dict, key: str) -> dict:
    return {k: v for k, v in doc.items() if k != key}

DAMAGED = [  # (the record, what the error must say is wrong)
    ({**CURRENT, "rows_in": "5"}, "field 'rows_in' is '5', expected a count"),
    ({**CURRENT, "unique": True}, "field 'unique' is True, expected a count"),
    ({**CURRENT, "duplicates": -1}, "field 'duplicates' is -1, expected a count"),
    ({k: v for k, v in CURRENT.items() if k != "expired"}, "field 'expired' is missing"),
    # every field a load writes is required
    (_without(CURRENT, "contract_version"), "field 'contract_version' is missing"),
    (_without(CURRENT, "output_files"), "field 'output_files' is missing"),
    (_without(CURRENT, "inputs"), "field 'inputs' is missing"),
    (_without(CURRENT, "committed_at"), "field 'committed_at' is missing"),
    (_without(CURRENT, "check_figures"), "field 'check_figures' is missing"),
    (_without(CURRENT, "dataset"), "field 'dataset' is missing"),
    ({**CURRENT, "index_files": [{k: v for k, v in CURRENT["index_files"][0].items()
                                  if k != "sha256"}]}, "field 'index_files[0].sha256' is missing"),
    ({**CURRENT, "index_format": 2}, "field 'index_format' is 2, expected 1"),
    ({**CURRENT, "load_hour": "2026-11-01-02"},
     "load_hour is '2026-11-01-02', expected '2026-11-01-01'"),
    ({**CURRENT, "latest_point": "garbage"},
     "field 'latest_point' is 'garbage', expected a number or null"),
    ({**CURRENT, "dataset": 7}, "field 'dataset' is 7, expected a string"),
    ({**CURRENT, "index_slices_written": [1992772, "x"]},
     "field 'index_slices_written[1]' is 'x', expected an integer"),
    (_index_file(CURRENT, size=-1512), "field 'index_files[0].size' is -1512, expected a count"),
    ({**CURRENT, "index_files": [{"slice": 1, "name": "p"}]},
     "field 'index_files[0].size' is missing"),
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
        "the hour's state cannot be trusted. Rerun that hour (dedup-pipeline run --config <file> "
        "--from 2026-11-01-01:00 --to 2026-11-01-01:00): it deletes the record and loads the hour "
        "afresh, with the same result")


def test_the_commit_log_gives_one_answer_and_sees_changes_made_by_hand(tmp_path: Path) -> None:
    """`CommitLog.committed` (what loads, sensors, checks and verify ask) answers from the saved
    summary only while `_commits/` is as it was when saved; a record deleted or added by hand is
    seen at once, and a summary that does not parse or is of another format is read around (and
    said so in one line)."""
    from dedup_pipeline.engine.core.commit_log import SUMMARY, CommitLog
    from dedup_pipeline.engine.core.commits import committed_tags
    from dedup_pipeline.hours import HourSet

    rec = CommitRecord.from_json(json.loads((FIXTURES / "format_1.json").read_text()), FIXTURE_TAG)
    st = Storage(str(tmp_path / "w"))
    Path(st.path("_commits")).mkdir(parents=True)
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
    saved = CommitLog(st).summary()
    assert json.loads(Path(st.path(SUMMARY)).read_text())["format"] == 1
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
    for found, _said in OTHER_FORMATS:  # a summary of another format is not read: rebuilt
        doc = json.loads(saved.stored().model_dump_json())
        if found is None:
            del doc["format"]
        else:
            doc["format"] = found
        Path(st.path(SUMMARY)).write_text(json.dumps(doc))
        assert CommitLog(st).summary() is None
        assert set(CommitLog(st).committed()) == set(tags[1:])
