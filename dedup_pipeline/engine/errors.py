"""Infrastructure errors in one line: the cause (disk full, read-only) and the path that failed.

A full disk surfaces from Spark as `Py4JJavaError: An error occurred while calling o6206.parquet`,
with "No space left on device" only deep in the Java trace; these helpers find it there.
"""

from __future__ import annotations

import re

CAUSES = ("No space left on device", "Read-only file system", "Disk quota exceeded",
          "Permission denied")
_PATH = re.compile(r"""(?:file:|(?<![\w.$/]))(/[^\s'"(),]+)""")  # not java.base/java.io...


def infrastructure_cause(text: str) -> str | None:
    """`"<cause>: <path>"` for the first line of `text` naming a known cause, else None.

    The path is taken from that line, or else from the nearest earlier line that names one
    (Java names the file in the outer exception, the cause in a `Caused by:` line below).
    """
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cause = next((c for c in CAUSES if c in line), None)
        if cause is None:
            continue
        for candidate in [line, *reversed(lines[:i])]:
            m = _PATH.search(candidate.split(cause, 1)[0] + " " + candidate.split(cause, 1)[-1])
            if m:
                return f"{cause}: {m.group(1).rstrip('.:')}"
        return cause
    return None
