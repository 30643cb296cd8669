"""The dataset contract check's cost against a 1e5-row load (docs/design.md, "The dataset
contract"; item 7: datasets whose config never changes see no difference).

Side by side in one process: generate three hours of 1e5 rows, load hour 0 (records contract v1)
and hour 1 (warm-up), then time the load of hour 2, and `contract.check` alone `--repeat` times
against the same output with the same config (the check a load makes: the `_contract` listing,
one small JSON file read and validated, the config's terms built and compared; no Spark job).
Prints the check's median, the load's total, and the ratio. Run:
``python -m benchmarks.contract_check [--rows 100000] [--repeat 2000]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from dedup_pipeline.config import load_config
from dedup_pipeline.engine import contract
from dedup_pipeline.engine.core.index.health import check_index
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.session import SparkSettings, get_session
from dedup_pipeline.hours import HOUR, format_hour, parse_hour
from dedup_pipeline.sample.generate import generate_landing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2_000)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="contract-bench-"))
    stats = generate_landing(root, hours=3, rows_per_hour=args.rows, seed=7,
                             start="2026-11-01-00:00")
    ds = load_config(stats.config).datasets[0]
    spark = get_session(SparkSettings(master="local[2]", conf={"spark.ui.enabled": "false"}))
    spark.sparkContext.setLogLevel("ERROR")
    hours = [format_hour(parse_hour(ds.start) + i * HOUR) for i in range(3)]
    load_hours(spark, ds, hours[:2])
    t0 = time.perf_counter()
    (rec,) = load_hours(spark, ds, hours[2:])
    load_s = time.perf_counter() - t0

    st = Storage(ds.output)
    state = check_index(st, ds).state
    assert state is not None
    committed = state.committed  # what the load passes: the records' summary's hour ranges
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        v = contract.check(st, ds, hours[2], committed)
        times.append(time.perf_counter() - t)
    assert v.new is None and v.version == 1
    med = statistics.median(times)
    print(f"rows per hour: {args.rows}; load of one hour (total, in this process): "
          f"{load_s:.2f} s (record: {rec.seconds['total']:.2f} s)")
    print(f"contract.check, median of {args.repeat}: {med * 1e3:.3f} ms "
          f"(p90 {statistics.quantiles(times, n=10)[-1] * 1e3:.3f} ms)")
    print(f"ratio check / load: {med / load_s:.2e} ({100 * med / load_s:.4f} %)")


if __name__ == "__main__":
    main()
