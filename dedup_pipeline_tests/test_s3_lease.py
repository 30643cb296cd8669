"""The dataset lease on a real S3 server (SeaweedFS, the `s3` fixture; never a mock): design.md S4.

What is proven here, against the store's own conditional writes:
- processes racing for one dataset's lease, from an absent, an expired and a dead holder's lease:
  exactly one holder per trial, never two;
- a holder paused past its lease (SIGSTOP) cannot commit afterwards, and never deletes the lease
  that replaced its own;
- the lease's basic behaviour (refusal naming the owner, conditional release, take-over of a
  killed holder at once, increasing generations, `Lock.holder`, the generation in the record);
- the storage seam's conditional primitives on S3, and the refusal of a store that ignores them.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.lock import DatasetLockedError, LeaseLostError, Lock, fence
from dedup_pipeline.engine.core.storage import Conflict, Storage, UnsafeStoreError
from dedup_pipeline_tests import lease_worker
from dedup_pipeline_tests.conftest import NOTHING

pytestmark = pytest.mark.slow  # every test here starts (or shares) a real S3 server

REPO = Path(__file__).resolve().parents[1]
H = [f"2026-11-01-{h:02d}:00" for h in range(4)]


def _record(tag: str) -> CommitRecord:
    return CommitRecord(**NOTHING, dataset="events", partition_key=tag, load_hour=tag, rows_in=0,
                        unique=0, duplicates=0, expired=0, rejected=0)


def _split(root: str) -> tuple[str, str]:
    bucket, _, prefix = root[len("s3://"):].partition("/")
    return bucket, prefix


_CLIENTS: dict[str, Any] = {}


def _client(s3: Any) -> Any:
    """One boto3 client per store for the test's own reads and plants (a client costs ~20 ms)."""
    if s3.endpoint not in _CLIENTS:
        _CLIENTS[s3.endpoint] = s3.client()
    return _CLIENTS[s3.endpoint]


def _lock_body(s3: Any, root: str) -> dict | None:
    bucket, prefix = _split(root)
    try:
        obj = _client(s3).get_object(Bucket=bucket, Key=f"{prefix}/_lock")
    except ClientError as e:
        if e.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise
    return json.loads(obj["Body"].read())


def _plant(s3: Any, root: str, body: dict) -> None:
    """A lease left by someone else, written plainly (as a crashed or remote holder left it)."""
    bucket, prefix = _split(root)
    _client(s3).put_object(Bucket=bucket, Key=f"{prefix}/_lock", Body=json.dumps(body).encode())


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _expired(generation: int) -> dict:
    """The lease of a run on another host that stopped renewing it a second ago."""
    return {"host": "another-host", "pid": 4242, "owner": "an expired run", "token": "t-expired",
            "since": "2026-01-01T00:00:00Z", "generation": generation, "lease_seconds": 60,
            "expires": time.time() - 1}


def _dead_local(generation: int) -> dict:
    """The lease of a run on this host whose process is gone, still 10 minutes from expiry."""
    return {"host": socket.gethostname(), "pid": _dead_pid(), "owner": "a killed run",
            "token": "t-dead", "since": "2026-01-01T00:00:00Z", "generation": generation,
            "lease_seconds": 600, "expires": time.time() + 600}


# -- 1. the race ---------------------------------------------------------------------------------

def test_lease_race_has_one_holder_per_trial(s3: Any) -> None:
    """3 processes race for one dataset's lease on S3, 100 trials of two rounds each: one from no
    lease (If-None-Match decides), one from a stale lease the parent plants (If-Match on the ETag
    read decides), alternately an expired lease of another host and a live-dated lease of a dead
    local pid. Exactly one holder per round, 0 double holders: `acquire` returned in one process
    only, the store's `_lock` carried that process's token and owner, and its generation is above
    the one it replaced."""
    workers, rounds = 3, 2 * 100  # rounds: absent, stale, absent, stale...
    root = s3.root
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    got = ctx.Array("b", workers * rounds, lock=False)
    seen = ctx.Array("b", workers * rounds, lock=False)
    procs = [ctx.Process(target=lease_worker.race,
                         args=(dict(s3.env), root, w, rounds, barrier, got, seen, workers))
             for w in range(workers)]
    for p in procs:
        p.start()
    owners: list[str | None] = []
    gens: list[tuple[int, int]] = []  # (planted, taken) per trial with a planted lease
    t0 = time.perf_counter()
    try:
        for t in range(rounds):
            mode = 0 if t % 2 == 0 else 1 + (t // 2) % 2  # absent; expired; absent; dead pid
            planted = 10**18 + t
            if mode == 0:
                assert _lock_body(s3, root) is None  # released by the last winner
            else:
                _plant(s3, root, _expired(planted) if mode == 1 else _dead_local(planted))
            barrier.wait(timeout=120)
            barrier.wait(timeout=120)  # all tried; the winner holds it now
            held = _lock_body(s3, root)
            owners.append(held.get("owner") if held else None)
            if mode and held:
                gens.append((planted, held["generation"]))
            barrier.wait(timeout=120)
            barrier.wait(timeout=120)  # released
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    elapsed = time.perf_counter() - t0
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    winners = [sum(got[t * workers:(t + 1) * workers]) for t in range(rounds)]
    doubles = [t for t, n in enumerate(winners) if n > 1]
    print(f"\nlease race on S3: {workers} processes x {rounds} rounds ({rounds // 2} from no "
          f"lease, {rounds // 2} from a stale one) in {elapsed:.1f} s, {len(doubles)} double "
          f"holders, {winners.count(1)} rounds with exactly one holder")
    assert doubles == [], f"{len(doubles)} of {rounds} rounds had two holders ({elapsed:.1f}s)"
    assert winners == [1] * rounds  # a free, expired or dead holder's lease is always taken
    assert list(seen) == list(got)  # each winner saw its own token in the store's _lock
    for t in range(rounds):
        (w,) = [w for w in range(workers) if got[t * workers + w]]
        assert owners[t] == f"worker {w}", (t, owners[t], w)
    assert all(taken > planted for planted, taken in gens) and len(gens) == rounds // 2
    assert _lock_body(s3, root) is None


# -- 2. a paused holder ----------------------------------------------------------------------------

@contextlib.contextmanager
def _holder(s3: Any, root: str, lease_s: float) -> Iterator[tuple[subprocess.Popen[str], dict]]:
    """A process holding the lease (lease_worker.hold); yields it and what it said it holds."""
    env = {**os.environ, **s3.env}
    p = subprocess.Popen(
        [sys.executable, "-m", "dedup_pipeline_tests.lease_worker", "hold", root, str(lease_s),
         _record(H[0]).model_dump_json()],
        env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        held = json.loads(p.stdout.readline())
        assert held["step"] == "held", held
        yield p, held
    finally:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
        p.wait(timeout=30)


def _ask(p: subprocess.Popen[str], cmd: str) -> dict:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(cmd + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def test_holder_paused_past_its_lease_cannot_commit(s3: Any) -> None:
    """A holds a 2 s lease and commits hour 0; it is SIGSTOPped (its heartbeat with it); B is
    refused while A's lease runs, then takes it over after its expiry and commits hour 1. A,
    resumed, tries to commit hour 2 (absent: only the fence stops it) and hour 1 (B's): both raise
    LeaseLostError and write nothing; its release leaves B's lease; B's lease is still B's (it
    renews), and B's record is byte for byte what B wrote."""
    root = s3.root
    st = Storage(root)
    with _holder(s3, root, lease_s=2) as (a, held):
        wrote = _ask(a, f"write {H[0]}")
        assert wrote == {"step": "write", "ok": True, "generation": held["generation"]}
        os.kill(a.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        expires = _lock_body(s3, root)["expires"]  # type: ignore[index]
        b = Lock(st, owner="run b", lease_s=30)
        refused = 0
        while True:
            tried = time.time()
            try:
                b.acquire()
                break
            except DatasetLockedError as e:
                assert tried <= expires  # refused only while A's lease ran
                assert f"locked by holder {a.pid} (pid {a.pid}" in str(e)
                refused += 1
                time.sleep(0.1)
        took = time.monotonic() - stopped
        assert time.time() > expires  # never before A's lease expired
        try:
            assert refused > 0 and took < 2 + 3, (refused, took)
            assert b.generation is not None and b.generation > held["generation"]
            log = CommitLog(st)
            assert log.write(_record(H[1]), new=True).lock_generation == b.generation
            bucket, prefix = _split(root)
            rec_b = _client(s3).get_object(
                Bucket=bucket, Key=f"{prefix}/_commits/load_hour={H[1]}.json")["Body"].read()
            lock_b = _lock_body(s3, root)

            os.kill(a.pid, signal.SIGCONT)
            for cmd in (f"write {H[2]}", f"write {H[1]}", "fence"):
                out = _ask(a, cmd)
                assert out["ok"] is False and out["error"] == "LeaseLostError", (cmd, out)
                assert root in out["message"]
            released = _ask(a, "release")
            assert released["ok"] is True and released["lost"]
            assert _ask(a, "exit")["ok"] is True
            assert a.wait(timeout=30) == 0

            assert commits.read_commit(st, H[2]) is None  # A committed nothing after its pause
            assert _client(s3).get_object(
                Bucket=bucket, Key=f"{prefix}/_commits/load_hour={H[1]}.json"
            )["Body"].read() == rec_b
            assert commits.read_commit(st, H[0]).lock_generation == held["generation"]  # type: ignore[union-attr]
            now = _lock_body(s3, root)
            assert now is not None and now["token"] == b.token == lock_b["token"]  # type: ignore[index]
            assert fence(st) == b.generation  # B renews: its lease is still its own
        finally:
            b.release()
    assert _lock_body(s3, root) is None
    print(f"\npaused holder: lease 2 s, taken over {took:.2f} s after the pause "
          f"({refused} refusals before expiry)")


def test_taken_over_holder_never_deletes_the_new_lease(s3: Any) -> None:
    """A taker whose clock runs ahead replaces a lease its holder still thinks live (If-Match on
    the ETag it read, as a take-over does). The old holder's commit is refused by the store
    (its renewal's If-Match fails), and neither its release after that nor a release without
    any renewal deletes the new lease."""
    root = s3.root
    st = Storage(root)
    for renew_first in (True, False):
        a = Lock(st, owner="run a").acquire()
        got = st.get(a.path)
        assert got is not None
        body = {**json.loads(got[0]), "owner": "run b", "token": "t-b", "pid": 1,
                "host": "another-host", "generation": a.generation + 1,  # type: ignore[operator]
                "expires": time.time() + 600}
        st.put(a.path, json.dumps(body).encode(), if_match=got[1])
        if renew_first:
            with pytest.raises(LeaseLostError, match="taken over by another run"):
                CommitLog(st).write(_record(H[3]), new=True)
            assert commits.read_commit(st, H[3]) is None
        a.release()
        now = _lock_body(s3, root)
        assert now is not None and now["token"] == "t-b", renew_first
        assert Lock.holder(st).startswith("run b (pid 1 on another-host")  # type: ignore[union-attr]
        st.delete(a.path)


# -- 3. basics -------------------------------------------------------------------------------------

def test_lease_basics(s3: Any) -> None:
    """A live lease refuses a second acquirer naming its owner and is reported by `Lock.holder`;
    a record committed under it carries its generation; release deletes `_lock`; an expired lease
    is reported as nobody's and taken over; a holder killed with -9 on this host is taken over at
    once (reaped or not yet), far before its 60 s lease would expire; generations increase."""
    root = s3.root
    st = Storage(root)
    gens: list[int] = []

    a = Lock(st, owner="run a").acquire()
    gens.append(a.generation)  # type: ignore[arg-type]
    body = _lock_body(s3, root)
    assert body is not None and body["token"] == a.token and body["generation"] == a.generation
    assert 50 < body["expires"] - time.time() <= 60
    with pytest.raises(DatasetLockedError, match=rf"locked by run a \(pid {os.getpid()} on "):
        Lock(st, owner="run b").acquire()
    assert Lock.holder(st).startswith(f"run a (pid {os.getpid()} on ")  # type: ignore[union-attr]
    CommitLog(st).write(_record(H[0]), new=True)
    assert commits.read_commit(st, H[0]).lock_generation == a.generation  # type: ignore[union-attr]
    a.release()
    assert _lock_body(s3, root) is None
    assert Lock.holder(st) is None

    _plant(s3, root, _expired(gens[-1] + 5))
    assert Lock.holder(st) is None  # expired: nobody's
    with Lock(st, owner="run c") as c:
        assert c.generation > gens[-1] + 5  # type: ignore[operator]
        gens.append(c.generation)  # type: ignore[arg-type]

    takeovers = []
    for reap in (True, False):
        with _holder(s3, root, lease_s=60) as (p, held):
            assert held["generation"] > gens[-1]
            gens.append(held["generation"])
            assert Lock.holder(st).startswith(f"holder {p.pid} (pid {p.pid}")  # type: ignore[union-attr]
            with pytest.raises(DatasetLockedError):
                Lock(st, owner="run d").acquire()
            os.kill(p.pid, signal.SIGKILL)
            killed = time.monotonic()
            if reap:
                p.wait()
            else:  # killed, a zombie until its parent reaps it: dead all the same
                while Path(f"/proc/{p.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
                    time.sleep(0.01)
            assert Lock.holder(st) is None
            d = Lock(st, owner="run d").acquire()
            takeovers.append(time.monotonic() - killed)
            try:
                assert d.generation > gens[-1]  # type: ignore[operator]
                gens.append(d.generation)  # type: ignore[arg-type]
            finally:
                d.release()
    assert takeovers[0] < 5 and takeovers[1] < 5, takeovers
    assert gens == sorted(set(gens)), gens
    print(f"\nkill -9 holder (60 s lease) taken over in {takeovers[0]:.2f} s (reaped), "
          f"{takeovers[1]:.2f} s (not yet reaped); generations {gens}")


def test_lease_is_renewed_while_moves_roll_forward(s3: Any) -> None:
    """A new holder first rolls forward the directory moves a crash cut short (`finish_moves`),
    which may outlast the lease: its heartbeat already runs, so the lease is still its own after
    (a 1 s lease, moves taking 2.5 s). And if the roll-forward fails, the lease goes back at once
    instead of blocking the dataset until it expires."""
    root = s3.root
    st = Storage(root)
    real = st.finish_moves

    def slow() -> int:
        done = real()
        time.sleep(2.5)
        return done

    st.finish_moves = slow  # type: ignore[method-assign]
    with Lock(st, owner="run a", lease_s=1) as a:
        assert fence(st) == a.generation  # renewed meanwhile: not lost
        assert _lock_body(s3, root)["expires"] > time.time()  # type: ignore[index]

    def broken() -> int:
        raise RuntimeError("the store went away mid roll-forward")

    st.finish_moves = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="went away"):
        Lock(st, owner="run b").acquire()
    assert _lock_body(s3, root) is None and fence(st) is None
    st.finish_moves = real  # type: ignore[method-assign]
    with Lock(st, owner="run c"):
        pass


# -- 4. the storage seam's conditional primitives ---------------------------------------------------

def test_conditional_primitives_on_s3(s3: Any) -> None:
    st = Storage(s3.root)
    k = st.path("obj")
    e1 = st.put(k, b"one", if_absent=True)
    with pytest.raises(Conflict, match="exists"):
        st.put(k, b"two", if_absent=True)
    with pytest.raises(Conflict, match="changed"):
        st.put(k, b"two", if_match='"0123456789abcdef0123456789abcdef"')
    e2 = st.put(k, b"two", if_match=e1)
    assert e2 != e1 and st.get(k) == (b"two", e2)
    with pytest.raises(Conflict, match="changed"):
        st.put(k, b"three", if_match=e1)  # the version it named is gone
    with pytest.raises(Conflict, match="changed"):
        st.delete(k, if_match=e1)
    assert st.get(k) == (b"two", e2)
    st.delete(k, if_match=e2)
    assert st.get(k) is None
    st.delete(k, if_match=e2)  # absent: nothing to delete, as on local disk
    # the first use of a fresh bucket probes it for real (the probe key is deleted after)
    fresh = s3.bucket("probe")
    Storage(f"s3://{fresh}/lake").check_conditional_writes()
    assert s3.keys(fresh) == []


class _StripConditions(http.server.BaseHTTPRequestHandler):
    """A reverse proxy to the S3 server that drops If-None-Match and If-Match from every request
    and signs it again (SigV4 signs those headers: dropped unsigned, the server would refuse the
    signature, not ignore the condition). Behind it, SeaweedFS is a store that ignores them."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    creds: Credentials | None = None
    stripped = 0
    DROP = frozenset({"authorization", "x-amz-date", "x-amz-content-sha256", "host",
                      "if-none-match", "if-match", "connection", "keep-alive"})

    def _forward(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if any(h.lower() in ("if-none-match", "if-match") for h in self.headers):
            type(self).stripped += 1
        headers = {k: v for k, v in self.headers.items() if k.lower() not in self.DROP}
        req = AWSRequest(method=self.command, url=self.upstream + self.path, data=body,
                         headers=headers)
        S3SigV4Auth(self.creds, "s3", "us-east-1").add_auth(req)
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        try:
            conn.request(self.command, self.path, body=body or None, headers=dict(req.headers))
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        length = resp.getheader("Content-Length") if self.command == "HEAD" else len(data)
        self.send_header("Content-Length", str(length or 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_DELETE = do_HEAD = do_POST = _forward

    def log_message(self, *args: Any) -> None:
        pass


def test_store_ignoring_conditional_headers_is_refused(s3: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that ignores conditional headers, simulated honestly: the real SeaweedFS behind a
    local proxy (http.server on 127.0.0.1) that strips If-None-Match / If-Match and signs each
    request again (no mock of S3 itself). `Storage.check_conditional_writes` raises
    UnsafeStoreError naming the cause and the fix, and `Lock.acquire` refuses before writing a
    lease (no `_lock`, no probe left) — even for a bucket this process already found safe
    through the real endpoint."""
    root = s3.root
    Storage(root).check_conditional_writes()  # the same bucket, straight: safe
    handler = type("Strip", (_StripConditions,), {
        "upstream": s3.endpoint, "creds": Credentials(s3.access_key, s3.secret_key)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        proxy = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        # the proxy really makes an ignoring store: a second create-if-absent is accepted
        via = boto3.client("s3", endpoint_url=proxy, aws_access_key_id=s3.access_key,
                           aws_secret_access_key=s3.secret_key, region_name="us-east-1",
                           config=Config(s3={"addressing_style": "path"}))
        bucket, prefix = _split(root)
        via.put_object(Bucket=bucket, Key=f"{prefix}/x", Body=b"1", IfNoneMatch="*")
        via.put_object(Bucket=bucket, Key=f"{prefix}/x", Body=b"2", IfNoneMatch="*")
        via.delete_object(Bucket=bucket, Key=f"{prefix}/x")

        st = Storage(root)
        with pytest.raises(UnsafeStoreError) as e:
            st.check_conditional_writes()
        msg = str(e.value)
        assert "ignores conditional writes" in msg and "If-None-Match" in msg
        assert "Use a store that honours If-None-Match and If-Match" in msg and root in msg
        with pytest.raises(UnsafeStoreError, match="ignores conditional writes"):
            Lock(st, owner="run x").acquire()
        assert handler.stripped >= 3  # the proxy saw (and dropped) the conditions sent
    finally:
        server.shutdown()
        server.server_close()
    assert s3.keys(bucket, prefix) == []  # no lease taken, no probe left
