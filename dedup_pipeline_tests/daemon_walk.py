"""A dataset, a DAGSTER_HOME (SQLite, or PostgreSQL from DAGSTER_PG_* settings) and a real
`dagster-daemon run` over the project's workspace, plus what a walk through the landing sensor's
life needs: land an hour, drop a late file, read the sensor's ticks, the runs, the input check's
evaluations and the daemon log's errors.

Used by test_sensor_daemon.py and by the soak script (benchmarks/soak.py): plain Python, no pytest.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

# tick history has no public API in Dagster 1.13 (the UI reads it through GraphQL)
from dagster._core.scheduler.instigation import InstigatorType, TickStatus

from dedup_pipeline.hours import format_hour
from dedup_pipeline.orchestration.landing_checks import CHECK_NAME
from dedup_pipeline.orchestration.names import (
    input_check_job_name,
    landing_sensor_name,
    load_job_name,
)
from dedup_pipeline.orchestration.sensors import INPUT_STATE_TAG
from dedup_pipeline_tests.spark_services import (
    FAST_JVM,
    REPO,
    VENV_BIN,
    Service,
    clean_env,
    start,
    wait_until,
)

SCHEMA = {"event_id": "string", "event_time": "timestamp"}
DATASET = "clicks"
# what a daemon log line of a failed tick or a refused write looks like
ERROR_LINE = re.compile(r"IntegrityError|UniqueViolation|Error occurred during the execution of "
                        r"evaluation_fn|sensor .* errored|Traceback \(most recent call last\)")


def instigator_ticks(inst: dg.DagsterInstance, name: str,
                     kind: InstigatorType = InstigatorType.SENSOR, limit: int = 100000
                     ) -> list[Any]:
    """The ticks of the sensor (or schedule) `name`, newest first; none before its first."""
    for state in inst.all_instigator_state(instigator_type=kind):
        if state.instigator_name == name:
            return list(inst.get_ticks(state.instigator_origin_id, state.selector_id, limit=limit))
    return []


@dataclass
class Walk:
    root: Path
    start_hour: datetime
    pg: dict[str, str] | None = None  # DAGSTER_PG_* settings; None: SQLite in DAGSTER_HOME
    extra_config: dict[str, Any] = field(default_factory=dict)
    check_every: float = 30  # the landing sensor's interval, seconds (`landing.check_every`)
    daemon: Service | None = None

    def __post_init__(self) -> None:
        self.home = self.root / "dagster_home"
        self.home.mkdir(parents=True, exist_ok=True)
        instance: dict[str, Any] = {"telemetry": {"enabled": False}}
        if self.pg:  # literal settings: this process reads the same file (`instance()`)
            instance["storage"] = {"postgres": {"postgres_db": {
                "hostname": self.pg["DAGSTER_PG_HOST"], "port": int(self.pg["DAGSTER_PG_PORT"]),
                "username": self.pg["DAGSTER_PG_USER"], "password": self.pg["DAGSTER_PG_PASSWORD"],
                "db_name": self.pg["DAGSTER_PG_DB"], "scheme": "postgresql+psycopg2"}}}
        (self.home / "dagster.yaml").write_text(yaml.safe_dump(instance))
        self.landing = self.root / "landing"
        self.output = self.root / "warehouse"
        ds = {"name": DATASET, "start": format_hour(self.start_hour),
              "source": {"path": str(self.landing), "format": "jsonl", "schema": SCHEMA},
              "key": ["event_id"], "output": str(self.output),
              "landing": {"check_every": f"{self.check_every:g}s"}, **self.extra_config}
        self.config = self.root / "dedup.yaml"
        self.config.write_text(yaml.safe_dump({"datasets": [ds]}, sort_keys=False))
        self.env = clean_env(
            DAGSTER_HOME=str(self.home), DEDUP_CONFIG=str(self.config),
            SPARK_MASTER_URL="local[1]",
            DEDUP_SPARK_CONF_spark__sql__shuffle__partitions="1",
            DEDUP_SPARK_CONF_spark__ui__enabled="false",
            DEDUP_SPARK_CONF_spark__driver__extraJavaOptions=FAST_JVM)
        self.log = self.root / "daemon.log"

    # ------------------------------------------------------------ processes and the instance
    def start_daemon(self) -> Service:
        # the instance's storages first, from this process alone: the daemon and its code
        # servers creating a fresh SQLite storage at once can stamp its schema version twice
        # ("more than one head"), and every later start of a process then fails
        with self.instance():
            pass
        self.daemon = start("dagster-daemon", [str(VENV_BIN / "dagster-daemon"), "run", "-w",
                                               str(REPO / "workspace.yaml")],
                            self.log, env=self.env, cwd=REPO)
        return self.daemon

    def instance(self) -> dg.DagsterInstance:
        """The daemon's instance, read from this process (DAGSTER_HOME and DAGSTER_PG_* set)."""
        return dg.DagsterInstance.from_config(str(self.home))

    def wait(self, what: str, fn: Callable[[], Any], timeout: float = 420) -> Any:
        return wait_until(what, fn, timeout, [self.daemon] if self.daemon else [], interval=2)

    # ------------------------------------------------------------ landing files
    def hour_dir(self, hour: datetime) -> Path:
        return self.landing / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}"

    def land(self, hour: datetime, ids: list[str], name: str = "part-0.jsonl",
             marker: bool = True) -> Path:
        d = self.hour_dir(hour)
        d.mkdir(parents=True, exist_ok=True)
        path = d / name
        tmp = d / f".{name}.tmp"
        tmp.write_text("".join(json.dumps({"event_id": i, "event_time": f"{hour:%Y-%m-%dT%H}:05:00Z"})
                               + "\n" for i in ids))
        tmp.rename(path)  # a landing file appears whole
        if marker:
            (d / "_SUCCESS").write_text("")
        return path

    def committed(self) -> set[str]:
        return {p.name.removeprefix("load_hour=").removesuffix(".json")
                for p in (self.output / "_commits").glob("load_hour=*.json")}

    def delete_index(self) -> None:
        shutil.rmtree(self.output / "index", ignore_errors=True)

    # ------------------------------------------------------------ what Dagster recorded
    def ticks(self, inst: dg.DagsterInstance, name: str | None = None,
              kind: InstigatorType = InstigatorType.SENSOR) -> list[Any]:
        return instigator_ticks(inst, name or landing_sensor_name(DATASET), kind)

    def failed_ticks(self, inst: dg.DagsterInstance) -> list[Any]:
        return [t for t in self.ticks(inst) if t.status == TickStatus.FAILURE]

    def load_runs(self, inst: dg.DagsterInstance, by_sensor: bool = True) -> list[dg.DagsterRun]:
        """Runs of the load job, oldest first; only the landing sensor's unless `by_sensor` is
        False (then a CLI reload's too)."""
        recs = sorted(inst.get_run_records(dg.RunsFilter(job_name=load_job_name(DATASET))),
                      key=lambda r: r.create_timestamp)
        return [r.dagster_run for r in recs if not by_sensor
                or r.dagster_run.tags.get("dagster/sensor_name") == landing_sensor_name(DATASET)]

    def check_runs(self, inst: dg.DagsterInstance, state: str | None = None) -> list[dg.DagsterRun]:
        runs = [r.dagster_run for r in inst.get_run_records(
            dg.RunsFilter(job_name=input_check_job_name(DATASET)))]
        return [r for r in runs if state is None or r.tags.get(INPUT_STATE_TAG) == state]

    def finished(self, runs: list[dg.DagsterRun]) -> list[dg.DagsterRun]:
        return [r for r in runs if r.is_finished]

    def check_history(self, inst: dg.DagsterInstance, partition: str) -> list[tuple[str, str]]:
        """(run id, status) of every recorded evaluation of the input check on `partition`,
        oldest first."""
        from dagster._core.event_api import PartitionKeyFilter  # no public API

        key = dg.AssetCheckKey(dg.AssetKey([DATASET, "raw_batch"]), CHECK_NAME)
        recs = inst.event_log_storage.get_asset_check_execution_history(
            key, limit=100, partition_filter=PartitionKeyFilter(key=partition))
        return [(r.run_id, r.status.value) for r in reversed(recs)]

    def log_errors(self) -> list[str]:
        """Lines of the daemon log that tell of a failed tick or a refused write."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if ERROR_LINE.search(line)]

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
