"""S3 and S3-compatible stores: where credentials and the endpoint come from, and the one place
that maps them into each client's settings (design.md C4).

A user sets the variables every AWS tool reads, once: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``),
``AWS_ENDPOINT_URL`` (an S3-compatible store: MinIO, Ceph, R2, SeaweedFS) and ``AWS_ALLOW_HTTP``
(a plain-http endpoint), or none of the credentials (the instance profile / web identity the AWS
SDKs find themselves). Never a config file: a config is shown in the UI and in errors, a
credential must not be. Spark's S3A connector (`spark_conf`), fsspec's s3fs (`fsspec_options`)
and delta-rs (`delta_options`) get them from here. Pure Python, below the engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

S3_SCHEMES = ("s3://", "s3a://")

# The S3A magic committer (never the rename-based file committer Spark's docs call unsafe on S3):
# its classes come from spark-hadoop-cloud (scripts/fetch_jars.sh).
COMMITTER_CONF = {
    "spark.hadoop.fs.s3a.committer.name": "magic",
    "spark.hadoop.fs.s3a.committer.magic.enabled": "true",
    "spark.hadoop.mapreduce.outputcommitter.factory.scheme.s3a":
        "org.apache.hadoop.fs.s3a.commit.S3ACommitterFactory",
    "spark.hadoop.mapreduce.outputcommitter.factory.scheme.s3":
        "org.apache.hadoop.fs.s3a.commit.S3ACommitterFactory",
    "spark.sql.sources.commitProtocolClass":
        "org.apache.spark.internal.io.cloud.PathOutputCommitProtocol",
    "spark.sql.parquet.output.committer.class":
        "org.apache.spark.internal.io.cloud.BindingParquetOutputCommitter",
    # upload blocks are buffered in memory, not in local files: the product's sessions read local
    # files through RawLocalFileSystem (engine/session.py), which S3A's disk buffer cannot use
    "spark.hadoop.fs.s3a.fast.upload.buffer": "bytebuffer",
    # `s3://` roots name the same store as `s3a://` in Spark too (Hadoop maps only s3a by default)
    "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
}
# Spark classes that tell whether the connector and the committer are on the classpath.
S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
COMMITTER_CLASS = "org.apache.spark.internal.io.cloud.PathOutputCommitProtocol"


def is_s3(uri: str) -> bool:
    return uri.startswith(S3_SCHEMES)


def any_s3(uris: Iterable[str]) -> bool:
    return any(is_s3(u) for u in uris)


def _true(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class S3Settings:
    """The S3 settings of this process's environment."""

    endpoint: str | None = None
    region: str | None = None
    allow_http: bool = False
    access_key: str | None = field(default=None, repr=False)  # never in a message (N6)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        return cls(
            endpoint=endpoint,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            # a plain-http endpoint is allowed when said so, or when the endpoint says http://
            allow_http=_true(env.get("AWS_ALLOW_HTTP")) or bool(
                endpoint and endpoint.startswith("http://")),
            access_key=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )

    def spark_conf(self, credentials: bool = False) -> dict[str, str]:
        """S3A's settings (``spark.hadoop.fs.s3a.*``) and the magic committer. With
        `credentials` (executors on other hosts: a standalone cluster) the keys are passed as
        settings, which Spark redacts in its UI and logs (`spark.redaction.regex` matches
        ``secret``/``token``/``access.key``); otherwise S3A's own chain reads them from this
        process's environment, or finds the instance profile or web identity, and no key is
        ever a setting (nor on a command line). An endpoint means an S3-compatible store:
        path-style addressing."""
        conf = dict(COMMITTER_CONF)
        h = "spark.hadoop.fs.s3a."
        if self.endpoint:
            conf[h + "endpoint"] = self.endpoint
            conf[h + "path.style.access"] = "true"
            conf[h + "connection.ssl.enabled"] = str(not self.endpoint.startswith("http://")).lower()
        if self.region:
            conf[h + "endpoint.region"] = self.region
        elif self.endpoint:
            conf[h + "endpoint.region"] = "us-east-1"  # S3-compatible stores ignore it; S3A asks
        if credentials and self.access_key and self.secret_key:
            conf[h + "access.key"] = self.access_key
            conf[h + "secret.key"] = self.secret_key
            if self.session_token:
                conf[h + "session.token"] = self.session_token
                conf[h + "aws.credentials.provider"] = (
                    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")
        return conf

    def fsspec_options(self) -> dict[str, object]:
        """s3fs's options (botocore reads the credentials and the endpoint itself as well). No
        listings cache: a long-lived process (the code server's sensors, a run loading many
        hours) must see files another process wrote or deleted since its last listing."""
        opts: dict[str, object] = {"use_listings_cache": False}
        client: dict[str, object] = {}
        if self.endpoint:
            opts["endpoint_url"] = self.endpoint
        if self.region:
            client["region_name"] = self.region
        if self.access_key and self.secret_key:
            opts["key"], opts["secret"] = self.access_key, self.secret_key
            if self.session_token:
                opts["token"] = self.session_token
        if client:
            opts["client_kwargs"] = client
        return opts

    def delta_options(self) -> dict[str, str]:
        """delta-rs's `storage_options`. Commits on S3 by put-if-absent (deltalake >= 1.6): no
        locking provider, never ``AWS_S3_ALLOW_UNSAFE_RENAME``."""
        opts: dict[str, str] = {}
        if self.endpoint:
            opts["AWS_ENDPOINT_URL"] = self.endpoint
            opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        if self.region:
            opts["AWS_REGION"] = self.region
        elif self.endpoint:
            opts["AWS_REGION"] = "us-east-1"
        if self.allow_http:
            opts["AWS_ALLOW_HTTP"] = "true"
        if self.access_key and self.secret_key:
            opts["AWS_ACCESS_KEY_ID"] = self.access_key
            opts["AWS_SECRET_ACCESS_KEY"] = self.secret_key
            if self.session_token:
                opts["AWS_SESSION_TOKEN"] = self.session_token
        return opts
