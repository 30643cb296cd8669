"""The S3 tier through the component: a `dg` project whose `DedupDataset` reads its landing zone
from and writes its outputs to ``s3://`` (a real S3 server, SeaweedFS), checked by `dg check defs`
and loaded by `dg launch` as a team runs it, with only the standard AWS variables set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from dedup_pipeline.cli.demo import DEFINITIONS_PY, PROJECT_TOML
from dedup_pipeline.config import load_config
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import parse_hour
from dedup_pipeline.sample.generate import generate_landing
from dedup_pipeline_tests.reference import Reference
from dedup_pipeline_tests.test_s3_loads import OUTPUTS, engine_rows, upload

pytestmark = pytest.mark.slow

START = "2026-11-01-00:00"
DG = str(Path(sys.executable).parent / "dg")


def test_a_dg_project_loads_an_hour_of_an_s3_dataset(s3: Any, tmp_path: Path) -> None:
    generate_landing(tmp_path, hours=2, rows_per_hour=300, start=START)
    root = f"{s3.root}/component"
    upload(s3, tmp_path / "landing", f"{root}/landing")
    local = yaml.safe_load((tmp_path / "dedup.yaml").read_text())["datasets"][0]
    attrs = {**local, "source": {**local["source"], "path": f"{root}/landing/clicks"},
             "output": f"{root}/warehouse/clicks"}
    proj = tmp_path / "s3proj"
    defs = proj / "s3proj" / "defs" / "clicks"
    defs.mkdir(parents=True)
    (proj / "pyproject.toml").write_text(PROJECT_TOML.format(pkg="s3proj"))
    (proj / "s3proj" / "__init__.py").write_text("")
    (proj / "s3proj" / "defs" / "__init__.py").write_text("")
    (proj / "s3proj" / "definitions.py").write_text(DEFINITIONS_PY)
    (defs / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "dedup_pipeline.DedupDataset", "attributes": attrs}, sort_keys=False))
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, **s3.env, "DAGSTER_HOME": str(home), "PYTHONPATH": str(proj)}

    def run(*args: str) -> str:
        r = subprocess.run([DG, *args], cwd=proj, env=env, capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, f"dg {args}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r.stdout + r.stderr

    run("check", "defs")
    run("launch", "--job", "clicks_hourly_load", "--partition", START)

    st = Storage(attrs["output"])
    assert commits.committed_tags(st) == {"2026-11-01-00"}
    ds_local = yaml.safe_load((tmp_path / "dedup.yaml").read_text())
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(ds_local, sort_keys=False))
    want = Reference(load_config(str(tmp_path / "local.yaml")).datasets[0]).load(parse_hour(START))
    s3_ds = load_config(str(defs / "defs.yaml")).datasets[0]
    for name in OUTPUTS:
        assert engine_rows(s3_ds, name, "2026-11-01-00") == want.rows[name], name
    # the run is in the project's instance: the hour shows loaded there
    with dg.DagsterInstance.from_config(str(home)) as inst:
        ev = inst.get_latest_materialization_event(dg.AssetKey(["clicks", "unique"]))
        assert ev is not None and ev.dagster_event is not None
        assert ev.dagster_event.partition == START
