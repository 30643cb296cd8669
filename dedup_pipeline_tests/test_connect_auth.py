"""The Spark Connect token and secret settings in plain Python (design.md N6): where a client's
token comes from, the URL it connects with, what a message may show, secrets refused in a config
file, and secret settings kept off the server's command line. The real servers: test_security.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedup_pipeline.config import load_config
from dedup_pipeline.config.errors import ConfigError
from dedup_pipeline.engine.connect_auth import (
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    ConnectTokenError,
    client_url,
    default_token_file,
    read_token_file,
    server_token,
    uses_tls,
)
from dedup_pipeline.engine.session import server_command
from dedup_pipeline.redaction import is_secret_setting, redact_url
from dedup_pipeline_tests.conftest import dataset_raw, write_config


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for k in (TOKEN_ENV, TOKEN_FILE_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_a_loopback_client_reads_the_default_file_and_connects_as_localhost(
        no_token: Path) -> None:
    assert client_url("sc://127.0.0.1:15002") == "sc://127.0.0.1:15002"  # no token anywhere
    token, source = server_token(None)  # what `spark-server` does with nothing set
    assert source == f"{default_token_file()} (created)"
    assert oct(default_token_file().stat().st_mode & 0o777) == "0o600"
    assert client_url("sc://127.0.0.1:15002") == f"sc://localhost:15002/;token={token}"
    assert client_url("sc://[::1]:7/;user_id=a") == f"sc://localhost:7/;user_id=a;token={token}"
    # a server elsewhere never gets this host's default token
    assert client_url("sc://spark-connect:15002/;use_ssl=true") == \
        "sc://spark-connect:15002/;use_ssl=true"
    assert server_token(None) == (token, str(default_token_file()))  # read again, not replaced


def test_the_environment_and_a_named_file_win_and_tls_is_kept(
        no_token: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = no_token / "tok"
    f.write_text("from-file\n")
    f.chmod(0o600)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(f))
    url = client_url("sc://connect.example:15002/;use_ssl=true")
    assert url == "sc://connect.example:15002/;use_ssl=true;token=from-file" and uses_tls(url)
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert client_url("sc://127.0.0.1:1") == "sc://localhost:1/;token=from-env"
    assert not uses_tls("sc://localhost:1/;token=from-env")
    # with use_ssl a loopback host keeps its name (the certificate's)
    assert client_url("sc://127.0.0.1:1/;use_ssl=true") == \
        "sc://127.0.0.1:1/;use_ssl=true;token=from-env"
    # a token in the URL is sent as it is
    assert client_url("sc://h:1/;token=in-url") == "sc://h:1/;token=in-url"


def test_a_token_file_others_can_read_is_refused_naming_chmod(no_token: Path) -> None:
    f = no_token / "tok"
    f.write_text("x\n")
    f.chmod(0o644)
    with pytest.raises(ConnectTokenError, match=f"chmod 600 {f}"):
        read_token_file(f)
    f.chmod(0o600)
    f.write_text("\n")
    with pytest.raises(ConnectTokenError, match="is empty"):
        read_token_file(f)


@given(st.from_regex(r"[A-Za-z0-9._~+=%!*-]{1,64}", fullmatch=True))
def test_a_url_is_shown_without_its_token(token: str) -> None:
    for url, shown in (
            (f"sc://h:1/;token={token}", "sc://h:1/;token=<redacted>"),
            (f"sc://h:1/;use_ssl=true;token={token};user_id=u",
             "sc://h:1/;use_ssl=true;token=<redacted>;user_id=u"),
            (f"error at sc://h:1/;Token = {token} refused", "error at sc://h:1/;Token = <redacted> "
             "refused")):
        assert redact_url(url) == shown


def test_secret_settings_are_spark_s_redaction_names() -> None:
    for k in ("spark.authenticate.secret", "spark.connect.authenticate.token",
              "spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key",
              "spark.ssl.keyPassword", "spark.hadoop.fs.s3a.session.token"):
        assert is_secret_setting(k), k
    for k in ("spark.authenticate", "spark.driver.memory", "spark.hadoop.fs.s3a.endpoint"):
        assert not is_secret_setting(k), k


@pytest.mark.parametrize("spark, field", [
    ({"remote": "sc://h:15002/;token=abc"}, "spark.remote"),
    ({"conf": {"spark.authenticate.secret": "abc"}}, "spark.conf.spark.authenticate.secret"),
    ({"conf": {"spark.hadoop.fs.s3a.secret.key": "abc"}},
     "spark.conf.spark.hadoop.fs.s3a.secret.key"),
])
def test_a_secret_in_the_config_file_is_refused_naming_the_field(
        tmp_path: Path, spark: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path, dataset_raw(), spark=spark))
    msg = str(err.value)
    assert f"field '{field}'" in msg and "does not belong in a config file" in msg, msg
    assert "abc" not in msg


def test_secret_settings_reach_the_server_in_an_owner_only_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEDUP_SPARK_CONF_spark__authenticate__secret", "s3cr3t-value")
    cmd = server_command("local[1]", "127.0.0.1", 15002, {"spark.authenticate": "true"},
                         secrets_dir=tmp_path)
    assert not [c for c in cmd if "s3cr3t-value" in c]
    props = Path(cmd[cmd.index("--properties-file") + 1])
    assert "--load-spark-defaults" in cmd  # spark-defaults.conf is still read
    assert props.read_text() == "spark.authenticate.secret=s3cr3t-value\n"
    assert oct(os.stat(props).st_mode & 0o777) == "0o600"
    assert "spark.authenticate=true" in cmd
