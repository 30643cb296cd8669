"""`dedup-pipeline explain` of one key against a full scan of the four outputs, side by side.

Builds a history with the benchmark's generator (`dedup_pipeline.sample.generate`) and loads it
(every load writes Parquet bloom filters on the key columns and the hour's key digest,
`engine/keydigest.py`). The first `--load-hours` hours are also loaded into two more outputs, one
with the key digest written by a Spark write job (the former writer), one without a digest,
rotating which goes first, for the digest's load cost. Every day is then packed
(`engine/daypack.py`, timed). Then, interleaved over `--repeat` rounds in one warm Spark session,
it times:

- `full scan`: every row of unique, duplicates, expired and rejected of every committed hour
  read and filtered for the key (Parquet filter pushdown off: what a person does with Spark
  without the levers);
- `explain`: `explain_key` (day packs name the hours holding the key and hold the rejected
  lines, the rows of those hours read by pyarrow);
- `explain, rows by Spark`: the same with the rows read by one Spark job;
- `explain, no day packs`: every hour's own key digest and rejected file;
- `explain, no packs, rows by Spark`: both levers off;
- `explain, no key digest`: two passes over every hour, pushdown to row-group statistics and
  bloom filters (the design before the digest);
- `explain, no digest, no bloom`: the same with parquet-mr's bloom filter use off (row-group
  statistics only).

And it reports each step of one explain alone, the load time with each digest writer and
without (medians of the rotating first hours, from their commit records' stage timings) and the
footprint (bytes of the digest against the four outputs of those hours). The key is one with a
natural duplicate in a later hour, from the middle of the history.

    python -m benchmarks.explain --dir D --keep --hours 24 --rows-per-hour 100000 \
        --replicate 30 --load-hours 0 --prepare-only      # build a 720-hour history once
    python -m benchmarks.explain --dir D --reuse --hours 24 --rows-per-hour 100000 \
        --replicate 30 --repeat 3                           # measure it (quiet machine)
    python -m benchmarks.explain --hours 6 --rows-per-hour 100000 --load-hours 6  # load cost
    python -m benchmarks.explain                 # 48 hours x 5,000 rows (~10 min, busy machine)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import yaml

from dedup_pipeline.config import DatasetConfig, load_config
from dedup_pipeline.engine import daypack, explain, keydigest, outputs
from dedup_pipeline.engine.columns import RAW
from dedup_pipeline.engine.commits import committed_tags, read_commit, write_commit
from dedup_pipeline.engine.explain import committed_history, explain_key, output_files
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.session import SparkSettings, get_session
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag
from dedup_pipeline.sample.generate import generate_landing

ARROW_ROW_FILES = explain.ARROW_ROW_FILES
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


def _digests(spark: object, ds: DatasetConfig, first_hours: int) -> None:
    """Key digests for committed hours without one (a history loaded before digests): rebuilt
    from the outputs for the first `first_hours` hours, copied for their replicas."""
    st = Storage(ds.output)
    tags = sorted(committed_tags(st))
    span = first_hours
    for i, t in enumerate(tags):
        rec = read_commit(st, t)
        if rec is None or rec.key_digest is not None:
            continue
        if i < span:
            rec = keydigest.rebuild(spark, ds, st, rec)
        else:
            src = tags[i % span]
            shutil.copytree(Path(ds.output) / keydigest.DIGEST / f"load_hour={src}",
                            Path(ds.output) / keydigest.DIGEST / f"load_hour={t}",
                            dirs_exist_ok=True)
            rec = rec.with_(key_digest=read_commit(st, src).key_digest)
        write_commit(st, rec)


def _only_in_loaded_hours(spark: object, ds: DatasetConfig, key: str, span: int) -> int:
    """Remove the key's rows from the replicas (hours after the first `span`): their typed
    output files and key digests rewritten by pyarrow without it (those files lose their bloom
    filters), their records' sizes updated. A replicated history repeats every key in every copy;
    this gives the benchmark's key the few hours a key has in a real history. Returns the number
    of hours changed."""
    st = Storage(ds.output)
    tags = sorted(committed_tags(st))
    [typed] = explain.type_keys(spark, ds, [{"event_id": key}])
    records = {t: read_commit(st, t) for t in tags[span:]}
    digests = {t: p for t, r in records.items() if (p := keydigest.usable(st, t, r))}
    holding = sorted(keydigest.hours_holding(st, digests, [typed.h1])[typed.h1])
    h = keydigest.hash_of(typed.h1)
    for t in holding:
        rec = records[t]
        files = {}
        for name in (outputs.UNIQUE, outputs.DUPLICATES, outputs.EXPIRED):
            entries = []
            for f in rec.output_files[name]:
                path = Path(ds.output) / name / f"load_hour={t}" / f.name
                table = pq.read_table(path)
                kept = table.filter(pc.field("event_id") != key)
                if kept.num_rows != table.num_rows:
                    pq.write_table(kept, path, coerce_timestamps="us")
                    (path.parent / f".{f.name}.crc").unlink(missing_ok=True)
                entries.append(type(f)(f.name, path.stat().st_size))
            files[name] = tuple(entries)
        for f in rec.key_digest:
            path = Path(ds.output) / keydigest.DIGEST / f"load_hour={t}" / f.name
            table = pq.read_table(path)
            pq.write_table(table.filter(pc.field(keydigest.KEY_HASH) != h), path,
                           use_dictionary=False, data_page_version="2.0", row_group_size=4096,
                           column_encoding={keydigest.KEY_HASH: "DELTA_BINARY_PACKED"},
                           write_page_checksum=True)
            (path.parent / f".{f.name}.crc").unlink(missing_ok=True)
        write_commit(st, rec.with_(output_files={**rec.output_files, **files},
                                   key_digest=keydigest.entries(st, t)))
    return len(holding)


def _replicate(out: Path, times: int) -> None:
    """A longer history without loading it: the committed hours copied `times - 1` more times
    under later hours (outputs and commit records; no index files, so the index probe reads only
    the loaded hours' entries). For timing history length only: the copies' rows repeat."""
    commits_dir = out / "_commits"
    tags = sorted(p.name[len("load_hour="):-len(".json")] for p in commits_dir.glob("*.json"))
    span = len(tags)
    for r in range(1, times):
        for t in tags:
            new = to_tag(parse_hour(t) + r * span * HOUR)
            target = commits_dir / f"load_hour={new}.json"
            if target.exists():
                continue
            for name in (*outputs.OUTPUTS, keydigest.DIGEST):
                if (out / name / f"load_hour={t}").exists():
                    shutil.copytree(out / name / f"load_hour={t}", out / name / f"load_hour={new}")
            rec = json.loads((commits_dir / f"load_hour={t}.json").read_text())
            rec.update(load_hour=new, partition_key=format_hour(parse_hour(new)), index_files=[])
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
                    help="hours also loaded without the key digest, for its load cost")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--replicate", type=int, default=1,
                    help="copy the loaded hours N-1 more times under later hours (a long history "
                         "without loading it)")
    ap.add_argument("--reuse", action="store_true",
                    help="measure the history an earlier run loaded into --dir (no loads; "
                         "digests rebuilt where missing)")
    ap.add_argument("--key-in-copies", action="store_true",
                    help="with --replicate: leave the key in every copy of its hours (by "
                         "default its rows are removed from the copies, as a real history has "
                         "a key in a few hours)")
    ap.add_argument("--prepare-only", action="store_true",
                    help="build the history into --dir and stop (measure it later with --reuse)")
    args = ap.parse_args(argv)
    hours, rows = (720, 100_000) if args.full else (args.hours, args.rows_per_hour)
    root = Path(args.dir or tempfile.mkdtemp(prefix="explain_bench_"))
    try:
        start = format_hour(parse_hour("2026-01-01-00:00"))
        if not args.reuse:
            print(f"generating {hours} hours x {rows} rows in {root}", flush=True)
            generate_landing(root, hours=hours, rows_per_hour=rows, seed=7, start=start)
        main_ds = load_config(_config(root, "bloom")).datasets[0]
        no_digest = load_config(_config(root, "no_digest_loads")).datasets[0]
        spark_digest = load_config(_config(root, "spark_digest_loads")).datasets[0]
        spark = get_session(SparkSettings("local[2]", None, CONF))
        spark.sparkContext.setLogLevel("ERROR")
        keys = [] if args.reuse else [format_hour(parse_hour(start) + i * HOUR) for i in range(hours)]
        for i, k in enumerate(keys):
            order = [("digest", main_ds), ("no digest", no_digest),
                     ("spark digest", spark_digest)] if i < args.load_hours else \
                [("digest", main_ds)]
            order = order[i % len(order):] + order[:i % len(order)]  # rotate who goes first
            for label, ds in order:
                keydigest.ENABLED = label != "no digest"
                keydigest.WRITER = "spark" if label == "spark digest" else "arrow"
                load_hours(spark, ds, [k])
            if (i + 1) % 24 == 0 or i + 1 == hours:
                print(f"  loaded {i + 1}/{hours} hours", flush=True)
        keydigest.ENABLED = True
        keydigest.WRITER = "arrow"
        loaded = sorted(committed_tags(Storage(main_ds.output)))
        key = _pick_key(main_ds, loaded[:hours])  # among the loaded hours, not their copies
        if args.reuse:  # a history loaded before digests: rebuild theirs, copy to the replicas
            t0 = time.perf_counter()
            _digests(spark, main_ds, hours)
            print(f"digests written where missing in {time.perf_counter() - t0:.1f} s", flush=True)
        elif args.replicate > 1:
            _replicate(Path(main_ds.output), args.replicate)
        if args.replicate > 1:
            hours *= args.replicate
            if args.key_in_copies:
                print("the key is in every copy of its hours", flush=True)
            else:
                n = _only_in_loaded_hours(spark, main_ds, key, hours // args.replicate)
                print(f"the key's rows removed from {n} copied hours (it is in the loaded "
                      "hours only)", flush=True)
        print(f"key: event_id={key}; {len(committed_tags(Storage(main_ds.output)))} committed "
              "hours", flush=True)
        if args.prepare_only:
            return 0
        t0 = time.perf_counter()
        packed = daypack.pack_all(Storage(main_ds.output))
        if packed:
            print(f"day packs written for {len(packed)} days in {time.perf_counter() - t0:.1f} s "
                  f"({(time.perf_counter() - t0) / len(packed):.2f} s a day)", flush=True)
        jvm_conf = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001

        def full_scan() -> int:
            st = Storage(main_ds.output)
            hist = committed_history(st, None, None)
            n = 0
            spark.conf.set("spark.sql.parquet.filterPushdown", "false")
            try:
                for name in outputs.OUTPUTS:
                    files = [f for t in hist.records for f in
                             output_files(st, name, t, hist.records[t])]
                    df = spark.read.parquet(*files)
                    col = "event_id" if name != outputs.REJECTED else RAW
                    cond = (df[col] == key) if name != outputs.REJECTED else df[col].contains(key)
                    n += len(df.filter(cond).collect())
            finally:
                spark.conf.set("spark.sql.parquet.filterPushdown", "true")
            return n

        def without(digest: bool = True, bloom: bool = True, packs: bool = True,
                    arrow: bool = True, driver_typing: bool = True) -> object:
            explain.USE_DIGEST = digest
            explain.TYPE_ON_DRIVER = driver_typing
            daypack.ENABLED = packs
            explain.ARROW_ROW_FILES = ARROW_ROW_FILES if arrow else 0
            jvm_conf.set("parquet.filter.bloom.enabled", "true" if bloom else "false")
            try:
                return explain_key(spark, main_ds, {"event_id": key})
            finally:
                explain.USE_DIGEST = True
                explain.TYPE_ON_DRIVER = True
                daypack.ENABLED = True
                explain.ARROW_ROW_FILES = ARROW_ROW_FILES
                jvm_conf.set("parquet.filter.bloom.enabled", "true")

        cases: dict[str, Callable[[], object]] = {
            "full scan (4 outputs)": full_scan,
            "explain": lambda: explain_key(spark, main_ds, {"event_id": key}),
            "explain, key typed by Spark": lambda: without(driver_typing=False),
            "explain, rows by Spark": lambda: without(arrow=False),
            "explain, no day packs": lambda: without(packs=False),
            "explain, no packs, rows by Spark": lambda: without(packs=False, arrow=False),
            "explain, no key digest": lambda: without(digest=False),
            "explain, no digest, no bloom": lambda: without(digest=False, bloom=False),
        }
        ex = explain_key(spark, main_ds, {"event_id": key})  # warm-up, and the story printed
        print("\n".join(ex.lines()))
        for other in (without(digest=False), without(packs=False), without(arrow=False),
                      without(driver_typing=False)):
            assert [asdict(o) for o in other.occurrences] == [asdict(o) for o in ex.occurrences], \
                "explain with and without a lever differs"
        times: dict[str, list[float]] = {c: [] for c in cases}
        for _ in range(args.repeat):
            for name, f in cases.items():
                _median(f, times[name])
        med = {c: statistics.median(v) for c, v in times.items()}
        full = med["full scan (4 outputs)"]
        print(f"\n{hours} hours x {rows} rows; medians of {args.repeat} interleaved rounds "
              "(warm session)")
        for c, m in med.items():
            print(f"  {c:<34} {m:7.2f} s   {full / m:6.1f}x faster than the full scan"
                  if c != "full scan (4 outputs)" else f"  {c:<34} {m:7.2f} s")
        # where the time of one explain goes (each step alone, warm)
        st = Storage(main_ds.output)
        steps: dict[str, Callable[[], object]] = {}
        hist = committed_history(st, None, None)
        typed = {0: explain.type_keys(spark, main_ds, [{"event_id": key}])[0]}
        steps["type the key (driver)"] = lambda: explain.type_keys(spark, main_ds,
                                                                   [{"event_id": key}])
        steps["type the key (Spark)"] = lambda: without_driver_typing(
            lambda: explain.type_keys(spark, main_ds, [{"event_id": key}]))
        steps["read the commit records"] = lambda: committed_history(st, None, None)
        steps["index entries (pyarrow)"] = lambda: explain._index_entries(  # noqa: SLF001
            spark, main_ds, st, typed, set(hist.all_committed))
        steps["rejected lines (day packs)"] = lambda: explain._find_rejected(  # noqa: SLF001
            spark, main_ds, st, hist, typed)
        steps["digests + rows (packs, pyarrow)"] = lambda: explain._find_rows(  # noqa: SLF001
            spark, main_ds, st, hist, typed, {})
        packs = daypack.covers(st, hist.records, daypack.KEYS)
        steps["the day packs' digests alone"] = lambda: daypack.keys_holding(
            st, packs, [typed[0].h1])
        held = {t: p for t in hist.records if (p := keydigest.usable(st, t, hist.records[t]))}
        steps["hourly digests alone"] = lambda: keydigest.hours_holding(
            st, held, [typed[0].h1])

        def without_driver_typing(f: Callable[[], object]) -> object:
            explain.TYPE_ON_DRIVER = False
            try:
                return f()
            finally:
                explain.TYPE_ON_DRIVER = True

        def no_packs(f: Callable[[], object]) -> Callable[[], object]:
            def run() -> object:
                daypack.ENABLED = False
                try:
                    return f()
                finally:
                    daypack.ENABLED = True
            return run

        steps["rejected lines (hourly files)"] = no_packs(steps["rejected lines (day packs)"])
        print("  one explain, step by step (each alone, warm; best of 3):")
        for name, f in steps.items():
            best = []
            for _ in range(3):
                _median(f, best)
            print(f"    {name:<34} {min(best):6.3f} s")
        print(f"    hours whose digest holds the key: "
              f"{sorted(keydigest.hours_holding(st, held, [typed[0].h1])[typed[0].h1])}")
        n = min(args.load_hours, len(loaded))
        if n and not args.reuse:
            ld, ln, ls = (statistics.median(_load_seconds(d, n, "total"))
                          for d in (main_ds, no_digest, spark_digest))
            wd, wn, ws = (statistics.median(_load_seconds(d, n, "write_outputs"))
                          for d in (main_ds, no_digest, spark_digest))
            print(f"  load, median per hour over the first {n} hours, rotating: key digest by "
                  f"pyarrow {ld:.2f} s ({100 * (ld / ln - 1):+.1f}%), by a Spark write {ls:.2f} s "
                  f"({100 * (ls / ln - 1):+.1f}%), without {ln:.2f} s; write_outputs stage "
                  f"{wd:.2f} / {ws:.2f} / {wn:.2f} s")
        n = min(args.load_hours or len(loaded), len(loaded))
        out_bytes = _bytes(main_ds, outputs.OUTPUTS, n)
        dig_bytes = _bytes(main_ds, (keydigest.DIGEST,), n)
        print(f"  bytes of the first {n} hours: four outputs {out_bytes:,}, key digest "
              f"{dig_bytes:,} (+{100 * dig_bytes / out_bytes:.1f}%)")
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
