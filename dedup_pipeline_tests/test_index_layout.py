"""The index's on-disk names (engine/core/index/layout.py): the grammar loads, rebuilds, checks and
Hadoop error messages agree on. Changing a name changes the index format. No Spark."""

from __future__ import annotations

from dedup_pipeline.engine.core.commits import IndexFileEntry
from dedup_pipeline.engine.core.index import layout
from dedup_pipeline.engine.core.index.health import index_read_failure
from dedup_pipeline.engine.core.index.layout import IndexFile


def test_names_build_and_parse_back() -> None:
    tag = "2026-11-01-05"
    assert layout.load_rel(-3, tag) == "slice=-3/load_hour=2026-11-01-05"
    assert layout.staging_rel(tag) == "_staging/load_hour=2026-11-01-05"
    assert layout.compact_dir("a", "b") == "compact=a_b"
    assert layout.slice_number("slice=-3") == -3
    assert layout.slice_number("slice=x") is None and layout.is_slice_dir("slice=x")
    assert layout.slice_number("_staging") is None
    assert layout.load_tag(layout.load_dir(tag)) == tag
    assert layout.load_tag("compact=a_b") is None and layout.is_compact_dir("compact=a_b")
    assert layout.rel_load(f"slice=0/load_hour={tag}/part-0.parquet") == tag
    assert layout.rel_load("slice=0/compact=a_b/part-0.parquet") is None


def test_index_file_paths_and_the_checksum_message_agree() -> None:
    entry = IndexFileEntry(slice=7, name="part-0.parquet", size=10, rows=1, sha256="ab")
    per_load = IndexFile.of(entry, "2026-11-01-05")
    merged = IndexFile(tag="2026-11-01-01", slice=7, name="part-1.parquet", size=10, rows=1,
                       sha256="cd",
                       dir="compact=2026-11-01-01_2026-11-01-04",
                       loads=("2026-11-01-01", "2026-11-01-04"))
    assert isinstance(per_load, IndexFileEntry) and per_load.to_json() == {
        **entry.to_json(), "tag": "2026-11-01-05", "dir": "", "loads": []}
    assert per_load.rel == "slice=7/load_hour=2026-11-01-05/part-0.parquet"
    assert per_load.holds == ("2026-11-01-05",)
    assert merged.rel == "slice=7/compact=2026-11-01-01_2026-11-01-04/part-1.parquet"
    for f in (per_load, merged):
        err = RuntimeError(f"org.apache.hadoop.fs.ChecksumException: Checksum error: "
                           f"/data/out/{layout.INDEX}/{f.rel} at 0 exp: 1 got: 2")
        found = index_read_failure(err)
        assert found is not None and (found.rel, found.kind) == (f.rel, "checksum")
    found = index_read_failure(RuntimeError(f"no such file {layout.INDEX}/{per_load.rel}"))
    assert found is None or found.kind != "checksum"
