"""Commands starting at the same instant on a brand-new DAGSTER_HOME (design.md K2; N: infrastructure
errors in one line).

Dagster creates its SQLite storages on first use with "create table" and no retry, so two CLI runs
starting together on a new DAGSTER_HOME failed with `table jobs already exists`, printed as
SQLAlchemy's "Background on this error" link. The CLI opens the instance under a file lock.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy.exc

from dedup_pipeline.cli.common import one_line

REPO = Path(__file__).resolve().parents[1]

# Each process opens the instance the way every CLI command does, at one shared instant, then
# reads its run, event and schedule storages, so a half-created one would show.
WORKER = """
import os, sys, time
from dedup_pipeline.cli.runs import instance
import dagster as dg

print("READY", flush=True)
while not os.path.exists(sys.argv[1]):  # every process released within a millisecond
    time.sleep(0.001)
with instance() as inst:
    inst.get_latest_materialization_event(dg.AssetKey("probe"))
    inst.all_instigator_state()
    print("RUNS", len(inst.get_runs()))
"""


@pytest.mark.slow  # several Dagster processes racing on one new home
def test_concurrent_first_commands_on_a_new_dagster_home(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")]))}
    for attempt in range(3):
        home = tmp_path / f"home{attempt}"  # brand new: not even the directory exists
        go = tmp_path / f"go{attempt}"
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(go)],
                                  env={**env, "DAGSTER_HOME": str(home)}, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(3)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "READY"
        go.touch()
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (attempt, err[-3000:])
            assert "RUNS" in out
        assert (home / "history" / "runs.db").exists()


def test_an_infrastructure_error_is_one_line_with_its_cause_not_a_link() -> None:
    try:
        raise sqlalchemy.exc.OperationalError("CREATE TABLE jobs (...)", {},
                                              Exception("table jobs already exists"))
    except sqlalchemy.exc.OperationalError as e:
        assert "Background on this error" in str(e)  # what SQLAlchemy's own text ends with
        line = one_line(e)
    assert line == "OperationalError: (builtins.Exception) table jobs already exists"
