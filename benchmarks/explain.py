"""`dedup-pipeline explain` of one key against a full scan of the four outputs, side by side.

Builds a history with the benchmark's generator (`dedup_pipeline.sample.generate`) and loads it
(`bloom`: with the Parquet bloom filters on the key columns every load writes). `plain` is a copy of
that warehouse whose typed output files are rewritten by pyarrow without bloom filters (same
rows, same file names). The first `--load-hours` hours are also loaded into a third output with
bloom filters off, alternating with the `bloom` loads of the same hours, for the load cost of the
filters. Then, interleaved over `--repeat` rounds in one warm Spark session, it times:

- `full scan`: every row of unique, duplicates, expired and rejected of every committed hour
  read and filtered for the key (Parquet filter pushdown off: what a person does with Spark
  without the levers), on `bloom`;
- `explain`: `explain_key` on `bloom` (two passes, pushdown to row-group statistics and bloom
  filters);
- `explain, no bloom`: the same on `plain` (row-group statistics only);
- `explain, no pushdown`: on `bloom` with Parquet filter pushdown off (column pruning only).

And it reports the load time with and without bloom filters (medians of the alternating first
hours, from their commit records' stage timings) and their footprint (bytes of the three typed
outputs of those hours). The key is one with a natural duplicate in a later
hour, from the middle of the history.

    python -m benchmarks.explain                 # 48 hours x 5,000 rows (~10 min, busy machine)
    python -m benchmarks.explain --full          # the target scale: 720 hours x 100,000 rows
    python -m benchmarks.explain --hours 720 --rows-per-hour 1000
    python -m benchmarks.explain --hours 24 --rows-per-hour 50000 --replicate 10   # 240 hours
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import yaml

from dedup_pipeline.config import DatasetConfig, load_config
from dedup_pipeline.engine import outputs
from dedup_pipeline.engine.commits import committed_tags, read_commit
from dedup_pipeline.engine.explain import committed_history, explain_key, output_files
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.session import SparkSettings, get_session
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import HOUR, parse_key, to_key, to_tag
from dedup_pipeline.sample.generate import generate_landing

CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "4g"}


def _config(root: Path, label: str) -> Path:
    raw = yaml.safe_load((root / "dedup.yaml").read_text())
    raw["datasets"][0]["source"]["path"] = str(root / "landing" / "clicks")
    raw["datasets"][0]["output"] = str(root / "warehouse" / label)
    path = root / f"{label}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _bytes(ds: DatasetConfig, names: tuple[str, ...], first_hours: int) -> int:
    """Bytes of the outputs' Parquet files of the first `first_hours` committed hours."""
    tags = sorted(committed_tags(Storage(ds.output)))[:first_hours]
    return sum(p.stat().st_size for n in names for t in tags
               for p in (Path(ds.output) / n / f"load_hour={t}").glob("*.parquet"))


def _copy_without_bloom(src: Path, dst: Path) -> None:
    """The warehouse again, its typed outputs' files rewritten by pyarrow (no bloom filters)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    for name in (outputs.UNIQUE, outputs.DUPLICATES, outputs.EXPIRED):
        for f in (dst / name).rglob("*.parquet"):
            table = pq.read_table(f)
            pq.write_table(table, f, coerce_timestamps="us")
            (f.parent / f".{f.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum sidecar


def _replicate(out: Path, times: int) -> None:
    """A longer history without loading it: the committed hours copied `times - 1` more times
    under later hours (outputs and commit records; no index files, so the index probe reads only
    the loaded hours' entries). For timing history length only: the copies' rows repeat."""
    commits_dir = out / "_commits"
    tags = sorted(p.name[len("load_hour="):-len(".json")] for p in commits_dir.glob("*.json"))
    span = len(tags)
    for r in range(1, times):
        for t in tags:
            new = to_tag(parse_key(t) + r * span * HOUR)
            target = commits_dir / f"load_hour={new}.json"
            if target.exists():
                continue
            for name in outputs.OUTPUTS:
                shutil.copytree(out / name / f"load_hour={t}", out / name / f"load_hour={new}")
            rec = json.loads((commits_dir / f"load_hour={t}.json").read_text())
            rec.update(load_hour=new, partition_key=to_key(parse_key(new)), index_files=[])
            target.write_text(json.dumps(rec))


def _load_seconds(ds: DatasetConfig, first_hours: int, stage: str) -> list[float]:
    """Seconds of a load stage (`total`, `write_outputs`) of the first hours, from the records."""
    st = Storage(ds.output)
    tags = sorted(committed_tags(st))[:first_hours]
    return [float(r.seconds.get(stage, 0.0)) for t in tags if (r := read_commit(st, t))]


def _pick_key(ds: DatasetConfig, tags: list[str]) -> str:
    """A key whose record has a natural duplicate in a later hour, from the middle hour on."""
    mid = tags[len(tags) // 2]
    for tag in tags[len(tags) // 2:]:
        d = Path(ds.output) / "duplicates" / f"load_hour={tag}"
        t = pads.dataset(str(d)).to_table(columns=["event_id", "_first_load_hour",
                                                   "_duplicate_kind"]).to_pylist()
        for r in t:
            if r["_first_load_hour"] >= mid and r["_first_load_hour"] != tag:
                return r["event_id"]
    raise SystemExit("no replayed key found; use more hours")


def _median(f: Callable[[], object], out: list[float]) -> None:
    t0 = time.perf_counter()
    f()
    out.append(time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hours", type=int, default=48)
    ap.add_argument("--rows-per-hour", type=int, default=5_000)
    ap.add_argument("--full", action="store_true", help="720 hours x 100,000 rows (a quiet machine)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--load-hours", type=int, default=8,
                    help="hours also loaded without bloom filters, for their load cost")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--replicate", type=int, default=1,
                    help="copy the loaded hours N-1 more times under later hours (a long history "
                         "without loading it)")
    ap.add_argument("--reuse", action="store_true",
                    help="measure the history an earlier run loaded into --dir (no loads)")
    args = ap.parse_args(argv)
    hours, rows = (720, 100_000) if args.full else (args.hours, args.rows_per_hour)
    root = Path(args.dir or tempfile.mkdtemp(prefix="explain_bench_"))
    try:
        start = to_key(parse_key("2026-01-01-00:00"))
        if not args.reuse:
            print(f"generating {hours} hours x {rows} rows in {root}", flush=True)
            generate_landing(root, hours=hours, rows_per_hour=rows, seed=7, start=start)
        bloom = load_config(_config(root, "bloom")).datasets[0]
        plain = load_config(_config(root, "plain")).datasets[0]
        spark = get_session(SparkSettings("local[2]", None, CONF))
        spark.sparkContext.setLogLevel("ERROR")
        no_bloom = load_config(_config(root, "no_bloom_loads")).datasets[0]
        keys = [to_key(parse_key(start) + i * HOUR) for i in range(hours)]
        if args.reuse:  # a history an earlier run of this benchmark loaded into --dir
            keys = []
        for i, k in enumerate(keys):
            order = [("bloom", bloom), ("plain", no_bloom)] if i < args.load_hours else \
                [("bloom", bloom)]
            if i % 2:
                order.reverse()  # alternate who goes first (page cache, JIT)
            for label, ds in order:
                outputs.BLOOM_FILTERS = label == "bloom"
                load_hours(spark, ds, [k])
            if (i + 1) % 24 == 0 or i + 1 == hours:
                print(f"  loaded {i + 1}/{hours} hours", flush=True)
        outputs.BLOOM_FILTERS = True
        loaded = sorted(committed_tags(Storage(bloom.output)))
        key = _pick_key(bloom, loaded[:hours])  # among the loaded hours, not their copies
        if args.replicate > 1:
            _replicate(Path(bloom.output), args.replicate)
            hours *= args.replicate
            print(f"history replicated to {hours} hours", flush=True)
        _copy_without_bloom(Path(bloom.output), Path(plain.output))
        print(f"key: event_id={key}", flush=True)

        def full_scan() -> int:
            st = Storage(bloom.output)
            hist = committed_history(st, None, None)
            n = 0
            spark.conf.set("spark.sql.parquet.filterPushdown", "false")
            try:
                for name in outputs.OUTPUTS:
                    files = [f for t in hist.records for f in
                             output_files(st, name, t, hist.records[t])]
                    df = spark.read.parquet(*files)
                    col = "event_id" if name != outputs.REJECTED else outputs.RAW
                    cond = (df[col] == key) if name != outputs.REJECTED else df[col].contains(key)
                    n += len(df.filter(cond).collect())
            finally:
                spark.conf.set("spark.sql.parquet.filterPushdown", "true")
            return n

        def no_pushdown() -> object:
            spark.conf.set("spark.sql.parquet.filterPushdown", "false")
            try:
                return explain_key(spark, bloom, {"event_id": key})
            finally:
                spark.conf.set("spark.sql.parquet.filterPushdown", "true")

        cases: dict[str, Callable[[], object]] = {
            "full scan (4 outputs)": full_scan,
            "explain": lambda: explain_key(spark, bloom, {"event_id": key}),
            "explain, no bloom": lambda: explain_key(spark, plain, {"event_id": key}),
            "explain, no pushdown": no_pushdown,
        }
        ex = explain_key(spark, bloom, {"event_id": key})  # warm-up, and the story printed
        print("\n".join(ex.lines()))
        times: dict[str, list[float]] = {c: [] for c in cases}
        for _ in range(args.repeat):
            for name, f in cases.items():
                _median(f, times[name])
        med = {c: statistics.median(v) for c, v in times.items()}
        full = med["full scan (4 outputs)"]
        print(f"\n{hours} hours x {rows} rows; medians of {args.repeat} interleaved rounds "
              "(warm session)")
        for c, m in med.items():
            print(f"  {c:<24} {m:7.2f} s   {full / m:6.1f}x faster than the full scan"
                  if c != "full scan (4 outputs)" else f"  {c:<24} {m:7.2f} s")
        n = args.load_hours
        lb, lp = (statistics.median(_load_seconds(d, n, "total")) for d in (bloom, no_bloom))
        wb, wp = (statistics.median(_load_seconds(d, n, "write_outputs")) for d in (bloom, no_bloom))
        typed = (outputs.UNIQUE, outputs.DUPLICATES, outputs.EXPIRED)
        bb_part = _bytes(bloom, typed, args.load_hours)
        bp_part = _bytes(no_bloom, typed, args.load_hours)
        print(f"  load, median per hour over the first {args.load_hours} hours, alternating: "
              f"with bloom filters {lb:.2f} s, without {lp:.2f} s ({100 * (lb / lp - 1):+.1f}%); "
              f"its write_outputs stage {wb:.2f} s vs {wp:.2f} s")
        print(f"  unique+duplicates+expired bytes of those hours: with bloom filters "
              f"{bb_part:,}, without {bp_part:,} ({100 * (bb_part / bp_part - 1):+.1f}%)")
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
