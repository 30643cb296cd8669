"""What counts as a secret, and how one is shown (design.md N6): below the config and the engine.

A Spark setting holds a secret when its name matches Spark's own default `spark.redaction.regex`
(`spark.authenticate.secret`, `spark.connect.authenticate.token`, `spark.hadoop.fs.s3a.secret.key`,
`spark.ssl.keyPassword`, …). Such settings are never read from a config file (the environment
only), never written on a command line (`ps` shows it to every user of the host), and shown as
`<redacted>`; a Spark Connect URL is shown with its `;token=` replaced.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"
# Spark's default spark.redaction.regex (core/src/main/scala/.../internal/config/package.scala)
SECRET_SETTING = re.compile(r"(?i)secret|password|token|access[.]?key")
_URL_TOKEN = re.compile(r"(;\s*token\s*=\s*)[^;/\s'\"]*", re.IGNORECASE)


def is_secret_setting(name: str) -> bool:
    return SECRET_SETTING.search(name) is not None


def redact_url(text: str) -> str:
    """`text` with every Spark Connect URL's token replaced."""
    return _URL_TOKEN.sub(rf"\g<1>{REDACTED}", text)
