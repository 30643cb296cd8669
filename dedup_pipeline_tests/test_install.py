"""Installed as users install it: the wheel with no extras is enough to load an hour.

The README's commands install the `dev` extra, which pulls in pandas and numpy through other
packages; a team adding the package to its own Dagster deployment installs `dedup_pipeline`
alone. So a clean venv gets the built wheel with no extras and runs the demo there, and every
import of the package is checked against `[project.dependencies]`.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# import name -> the declared distribution that provides it (py4j: pyspark's own bridge)
DISTRIBUTION = {"yaml": "pyyaml", "pydantic_core": "pydantic", "py4j": "pyspark"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.fast
def test_every_import_of_the_package_is_a_declared_dependency() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}
    third_party = set()
    for path in (REPO / "dedup_pipeline").rglob("*.py"):
        for name in _imports(path):
            if name in sys.stdlib_module_names or name in ("dedup_pipeline", "__future__"):
                continue
            third_party.add(name)
    missing = {n for n in third_party
               if DISTRIBUTION.get(n, n).lower().replace("_", "-") not in declared}
    assert not missing, f"imported but not in [project.dependencies]: {sorted(missing)}"


@pytest.mark.slow
@pytest.mark.spark
def test_the_wheel_with_no_extras_runs_the_demo_in_a_clean_venv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                    str(REPO)], check=True, cwd=tmp_path, timeout=600)
    (wheel,) = wheels.glob("dedup_pipeline-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=900)
    # nothing of the dev extra came along
    probe = subprocess.run([str(py), "-c", "import importlib.util as u; "
                            "print([m for m in ('pandas', 'pytest', 'dagster_webserver') "
                            "if u.find_spec(m)])"], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]", probe.stdout
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SPARK_REMOTE", "VIRTUAL_ENV", "PYSPARK_PYTHON")}
    env.update(DAGSTER_HOME=str(tmp_path / "dh"), SPARK_MASTER_URL="local[1]",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    out = subprocess.run([str(venv / "bin" / "dedup-pipeline"), "demo", "--dir",
                          str(tmp_path / "demo"), "--hours", "2", "--rows-per-hour", "40"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "total" in out.stdout
    commits = sorted(p.name for p in (tmp_path / "demo").rglob("_commits/load_hour=*.json"))
    assert len(commits) == 2, commits  # and its newest, third hour for the user
    v = subprocess.run([str(venv / "bin" / "dedup-pipeline"), "verify", "--config",
                        str(tmp_path / "demo" / "dedup.yaml")], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=600)
    assert v.returncode == 0 and "OK" in v.stdout, v.stdout + v.stderr
