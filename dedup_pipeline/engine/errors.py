"""Infrastructure errors in one line: the cause (disk full, read-only) and the path that failed.

A full disk surfaces from Spark as `Py4JJavaError: An error occurred while calling o6206.parquet`,
with "No space left on device" only deep in the Java trace; these helpers find it there.
"""

from __future__ import annotations

import os
import re

CAUSES = ("No space left on device", "Read-only file system", "Disk quota exceeded",
          "Permission denied")
_PATH = re.compile(r"""(?:file:|(?<![\w.$/]))(/[^\s'"(),]+)""")  # not java.base/java.io...
_MKDIRS = re.compile(r"""Mkdirs failed to create (?:file:)?(/[^\s'"(),]+)""")


def _why_not_writable(path: str) -> str | None:
    """Hadoop says only "Mkdirs failed to create <path>": ask the file system that holds it."""
    p = path
    while p and not os.path.exists(p):
        p = os.path.dirname(p.rstrip("/")) if p != "/" else ""
    if not p:
        return None
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return "Read-only file system"
    if st.f_bavail == 0:
        return "No space left on device"
    if not os.access(p, os.W_OK):
        return "Permission denied"
    return None


def infrastructure_cause(text: str) -> str | None:
    """`"<cause>: <path>"` for the first line of `text` naming a known cause, else None.

    The path is taken from that line, or else from the nearest earlier line that names one
    (Java names the file in the outer exception, the cause in a `Caused by:` line below).
    """
    lines = text.splitlines()
    for i, line in enumerate(lines):
        mk = _MKDIRS.search(line)
        if mk is not None:
            why = _why_not_writable(mk.group(1))
            if why is not None:
                return f"{why}: {mk.group(1)}"
        cause = next((c for c in CAUSES if c in line), None)
        if cause is None:
            continue
        for candidate in [line, *reversed(lines[:i])]:
            m = _PATH.search(candidate.split(cause, 1)[0] + " " + candidate.split(cause, 1)[-1])
            if m:
                return f"{cause}: {m.group(1).rstrip('.:')}"
        return cause
    return None
