"""The Spark Connect token (design.md N6): where the server and its clients read it, how a client
sends it, and a Connect URL as it may be shown.

A Connect server runs any code a client sends, as the Spark user, so `dedup-pipeline spark-server`
always starts one that asks for a token (Spark's `spark.connect.authenticate.token`, handed to the
JVM in its environment, never on its command line). Where the token comes from, first found wins:

1. ``SPARK_CONNECT_AUTHENTICATE_TOKEN`` (the variable PySpark's client and Spark's server read);
2. the file ``DEDUP_SPARK_CONNECT_TOKEN_FILE`` names (owner-only permissions, e.g. a mounted
   Kubernetes or Compose secret);
3. the default file ``~/.config/dedup_pipeline/spark-connect-token``: `spark-server` creates it
   (0600, a random 256-bit token) when none of the above is set, and a client of a server on this
   host (a loopback address) reads it, so a local warm server needs no setup.

A token in the URL (``sc://host:15002/;token=…``, PySpark's own parameter) is sent as it is.

How PySpark sends a token (`pyspark/sql/connect/client/core.py`, `toChannel`): over TLS, or to the
host spelled ``localhost`` over gRPC's local channel credentials; never in plaintext to another
address. So a client of a loopback server is pointed at ``localhost`` (`client_url`), and a server
reached over a network needs TLS in front of it: Spark 4's Connect server has no TLS of its own,
and deploy/ puts nginx in front of it (docs/operations.md, "Security").
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from dedup_pipeline.errors import UserError
from dedup_pipeline.redaction import redact_url

TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
TOKEN_FILE_ENV = "DEDUP_SPARK_CONNECT_TOKEN_FILE"
LOOPBACK = ("127.0.0.1", "::1", "localhost", "[::1]")
CONNECT_PORT = 15002  # Spark Connect's default port (design.md N5)


class ConnectTokenError(UserError, RuntimeError):
    """A Spark Connect token cannot be read, or the server refused the one sent."""

    stage = "the Spark Connect token"
    fix = (f"give the server's token to the client: {TOKEN_ENV}, or {TOKEN_FILE_ENV} naming a "
           "file only its owner can read (docs/operations.md, \"Security\")")


def default_token_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dedup_pipeline" / "spark-connect-token"


def read_token_file(path: Path) -> str:
    """The token in `path`, refused when others than its owner may read the file."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as e:
        raise ConnectTokenError(f"cannot read the Spark Connect token file {path}: "
                                f"{e.strerror or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConnectTokenError(
            f"the Spark Connect token file {path} can be read by others (mode "
            f"{stat.S_IMODE(mode):o}); run: chmod 600 {path}")
    if not text:
        raise ConnectTokenError(f"the Spark Connect token file {path} is empty")
    return text


def write_token_file(path: Path) -> str:
    """Create `path` with a new random token, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def configured_token() -> tuple[str, str] | None:
    """(token, where it came from) from the environment or the file it names; None if neither."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV], TOKEN_ENV
    named = os.environ.get(TOKEN_FILE_ENV)
    if named:
        return read_token_file(Path(named)), f"{TOKEN_FILE_ENV} ({named})"
    return None


def server_token(token_file: Path | None) -> tuple[str, str]:
    """The token a server starts with and where it came from: `token_file` (created if missing),
    else the environment, else the default file (created if missing)."""
    if token_file is None:
        found = configured_token()
        if found is not None:
            return found
        token_file = default_token_file()
    if token_file.exists():
        return read_token_file(token_file), str(token_file)
    return write_token_file(token_file), f"{token_file} (created)"


def url_host_port(remote: str) -> tuple[str, int]:
    """Host (as written: an IPv6 address in brackets) and port of a Spark Connect URL,
    `sc://host[:port][/;param=value...]`."""
    where = remote.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]
    host, sep, port = where.rpartition(":")
    if not sep or not port.isdigit():
        return where, CONNECT_PORT
    return host, int(port)


def connect_address(remote: str) -> tuple[str, int]:
    """Host and port of a Spark Connect URL, to open a socket to."""
    host, port = url_host_port(remote)
    return host.strip("[]"), port


def url_host(remote: str) -> str:
    return url_host_port(remote)[0]


def _params(remote: str) -> dict[str, str]:
    """The `;name=value` parameters of `sc://host:port/;name=value;...` (names lower-cased)."""
    path = remote.removeprefix("sc://").partition("/")[2]
    out = {}
    for part in path.split(";")[1:]:
        k, _, v = part.partition("=")
        out[k.strip().lower()] = v.strip()
    return out


def is_loopback(remote: str) -> bool:
    return url_host(remote) in LOOPBACK


def client_token(remote: str) -> tuple[str, str] | None:
    """(token, where it came from) that a client of `remote` sends; None if it has none."""
    params = _params(remote)
    if "token" in params:
        return params["token"], "SPARK_REMOTE's URL"
    found = configured_token()
    if found is None and is_loopback(remote) and default_token_file().exists():
        found = read_token_file(default_token_file()), str(default_token_file())
    return found


def client_url(remote: str) -> str:
    """The URL the client connects with: the token added where the environment or a token file
    gives one (a loopback server also from the default file), and a loopback host spelled
    ``localhost`` so PySpark sends the token over local channel credentials instead of TLS."""
    params = _params(remote)
    found = client_token(remote)
    if found is not None and "token" not in params:
        sep = "" if remote.removeprefix("sc://").count("/") else "/"
        remote = f"{remote}{sep};token={found[0]}"
    if found is not None and is_loopback(remote) and params.get("use_ssl", "") != "true":
        remote = remote.replace(f"sc://{url_host(remote)}", "sc://localhost", 1)
    return remote


def refusal(remote: str) -> str:
    """Why the server at `remote` refused this client, naming the token's source, not its value."""
    found = client_token(remote)
    if found is not None:
        return f"a wrong token in {found[1]}"
    return (f"no token sent ({TOKEN_ENV}, {TOKEN_FILE_ENV} and {default_token_file()} are unset "
            "or absent)")


def uses_tls(url: str) -> bool:
    """Whether PySpark's client opens a TLS channel for `url` (as `client_url` returns it)."""
    params = _params(url)
    return params.get("use_ssl", "").lower() == "true" or (
        "token" in params and url_host(url) != "localhost")


def check_tls(remote: str, host: str, port: int, timeout: float) -> None:
    """A TLS handshake with the server as gRPC makes it (same trust roots, ALPN h2), so a
    certificate the client does not trust, or a server that speaks no TLS, is one line now
    instead of the client's retries for minutes."""
    import socket
    import ssl

    roots = os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
    ctx = ssl.create_default_context(cafile=roots or None)
    ctx.set_alpn_protocols(["h2"])
    shown = redact_url(remote)
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                ctx.wrap_socket(raw, server_hostname=host.strip("[]")):
            return
    except ssl.SSLCertVerificationError as e:
        raise ConnectTLSError(
            f"the Spark Connect server at {shown} presents a certificate this client does not "
            f"trust ({e.verify_message}); set GRPC_DEFAULT_SSL_ROOTS_FILE_PATH to the file of the "
            "CA that signed it" + (f" (now {roots})" if roots else "")) from None
    except (ssl.SSLError, OSError) as e:
        raise ConnectTLSError(
            f"the Spark Connect server at {shown} does not answer TLS ({e}): a client sends its "
            "token over TLS only, so a server on another host is reached through its TLS proxy; "
            "a server on this host as sc://localhost:<port>") from None


class ConnectTLSError(UserError, RuntimeError):
    """The TLS channel to a Spark Connect server cannot be opened."""

    stage = "the TLS channel to the Spark Connect server"
    fix = ("trust the proxy's CA (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) or point SPARK_REMOTE at the "
           "TLS proxy's address (docs/operations.md, \"Security\")")


def is_auth_refusal(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is the server refusing this client's token."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if "UNAUTHENTICATED" in text or "Invalid authentication token" in text:
            return True
        e = e.__cause__ or e.__context__
    return False
