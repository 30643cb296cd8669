"""Every check and asset the UI offers to execute or materialize works (through the real
`dagster-webserver` and `dagster-daemon`, on the demo's instance config).

What the UI offers is read from the webserver's GraphQL as its pages read it: an asset's
Materialize button is there when `isExecutable`; a check's Execute button is enabled when
`canExecuteIndividually` is CAN_EXECUTE (REQUIRES_MATERIALIZATION disables it: the check runs
inside its asset's load). Each offered button is then pressed the way the UI sends it
(`launchPipelineExecution` of `__ASSET_JOB` with the same selection), with one partition selected
and, for checks, with none; every run must succeed and record what it says.

Then headless Chromium presses them for real: each output's Materialize (one hour each, and the
dialog's Launch unavailable with no hour selected; the launchpad's run without a partition fails
at once with its cause and fix), every check's Execute (disabled where the UI cannot run the check
alone) and Execute all, and reads a failed load's cause and fix where its run page opens.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML
from dedup_pipeline.hours import HOUR, format_hour, hour_range, to_tag
from dedup_pipeline.orchestration.landing_checks import CHECK_NAME
from dedup_pipeline_tests.daemon_walk import DATASET, Walk
from dedup_pipeline_tests.spark_services import (
    LOOPBACK,
    REPO,
    VENV_BIN,
    connect_client_env,
    free_port,
    loaded_location,
    start,
    start_connect_server,
    stop_all,
    wait_until,
)
from dedup_pipeline_tests.spark_services import graphql as gql
from dedup_pipeline_tests.ui_browser import VIEWPORT, browser_page, button, menu_of, open_page

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
    w = Walk(root, start_hour=now - 8 * HOUR)  # seven complete hours for the clicks below
    (w.home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)
    # every run the buttons launch is a Spark Connect client of one warm server (the recommended
    # topology, docs/operations.md "Spark: local, cluster, Connect"): no Spark start-up per run
    server = start_connect_server(root / "spark", master="local[1]")
    w.env = connect_client_env(w.env, server.url)
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
        server.wait_ready()
        entry = wait_until("the webserver to load the code location",
                           lambda: loaded_location(url, "dedup_pipeline"), 300, [web, daemon], 2)
        assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry
        yield {"url": url, "walk": w, "hours": [format_hour(h0), format_hour(h1)], "root": root,
               "services": [web, daemon, server.service]}
    finally:
        stop_all([web, daemon, server.service])


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


# ---------------------------------------------------------------- the real browser

OUTPUT_ASSETS = ("unique", "duplicates", "expired", "rejected", "index")


class UIRuns:
    """The runs the browser's clicks launch (the UI's asset job), told apart from the landing
    sensor's own input-check runs."""

    def __init__(self, ui: dict[str, Any]) -> None:
        self.ui = ui
        self.seen = {r.run_id for r in self._asset_job_runs()}

    def _asset_job_runs(self) -> list[dg.DagsterRun]:
        with dg.DagsterInstance.from_config(str(self.ui["walk"].home)) as inst:
            return list(inst.get_runs(dg.RunsFilter(job_name="__ASSET_JOB")))

    def next_finished(self, what: str) -> dg.DagsterRun:
        """The one run the last click launched, once it finished."""
        def new() -> list[dg.DagsterRun]:
            return [r for r in self._asset_job_runs() if r.run_id not in self.seen]

        runs = wait_until(f"the run of {what}", lambda: [r for r in new() if r.is_finished] and
                          new(), 420, self.ui["services"], interval=2)
        assert len(runs) == 1, (what, runs)
        self.seen.add(runs[0].run_id)
        return runs[0]


def _partition_dialog(page: Any) -> Any:
    """The Materialize button's partition dialog, after the notice that the multi-asset's other
    outputs come along (the five outputs are one load)."""
    notice = page.get_by_role("dialog").filter(has_text="Additional assets will be materialized")
    notice.wait_for(timeout=30_000)
    listed = set(re.findall(rf"{DATASET} / (\w+)", notice.inner_text()))
    assert len(listed) == len(OUTPUT_ASSETS) - 1 and listed < set(OUTPUT_ASSETS), listed
    button(notice, "Confirm").click()
    dialog = page.get_by_role("dialog").filter(has_text="Partition selection")
    dialog.wait_for(timeout=30_000)
    return dialog


def _materialize(page: Any, url: str, asset: str, hour: str) -> None:
    """Asset page -> Materialize... -> (notice) -> partition dialog: with no hour selected the
    launch is unavailable; one hour selected -> Launch 1 run."""
    open_page(page, f"{url}/assets/{DATASET}/{asset}")
    mat = button(page, "Materialize…")
    mat.first.wait_for(timeout=60_000)  # the page renders it after its queries (slow when loaded)
    assert mat.count() == 1 and mat.is_enabled(), asset
    mat.click()
    dialog = _partition_dialog(page)
    assert "0 partitions" in dialog.inner_text()
    launch = dialog.locator("button").filter(has_text=re.compile(r"^Launch"))
    assert launch.count() == 1 and launch.is_disabled(), (asset, launch.all_inner_texts())
    hours = dialog.locator("input:not([type=checkbox])").first
    hours.fill(hour)
    hours.press("Enter")
    one = button(dialog, "Launch 1 run")
    one.wait_for(timeout=30_000)
    one.click()
    dialog.wait_for(state="detached", timeout=30_000)


def _failure_in_view(page: Any, url: str, run_id: str, starts: str) -> str:
    """Open a failed run's page as a user does and return the first error text in view (no
    scrolling) that starts with `starts` (after Dagster's class name of the `Failure`, or the
    failure summary's lead)."""
    open_page(page, f"{url}/runs/{run_id}")
    page.get_by_text("RUN_FAILURE").first.wait_for(timeout=60_000)
    page.wait_for_load_state("networkidle")
    found = page.get_by_text(re.compile(
        rf"^(dagster\._core\.definitions\.events\.Failure: |dedup_pipeline run failure: )?"
        rf"{re.escape(starts)}"))
    for el in found.all():
        box = el.bounding_box()
        if el.is_visible() and box and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]:
            return str(el.inner_text())
    raise AssertionError(f"no {starts!r} in view on the run page of {run_id}:\n"
                         f"{page.inner_text('body')[-3000:]}")


PARTITION_STATUS = """
query Status($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode {
  assetPartitionStatuses { ... on TimePartitionStatuses { ranges { startKey endKey status } } } } } }
"""


def _partition_status_in_browser(page: Any, url: str, shot: Path) -> tuple[dict[str, int],
                                                                          dict[str, set[str]]]:
    """clicks/unique's Partitions tab as the browser shows it: the count per status its filter
    shows; and the hours per status from the same webserver's GraphQL (the partition bar's data)."""
    open_page(page, f"{url}/assets/{DATASET}/unique?view=partitions")
    page.get_by_text("Partitions Selected").wait_for(timeout=60_000)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(shot), full_page=True)
    counts = {s: int(n) for s, n in re.findall(r"(Failed|Materialized|Materializing|Missing) "
                                               r"\((\d+)\)", page.inner_text("body"))}
    node = gql(url, PARTITION_STATUS, {"key": {"path": [DATASET, "unique"]}})["assetNodeOrError"]
    hours: dict[str, set[str]] = {"MATERIALIZED": set(), "FAILED": set()}
    for r in node["assetPartitionStatuses"]["ranges"]:
        hours.setdefault(r["status"], set()).update(
            format_hour(h) for h in hour_range(r["startKey"], r["endKey"]))
    return counts, hours


def _check_counts_in_browser(page: Any, url: str, check: str, shot: Path) -> dict[str, int]:
    """The check's Partitions tab: the count per status it shows."""
    open_page(page, f"{url}/assets/{DATASET}/unique?view=checks&checkDetail={check}")
    page.locator("button[role=tab]#partitions").click()
    page.get_by_text("Partitions Selected").wait_for(timeout=60_000)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(shot), full_page=True)
    return {s: int(n) for s, n in re.findall(
        r"(Missing|Passed|In Progress|Failed|Execution Failed|Skipped) \((\d+)\)",
        page.inner_text("body"))}


def test_the_browser_clicks_every_materialize_and_execute(ui: dict[str, Any], tmp_path: Path) -> None:
    """Headless Chromium presses each button once: every output's Materialize (its own hour),
    the launchpad without a partition, a Materialize that fails (an hour after a missing one),
    every check's Execute and each Checks tab's Execute all."""
    url, w = ui["url"], ui["walk"]
    hours = [w.start_hour + i * HOUR for i in range(7)]
    for i in (2, 3, 4, 6):  # hour 5 never lands: loading hour 6 must be refused
        w.land(hours[i], [f"b{i}", f"b{i}", "a"], marker=False)
    by_asset = dict(zip(OUTPUT_ASSETS, hours[:5], strict=True))
    runs = UIRuns(ui)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with browser_page(tmp_path / "chromium-profile") as page, \
            dg.DagsterInstance.from_config(str(w.home)) as inst:
        # the launchpad (the Materialize menu) launches without a partition after a warning:
        # the run fails at once, before Spark (in Dagster's own step set-up once the raw batch
        # has observations); the failure summary's cause and fix are where the run page opens
        open_page(page, f"{url}/assets/{DATASET}/unique")
        button(page, "Materialize…").wait_for(timeout=60_000)
        menu_of(page, "Materialize…").click()
        page.get_by_role("menuitem", name="Open launchpad").click()
        button(page.get_by_role("dialog").filter(has_text="Additional assets"), "Confirm").click()
        launchpad = page.get_by_role("dialog").filter(has_text="Launchpad")
        launchpad.get_by_text("No errors").wait_for(timeout=60_000)  # its config is checked
        button(launchpad, "Materialize").click()
        sure = button(page, "Confirm")  # "Are you sure ... without partition specified?"
        sure.last.wait_for(timeout=30_000)
        page.screenshot(path=str(shots / "launchpad-without-partition.png"))
        sure.last.click()
        run = runs.next_finished("the launchpad without a partition")
        assert run.status == dg.DagsterRunStatus.FAILURE, run.run_id
        wait_until("the failure summary", lambda: any(
            "dedup_pipeline run failure" in (e.message or "") for e in inst.all_logs(run.run_id)),
            120, ui["services"], interval=2)
        text = _failure_in_view(page, url, run.run_id, f"A load of {DATASET} needs the hours")
        page.screenshot(path=str(shots / "run-without-partition.png"))
        assert "Fix:" in text and "in the UI" in text and "dedup-pipeline run" in text, text

        # every output's Materialize, each for the next hour: one run, that hour committed and
        # materialized for all five outputs
        for asset, hour in by_asset.items():
            t0 = time.monotonic()
            _materialize(page, url, asset, format_hour(hour))
            run = runs.next_finished(f"Materialize of {asset}")
            page.screenshot(path=str(shots / f"materialize-{asset}.png"))
            assert run.status == dg.DagsterRunStatus.SUCCESS, (asset, run.run_id)
            assert run.tags.get("dagster/partition") == format_hour(hour), run.tags
            assert to_tag(hour) in w.committed()
            for out in OUTPUT_ASSETS:
                recs = inst.fetch_materializations(dg.AssetRecordsFilter(
                    asset_key=dg.AssetKey([DATASET, out]), asset_partitions=[format_hour(hour)]),
                    limit=5).records
                assert recs and recs[0].run_id == run.run_id, (asset, out, recs)  # the latest
            print(f"Materialize {asset} {format_hour(hour)}: {time.monotonic() - t0:.0f}s")

        # a failed load (hour 6 after the never-landed hour 5): its one-line cause and fix, the
        # UI and the CLI way, where the run page opens; the traceback only behind it
        _materialize(page, url, "unique", format_hour(hours[6]))
        run = runs.next_finished("Materialize of an hour after a missing one")
        assert run.status == dg.DagsterRunStatus.FAILURE, run.run_id
        text = _failure_in_view(page, url, run.run_id, f"Load of {DATASET} hour(s) {format_hour(hours[6])}")
        page.screenshot(path=str(shots / "run-load-order-error.png"))
        assert "LoadOrderError" in text and "Fix: load the missing earlier hours first" in text, text
        assert f"in the UI, open asset {DATASET}/unique" in text, text
        assert (f"dedup-pipeline run --config {w.config} --dataset {DATASET} "
                f"--from {format_hour(hours[5])}") in text, text
        assert "Traceback" not in text and 'File "' not in text, text
        assert to_tag(hours[6]) not in w.committed()

        # a refused rerun (hour 1 while hours 2-4 are loaded): its fix names hours 1..4 in order;
        # the partition bar and the checks still show hour 1 as committed; only hour 6, whose
        # load committed nothing, is Failed
        _materialize(page, url, "unique", format_hour(hours[1]))
        run = runs.next_finished("Materialize of a loaded hour before later loaded ones")
        assert run.status == dg.DagsterRunStatus.FAILURE, run.run_id
        text = _failure_in_view(page, url, run.run_id, f"Load of {DATASET} hour(s) {format_hour(hours[1])}")
        assert "LaterHoursLoadedError" in text, text
        assert f"--from {format_hour(hours[1])} --to {format_hour(hours[4])}" in text, text
        counts, status = _partition_status_in_browser(page, url, shots / "after-refusal.png")
        assert counts.get("Materialized") == 5 and counts.get("Failed") == 1, counts
        committed = {format_hour(h) for h in hours[:5]}
        assert status["MATERIALIZED"] == committed and status["FAILED"] == {format_hour(hours[6])}, status
        counts = _check_counts_in_browser(page, url, "conservation", shots / "check-after-refusal.png")
        assert counts.get("Passed") == 5 and not counts.get("Failed") and not counts.get("Skipped"), counts
        w.land(hours[1], ["late"], name="part-late.jsonl", marker=False)  # after hour 1's load

        # every check: Execute is disabled where the UI cannot run the check alone (the load's
        # checks run inside the load; a partitioned asset's check alone: not supported by the
        # UI); the raw batch's Execute all runs the input check without a partition
        for asset, names in (("raw_batch", [CHECK_NAME]), ("unique", ["conservation", "unique_keys"]),
                             ("index", ["index_agrees", "index_size"]),
                             ("duplicates", ["duplicate_rate", "conflict_rate"]),
                             ("rejected", ["rejected_rate"])):
            for name in names:
                open_page(page, f"{url}/assets/{DATASET}/{asset}?view=checks&checkDetail={name}")
                execute = button(page, "Execute")
                execute.wait_for(timeout=30_000)
                assert execute.is_disabled(), (asset, name)
            execute_all = button(page, "Execute all")
            assert execute_all.count() == 1
            if asset != "raw_batch":
                assert execute_all.is_disabled(), asset
                continue
            execute_all.click()
            run = runs.next_finished("Execute all of the raw batch's checks")
            page.screenshot(path=str(shots / "execute-input-check.png"))
            assert run.status == dg.DagsterRunStatus.SUCCESS, run.run_id
            [ev] = [e.dagster_event.event_specific_data for e in inst.all_logs(
                run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)]
            # every loaded hour compared; hour 1's late file reported
            assert ev.check_name == CHECK_NAME and ev.passed is False, ev
            assert ev.metadata["changed_hours"].value == format_hour(hours[1]), ev.metadata
    print(f"screenshots in {shots}")
