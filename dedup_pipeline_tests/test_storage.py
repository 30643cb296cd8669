"""Storage primitives (SPEC L3, R10): atomic partition replace and the dataset lock. No Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dedup_pipeline.engine.storage import DatasetLockedError, Lock, Storage


def _make_version(root: Path, name: str, version: int, files: int = 20) -> Path:
    """A partition version whose file names are unique to it, as Spark's are."""
    d = root / name
    d.mkdir(parents=True)
    for i in range(files):
        (d / f"part-{i:03d}-v{version}.parquet").write_text(f"v{version}")
    return d


def test_replace_dir_readers_never_see_a_mix_or_nothing(tmp_path: Path) -> None:
    st = Storage(str(tmp_path))
    target = tmp_path / "unique" / "load_hour=2026-11-01-00"
    _make_version(tmp_path / "unique", "load_hour=2026-11-01-00", 0)
    snapshots: list[tuple[int, frozenset[str]]] = []
    path_reads: list[frozenset[str]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            # a reader that resolves the partition once (like an open directory handle)
            fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
            try:
                names = os.listdir(fd)
                texts = set()
                for n in names:
                    f = os.open(n, os.O_RDONLY, dir_fd=fd)
                    texts.add(os.read(f, 16).decode())
                    os.close(f)
                snapshots.append((len(names), frozenset(texts)))
            finally:
                os.close(fd)
            # a reader that lists, then opens by path: may fail, must never mix versions
            try:
                names = os.listdir(target)
                path_reads.append(frozenset((target / n).read_text() for n in names))
            except FileNotFoundError:
                pass

    t = threading.Thread(target=reader)
    t.start()
    for v in range(1, 60):
        new = _make_version(tmp_path / "_tmp", f"v{v}", v)
        st.replace_dir(str(new), str(target))
    stop.set()
    t.join()
    assert {(target / n).read_text() for n in os.listdir(target)} == {"v59"}
    assert len(snapshots) > 50
    bad = [s for s in snapshots if s[0] != 20 or len(s[1]) != 1]
    assert not bad, f"readers saw a partial or mixed partition: {bad[:3]}"
    assert all(len(r) == 1 for r in path_reads)
    assert not list((tmp_path / "_tmp").iterdir())
    # replaced versions are parked, then purged once old enough
    assert len(list((tmp_path / "_trash").iterdir())) == 59
    assert st.purge_trash(older_than_s=3600) == 0
    assert st.purge_trash(older_than_s=0) == 59


def test_replace_dir_creates_a_new_partition(tmp_path: Path) -> None:
    st = Storage(str(tmp_path))
    new = _make_version(tmp_path / "_tmp", "x", 1, files=2)
    target = tmp_path / "a" / "b"
    st.replace_dir(str(new), str(target))
    assert sorted(os.listdir(target)) == ["part-000-v1.parquet", "part-001-v1.parquet"]
    assert not new.exists()


def test_lock_excludes_a_second_holder_and_names_the_owner(tmp_path: Path) -> None:
    st = Storage(str(tmp_path))
    with Lock(st, "first run"), pytest.raises(DatasetLockedError, match="locked by first run"):
        Lock(st, "second run").acquire()
    # released: can be taken again
    with Lock(st, "third run"):
        assert json.loads((tmp_path / "_lock").read_text())["owner"] == "third run"
    assert not (tmp_path / "_lock").exists()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    code = ("import sys, os; from dedup_pipeline.engine.storage import Lock, Storage\n"
            "Lock(Storage(sys.argv[1]), 'killed run').acquire()\n"
            "os._exit(9)\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60)
    assert res.returncode == 9
    held = json.loads((tmp_path / "_lock").read_text())
    assert held["owner"] == "killed run"
    with Lock(Storage(str(tmp_path)), "recovering run"):
        assert json.loads((tmp_path / "_lock").read_text())["owner"] == "recovering run"


def test_lock_of_another_host_is_honoured(tmp_path: Path) -> None:
    (tmp_path / "_lock").write_text(json.dumps(
        {"host": "elsewhere", "pid": 1, "owner": "remote run", "since": "2026-11-01T00:00:00Z"}))
    with pytest.raises(DatasetLockedError, match="remote run"):
        Lock(Storage(str(tmp_path)), "local run").acquire()
