"""`dedup-pipeline explain` of one key over a long history: with the hours' key digests and
without them (every hour read in full), the steps of one explain, and a cold CLI process.

Builds a history with the benchmark's generator (`dedup_pipeline.sample.generate`), loads
`--hours` hours, and copies them `--replicate` times under later hours (outputs, key digests and
commit records; the key's rows are removed from the copies, as a real key is in a few hours).
The key is one with a natural duplicate in a later hour, from the middle of the loaded hours.
Times are the best and the median of `--repeat` warm runs in this process (no Spark: explain
starts none); the cold figure is a fresh `dedup-pipeline explain` process, import included.

    python -m benchmarks.explain --dir D --keep --hours 6 --rows-per-hour 100000 \
        --replicate 120 --prepare-only          # build a 720-hour history once
    python -m benchmarks.explain --dir D --reuse --replicate 120   # measure it
    python -m benchmarks.explain                # 48 hours x 5,000 rows
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import yaml

from dedup_pipeline.config import DatasetConfig, load_config
from dedup_pipeline.engine import explain, keydigest
from dedup_pipeline.engine.core import outputs
from dedup_pipeline.engine.core.commits import committed_tags, read_commit, write_commit
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.explain import committed_history, explain_key
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.session import SparkSettings, get_session
from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag
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


def _only_in_loaded_hours(ds: DatasetConfig, key: str, span: int) -> int:
    """Remove the key's rows from the replicas (hours after the first `span`): their typed
    output files and key digests rewritten by pyarrow without it, their records' sizes updated.
    A replicated history repeats every key in every copy;
    this gives the benchmark's key the few hours a key has in a real history. Returns the number
    of hours changed."""
    st = Storage(ds.output)
    tags = sorted(committed_tags(st))
    [typed] = explain.type_keys(ds, [{"event_id": key}])
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
                entries.append(type(f)(name=f.name, size=path.stat().st_size))
            files[name] = tuple(entries)
        for f in rec.key_digest:
            path = Path(ds.output) / keydigest.DIGEST / f"load_hour={t}" / f.name
            table = pq.read_table(path)
            pq.write_table(table.filter(pc.field(keydigest.KEY_HASH) != h), path,
                           **keydigest.OPTIONS)
            (path.parent / f".{f.name}.crc").unlink(missing_ok=True)
        write_commit(st, rec.with_(output_files={**rec.output_files, **files},
                                   key_digest=keydigest.entries(st, t)))
    return len(holding)


def _replicate(out: Path, times: int, span: int) -> None:
    """A longer history without loading it: the committed hours copied `times - 1` more times
    under later hours (outputs and commit records; no index files, so the index probe reads only
    the loaded hours' entries). For timing history length only: the copies' rows repeat."""
    commits_dir = out / "_commits"
    tags = sorted(p.name[len("load_hour="):-len(".json")] for p in commits_dir.glob("*.json"))[:span]
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


def _timed(f: Callable[[], object], repeat: int) -> tuple[float, float]:
    got = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        got.append(time.perf_counter() - t0)
    return min(got), statistics.median(got)


def _load(root: Path, ds: DatasetConfig, hours: int, start: str) -> None:

    spark = get_session(SparkSettings("local[2]", None, CONF))
    spark.sparkContext.setLogLevel("ERROR")
    for i in range(hours):
        load_hours(spark, ds, [format_hour(parse_hour(start) + i * HOUR)])
        print(f"  loaded {i + 1}/{hours} hours", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hours", type=int, default=48)
    ap.add_argument("--rows-per-hour", type=int, default=5_000)
    ap.add_argument("--replicate", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--reuse", action="store_true", help="measure the history in --dir")
    ap.add_argument("--prepare-only", action="store_true", help="build the history and stop")
    args = ap.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="explain_bench_"))
    try:
        start = format_hour(parse_hour("2026-01-01-00:00"))
        cfg = root / "main.yaml"
        if not args.reuse:
            print(f"generating {args.hours} hours x {args.rows_per_hour} rows in {root}",
                  flush=True)
            generate_landing(root, hours=args.hours, rows_per_hour=args.rows_per_hour, seed=7,
                             start=start)
            cfg = _config(root, "main")
        ds = load_config(cfg).datasets[0]
        st = Storage(ds.output)
        if not args.reuse:
            _load(root, ds, args.hours, start)
        loaded = sorted(committed_tags(st))[:args.hours]
        key = _pick_key(ds, loaded)
        if args.replicate > 1:  # both steps skip what is done already
            _replicate(Path(ds.output), args.replicate, args.hours)
            n = _only_in_loaded_hours(ds, key, args.hours)
            print(f"the key's rows removed from {n} copied hours", flush=True)
        (root / "key.txt").write_text(key)
        hours = len(committed_tags(st))
        print(f"key: event_id={key}; {hours} committed hours", flush=True)
        if args.prepare_only:
            return 0
        given = {"event_id": key}
        ex = explain_key(ds, given)
        print("\n".join(ex.lines()), flush=True)
        usable = keydigest.usable

        def in_full() -> object:
            keydigest.usable = lambda *_a: None  # type: ignore[assignment]
            try:
                return explain_key(ds, given)
            finally:
                keydigest.usable = usable

        assert in_full().to_json() == ex.to_json(), "with and without digests differ"
        hist = committed_history(st, None, None)
        [typed] = explain.type_keys(ds, [given])
        digests = {t: p for t in hist.records if (p := usable(st, t, hist.records[t]))}
        steps: dict[str, Callable[[], object]] = {
            "explain (key digests)": lambda: explain_key(ds, given),
            "explain, every hour read in full": in_full,
            "  the commit records": lambda: committed_history(st, None, None),
            "  the key digests alone": lambda: keydigest.hours_holding(st, digests, [typed.h1]),
            "  the index entries": lambda: explain._index_entries(  # noqa: SLF001
                ds, st, {0: typed}, set(hist.records)),
            "  the rejected lines": lambda: explain._find_rejected(  # noqa: SLF001
                ds, st, hist, {0: typed}),
        }
        figures = {}
        print(f"\n{hours} hours x {args.rows_per_hour} rows, warm, {args.repeat} runs:")
        for label, f in steps.items():
            best, med = _timed(f, args.repeat)
            figures[label] = best
            print(f"  {label:<36} best {best:7.3f} s  median {med:7.3f} s  "
                  f"({best / hours * 1000:.2f} ms an hour; x 8,760 hours: {best / hours * 8760:.1f} s)",
                  flush=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        t0 = time.perf_counter()
        subprocess.run([str(Path(sys.executable).parent / "dedup-pipeline"), "explain", "--config",
                        str(cfg), "--key", f"event_id={key}"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        cold = time.perf_counter() - t0
        print(f"  a cold dedup-pipeline explain process: {cold:.2f} s", flush=True)
        (root / "explain_figures.json").write_text(json.dumps({**figures, "cold_cli": cold,
                                                                 "hours": hours}, indent=1))
    finally:
        if not args.keep and not args.reuse and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
