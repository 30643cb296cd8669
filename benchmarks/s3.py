"""The S3 point of the benchmark (issue 57 point 6): the same loads on a real S3 server
(SeaweedFS on 127.0.0.1, dedup_pipeline_tests/s3_store.py) as on local disk.

    .venv/bin/python -m benchmarks --s3            # ~10 min on 2 cores: 6 hours x 1e5 rows, 24 and 720 h
    .venv/bin/python -m benchmarks --s3 --quick    # tiny: 2 hours x 300 rows, history 2 and 6 h

1. Load time per hour, S3 against local disk: `generate_landing` hours (the benchmark's data)
   uploaded to S3; two warm worker processes (benchmarks/worker.py), one Spark session each, one
   loading the local copy into a local output, the other the S3 copy into an ``s3://`` output,
   alternating hour by hour; the ratio is S3 / local of the medians of the last `--s3-last` hours.
   These loads talk to the store directly (no proxy in their way).
2. Object-store requests per load, by kind, counted at the HTTP level by a pass-through reverse
   proxy on 127.0.0.1 (`CountingProxy`) that every client of the counted worker reaches the store
   through: Spark's S3A, s3fs (the pipeline's own state) and delta-rs (the Delta publish) all read
   ``AWS_ENDPOINT_URL``, which points at the proxy. The proxy keeps every header (the Host one
   too) and forwards the bytes as they came, so the clients' signatures stay valid. A history of
   N committed hours is fabricated as `benchmarks.bookkeeping` does (commit records in the
   writer's format, the live 24 hours of index files, retention state, the summary loads keep)
   plus the four Delta tables with one commit per hour (`lake.publish_load`, checkpoints every 100
   commits, as `benchmarks.publish` builds them), built on local disk, uploaded to S3 and its
   summary rebuilt there; then a real hour (`--count-rows` rows) is loaded on top at hour N-1
   (the first load of the process: the store probe, connections), and hour N is the one counted.
   720 hours loaded for real on S3 would take hours on this machine; the bookkeeping a load does
   of history reads what these fabricated files are, byte for byte in format.

Kinds: GET, PUT, LIST (a GET on a bucket, or with `list-type`/`prefix`/`delimiter`/`uploads` in
the query), HEAD, DELETE (a POST `?delete` is a bulk DELETE), COPY (a PUT with
`x-amz-copy-source`), POST (multipart upload start and completion).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import http.server
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

KINDS = ("GET", "PUT", "LIST", "HEAD", "DELETE", "POST", "COPY")
_LIST_QUERY = ("list-type", "prefix", "delimiter", "uploads", "continuation-token", "marker")


def classify(method: str, target: str, headers: Mapping[str, str]) -> str:
    """The kind of one S3 request (path-style addressing: ``/bucket/key?query``)."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    has_key = "/" in parts.path.strip("/")
    method = method.upper()
    lower = {k.lower() for k in headers}
    if method == "GET":
        return "LIST" if not has_key or any(q in query for q in _LIST_QUERY) else "GET"
    if method == "PUT":
        return "COPY" if "x-amz-copy-source" in lower else "PUT"
    if method == "POST" and "delete" in query:
        return "DELETE"
    return method if method in KINDS else "OTHER"


def client_of(user_agent: str) -> str:
    """Which client sent a request: Spark's S3A (AWS SDK for Java), s3fs (botocore), delta-rs
    (object_store)."""
    ua = user_agent.lower()
    if "hadoop" in ua or "aws-sdk-java" in ua or "s3a" in ua:
        return "spark"
    if "botocore" in ua or "boto3" in ua or "s3fs" in ua:
        return "s3fs"
    if "object_store" in ua or "delta" in ua or "reqwest" in ua:
        return "delta-rs"
    return "other"


class CountingProxy:
    """A pass-through reverse proxy on 127.0.0.1 in front of `upstream`, counting each request by
    kind (and by client). `with proxy.counting() as c:` counts what happens inside."""

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.lock = threading.Lock()
        self.counts: Counter[str] | None = None
        self.by_client: Counter[tuple[str, str]] = Counter()
        self.log: list[tuple[str, str, str, str]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            conn: http.client.HTTPConnection | None = None

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _forward(self) -> None:
                body = self._body()
                proxy.count(self.command, self.path, self.headers)
                drop = ("connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in drop}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                for attempt in (0, 1):  # a kept-alive upstream connection may have been closed
                    if self.conn is None:
                        self.conn = http.client.HTTPConnection(
                            proxy.upstream.hostname, proxy.upstream.port, timeout=120)
                    try:
                        self.conn.request(self.command, self.path, body=body or None,
                                          headers=headers)
                        resp = self.conn.getresponse()
                        data = resp.read()
                        break
                    except (http.client.HTTPException, OSError):
                        self.conn.close()
                        self.conn = None
                        if attempt:
                            raise
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length",
                                         "keep-alive"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else len(data)
                self.send_header("Content-Length", str(length or 0))
                self.end_headers()
                if self.command != "HEAD" and data:
                    self.wfile.write(data)

            do_GET = do_PUT = do_DELETE = do_HEAD = do_POST = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self, method: str, target: str, headers: Mapping[str, str]) -> None:
        kind = classify(method, target, headers)
        who = client_of(headers.get("User-Agent", ""))
        with self.lock:
            if self.counts is not None:
                self.counts[kind] += 1
                self.by_client[(who, kind)] += 1
                self.log.append((who, kind, method, target))

    @contextlib.contextmanager
    def counting(self) -> Iterator[dict[str, Any]]:
        out: dict[str, Any] = {}
        with self.lock:
            self.counts, self.by_client, self.log = Counter(), Counter(), []
        try:
            yield out
        finally:
            with self.lock:
                out["kinds"] = dict(self.counts or {})
                out["clients"] = {f"{w} {k}": n for (w, k), n in sorted(self.by_client.items())}
                out["log"] = list(self.log)
                self.counts = None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the data ---------------------------------------------------------------------------------------

def upload_tree(client: Any, local: Path, bucket: str, prefix: str) -> int:
    """Every file under `local` to ``s3://bucket/prefix/...`` (threads: boto3 clients are
    thread-safe); the number of objects."""
    files = [f for f in sorted(local.rglob("*")) if f.is_file()]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda f: client.upload_file(
            str(f), bucket, f"{prefix}/{f.relative_to(local).as_posix()}"), files))
    return len(files)


def history_section(root: str, landing: str) -> dict[str, Any]:
    """`benchmarks.bookkeeping`'s dataset (24 h expiry, one index slice an hour) at `root`,
    publishing Delta tables (the default output format)."""
    from benchmarks.bookkeeping import LIVE, START

    return {"name": "clicks", "start": START,
           "source": {"path": landing, "format": "jsonl",
                      "schema": {"event_id": "string", "event_time": "timestamp"}},
           "key": ["event_id"], "output": root,
           "expiry": {"column": "event_time", "period": "24h"},
           "index": {"slice_span": "1h", "retention_lag_hours": LIVE, "compact_after": 0}}


def history_dataset(root: str, landing: str) -> Any:
    from dedup_pipeline.config import parse_config

    return parse_config({"datasets": [history_section(root, landing)]}, "s3-bench",
                        Path(tempfile.gettempdir())).datasets[0]


def synthesize_history(out: Path, n: int) -> Path:
    """N committed hours on local disk under `out` (reused if built before with the same N):
    records, live index files and retention state as `benchmarks.bookkeeping.synthesize` writes
    them, each hour also with one small file per output published to the four Delta tables."""
    from benchmarks.bookkeeping import LIVE, START, hour_record
    from benchmarks.publish import output_files
    from dedup_pipeline.engine import contract, lake
    from dedup_pipeline.engine.core import commits
    from dedup_pipeline.engine.core.index import layout
    from dedup_pipeline.engine.core.storage import Storage
    from dedup_pipeline.hours import HOUR, parse_hour, to_tag

    stamp = out / ".built"
    if stamp.exists() and stamp.read_text() == f"v2 {n}":
        return out / "warehouse"
    shutil.rmtree(out, ignore_errors=True)
    ds = history_dataset(str(out / "warehouse"), str(out / "landing"))
    st = Storage(ds.output)
    os.makedirs(st.path(commits.COMMITS), exist_ok=True)
    start = parse_hour(START)
    # the contract the first load records (the config's terms, effective from the first hour)
    contract.record(st, contract.check(st, ds, START, None))
    first_live = max(0, n - LIVE)
    for i in range(n):
        tag = to_tag(start + i * HOUR)
        rec = hour_record(st, ds, i, first_live, output_files=output_files(st, ds, i, tag),
                          rows_in=40, unique=10, duplicates=10, expired=10, rejected=10,
                          publish_token=lake.new_token())
        commits.write_commit(st, rec)
        lake.publish_load(st, ds, rec)
    if first_live:
        v_live = int((start + first_live * HOUR).timestamp()) * 1_000_000
        st.write_json_atomic(st.path(layout.INDEX, layout.RETENTION_STATE), {"kept_from": v_live})
    stamp.write_text(f"v2 {n}")
    return out / "warehouse"


def save_summary(output: str, landing: str) -> None:
    """The summary the loads before would have left (as `bookkeeping.synthesize` saves it),
    made where the history now lives: its stamp is the store's."""
    from dedup_pipeline.engine.core import commits
    from dedup_pipeline.engine.core.commit_log import CommitLog
    from dedup_pipeline.engine.core.index.health import check_index
    from dedup_pipeline.engine.core.storage import Storage

    ds = history_dataset(output, landing)
    st = Storage(ds.output)
    log = CommitLog(st)
    first = check_index(st, ds, full=True, log=log)
    assert first.state is not None, first.summary()
    first.state.commits_mtime = st.stamp_dir(st.path(commits.COMMITS))
    log.follow(first.state)
    log.save_summary()


def hour_lines(hour: datetime, rows: int) -> bytes:
    """A small hour of the history dataset: `rows` new keys inside the hour, 1% repeated."""
    ts = hour.strftime("%Y-%m-%dT%H:10:00Z")
    tag = hour.strftime("%Y%m%d%H")
    return "".join(json.dumps({"event_id": f"k{tag}-{i % max(1, rows - rows // 100)}",
                               "event_time": ts}) + "\n" for i in range(rows)).encode()


# -- the run ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _env(values: Mapping[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _worker(config: Path, section: dict[str, Any], log: Path) -> Any:
    from benchmarks.worker import WORKER_CONF, Worker

    spec = {"config": str(config), "dataset": section, "conf": WORKER_CONF, "root": ""}
    return Worker("pipeline", spec, log)


def load_times(store: Any, bucket: str, work: Path, hours: int, rows: int, last: int,
               say: Any) -> dict[str, Any]:
    """Part 1: the same generated hours loaded on local disk and on S3, one warm worker each,
    alternating hour by hour."""
    from benchmarks.data import landing
    from dedup_pipeline.engine.core.commits import CommitRecord
    from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag

    config = landing(work / "landing", hours, rows, say)
    raw = yaml.safe_load(config.read_text())
    local = dict(raw["datasets"][0])
    shutil.rmtree(work / "landing" / "out-local", ignore_errors=True)
    local["output"] = "out-local"
    prefix = f"times-{int(time.time())}"
    n = upload_tree(store.client(), Path(local["source"]["path"]) if Path(
        local["source"]["path"]).is_absolute() else config.parent / local["source"]["path"],
        bucket, f"{prefix}/landing")
    say(f"uploaded the landing zone to s3://{bucket}/{prefix}/landing ({n} objects)")
    remote = {**local, "source": {**local["source"], "path": f"s3://{bucket}/{prefix}/landing"},
              "output": f"s3://{bucket}/{prefix}/warehouse"}
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    workers = {"local": _worker(config, local, logs / "s3bench-local.log")}
    with _env(store.env):
        workers["s3"] = _worker(config, remote, logs / "s3bench-s3.log")
    start = parse_hour(raw["datasets"][0]["start"])
    seconds: dict[str, list[float]] = {"local": [], "s3": []}
    uniques: dict[str, list[int]] = {"local": [], "s3": []}
    try:
        for i in range(hours):
            key = format_hour(start + i * HOUR)
            line = f"h{i} {key}:"
            for name in ("local", "s3"):
                cost, extra = workers[name].step(key)
                rec = CommitRecord.from_json(extra["result"], to_tag(start + i * HOUR))
                seconds[name].append(round(cost.seconds, 3))
                uniques[name].append(rec.unique)
                line += f" {name} {cost.seconds:6.2f}s"
            say(line)
    finally:
        for w in workers.values():
            w.close()
    med = {k: statistics.median(v[-last:]) for k, v in seconds.items()}
    return {"hours": hours, "rows_per_hour": rows, "last": last, "seconds": seconds,
            "median": med, "ratio": med["s3"] / med["local"], "same_unique": uniques["local"] ==
            uniques["s3"], "unique": uniques}


def count_requests(store: Any, bucket: str, work: Path, sizes: list[int], rows: int,
                   say: Any) -> dict[int, dict[str, Any]]:
    """Part 2: for each history length N, one counted load of hour N on N fabricated hours."""
    from benchmarks.bookkeeping import START
    from benchmarks.data import is_conserved
    from dedup_pipeline.engine.core.commits import CommitRecord
    from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag

    client = store.client()
    proxy = CountingProxy(store.endpoint)
    results: dict[int, dict[str, Any]] = {}
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        for n in sizes:
            t0 = time.perf_counter()
            local = synthesize_history(work / f"history-{n}", n - 1)
            built = time.perf_counter() - t0
            prefix = f"history-{n}-{int(time.time())}"
            root, land = f"s3://{bucket}/{prefix}/warehouse", f"s3://{bucket}/{prefix}/landing"
            t0 = time.perf_counter()
            objects = upload_tree(client, local, bucket, f"{prefix}/warehouse")
            with _env(store.env):
                save_summary(root, land)
            start = parse_hour(START)
            for i in (n - 1, n):
                h = start + i * HOUR
                client.put_object(Bucket=bucket, Body=hour_lines(h, rows),
                                  Key=f"{prefix}/landing/date={h:%Y-%m-%d}/hour={h:%H}/part-0.jsonl")
            say(f"history {n} h: {n - 1} hours fabricated in {built:.1f} s, {objects} objects "
                f"uploaded and the summary saved in {time.perf_counter() - t0:.1f} s")
            section = history_section(root, land)
            cfg = work / f"history-{n}.yaml"
            cfg.write_text(yaml.safe_dump({"datasets": [section]}))
            with _env({**store.env, "AWS_ENDPOINT_URL": proxy.endpoint}):
                w = _worker(cfg, section, logs / f"s3bench-count-{n}.log")
            try:
                out: dict[str, Any] = {"history": n, "objects": objects}
                for i in (n - 1, n):
                    key = format_hour(start + i * HOUR)
                    with proxy.counting() as c:
                        cost, extra = w.step(key)
                    rec = CommitRecord.from_json(extra["result"], to_tag(start + i * HOUR))
                    if not is_conserved(rec) or rec.rows_in != rows:
                        raise RuntimeError(f"history {n}: the load of {key} broke conservation")
                    out["first" if i < n else "counted"] = {
                        "hour": key, "seconds": round(cost.seconds, 3), "kinds": c["kinds"],
                        "clients": c["clients"], "total": sum(c["kinds"].values())}
                    if i == n:
                        (logs / f"s3bench-requests-{n}.txt").write_text(
                            "".join(f"{w_} {k} {m} {t}\n" for w_, k, m, t in c["log"]))
                say(f"history {n} h: hour {n} {out['counted']['total']} requests "
                    f"{out['counted']['kinds']} (the process's first load: "
                    f"{out['first']['total']})")
                results[n] = out
            finally:
                w.close()
    finally:
        proxy.close()
    return results


def report(times: dict[str, Any] | None, counts: dict[int, dict[str, Any]]) -> str:
    lines = []
    if times:
        last = times["last"]
        lines += [f"load time per hour, {times['rows_per_hour']:,} rows, {times['hours']} hours "
                  f"(median of the last {last}):",
                  f"  local disk {times['median']['local']:6.2f} s   per hour: "
                  f"{' '.join(f'{s:.2f}' for s in times['seconds']['local'])}",
                  f"  S3         {times['median']['s3']:6.2f} s   per hour: "
                  f"{' '.join(f'{s:.2f}' for s in times['seconds']['s3'])}",
                  f"  S3 / local {times['ratio']:6.2f}     same unique rows per hour: "
                  f"{'yes' if times['same_unique'] else 'NO'}", ""]
    if counts:
        sizes = sorted(counts)
        lo, hi = sizes[0], sizes[-1]
        lines.append(f"object-store requests per load, by kind (one load of hour N at N hours of "
                     f"history; ratio {hi}h/{lo}h):")
        lines.append(f"  {'kind':<7}" + "".join(f"{f'{n} h':>9}" for n in sizes) + f"{'ratio':>9}")
        kinds = [k for k in KINDS if any(counts[n]["counted"]["kinds"].get(k) for n in sizes)]
        for k in [*kinds, "total"]:
            vals = [counts[n]["counted"]["total"] if k == "total" else
                    counts[n]["counted"]["kinds"].get(k, 0) for n in sizes]
            ratio = f"{vals[-1] / vals[0]:.2f}" if vals[0] else "-"
            lines.append(f"  {k:<7}" + "".join(f"{v:>9}" for v in vals) + f"{ratio:>9}")
        lines.append("  by client: " + "; ".join(
            f"{n} h: " + ", ".join(f"{c} {v}" for c, v in counts[n]["counted"]["clients"].items())
            for n in sizes))
    return "\n".join(lines)


def main(quick: bool = False, work: Path | None = None, results: Path | None = None,
         hours: int | None = None, rows: int | None = None, sizes: str | None = None,
         skip_times: bool = False, skip_requests: bool = False) -> int:
    from dedup_pipeline_tests.s3_store import running_store

    here = Path(__file__).resolve().parent
    work = (work or here / "work") / "s3"
    work.mkdir(parents=True, exist_ok=True)
    hours = hours or (2 if quick else 6)
    rows = rows or (300 if quick else 100_000)
    size_list = [int(s) for s in (sizes or ("2,6" if quick else "24,720")).split(",")]
    last = max(1, min(3, hours - 1))
    t_start = time.perf_counter()
    started = datetime.now(UTC)

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    with open("/proc/loadavg") as f:
        load0 = " ".join(f.read().split()[:3])
    say(f"S3 point: {hours} hours x {rows:,} rows, request counts at {size_list} h; "
        f"load average {load0}")
    store_dir = Path(tempfile.mkdtemp(prefix="s3bench-store-"))
    try:
        with running_store(store_dir) as store:
            bucket = store.bucket("bench")
            times = None if skip_times else load_times(store, bucket, work, hours, rows, last, say)
            counts = {} if skip_requests else count_requests(
                store, bucket, work, size_list, 10 if quick else 1000, say)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    with open("/proc/loadavg") as f:
        load1 = " ".join(f.read().split()[:3])
    text = report(times, counts)
    print("\n" + text + f"\n\nload average at the start {load0}, at the end {load1}\n")
    out = {"started": started.strftime("%Y-%m-%d %H:%M UTC"),
           "minutes": (time.perf_counter() - t_start) / 60, "load_average": [load0, load1],
           "times": times, "requests": {str(n): {k: v for k, v in r.items()}
                                        for n, r in counts.items()}}
    results = results or here / "results"
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"s3-{started:%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    say(f"wrote {path}")
    failed = times is not None and not times["same_unique"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
