"""What the benchmarks share about their data: the landing zone they generate (or reuse), an
hour's input files, and what a load left (rows conserved, an hour's unique rows read back)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import lake
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.parse import list_input_files
from dedup_pipeline.hours import HOUR, format_hour
from dedup_pipeline.sample.generate import generate_landing


def landing(root: Path, hours: int, rows: int, say: Any,
            thin: tuple[int, frozenset[int]] | None = None) -> Path:
    """Generate (or reuse, if generated with the same arguments) a landing zone; its config.
    `thin` = (rows, full hours): every hour not in `full hours` has that many rows instead."""
    stamp = root / ".generated"
    want = json.dumps({"hours": hours, "rows": rows, "seed": 7,
                       **({"thin": [thin[0], sorted(thin[1])]} if thin else {})})
    if stamp.exists() and stamp.read_text() == want:
        say(f"reusing {hours} h x {rows} rows in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
        start = format_hour(datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
                       - (hours + 1) * HOUR)
        rows_of = None if thin is None else (lambda h: rows if h in thin[1] else thin[0])
        st = generate_landing(root, hours=hours, rows_per_hour=rows, seed=7, start=start,
                              rows_of=rows_of)
        stamp.write_text(want)
        say(f"generated {st.rows} rows ({hours} h, {rows} rows an hour"
            + (f", {thin[0]} outside {len(thin[1])} full hours" if thin else "")
            + f") in {st.seconds:.1f}s")
    return root / "dedup.yaml"


def input_paths(ds: DatasetConfig, hour: datetime) -> list[str]:
    return [f.path for f in list_input_files(ds, hour)]


def is_conserved(r: CommitRecord) -> bool:
    return r.rows_in == r.unique + r.duplicates + r.expired + r.rejected


def unique_table(root: Path, tag: str, columns: list[str]) -> pa.Table:
    """`columns` of the unique rows the pipeline under `root` committed for `tag`: the files its
    Delta table serves for the hour (a rerun's replaced ones stay until vacuum), else the
    partition directory."""
    if (root / "unique" / "_delta_log").is_dir():
        held = lake.files_by_hour(DeltaTable(str(root / "unique"))).get(tag, {})
        return pq.read_table([str(root / "unique" / f) for f in held], columns=columns)
    return pq.read_table(root / "unique" / f"load_hour={tag}", columns=columns)
