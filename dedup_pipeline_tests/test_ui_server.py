"""What the UI shows per hour, through the real `dagster-webserver` and `dagster-daemon`.

One server session on the demo's instance config (SQLite, queued runs, pool dedup_<ds> limited to
one run): the webserver (which starts the code location's gRPC server) and the daemon run as
process groups on free loopback ports. Launched the way the webserver's buttons launch them:

- H0: one hour materialized from the UI (`launchRun` of the asset job with `dagster/partition`);
- H1..H3: a UI backfill of a range (`launchPartitionBackfill`; single-run policy: one run);
- H4: a UI run held in the queue (the pool's limit set to 0 through `setConcurrencyLimit`, as on
  the UI's concurrency page) while H4's `_SUCCESS` marker lands: the landing sensor's ticks skip
  and name the UI run (the collision case); the limit back to 1, the UI run loads H4;
- H5: its marker lands; the landing sensor under the real daemon loads it;
- H6: loaded by the CLI (`dedup-pipeline run --from H6 --to H6` on the same DAGSTER_HOME, as an
  engineer reruns one hour from a shell): a single-partition run, which the UI must show like H0.

Then asserted through GraphQL, the queries the UI's pages make: each check's Partitions tab
(`partitionStatuses`) shows every loaded hour Passed for every check, nothing else; each output's
materialization for each hour carries that hour's own figures, the expected numbers computed by
the independent design.md oracle (`reference.py`) from the generated files; every run succeeded and each
hour was loaded by exactly one run. The browser test at the end of this file reuses these servers.
"""

from __future__ import annotations

import contextlib
import re
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML
from dedup_pipeline.config import load_config
from dedup_pipeline.hours import HOUR, format_hour, hour_range, parse_hour
from dedup_pipeline.orchestration.names import (
    PARTITION,
    RANGE_END,
    RANGE_START,
    WRITTEN,
    landing_sensor_name,
    pool_name,
)
from dedup_pipeline.sample.generate import default_start, generate_landing
from dedup_pipeline_tests.reference import Reference
from dedup_pipeline_tests.spark_services import (
    LOOPBACK,
    REPO,
    VENV_BIN,
    Service,
    backfill_finished,
    clean_env,
    connect_client_env,
    free_port,
    launch_backfill,
    launch_partition_run,
    loaded_location,
    run_logged,
    start_connect_server,
    stop_all,
    wait_until,
)
from dedup_pipeline_tests.spark_services import graphql as gql
from dedup_pipeline_tests.spark_services import start as start_service
from dedup_pipeline_tests.ui_browser import browser_page

pytestmark = pytest.mark.slow

# the last seven complete hours: the UI's Plots -> Partitions asks for the latest 120 partition
# keys of the definition (up to now), so older hours would not be plotted at all
FIRST = default_start(7)
HOURS = [format_hour(parse_hour(FIRST) + i * HOUR) for i in range(7)]
ROWS_PER_HOUR = 200
DS = "clicks"
OUTPUTS = WRITTEN
CHECKS = ("conservation", "unique_keys", "index_agrees", "index_size", "duplicate_rate",
          "conflict_rate", "rejected_rate")
CHECK_ASSET = {"conservation": "unique", "unique_keys": "unique", "index_agrees": "index",
               "index_size": "index", "duplicate_rate": "duplicates", "conflict_rate": "duplicates",
               "rejected_rate": "rejected"}
LOCATION, REPOSITORY = "dedup_pipeline", "__repository__"
SENSOR = landing_sensor_name(DS)
POOL = pool_name(DS)


SET_LIMIT = """
mutation SetLimit($key: String!, $limit: Int!) { setConcurrencyLimit(concurrencyKey: $key, limit: $limit) }
"""

RUNS = """
query { runsOrError(limit: 100) { ... on Runs { results {
  runId jobName status tags { key value } } } } }
"""

RUN = """
query Run($id: ID!) { runOrError(runId: $id) { __typename ... on Run { runId status } } }
"""

SENSOR_TICKS = """
query Ticks($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) {
  __typename ... on Sensor { sensorState { status ticks(limit: 50) {
    status skipReason runIds timestamp } } } } }
"""

# The check's Partitions tab: AssetCheck.partitionStatuses (time partitions: status ranges).
CHECK_STATUSES = """
query Checks($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { __typename
  ... on AssetNode { assetChecksOrError { __typename ... on AssetChecks { checks { name
    partitionStatuses { __typename ... on AssetCheckTimePartitionStatuses {
      ranges { startKey endKey status } } } } } } } } }
"""

# Plots -> Partitions (the asset's Overview, metadata Plots, Partitions): the latest
# materialization of each partition, as the UI's AssetPartitionEventsQuery asks for it.
MATERIALIZATIONS = """
query Mats($key: AssetKeyInput!, $partitions: [String!]!) { assetNodeOrError(assetKey: $key) {
  __typename ... on AssetNode { latestMaterializationByPartition(partitions: $partitions) {
    partition timestamp runId metadataEntries { label __typename
      ... on IntMetadataEntry { intValue }
      ... on FloatMetadataEntry { floatValue }
      ... on TimestampMetadataEntry { timestamp } } } } } }
"""


def _asset_paths() -> list[dict[str, list[str]]]:
    return [{"path": [DS, o]} for o in OUTPUTS]


def launch_one_hour(url: str, hour: str) -> str:
    """What the UI sends for "Materialize" of one partition of the dataset's outputs."""
    res = launch_partition_run(url, DS, OUTPUTS, CHECK_ASSET, hour, LOCATION)
    assert res["__typename"] == "LaunchRunSuccess", res
    return res["run"]["runId"]


def run_status(url: str, run_id: str) -> str:
    return gql(url, RUN, {"id": run_id})["runOrError"]["status"]


def sensor_ticks(url: str) -> list[dict[str, Any]]:
    res = gql(url, SENSOR_TICKS, {"selector": {
        "repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": SENSOR}})
    return res["sensorOrError"]["sensorState"]["ticks"]


def check_statuses(url: str) -> dict[str, dict[str, set[str]]]:
    """check name -> status -> hours, from each check's Partitions tab query."""
    out: dict[str, dict[str, set[str]]] = {}
    for asset in ("unique", "duplicates", "rejected", "index"):
        node = gql(url, CHECK_STATUSES, {"key": {"path": [DS, asset]}})["assetNodeOrError"]
        for check in node["assetChecksOrError"]["checks"]:
            ps = check["partitionStatuses"]
            assert ps["__typename"] == "AssetCheckTimePartitionStatuses", ps
            by_status: dict[str, set[str]] = {}
            for r in ps["ranges"]:
                keys = {format_hour(h) for h in hour_range(r["startKey"], r["endKey"])}
                by_status.setdefault(r["status"], set()).update(keys)
            out[check["name"]] = by_status
    return out


def latest_figures(url: str, asset: str) -> dict[str, dict[str, Any]]:
    """hour -> metadata of the hour's latest materialization (the point Plots -> Partitions draws)."""
    node = gql(url, MATERIALIZATIONS, {"key": {"path": [DS, asset]}, "partitions": HOURS})
    latest: dict[str, dict[str, Any]] = {}
    for m in node["assetNodeOrError"]["latestMaterializationByPartition"]:
        if m is not None:
            latest[m["partition"]] = {
                e["label"]: e.get("intValue", e.get("floatValue", e.get("timestamp")))
                for e in m["metadataEntries"]}
    return latest


def expected_figures(root: Path) -> dict[str, dict[str, int]]:
    """Each hour's figures by the design.md oracle (`reference.py`), from the generated landing files."""
    (ds,) = load_config(str(root / "dedup.yaml")).datasets
    ref = Reference(ds).run(parse_hour(FIRST), len(HOURS))
    out = {}
    for key in HOURS:
        res = ref[f"{parse_hour(key):%Y-%m-%d-%H}"]
        out[key] = {"rows_in": res.rows_in,
                    **{o: sum(res.rows[o].values()) for o in ("unique", "duplicates", "expired",
                                                               "rejected")}}
    return out


@pytest.fixture(scope="module")
def ui_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The webserver and daemon, and the four UI/sensor launches; yields what they did."""
    root = tmp_path_factory.mktemp("ui_server")
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)  # what `dedup-pipeline demo` writes
    # create the SQLite storages once: the webserver, its code server and the daemon creating them
    # at the same moment can stamp the schema twice ("more than one head")
    with dg.DagsterInstance.from_config(str(home)) as inst:
        assert type(inst.run_coordinator).__name__ == "QueuedRunCoordinator"
    generate_landing(root, hours=len(HOURS), rows_per_hour=ROWS_PER_HOUR, seed=11, start=FIRST)
    raw = yaml.safe_load((root / "dedup.yaml").read_text())
    raw["datasets"][0]["landing"] = {"check_every": "5s"}  # the sensor looks often: short waits
    (root / "dedup.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    markers = {m.parent: m for m in (root / "landing").rglob("_SUCCESS")}
    for m in markers.values():
        m.unlink()  # the sensor waits; each path below decides who loads which hour

    def land(hour: str) -> None:
        h = parse_hour(hour)
        (root / "landing" / DS / f"date={h:%Y-%m-%d}" / f"hour={h:%H}" / "_SUCCESS").write_text("")

    logs = root / "logs"
    # every run (UI, sensor, CLI) is a Spark Connect client of one warm server (the recommended
    # topology, docs/operations.md "Spark: local, cluster, Connect"): no Spark start-up per run
    server = start_connect_server(logs / "spark", master="local[1]")
    env = connect_client_env(clean_env(
        DAGSTER_HOME=str(home),
        DEDUP_CONFIG=str(root / "dedup.yaml"),
        DEDUP_SPARK_CONF_spark__sql__shuffle__partitions="2",
    ), server.url)
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    services: list[Service] = [server.service]
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        web = start_service("dagster-webserver", [str(VENV_BIN / "dagster-webserver"), "-h", LOOPBACK,
                                                  "-p", str(port), "-w", "workspace.yaml"],
                            logs / "webserver.log", env=env, cwd=REPO)
        daemon = start_service("dagster-daemon", [str(VENV_BIN / "dagster-daemon"), "run", "-w",
                                                  "workspace.yaml"],
                               logs / "daemon.log", env=env, cwd=REPO)
        services += [web, daemon]
        server.wait_ready()
        entry = wait_until("the webserver to load the code location", lambda: loaded_location(url, LOCATION),
                           240, services, interval=2)
        assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry
        timings["webserver"] = time.monotonic() - t0

        def finished(run_id: str) -> str | None:
            s = run_status(url, run_id)
            return s if s in ("SUCCESS", "FAILURE", "CANCELED") else None

        def logs_tail() -> str:
            return "\n".join(f"--- {s.name}:\n{s.tail(4000)}" for s in services)

        # H0: one hour from the UI
        t1 = time.monotonic()
        ui_one = launch_one_hour(url, HOURS[0])
        assert wait_until("the UI run of H0", lambda: finished(ui_one), 300, services, 2) == \
            "SUCCESS", logs_tail()
        timings["ui_one_hour"] = time.monotonic() - t1

        # H1..H3: a UI backfill of a range
        t1 = time.monotonic()
        backfill_id = launch_backfill(url, {
            "assetSelection": _asset_paths(), "partitionNames": HOURS[1:4],
            "fromFailure": False, "tags": [], "title": "UI backfill"})
        backfill = wait_until("the UI backfill", lambda: backfill_finished(url, backfill_id), 420,
                              services, 2)
        assert backfill["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), (backfill, logs_tail())
        timings["ui_backfill"] = time.monotonic() - t1

        # H4: a UI run held in the queue while its marker lands -> the sensor must not launch
        t1 = time.monotonic()
        gql(url, SET_LIMIT, {"key": POOL, "limit": 0})
        ui_held = launch_one_hour(url, HOURS[4])
        wait_until("the held UI run to be queued", lambda: run_status(url, ui_held) == "QUEUED", 60,
                   services)
        land(HOURS[4])
        since = datetime.now(UTC).timestamp()

        def collision_tick() -> dict[str, Any] | None:
            for t in sensor_ticks(url):
                if float(t["timestamp"]) > since and t["status"] == "SKIPPED" and \
                        ui_held in (t["skipReason"] or ""):
                    return t
            return None

        skipped = wait_until("a landing-sensor tick that waits for the UI run", collision_tick, 150,
                             services, 2)
        assert run_status(url, ui_held) == "QUEUED"
        gql(url, SET_LIMIT, {"key": POOL, "limit": 1})
        assert wait_until("the UI run of H4", lambda: finished(ui_held), 300, services, 2) == \
            "SUCCESS", logs_tail()
        timings["collision"] = time.monotonic() - t1

        # H5: the landing sensor under the daemon
        t1 = time.monotonic()
        land(HOURS[5])

        def sensor_run() -> str | None:
            for r in gql(url, RUNS)["runsOrError"]["results"]:
                tags = {t["key"]: t["value"] for t in r["tags"]}
                if tags.get("dagster/sensor_name") == SENSOR:
                    return r["runId"]
            return None

        sensor_run_id = wait_until("the landing sensor's run", sensor_run, 150, services, 2)
        assert wait_until("the sensor's run", lambda: finished(sensor_run_id), 300, services, 2) == \
            "SUCCESS", logs_tail()
        timings["sensor"] = time.monotonic() - t1

        # H6: the CLI, as an engineer runs one hour from a shell, recorded in the same instance
        t1 = time.monotonic()
        rc, out = run_logged([str(VENV_BIN / "dedup-pipeline"), "run", "--config",
                              str(root / "dedup.yaml"), "--from", HOURS[6], "--to", HOURS[6]],
                             logs / "cli-run.log", env, REPO)
        assert rc == 0, out
        timings["cli_one_hour"] = time.monotonic() - t1
        print("ui server timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
        yield {"url": url, "root": root, "services": services, "skipped_tick": skipped,
               "runs": {"ui_one": ui_one, "backfill": backfill, "ui_held": ui_held,
                        "sensor": sensor_run_id}}
    finally:
        stop_all(services)


def test_every_ui_and_sensor_run_succeeded_once_per_hour(ui_session: dict[str, Any]) -> None:
    url = ui_session["url"]
    assert len(ui_session["runs"]["backfill"]["runs"]) == 1  # single-run backfill of H1..H3
    runs = gql(url, RUNS)["runsOrError"]["results"]
    assert [r["status"] for r in runs] == ["SUCCESS"] * 5, runs
    loaded_by: dict[str, list[str]] = {}
    for r in runs:
        tags = {t["key"]: t["value"] for t in r["tags"]}
        first = tags.get(RANGE_START) or tags[PARTITION]
        last = tags.get(RANGE_END) or first
        for h in hour_range(first, last):
            loaded_by.setdefault(format_hour(h), []).append(r["runId"])
    assert {h: len(ids) for h, ids in loaded_by.items()} == dict.fromkeys(HOURS, 1), loaded_by
    # the collision: the tick named the UI run and requested nothing; no sensor run of H4
    tick = ui_session["skipped_tick"]
    assert tick["runIds"] == [] and "__ASSET_JOB" in tick["skipReason"], tick
    assert loaded_by[HOURS[4]] == [ui_session["runs"]["ui_held"]]
    assert loaded_by[HOURS[5]] == [ui_session["runs"]["sensor"]]
    # the CLI's one hour is a run of that one partition, no range tags (as the UI's Materialize)
    (cli,) = [r for r in runs if loaded_by[HOURS[6]] == [r["runId"]]]
    tags = {t["key"]: t["value"] for t in cli["tags"]}
    assert tags[PARTITION] == HOURS[6] and RANGE_START not in tags and RANGE_END not in tags, tags


def test_every_check_shows_every_loaded_hour_passed(ui_session: dict[str, Any]) -> None:
    statuses = check_statuses(ui_session["url"])
    assert set(statuses) == set(CHECKS)
    for name, by_status in statuses.items():
        assert by_status == {"SUCCEEDED": set(HOURS)}, (name, by_status)


def test_each_hour_carries_its_own_figures(ui_session: dict[str, Any]) -> None:
    url = ui_session["url"]
    expected = expected_figures(ui_session["root"])
    assert len({tuple(v.values()) for v in expected.values()}) > 1  # hours differ: not one stamp
    for asset in OUTPUTS:
        latest = latest_figures(url, asset)
        assert set(latest) == set(HOURS), (asset, sorted(latest))
        for hour, figures in expected.items():
            md = latest[hour]
            for k, v in figures.items():
                assert md[k] == v, (asset, hour, k, md[k], v)
            assert md["dagster/row_count"] == (figures["unique"] if asset == "index" else figures[asset])
            assert "range_hours" not in md and "range_rows" not in md
            # a time, not epoch microseconds: within the generated hours' day
            assert abs(float(md["latest_point"]) - parse_hour(hour).timestamp()) < 2 * 86400, md


# ---------------------------------------------------------------- the real browser

def test_the_browser_shows_every_hour_passed_and_plotted(ui_session: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """Headless Chromium (Debian's, driven by playwright; no browser download) on the webserver:
    clicks/unique -> Checks -> conservation -> Partitions shows every loaded hour Passed and no
    other status of a loaded hour; Plots draws one point per hour (counted in the GraphQL
    responses the page received, the data its charts are drawn from)."""
    url = ui_session["url"]
    responses: list[dict[str, Any]] = []

    def keep(resp: Any) -> None:
        # the UI posts to /graphql?op=<QueryName>
        if urllib.parse.urlsplit(resp.url).path.endswith("/graphql") and \
                resp.request.method == "POST":
            with contextlib.suppress(Exception):
                responses.append(resp.json())

    shots: list[Path] = []
    with browser_page(tmp_path / "chromium-profile") as page:
        page.on("response", keep)
        # the check's Partitions tab, filtered to Passed: the hours it lists
        page.goto(f"{url}/assets/{DS}/unique?view=checks&checkDetail=conservation",
                  wait_until="networkidle", timeout=120_000)
        page.locator("button[role=tab]#partitions").click()  # the check's tab, not the asset's link
        page.get_by_text("Partitions Selected").wait_for(timeout=60_000)
        page.wait_for_load_state("networkidle")
        shots.append(tmp_path / "check-partitions.png")
        page.screenshot(path=str(shots[-1]), full_page=True)
        text = page.inner_text("body")
        counts = {s: int(n) for s, n in re.findall(
            r"(Missing|Passed|In Progress|Failed|Execution Failed|Skipped) \((\d+)\)", text)}
        assert counts.get("Passed") == len(HOURS), (counts, text[-3000:])
        for bad in ("Failed", "Execution Failed", "Skipped", "In Progress"):
            assert counts.get(bad, 0) == 0, (bad, counts)
        # the hours themselves, listed when only Passed is shown
        page.goto(f"{url}/assets/{DS}/unique?view=checks&checkDetail=conservation"
                  "&status=SUCCEEDED", wait_until="networkidle", timeout=120_000)
        page.locator("button[role=tab]#partitions").click()  # the check's tab, not the asset's link
        page.get_by_text(f"{len(HOURS)} Partitions Selected").wait_for(timeout=60_000)
        page.get_by_text(HOURS[-1], exact=True).first.wait_for(timeout=30_000)
        shots.append(tmp_path / "check-partitions-passed.png")
        page.screenshot(path=str(shots[-1]), full_page=True)
        listed = set(re.findall(r"\d{4}-\d{2}-\d{2}-\d{2}:\d{2}", page.inner_text("body")))
        assert set(HOURS) <= listed, sorted(listed)

        # Overview -> metadata Plots -> Partitions (the default for a partitioned asset):
        # one point per hour on the partition axis
        responses.clear()
        page.goto(f"{url}/assets/{DS}/unique?view=overview", wait_until="networkidle",
                  timeout=120_000)
        page.get_by_role("button", name="Plots").first.click()
        page.get_by_text("rows_in").first.wait_for(timeout=60_000)
        page.wait_for_load_state("networkidle")
        shots.append(tmp_path / "plots.png")
        page.screenshot(path=str(shots[-1]), full_page=True)
    for s in shots:
        print(f"screenshot: {s}")
    points: dict[str, float] = {}
    for body in responses:
        node = (body.get("data") or {}).get("assetNodeOrError") or {}
        for m in node.get("latestMaterializationByPartition") or []:
            for e in (m or {}).get("metadataEntries") or []:
                if e.get("label") == "rows_in" and e.get("intValue") is not None:
                    points[m["partition"]] = e["intValue"]
    expected = expected_figures(ui_session["root"])
    assert points == {h: f["rows_in"] for h, f in expected.items()}, points
