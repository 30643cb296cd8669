"""Debian packages the service tests need (chromium, postgresql), installed with apt-get when the
suite runs as root. One install at a time across the suite's worker processes: apt-get refuses to
run while another holds dpkg's lock."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

APT_LOCK = Path(tempfile.gettempdir()) / "dedup-pipeline-tests-apt.lock"


def apt_install(*packages: str) -> str:
    """Install `packages` (the package lists refreshed once if the first try fails). Returns ''
    on success, else why not: not root, no apt-get, or the end of apt-get's error."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "not root or no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    with APT_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode == 0:
            return ""
        for cmd in (["apt-get", "update"], install):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                return f"{' '.join(cmd)} failed: {r.stderr[-500:]}"
    return ""
