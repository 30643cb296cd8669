"""Storage primitives (design.md L3, R10): atomic partition replace, the dataset lock, and storage roots
given as URIs (file://, non-local fsspec file systems). No Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dedup_pipeline.engine.core.lock import DatasetLockedError, Lock
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline_tests.conftest import dataset_config, source_raw


def _make_version(root: Path, name: str, version: int, files: int = 20) -> Path:
    """A partition version whose file names are unique to it, as Spark's are."""
    d = root / name
    d.mkdir(parents=True)
    for i in range(files):
        (d / f"part-{i:03d}-v{version}.parquet").write_text(f"v{version}")
    return d


@pytest.mark.fast
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


@pytest.mark.fast
def test_lock_excludes_a_second_holder_and_names_the_owner(tmp_path: Path) -> None:
    st = Storage(str(tmp_path))
    with Lock(st, "first run"), pytest.raises(DatasetLockedError, match="locked by first run"):
        Lock(st, "second run").acquire()
    # released: can be taken again
    with Lock(st, "third run"):
        assert json.loads((tmp_path / "_lock").read_text())["owner"] == "third run"
    assert not (tmp_path / "_lock").exists()


@pytest.mark.fast
def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    code = ("import sys, os\nfrom dedup_pipeline.engine.core.lock import Lock\n"
            "from dedup_pipeline.engine.core.storage import Storage\n"
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


# ---------------------------------------------------------------- storage URIs


@pytest.mark.parametrize("spelling", ["plain", "file:///", "file:/", "file://localhost/"])
def test_file_uris_and_plain_paths_name_the_same_directory(tmp_path: Path, spelling: str) -> None:
    root = str(tmp_path / "out")
    uri = root if spelling == "plain" else spelling + root.lstrip("/")
    st = Storage(uri)
    assert st.local and st.root == root
    assert st.spark_path("unique") == f"{root}/unique"  # Spark gets plain local paths
    assert st.to_uri(st.path("unique", "x.parquet")) == f"{root}/unique/x.parquet"
    st.write_json_atomic(st.path("_commits", "load_hour=2026-11-01-00.json"), {"ok": 1})
    assert json.loads((tmp_path / "out" / "_commits" / "load_hour=2026-11-01-00.json").read_text())
    new = _make_version(tmp_path / "out" / "_tmp", "v1", 1, files=2)
    st.replace_dir(str(new), st.path("unique", "load_hour=2026-11-01-00"))
    assert st.list_dirs(st.path("unique")) == ["load_hour=2026-11-01-00"]
    assert [Path(f).name for f in st.list_files(st.path("unique"), ".parquet")] == [
        "part-000-v1.parquet", "part-001-v1.parquet"]
    with Lock(st, "uri run"):
        assert json.loads((tmp_path / "out" / "_lock").read_text())["owner"] == "uri run"


def test_file_uri_of_another_host_is_refused() -> None:
    with pytest.raises(ValueError, match="must be local"):
        Storage("file://otherhost/data/out")


def test_non_local_storage_gives_spark_the_roots_own_uri() -> None:
    """A non-local fsspec file system (memory://, standing in for hdfs:// and s3a://): the same
    operations work without the local fast paths, and every path handed to Spark carries the
    root's scheme and authority, not fsspec's stripped form."""
    st = Storage("memory://lake-test/warehouse/clicks/")
    assert not st.local and st.uri_root == "memory://lake-test/warehouse/clicks"
    assert st.spark_path("unique") == "memory://lake-test/warehouse/clicks/unique"
    st.write_json_atomic(st.path("_commits", "load_hour=2026-11-01-00.json"), {"rows_in": 3})
    assert st.read_json(st.path("_commits", "load_hour=2026-11-01-00.json")) == {"rows_in": 3}
    for version in (1, 2):  # a new partition, then a replacement (two renames off Linux)
        tmp = st.path("_tmp", f"v{version}")
        st.makedirs(tmp)
        with st.fs.open(f"{tmp}/part-0-v{version}.parquet", "w") as f:
            f.write(f"v{version}")
        st.replace_dir(tmp, st.path("unique", "load_hour=2026-11-01-00"))
    files = st.list_files(st.path("unique"), ".parquet")
    assert [st.read_text(f) for f in files] == ["v2"]
    assert [st.to_uri(f) for f in files] == [
        "memory://lake-test/warehouse/clicks/unique/load_hour=2026-11-01-00/part-0-v2.parquet"]
    assert st.list_dirs(st.path("_trash"))  # the replaced version is parked
    with Lock(st, "remote run"), pytest.raises(DatasetLockedError):
        Lock(st, "second run").acquire()
    assert not st.exists(st.path("_lock"))
    st.remove(st.root)


def test_config_keeps_uris_and_resolves_relative_paths(tmp_path: Path) -> None:
    def ds(source: str, output: str) -> Any:
        return dataset_config(tmp_path, key=["id"], output=output,
                              source=source_raw(source, schema={"id": "string"}))

    for uri in ("file:///data/landing", "hdfs://namenode:8020/lake/landing",
                "s3a://bucket/lake/landing"):
        got = ds(uri, uri.replace("landing", "warehouse"))
        assert (got.source.path, got.output) == (uri, uri.replace("landing", "warehouse"))
    got = ds("landing", "out/clicks")
    assert (got.source.path, got.output) == (str(tmp_path / "landing"), str(tmp_path / "out/clicks"))


# A full load with file:// URIs for source.path and output is compared row for row with the
# plain-path load in test_cluster.py::test_spark_connect_load_equals_local_mode (through Spark
# Connect, whose client has no JVM), so it costs no extra Spark loads here.
