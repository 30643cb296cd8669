"""Every check and asset the UI offers to execute or materialize works (through the real
`dagster-webserver` and `dagster-daemon`, on the demo's instance config).

What the UI offers is read from the webserver's GraphQL as its pages read it: an asset's
Materialize button is there when `isExecutable`; a check's Execute button is enabled when
`canExecuteIndividually` is CAN_EXECUTE (REQUIRES_MATERIALIZATION disables it: the check runs
inside its asset's load). Each offered button is then pressed the way the UI sends it
(`launchPipelineExecution` of `__ASSET_JOB` with the same selection), with one partition selected
and, for checks, with none; every run must succeed and record what it says. A browser test clicks
the input check's Execute and the load's Materialize for real.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dedup_pipeline.cli import DEMO_INSTANCE_YAML
from dedup_pipeline.defs.landing_checks import CHECK_NAME
from dedup_pipeline.hours import HOUR, to_key
from dedup_pipeline_tests.daemon_walk import DATASET, Walk
from dedup_pipeline_tests.spark_services import (
    LOOPBACK,
    REPO,
    VENV_BIN,
    free_port,
    loaded_location,
    start,
    stop_all,
    wait_until,
)
from dedup_pipeline_tests.spark_services import graphql as gql

pytestmark = pytest.mark.slow

ASSET_NODES = """
query { assetNodes { assetKey { path } isExecutable isPartitioned
  assetChecksOrError { __typename ... on AssetChecks { checks { name canExecuteIndividually } } } } }
"""

LAUNCH = """
mutation Launch($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}
"""

RUN = """
query Run($id: ID!) { runOrError(runId: $id) { __typename ... on Run { runId status
  eventConnection { events { __typename
    ... on ExecutionStepFailureEvent { message error { message stack } failureMetadata { description } }
    ... on AssetCheckEvaluationEvent { evaluation { checkName success partition } }
  } } } } }
"""


def launch(url: str, assets: list[list[str]], checks: list[tuple[list[str], str]],
           partition: str | None) -> str:
    """What the UI's Materialize / Execute buttons send (the asset job, the selection)."""
    tags = [{"key": "dagster/partition", "value": partition}] if partition else []
    res = gql(url, LAUNCH, {"executionParams": {
        "mode": "default", "runConfigData": {},
        "selector": {"repositoryLocationName": "dedup_pipeline", "repositoryName": "__repository__",
                     "pipelineName": "__ASSET_JOB",
                     "assetSelection": [{"path": a} for a in assets],
                     "assetCheckSelection": [{"assetKey": {"path": a}, "name": c} for a, c in checks]},
        "executionMetadata": {"tags": tags}}})["launchPipelineExecution"]
    assert res["__typename"] == "LaunchRunSuccess", res
    return res["run"]["runId"]


def finished_run(url: str, run_id: str) -> dict[str, Any] | None:
    run = gql(url, RUN, {"id": run_id})["runOrError"]
    return run if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("ui_buttons")
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    w = Walk(root, start_hour=now - 3 * HOUR)
    (w.home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)
    with dg.DagsterInstance.from_config(str(w.home)):
        pass  # create the SQLite storages once, before two processes race to
    h0, h1 = w.start_hour, w.start_hour + HOUR
    w.land(h0, ["a", "b", "a"], marker=False)  # no markers: the sensor loads nothing by itself
    w.land(h1, ["c", "a"], marker=False)
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    web = start("dagster-webserver", [str(VENV_BIN / "dagster-webserver"), "-h", LOOPBACK, "-p",
                                      str(port), "-w", "workspace.yaml"], root / "webserver.log",
                env=w.env, cwd=REPO)
    daemon = w.start_daemon()
    try:
        entry = wait_until("the webserver to load the code location",
                           lambda: loaded_location(url, "dedup_pipeline"), 300, [web, daemon], 2)
        assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry
        yield {"url": url, "walk": w, "hours": [to_key(h0), to_key(h1)], "root": root,
               "services": [web, daemon]}
    finally:
        stop_all([web, daemon])


def _offered(url: str) -> tuple[list[list[str]], dict[str, list[tuple[list[str], str]]]]:
    """Assets with a Materialize button; checks by what their Execute button does."""
    assets, checks = [], {"CAN_EXECUTE": [], "REQUIRES_MATERIALIZATION": [], "other": []}
    for node in gql(url, ASSET_NODES)["assetNodes"]:
        path = node["assetKey"]["path"]
        if path[0] != DATASET:
            continue
        if node["isExecutable"]:
            assets.append(path)
        for c in (node["assetChecksOrError"].get("checks") or []):
            kind = c["canExecuteIndividually"]
            checks[kind if kind in checks else "other"].append((path, c["name"]))
    return assets, checks


def _wait(ui: dict[str, Any], run_id: str) -> dict[str, Any]:
    return wait_until(f"run {run_id}", lambda: finished_run(ui["url"], run_id), 420,
                      ui["services"], interval=2)


def test_every_offered_check_and_asset_runs(ui: dict[str, Any]) -> None:
    url, (h0, h1) = ui["url"], ui["hours"]
    assets, checks = _offered(url)
    # the raw batch is read in place (an external asset): no Materialize button; the load's five
    # outputs are one step (materialized together); its checks run inside it (Execute disabled)
    assert sorted(a[1] for a in assets) == ["duplicates", "expired", "index", "rejected", "unique"]
    assert checks["CAN_EXECUTE"] == [([DATASET, "raw_batch"], CHECK_NAME)], checks
    assert not checks["other"] and len(checks["REQUIRES_MATERIALIZATION"]) == 7, checks

    # Materialize (one partition): the whole load step with its checks, as the UI selects it
    t0 = time.monotonic()
    in_load = checks["REQUIRES_MATERIALIZATION"]
    load = _wait(ui, launch(url, assets, in_load, h0))
    assert load["status"] == "SUCCESS", load
    print(f"Materialize {h0}: {time.monotonic() - t0:.0f}s")
    # (a partitioned asset's Materialize always asks for the hours: the UI sends no load
    # without a partition)

    # Execute of the input check: a loaded hour, an hour not loaded, and no partition at all
    for partition, expected in ((h0, (True, h0)), (h1, (True, h1)), (None, (True, None))):
        run = _wait(ui, launch(url, [], checks["CAN_EXECUTE"], partition))
        assert run["status"] == "SUCCESS", (partition, [
            e for e in run["eventConnection"]["events"] if e["__typename"] == "ExecutionStepFailureEvent"])
        evals = [e["evaluation"] for e in run["eventConnection"]["events"]
                 if e["__typename"] == "AssetCheckEvaluationEvent"]
        assert [(e["success"], e["partition"]) for e in evals] == [expected], evals
    # a late file in the loaded hour: the same button reports it, with and without a partition
    ui["walk"].land(ui["walk"].start_hour, ["z"], name="part-late.jsonl", marker=False)
    for partition in (h0, None):
        run = _wait(ui, launch(url, [], checks["CAN_EXECUTE"], partition))
        [ev] = [e["evaluation"] for e in run["eventConnection"]["events"]
                if e["__typename"] == "AssetCheckEvaluationEvent"]
        assert run["status"] == "SUCCESS" and ev["success"] is False, run


def test_the_browser_clicks_execute_and_materialize(ui: dict[str, Any], tmp_path: Path) -> None:
    """Headless Chromium: the input check's Execute button and the load's Materialize button
    (one hour) launch runs that succeed."""
    from dedup_pipeline_tests.test_ui_server import CHROMIUM_FLAGS, _chromium

    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    url = ui["url"]
    with dg.DagsterInstance.from_config(str(ui["walk"].home)) as inst:
        before = {r.run_id for r in inst.get_runs()}

    def new_runs() -> list[dg.DagsterRun]:
        with dg.DagsterInstance.from_config(str(ui["walk"].home)) as inst:
            return [r for r in inst.get_runs() if r.run_id not in before]

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1600, "height": 1000})
        try:
            page = ctx.new_page()
            page.goto(f"{url}/assets/{DATASET}/raw_batch?view=checks&checkDetail={CHECK_NAME}",
                      wait_until="networkidle", timeout=120_000)
            skip = page.get_by_role("button", name="Skip")
            with contextlib.suppress(Exception):
                skip.wait_for(timeout=5_000)
                skip.first.click()
            page.get_by_role("button", name="Execute").first.click()
            page.screenshot(path=str(tmp_path / "execute.png"), full_page=True)
            wait_until("the check's run", lambda: [r for r in new_runs() if r.is_finished], 300,
                       ui["services"], interval=2)
            # Materialize of the load: the partition dialog, one hour, Launch
            page.goto(f"{url}/assets/{DATASET}/unique", wait_until="networkidle", timeout=120_000)
            page.get_by_role("button", name="Materialize").first.click()
            page.screenshot(path=str(tmp_path / "materialize-dialog.png"), full_page=True)
            print(f"screenshots in {tmp_path}")
        finally:
            ctx.close()
    done = [r for r in new_runs() if r.is_finished]
    assert done and all(r.status == dg.DagsterRunStatus.SUCCESS for r in done), done
