"""Integrity of the pipeline's own state: the lock, index content, commit records,
verify on a damaged warehouse, durability of the small state files."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import struct
import subprocess
import time
import zlib
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dedup_pipeline.engine.core.commits import CommitRecordError, read_commit
from dedup_pipeline.engine.core.index.health import IndexDamagedError, check_index
from dedup_pipeline.engine.core.index.rebuild import rebuild_index
from dedup_pipeline.engine.core.lock import DatasetLockedError, Lock
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline.orchestration.names import rebuild_op_name
from dedup_pipeline.orchestration.recovery import build_rebuild_job, build_recovery_sensor
from dedup_pipeline_tests import lock_worker
from dedup_pipeline_tests.conftest import dataset_config, read_output, write_hour


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.slow  # many processes racing for the lock
def test_stale_lock_takeover_is_exclusive_under_races(tmp_path: Path) -> None:
    """R10: 3 processes x 300 trials race for a stale lock of a dead pid: exactly one wins each."""
    workers, trials = 3, 300
    root = str(tmp_path / "warehouse")
    os.makedirs(root)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    got = ctx.Array("b", workers * trials, lock=False)
    procs = [ctx.Process(target=lock_worker.race, args=(root, w, trials, barrier, got, workers))
             for w in range(workers)]
    for p in procs:
        p.start()
    stale = json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "owner": "a killed run",
                        "since": "2026-01-01T00:00:00Z"})
    t0 = time.perf_counter()
    try:
        for _ in range(trials):
            Path(root, "_lock").write_text(stale)
            barrier.wait(timeout=60)
            barrier.wait(timeout=60)
            barrier.wait(timeout=60)
    finally:
        for p in procs:
            p.join(timeout=60)
    elapsed = time.perf_counter() - t0
    assert all(p.exitcode == 0 for p in procs)
    winners = [sum(got[t * workers:(t + 1) * workers]) for t in range(trials)]
    doubles = [t for t, n in enumerate(winners) if n > 1]
    assert doubles == [], f"{len(doubles)} of {trials} trials had two holders ({elapsed:.1f}s)"
    assert winners == [1] * trials  # and the stale lock is always taken over
    assert not Path(root, "_lock").exists()


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    st = Storage(str(tmp_path / "w"))
    a = Lock(st, "a").acquire()
    try:
        b = Lock(st, "b")
        try:
            b.acquire()
            raise AssertionError("second acquire of a live lock succeeded")
        except Exception as e:  # noqa: BLE001
            assert type(e).__name__ == "DatasetLockedError"
            assert "locked by a (pid" in str(e)
    finally:
        a.release()
    assert not (tmp_path / "w" / "_lock").exists()
    # an unreadable lock (a write cut short) is not held by anyone alive: taken over
    (tmp_path / "w" / "_lock").write_text('{"host": "')
    with Lock(st, "c"):
        assert json.loads((tmp_path / "w" / "_lock").read_text())["owner"] == "c"


# -- index content, commit records ---------------------------------------------------------------
H = [f"2026-11-01-{h:02d}:00" for h in range(4)]


def _ev(eid: str, h: int, m: int) -> dict:
    return {"event_id": eid, "user_id": "u", "event_time": f"2026-11-01T{h:02d}:{m:02d}:00Z",
            "url": f"/{eid}"}


def _site(tmp: Path, **extra: object):
    """Hours 0-2: hour 0 has keys a0..a9; hour 2 repeats all of them (duplicates of hour 0)."""
    ds = dataset_config(tmp, **extra)
    write_hour(ds, H[0], [_ev(f"a{i}", 0, i) for i in range(10)])
    write_hour(ds, H[1], [_ev(f"b{i}", 1, i) for i in range(5)])
    write_hour(ds, H[2], [_ev(f"a{i}", 2, i) for i in range(10)] + [_ev("c0", 2, 30)])
    return ds


def _hour0_index_files(ds) -> list[Path]:
    return sorted(Path(ds.output, "index").glob("slice=*/load_hour=2026-11-01-00/*.parquet"))


def _flip_h1_same_size(ds, path: Path) -> None:
    """Flip one bit of every `_h1` in an index file, keep it valid Parquet, and make the commit
    record's size agree (the damage the size check cannot see); drop the stale .crc."""
    t = pq.read_table(path)
    i = t.schema.get_field_index("_h1")
    flipped = pa.array([v ^ 1 for v in t.column(i).to_pylist()], pa.int64())
    pq.write_table(t.set_column(i, "_h1", flipped), path)
    crc = path.with_name(f".{path.name}.crc")
    crc.unlink(missing_ok=True)
    rec_file = Path(ds.output, "_commits", "load_hour=2026-11-01-00.json")
    rec = json.loads(rec_file.read_text())
    n = int(path.parent.parent.name.split("=")[1])
    for f in rec["index_files"]:
        if f["name"] == path.name and f["slice"] == n:
            f["size"] = path.stat().st_size
    rec_file.write_text(json.dumps(rec))


def _ids(spark, ds, out: str, hour: str) -> set[str]:
    return {r["event_id"] for r in read_output(spark, ds, out, hour)}


def test_flipped_bits_in_index_are_caught_before_a_result_changes(spark, tmp_path: Path) -> None:
    ds = _site(tmp_path)
    load_hours(spark, ds, H[:2])
    for p in _hour0_index_files(ds):
        _flip_h1_same_size(ds, p)
    assert check_index(Storage(ds.output), ds).ok  # listing alone cannot see it
    # the recovery sensor's rolling content check finds it before any load reads it
    res = build_recovery_sensor(ds, build_rebuild_job(ds))(dg.build_sensor_context())
    assert [r.run_config["ops"][rebuild_op_name("clicks")]["config"]["hours"]
            for r in res.run_requests] == [["2026-11-01-00:00"]]
    with pytest.raises(IndexDamagedError, match=r"2026-11-01-00:00.*rebuild-index"):
        load_hours(spark, ds, [H[2]])
    st = Storage(ds.output)
    assert not st.exists(st.path("_commits", "load_hour=2026-11-01-02.json"))
    damage = check_index(st, ds)  # now every later check (the recovery sensor) reports it
    assert not damage.ok and damage.damaged_loads == ["2026-11-01-00"]
    sensor = build_recovery_sensor(ds, build_rebuild_job(ds))
    res = sensor(dg.build_sensor_context())
    assert [r.run_config["ops"][rebuild_op_name("clicks")]["config"]["hours"]
            for r in res.run_requests] == [["2026-11-01-00:00"]]
    # with on_damaged_index: rebuild the load rebuilds first, and the results follow the rules
    ds_rebuild = dataset_config(tmp_path, on_damaged_index="rebuild")
    load_hours(spark, ds_rebuild, [H[2]])
    assert _ids(spark, ds, "duplicates", H[2]) == {f"a{i}" for i in range(10)}
    assert _ids(spark, ds, "unique", H[2]) == {"c0"}
    assert {r["_first_load_hour"] for r in read_output(spark, ds, "duplicates", H[2])} == {
        "2026-11-01-00:00"} or {r["_first_load_hour"] for r in read_output(
            spark, ds, "duplicates", H[2])} == {"2026-11-01-00"}
    assert check_index(st, ds).ok
    assert not (Path(ds.output) / "index" / "_damaged.json").exists()


def _delete_index_once_read(ds, monkeypatch) -> None:
    """Delete the whole index right after a load planned its read of it (before Spark runs the
    read): the index removed under a running load, as a person or a cleanup job would."""
    from dedup_pipeline.engine.core.index import store

    read = store.read_live
    done: list[bool] = []

    def read_then_delete(*args: object, **kwargs: object):
        frame = read(*args, **kwargs)
        if not done:
            done.append(True)
            shutil.rmtree(Path(ds.output, "index"))
        return frame

    monkeypatch.setattr(store, "read_live", read_then_delete)


def test_index_deleted_under_a_running_load_is_index_damage(spark, tmp_path: Path,
                                                            monkeypatch) -> None:
    """A file gone between the load's listing and Spark's read fails the load as index damage
    (named, with the rebuild hint; nothing committed), or with `on_damaged_index: rebuild` the load
    rebuilds and is redone, with the results the rules give."""
    ds = _site(tmp_path)
    load_hours(spark, ds, H[:2])
    _delete_index_once_read(ds, monkeypatch)
    with pytest.raises(IndexDamagedError, match=r"index/slice=.*disappeared while the load read "
                                                r"it.*rebuild-index"):
        load_hours(spark, ds, [H[2]])
    st = Storage(ds.output)
    assert not st.exists(st.path("_commits", "load_hour=2026-11-01-02.json"))
    assert set(check_index(st, ds).damaged_loads) == {"2026-11-01-00", "2026-11-01-01"}
    rebuild_index(spark, ds)
    load_hours(spark, ds, [H[2]])
    assert _ids(spark, ds, "duplicates", H[2]) == {f"a{i}" for i in range(10)}

    ds2 = _site(tmp_path / "self_repair", on_damaged_index="rebuild")
    load_hours(spark, ds2, H[:2])
    _delete_index_once_read(ds2, monkeypatch)
    load_hours(spark, ds2, [H[2]])
    assert _ids(spark, ds2, "duplicates", H[2]) == {f"a{i}" for i in range(10)}
    assert _ids(spark, ds2, "unique", H[2]) == {"c0"}
    assert check_index(Storage(ds2.output), ds2).ok


def test_a_damaged_commit_record_names_file_hour_and_fix(spark, tmp_path: Path) -> None:
    ds = _site(tmp_path)
    load_hours(spark, ds, H[:2])
    rec_file = Path(ds.output, "_commits", "load_hour=2026-11-01-01.json")
    good = rec_file.read_text()
    for bad in (good[: len(good) // 2], json.dumps({"format": 1, "load_hour": "2026-11-01-01"}),
                "[]"):
        rec_file.write_text(bad)
        with pytest.raises(IndexDamagedError) as ei:
            load_hours(spark, ds, [H[2]])
        msg = str(ei.value)
        assert str(rec_file) in msg and "2026-11-01-01:00" in msg and "Rerun that hour" in msg
        damage = check_index(Storage(ds.output), ds)
        assert list(damage.bad_records) == ["2026-11-01-01"] and not damage.ok
        with pytest.raises(CommitRecordError, match="2026-11-01-01:00"):
            read_commit(Storage(ds.output), "2026-11-01-01")
    sensor = build_recovery_sensor(ds, build_rebuild_job(ds))
    res = sensor(dg.build_sensor_context())  # reported, and no rebuild of everything requested
    assert isinstance(res, dg.SkipReason) and "2026-11-01-01:00" in str(res.skip_message)
    assert "Rerun that hour" in str(res.skip_message)
    load_hours(spark, ds, [H[1]])  # the fix the message names: rerun that hour
    load_hours(spark, ds, [H[2]])
    assert _ids(spark, ds, "unique", H[1]) == {f"b{i}" for i in range(5)}
    assert _ids(spark, ds, "duplicates", H[2]) == {f"a{i}" for i in range(10)}
    assert check_index(Storage(ds.output), ds).ok


def test_compacted_index_files_carry_hashes_and_damage_in_them_is_caught(spark,
                                                                         tmp_path: Path) -> None:
    ds = _site(tmp_path, index={"compact_after": 2})
    load_hours(spark, ds, H[:2])
    compacted = sorted(Path(ds.output, "index").glob("slice=*/compact=*/*.parquet"))
    assert compacted
    manifest = json.loads((compacted[0].parent / "_manifest.json").read_text())
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])
    for p in compacted:
        t = pq.read_table(p)
        i = t.schema.get_field_index("_h1")
        pq.write_table(t.set_column(i, "_h1", pa.array([v ^ 4 for v in t.column(i).to_pylist()],
                                                       pa.int64())), p)
        p.with_name(f".{p.name}.crc").unlink(missing_ok=True)
        m = json.loads((p.parent / "_manifest.json").read_text())
        for f in m["files"]:
            if f["name"] == p.name:
                f["size"] = p.stat().st_size
        (p.parent / "_manifest.json").write_text(json.dumps(m))
    # a rerun inside the compacted range would rewrite the damaged file with a fresh hash: refused
    with pytest.raises(IndexDamagedError, match="rebuild-index"):
        load_hours(spark, ds, [H[1]])
    rebuilding = dataset_config(tmp_path, index={"compact_after": 2}, on_damaged_index="rebuild")
    load_hours(spark, rebuilding, [H[1]])  # rebuilds hour 0 first, then reloads hour 1
    load_hours(spark, ds, [H[2]])
    assert _ids(spark, ds, "duplicates", H[2]) == {f"a{i}" for i in range(10)}
    assert _ids(spark, ds, "unique", H[2]) == {"c0"}
    assert check_index(Storage(ds.output), ds, content=True).ok


def test_verify_reports_every_kind_of_warehouse_damage_without_crashing(spark,
                                                                         tmp_path: Path) -> None:
    ds = _site(tmp_path)
    load_hours(spark, ds, H[:3])
    assert verify_dataset(spark, ds).ok
    out = Path(ds.output)
    (out / "unique/load_hour=2026-11-01-00/notes.txt").write_text("operator notes\n")
    (out / "unique/load_hour=2026-11-01-00/extra").mkdir()
    (out / "unique/README.md").write_text("hi\n")
    dup = next((out / "duplicates/load_hour=2026-11-01-02").glob("*.parquet"))
    shutil.copy(dup, dup.with_name("part-99999-copy.snappy.parquet"))
    (out / "expired/load_hour=2026-11-01-01/part-broken.parquet").write_bytes(b"PAR1garbagePAR1")
    orphan = out / "rejected/load_hour=2026-11-01-05"
    shutil.copytree(out / "rejected/load_hour=2026-11-01-00", orphan)
    rec = out / "_commits/load_hour=2026-11-01-01.json"
    rec.write_text(rec.read_text()[:40])
    for p in _hour0_index_files(ds)[:1]:
        _flip_h1_same_size(ds, p)
    idx = _hour0_index_files(ds)[0].relative_to(out)
    (out / "_commits/notes.txt").write_text("x")
    (out / "_commits/load_hour=yesterday.json").write_text("{}")
    stray = out / "index/slice=abc/load_hour=2026-11-01-00"
    stray.mkdir(parents=True)
    shutil.copy(out / idx, stray / "part-0.parquet")

    rep = verify_dataset(spark, ds)
    assert not rep.ok
    text = "\n".join(rep.violations)

    def reported(hour: str, *needles: str) -> bool:
        return any(v.startswith(hour) and all(n in v for n in needles) for v in rep.violations)

    assert reported("2026-11-01-00:00", "unique/load_hour=2026-11-01-00/notes.txt"), text
    assert reported("2026-11-01-00:00", "unique/load_hour=2026-11-01-00/extra"), text
    assert reported("unique/README.md"), text
    assert reported("2026-11-01-02:00", "part-99999-copy.snappy.parquet", "commit record"), text
    assert reported("2026-11-01-02:00", "conservation broken"), text
    assert reported("2026-11-01-01:00", "expired/load_hour=2026-11-01-01/part-broken.parquet",
                    "not readable"), text
    assert reported("2026-11-01-05:00", "rejected/load_hour=2026-11-01-05", "no commit record"), text
    assert reported("2026-11-01-01:00", str(rec), "Rerun that hour"), text
    assert reported("2026-11-01-00:00", str(idx.relative_to("index")), "SHA-256", "rebuild-index")
    assert reported("_commits/notes.txt", "unexpected"), text
    assert reported("_commits/load_hour=yesterday.json", "unexpected"), text
    assert reported("2026-11-01-00:00", "index/slice=abc/load_hour=2026-11-01-00/part-0.parquet"), text
    assert rep.bad_hours == {"2026-11-01-00", "2026-11-01-01", "2026-11-01-02", "2026-11-01-05"}


def test_state_files_are_fsynced_before_and_after_the_rename(tmp_path: Path, monkeypatch) -> None:
    """A commit record (and the lock) reach the disk before the rename, and the rename too."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("rename", str(dst)))
        real_replace(src, dst)

    def link(src: str, dst: str) -> None:
        events.append(("rename", str(dst)))
        real_link(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)
    st = Storage(str(tmp_path / "w"))
    target = st.path("_commits", "load_hour=2026-11-01-00.json")
    st.write_json_atomic(target, {"x": 1})
    commits_dir = str(tmp_path / "w" / "_commits")
    assert [e[0] for e in events] == ["fsync", "rename", "fsync"], events
    assert ".tmp-" in events[0][1] and events[1][1] == target and events[2][1] == commits_dir
    events.clear()
    with Lock(st, "me"):
        kinds = [e for e in events if e[0] == "rename" or e[1] == str(tmp_path / "w")]
        assert events[0][0] == "fsync" and ".tmp-" in events[0][1]
        assert kinds[0] == ("rename", st.path("_lock")) and kinds[1] == ("fsync", st.path())


# -- damage cases: one small warehouse, copied per case, damaged, then checked ----------------------
COMPACT = {"compact_after": 2}


@pytest.fixture(scope="module")
def loaded(spark, tmp_path_factory) -> Path:
    """`_site` with hours 0-1 loaded and compacted (slices holding both hours are merged)."""
    base = tmp_path_factory.mktemp("loaded")
    load_hours(spark, _site(base, index=COMPACT), H[:2])
    assert list(Path(base, "warehouse", "index").glob("slice=*/compact=*/_manifest.json"))
    return base


def _copy(loaded: Path, tmp_path: Path, **extra: object):
    shutil.copytree(loaded, tmp_path / "w")
    return dataset_config(tmp_path / "w", index=COMPACT, **extra)


def _rec_file(ds, tag: str) -> Path:
    return Path(ds.output, "_commits", f"load_hour={tag}.json")


def _exact_after_hour2(spark, ds) -> None:
    assert sorted(r["event_id"] for r in read_output(spark, ds, "duplicates", H[2])) == sorted(
        f"a{i}" for i in range(10))
    assert _ids(spark, ds, "unique", H[2]) == {"c0"}


def test_damaged_records_are_named_with_their_fix(spark, loaded: Path, tmp_path: Path) -> None:
    """A string expiry point is a named record error, not a raw TypeError; a record of an hour
    before `start` says delete it (its rerun is refused); a damaged record of a later, unreachable
    hour does not block earlier loads, so its own fix (rerun it) stays reachable under R11."""
    ds = _copy(loaded, tmp_path)
    st = Storage(ds.output)
    rec1 = _rec_file(ds, "2026-11-01-01")
    good = rec1.read_text()
    rec1.write_text(json.dumps({**json.loads(good), "latest_point": "garbage"}))
    with pytest.raises(IndexDamagedError) as ei:
        load_hours(spark, ds, [H[2]])
    assert (f"commit record {rec1} of hour 2026-11-01-01:00 is damaged (field 'latest_point' is "
            "'garbage', expected a number or null)") in str(ei.value)
    assert ("Rerun that hour (dedup-pipeline run --config <file> --from 2026-11-01-01:00 --to "
            "2026-11-01-01:00)") in str(ei.value)
    rec1.write_text(json.dumps({**json.loads(good), "operator_note": {"x": 1}}))  # unknown: fine
    assert check_index(st, ds).ok

    before = _rec_file(ds, "2026-10-31-23")  # a copied record of an hour before the start
    before.write_text(json.dumps({**json.loads(good), "load_hour": "2026-10-31-23"}))
    with pytest.raises(IndexDamagedError) as ei:
        load_hours(spark, ds, [H[2]])
    assert str(ei.value) == (
        f"dataset 'clicks': commit record {before} is of hour 2026-10-31-23:00, before the "
        f"dataset's start 2026-11-01-00:00: no load writes such a record (a copied or misnamed "
        f"file). Delete {before}")
    before.unlink()

    later = _rec_file(ds, "2026-11-01-05")  # damaged record of an hour R11 cannot rerun yet
    later.write_text(good)  # its load_hour says 01
    load_hours(spark, ds, [H[2]])  # not blocked: hour 2 reads nothing of hour 5
    _exact_after_hour2(spark, ds)
    damage = check_index(st, ds)
    assert list(damage.bad_records) == ["2026-11-01-05"] and "expected '2026-11-01-05'" in (
        damage.bad_records["2026-11-01-05"])
    later.unlink()
    before.write_text(json.dumps({**json.loads(good), "load_hour": "2026-10-31-23"}))
    rep = verify_dataset(spark, ds)
    assert rep.bad_hours == {"2026-10-31-23"}
    assert rep.violations[0] == (
        f"2026-10-31-23:00: commit record {before} is of an hour before the dataset's start "
        "2026-11-01-00:00 (no load writes it; delete it)")


def test_rebuild_refuses_a_damaged_unique(spark, loaded: Path, tmp_path: Path) -> None:
    """rebuild-index reads exactly the unique files the record lists: a removed unique file (or a
    copied record of a never-loaded hour) is refused, never 'repaired' into a healthy-looking index
    missing keys (later loads would take them for new), and a copied unique file doubles nothing."""
    ds = _copy(loaded, tmp_path)
    uniq0 = Path(ds.output, "unique", "load_hour=2026-11-01-00")
    (f0,) = list(uniq0.glob("*.parquet"))
    shutil.copy(f0, uniq0 / "part-99999-copy.snappy.parquet")  # not listed: not read
    rebuild_index(spark, ds)
    assert check_index(Storage(ds.output), ds, content=True).ok
    moved = tmp_path / "aside.parquet"
    f0.rename(moved)
    with pytest.raises(IndexDamagedError) as ei:
        rebuild_index(spark, ds)
    assert str(ei.value) == (
        f"cannot rebuild the index entries of hour 2026-11-01-00:00: {uniq0}/{f0.name}, listed in "
        "its commit record, is missing, so its keys are not all there to rebuild from. Rerun that "
        "hour (dedup-pipeline run --config <file> --from 2026-11-01-00:00 --to 2026-11-01-00:00); "
        "if it was never "
        f"loaded (a copied commit record), delete {_rec_file(ds, '2026-11-01-00')}")
    moved.rename(f0)
    (uniq0 / "part-99999-copy.snappy.parquet").unlink()
    ghost = _rec_file(ds, "2026-11-01-05")  # a valid record of an hour never loaded
    ghost.write_text(json.dumps({**json.loads(_rec_file(ds, "2026-11-01-01").read_text()),
                                 "load_hour": "2026-11-01-05"}))
    with pytest.raises(IndexDamagedError, match=r"missing or changed for 1 committed load\(s\): "
                       r"2026-11-01-05:00\).*rebuild-index"):
        load_hours(spark, ds, [H[2]])
    with pytest.raises(IndexDamagedError, match=(
            r"hour 2026-11-01-05:00: its unique partition .*unique/load_hour=2026-11-01-05 is "
            r"missing.*delete .*_commits/load_hour=2026-11-01-05.json")):
        rebuild_index(spark, ds)
    ghost.unlink()
    load_hours(spark, ds, [H[2]])
    _exact_after_hour2(spark, ds)


def _flip_compacted_with_crc(ds) -> None:
    p = sorted(Path(ds.output, "index").glob("slice=*/compact=*/*.parquet"))[0]
    data = bytearray(p.read_bytes())
    data[len(data) // 3] ^= 0x10
    p.write_bytes(bytes(data))
    crc = p.with_name(f".{p.name}.crc")
    raw = crc.read_bytes()
    step = struct.unpack(">i", raw[4:8])[0]
    crc.write_bytes(raw[:8] + b"".join(struct.pack(">I", zlib.crc32(data[i:i + step]))
                                       for i in range(0, len(data), step)))


def _truncate_manifest(ds) -> None:
    m = sorted(Path(ds.output, "index").glob("slice=*/compact=*/_manifest.json"))[0]
    m.write_text(m.read_text()[:30])


def _manifest_of_another_format(ds) -> None:
    m = sorted(Path(ds.output, "index").glob("slice=*/compact=*/_manifest.json"))[0]
    m.write_text(json.dumps({**json.loads(m.read_text()), "format": 2}))


def _harmless(ds) -> None:
    out = Path(ds.output)
    (out / "index" / "_damaged.json").write_text("\x00garbage{")
    (out / "index" / "notes.txt").write_text("x")
    (out / "_commits" / "notes.txt").write_text("x")
    (out / "_lock.guard").unlink()
    (out / "_lock").write_bytes(b"\xff garbage")  # a lock nobody could have written whole


@pytest.mark.parametrize("damage, refused", [
    (_flip_compacted_with_crc, "index files whose content differs"),
    (_truncate_manifest, "index file(s) not written by their load"),
    (_manifest_of_another_format, "_manifest.json is of format 2, expected format 1; rebuild the "
                                  "index: dedup-pipeline rebuild-index --config <file> --dataset "
                                  "<name>"),
    (_harmless, None),
])
def test_index_damage_is_refused_then_exact_after_rebuild(spark, loaded: Path, tmp_path: Path,
                                                          damage, refused: str | None) -> None:
    """Refused with the rebuild hint, then exact after it."""
    ds = _copy(loaded, tmp_path)
    damage(ds)
    if refused:
        with pytest.raises(IndexDamagedError) as ei:
            load_hours(spark, ds, [H[2]])
        assert refused in str(ei.value) and "dedup-pipeline rebuild-index" in str(ei.value)
        assert "2026-11-01-0" in str(ei.value) or "load_hour=2026-11-01-0" in str(ei.value)
        rebuild_index(spark, ds)
    load_hours(spark, ds, [H[2]])
    _exact_after_hour2(spark, ds)
    assert check_index(Storage(ds.output), ds, content=True).ok


def test_lock_reused_pid_and_directory_cases(tmp_path: Path) -> None:
    """A stale lock whose pid was reused by a live process (another start time) is taken over,
    not honoured forever; a `_lock` that is a directory is a DatasetLockedError, not a raw
    IsADirectoryError."""
    st = Storage(str(tmp_path / "w"))
    st.makedirs(st.root)
    lock = Path(st.root, "_lock")
    me = {"host": socket.gethostname(), "pid": 1, "owner": "a killed run", "since": "2026"}
    lock.write_text(json.dumps(me))  # an older lock without a start time: honoured
    with pytest.raises(DatasetLockedError, match=r"locked by a killed run \(pid 1 on "):
        Lock(st, "b").acquire()
    lock.write_text(json.dumps({**me, "started": 12345}))  # pid 1 runs, but not since then
    with Lock(st, "b"):
        assert json.loads(lock.read_text())["owner"] == "b"
        started = json.loads(lock.read_text())["started"]
        assert isinstance(started, int) and started != 12345
        with pytest.raises(DatasetLockedError, match="locked by b"):  # the live owner: held
            Lock(st, "c").acquire()
    lock.mkdir()
    with pytest.raises(DatasetLockedError) as ei:
        Lock(st, "d").acquire()
    assert str(ei.value).startswith(f"dataset at {st.root}: the lock {lock} cannot be taken")
    assert f"remove {lock} and {lock}.guard" in str(ei.value)
