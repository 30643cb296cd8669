"""Where S3 settings come from and where they go (design.md C4): the standard AWS variables, mapped
once (objectstore.py) into Spark's S3A settings, s3fs's and delta-rs's options; the S3A jars and
committer only for S3 roots; keys never on a command line. Pure Python: no Spark, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedup_pipeline.engine import session
from dedup_pipeline.engine.session import S3ConnectorError, s3_conf, server_command
from dedup_pipeline.objectstore import COMMITTER_CONF, S3Settings, any_s3, is_s3

ENV = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
       "AWS_SESSION_TOKEN": "tok-value", "AWS_REGION": "eu-west-1",
       "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}


def test_the_standard_variables_map_into_every_client() -> None:
    s = S3Settings.from_env(ENV)
    assert s.allow_http  # an http:// endpoint implies it
    conf = s.spark_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3a.committer.name"] == "magic"
    assert "FileOutputCommitter" not in " ".join(conf.values())
    assert not any("secret" in k or "access.key" in k for k in conf)  # from the environment
    keyed = s.spark_conf(credentials=True)  # executors on other hosts
    assert keyed["spark.hadoop.fs.s3a.secret.key"] == "s3cr3t-value"
    assert keyed["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider")
    fs = s.fsspec_options()
    assert fs["endpoint_url"] == "http://127.0.0.1:9000" and fs["use_listings_cache"] is False
    delta = s.delta_options()
    assert delta["AWS_ALLOW_HTTP"] == "true" and delta["AWS_REGION"] == "eu-west-1"
    assert "AWS_S3_ALLOW_UNSAFE_RENAME" not in delta
    # AWS S3 itself: no endpoint, no path style, the instance profile when no keys are set
    aws = S3Settings.from_env({"AWS_REGION": "us-east-2"})
    assert "spark.hadoop.fs.s3a.endpoint" not in aws.spark_conf(credentials=True)
    assert "spark.hadoop.fs.s3a.access.key" not in aws.spark_conf(credentials=True)
    assert aws.delta_options() == {"AWS_REGION": "us-east-2"}


def test_only_s3_roots_bring_s3() -> None:
    assert is_s3("s3://b/x") and is_s3("s3a://b/x")
    assert not any_s3(["/data/x", "file:///x", "hdfs://nn:8020/x", "s3n-like/x"])


def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, complete: bool) -> Path:
    monkeypatch.setenv(session.JARS_CACHE_ENV, str(tmp_path))
    d = session.s3_jars_dir()
    d.mkdir(parents=True)
    (d / "hadoop-aws-3.5.0.jar").write_bytes(b"")
    if complete:
        (d / ".complete").write_text("")
    return d


def test_the_connector_comes_from_the_cache_or_the_users_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    d = _cache(tmp_path, monkeypatch, complete=False)  # a fetch cut short is not a cache
    with pytest.raises(S3ConnectorError, match="scripts/fetch_jars.sh"):
        s3_conf({})
    assert "spark.jars" not in s3_conf({"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.5.0"})
    (d / ".complete").write_text("")
    conf = s3_conf({"spark.jars": "/mine.jar", "spark.hadoop.fs.s3a.committer.name": "directory"})
    assert conf["spark.jars"].split(",") == [str(d / "hadoop-aws-3.5.0.jar"), "/mine.jar"]
    assert conf["spark.hadoop.fs.s3a.committer.name"] == "directory"  # the user's setting wins
    assert "spark.hadoop.fs.s3a.secret.key" not in conf  # local: S3A reads the environment
    remote = s3_conf({}, master="spark://10.0.0.1:7077")
    assert remote["spark.hadoop.fs.s3a.secret.key"] == "s3cr3t-value"


def test_a_connect_servers_command_line_never_holds_a_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    _cache(tmp_path, monkeypatch, complete=True)
    cmd = " ".join(server_command("spark://10.0.0.1:7077", "127.0.0.1", 15002))
    for name, value in COMMITTER_CONF.items():
        assert f"{name}={value}" in cmd
    for secret in ("s3cr3t-value", "tok-value", "AKIDEXAMPLE"):
        assert secret not in cmd


def test_the_settings_never_show_their_keys() -> None:
    """design.md N6: a message or log line that shows the settings shows no credential."""
    s = S3Settings.from_env({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
                             "AWS_SESSION_TOKEN": "t0ken", "AWS_ENDPOINT_URL": "http://h:1"})
    assert s.secret_key == "s3cr3t"
    for text in (repr(s), str(s), f"{s}"):
        assert "s3cr3t" not in text and "t0ken" not in text and "AKIDEXAMPLE" not in text
