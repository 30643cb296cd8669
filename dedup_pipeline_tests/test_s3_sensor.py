"""The landing sensor over an S3 landing zone and S3 outputs (a real S3 server, SeaweedFS): a tick
requests exactly the next complete hour, and its object-store requests, counted at the HTTP level
by benchmarks/s3.py's pass-through proxy, are the same at 24 and at 72 hours of history (once the
instance holds the fabricated hours' materializations the first ticks report).

The history is fabricated as the benchmark fabricates it (`benchmarks.s3.synthesize_history`:
commit records, live index files, Delta tables) and uploaded; no Spark runs here.
"""

from __future__ import annotations

import os
from datetime import UTC
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from benchmarks.bookkeeping import START
from benchmarks.s3 import (
    CountingProxy,
    history_section,
    save_summary,
    synthesize_history,
    upload_tree,
)
from dedup_pipeline.config import load_config
from dedup_pipeline.hours import HOUR, format_hour, parse_hour
from dedup_pipeline.orchestration.assets import build_dataset_defs
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.sensors import build_landing_sensor

pytestmark = pytest.mark.slow


def _tick(defs: dg.Definitions, inst: dg.DagsterInstance, sensor: Any) -> dg.SensorResult:
    with dg.build_sensor_context(instance=inst, definitions=defs) as ctx:
        result = sensor(ctx)
    assert isinstance(result, dg.SensorResult)
    return result


def _history(s3: Any, tmp: Path, n: int) -> Path:
    """`n` committed hours on S3 and hour `n` landed with its marker; the config's path."""
    local = synthesize_history(tmp / f"h{n}", n)
    prefix = f"{s3.root.split('/', 3)[3]}/h{n}"
    upload_tree(s3.client(), local, s3.lake, f"{prefix}/warehouse")
    root, land = f"s3://{s3.lake}/{prefix}/warehouse", f"s3://{s3.lake}/{prefix}/landing"
    save_summary(root, land)
    h = parse_hour(START) + n * HOUR
    day = f"{prefix}/landing/date={h:%Y-%m-%d}/hour={h:%H}"
    s3.client().put_object(Bucket=s3.lake, Key=f"{day}/part-0.jsonl",
                           Body=b'{"event_id": "a", "event_time": "%s"}\n' % h.isoformat().encode())
    s3.client().put_object(Bucket=s3.lake, Key=f"{day}/_SUCCESS", Body=b"")
    cfg = tmp / f"h{n}.yaml"
    # late-file watching covers the last `watch_hours` loaded hours (48 by default): a few here,
    # so both history lengths watch as many
    section = {**history_section(root, land), "landing": {"watch_hours": 6}}
    cfg.write_text(yaml.safe_dump({"datasets": [section]}, sort_keys=False))
    return cfg


def test_landing_sensor_on_s3_requests_the_next_hour_at_a_flat_request_count(
        s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = CountingProxy(s3.endpoint)
    counted: dict[int, dict[str, int]] = {}
    try:
        for n in (24, 72):
            cfg = load_config(str(_history(s3, tmp_path, n)))
            ds = cfg.datasets[0]
            nxt = parse_hour(START) + n * HOUR
            defs = build_definitions(cfg)
            sensor = build_landing_sensor(ds, build_dataset_defs(ds).job,
                                          clock=lambda nxt=nxt: (nxt + 2 * HOUR).astimezone(UTC))
            with dg.instance_for_test() as inst:
                # the first ticks report the fabricated hours this instance never saw loaded (up
                # to 48 a tick), as the daemon would record them; then a tick is one like any other
                for _ in range(n // 48 + 2):
                    res = _tick(defs, inst, sensor)
                    for ev in res.asset_events:
                        inst.report_runless_asset_event(ev)
                assert not _tick(defs, inst, sensor).asset_events
                monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)  # a new s3fs client
                _tick(defs, inst, sensor)  # its first requests: connections, the store probe
                with proxy.counting() as c:
                    res = _tick(defs, inst, sensor)
            monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # the next history: direct
            assert res.skip_reason is None and len(res.run_requests) == 1, res
            assert res.run_requests[0].partition_key == format_hour(nxt)
            counted[n] = dict(c["kinds"])
    finally:
        proxy.close()
    assert counted[72] == counted[24], counted
    assert sum(counted[24].values()) > 0
    assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint
