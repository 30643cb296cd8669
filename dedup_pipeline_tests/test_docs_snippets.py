"""Every code block of README.md and docs/operations.md runs, against the demo's outputs, and
prints what it computes.

One small demo (`dedup-pipeline demo`, 2 hours) is made; then each ```python block of both files
(the readers of operations.md, "Reading the tables") runs as its own script in the demo's
directory (where its relative paths point) and must exit 0 and print something; README's
```yaml config block must load as a config; each ```bash block is either run (operations.md's
commands, with the demo's config and hours in place of the examples) or is one of the few in
README.md that start the product itself, listed below with the test that covers it. A new block
that is neither fails this test.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dedup_pipeline.config import load_config
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import format_tag
from dedup_pipeline_tests.spark_services import REPO, VENV_BIN, clean_env

pytestmark = pytest.mark.slow

README = REPO / "README.md"
OPERATIONS = REPO / "docs" / "operations.md"

# shell blocks that start the product itself (not a command that finishes): what covers them
NOT_RUN = {
    "./scripts/demo.sh": "the demo: this test's fixture runs `dedup-pipeline demo`, what it runs",
    ".venv/bin/dedup-pipeline spark-server": "servers: test_warm_server.py, test_ui_server.py",
    "pip wheel --no-deps -w dist /path/to/dedup_pipeline":
        "the component in a fresh dg project, installed from the wheel: test_install.py",
}


def blocks(path: Path) -> list[tuple[str, str]]:
    """(language, text) of every fenced block of a Markdown file."""
    return re.findall(r"^```(\w*)\n(.*?)^```", path.read_text(), flags=re.S | re.M)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("docs") / "demo"
    out = subprocess.run([str(VENV_BIN / "dedup-pipeline"), "demo", "--dir", str(root), "--hours",
                          "2", "--rows-per-hour", "200"], env=clean_env(), cwd=root.parent,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the demo's closing lines: the Delta tables, the UI, and how the CLI uses the warm server
    assert "Outputs (Delta tables, partitioned by load_hour)" in out.stdout, out.stdout
    assert "export SPARK_REMOTE=sc://127.0.0.1:15002" in out.stdout, out.stdout
    yield root


def _config(demo: Path) -> Path:
    """The demo's dataset config: its component's defs.yaml."""
    return demo / "dedup_demo" / "defs" / "clicks" / "defs.yaml"


def test_every_python_block_runs_and_prints(demo: Path) -> None:
    py = [(f"{path.name} python block {i}", text) for path in (README, OPERATIONS)
          for i, text in enumerate((t for lang, t in blocks(path) if lang == "python"), start=1)]
    # at least the readers of operations.md: deltalake, DuckDB and Polars, a downstream Dagster asset
    assert len(py) >= 3, f"{len(py)} python blocks"
    for name, code in py:
        out = subprocess.run([str(VENV_BIN / "python"), "-c", code], cwd=demo / "data", env=clean_env(),
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{name}:\n{code}\n{out.stderr[-3000:]}"
        assert out.stdout.strip(), f"{name} printed nothing:\n{code}"
        print(f"--- {name}:\n{out.stdout[:600]}")


def test_the_readme_config_block_is_a_valid_config(tmp_path: Path) -> None:
    [text] = [t for lang, t in blocks(README) if lang == "yaml"]
    (tmp_path / "dedup.yaml").write_text(text)
    cfg = load_config(str(tmp_path / "dedup.yaml"))
    assert [d.name for d in cfg.datasets] == ["clicks"]
    assert yaml.safe_load(text)["datasets"][0]["output_format"] == "delta"


def test_every_shell_block_runs(demo: Path) -> None:
    """README's shell blocks are the demo and the servers (NOT_RUN); operations.md's commands run
    on the demo: the examples' hours become the demo's, `dedup.yaml` its component's defs.yaml. A command of
    NOT_RUN (it would not finish) has no place in operations.md's shell blocks."""
    for lang, text in blocks(README):
        if lang in ("bash", "sh", "shell"):
            first = text.strip().splitlines()[0].split("#")[0].strip()
            assert first in NOT_RUN, f"a README shell block neither run nor covered: {text}"
    (ds,) = load_config(str(_config(demo))).datasets
    hours = sorted(format_tag(t) for t in CommitLog(Storage(ds.output)).committed())
    assert len(hours) == 2
    env = clean_env(DAGSTER_HOME=str(demo / "dagster_home"), DEDUP_CONFIG=str(_config(demo)))
    ran = 0
    for lang, text in blocks(OPERATIONS):
        if lang not in ("bash", "sh", "shell"):
            continue
        for line in text.strip().splitlines():
            assert not any(line.strip().startswith(c) for c in NOT_RUN), f"operations.md: {line}"
            cmd = (line.replace("<latest loaded hour>", hours[-1])
                   .replace("2026-11-01-01:00", hours[0])
                   .replace("--config dedup.yaml", f"--config {_config(demo)}"))
            out = subprocess.run(cmd, shell=True, cwd=REPO, env=env, capture_output=True,
                                 text=True, timeout=600)
            assert out.returncode == 0, f"operations.md: {line}\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
            print(f"$ {cmd}\n{out.stdout[-800:]}")
            ran += 1
    assert ran >= 3
