"""Crash safety on a real S3 store (issue 57, design.md R10, L3, S2, S4): kill -9 a load at several
instants, then the next run; every table, the commit records and the index equal a clean run's.

The landing zone and the outputs live on SeaweedFS (dedup_pipeline_tests/s3_store.py). A load runs
in a subprocess that installs a fault (`DEDUP_FAULT=<point>`, dedup_pipeline_tests/faults.py):
at the named hook point it exits 137 (`os._exit`, as a SIGKILL leaves it) or, with
`DEDUP_KILL=SIGKILL`, sends itself a real SIGKILL. The next run is another process, which takes
over the dead run's lease (same host, dead pid), rolls any journaled directory move forward
(`Storage.finish_moves`), and loads. Then, read from S3 only: every output's Delta table (through
deltalake on ``s3://``, whole sets of rows), the commit records (hours and counts), the index entries
(the live files the product reads, listed by `check_index`) equal a clean run's of the same
landing data, no table lags or drifts from the records, and no ``_lock`` and no ``_moves/``
journal entry is left.

To keep Spark start-ups down, the state before each crashing load is a server-side copy of the
clean run's prefix at that point (boto3 `copy_object`), every load is a Spark Connect client of
one warm server for the module (the S3A jars and settings on its command line,
`engine.session.s3_conf`), the killed loads run two at a time, and one process runs every case's
next runs. The faults fire where no Spark job of the dead client is still running on the server
(a case with `how="local"` gives the dying process a driver JVM of its own instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dedup_pipeline import objectstore
from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import lake
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.index.health import check_index
from dedup_pipeline.engine.core.index.layout import INDEX, is_compact_dir
from dedup_pipeline.engine.core.storage import MOVES, Storage
from dedup_pipeline.engine.session import s3_conf, s3_jars_cached
from dedup_pipeline_tests.conftest import CLICKS_SCHEMA, dataset_raw, pipeline_config, source_raw
from dedup_pipeline_tests.spark_services import start_connect_server

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = ("unique", "duplicates", "expired", "rejected")
HOURS = ["2026-11-01-00:00", "2026-11-01-01:00", "2026-11-01-02:00", "2026-11-01-03:00"]
TAGS = [h[:13] for h in HOURS]
LAST, NEXT = HOURS[2], HOURS[3]  # the crashing load's hour; the next run's other hour
COUNTS = ("rows_in", "unique", "duplicates", "expired", "rejected")

# One process per step list: load each step's hours under its config, then (optionally) copy the
# dataset's prefix aside server-side. The fault, if any, is installed before anything loads.
SCRIPT = textwrap.dedent("""
    import json
    import os
    import signal
    import sys

    from dedup_pipeline.config import load_config
    from dedup_pipeline.engine.core import hooks
    from dedup_pipeline.engine.core import write as core_write
    from dedup_pipeline.engine.core.index import compaction
    from dedup_pipeline.engine.load import load_hours
    from dedup_pipeline.engine.session import SparkSettings, get_session
    from dedup_pipeline_tests import faults

    steps = json.loads(sys.argv[1])
    configs = {s["config"]: load_config(s["config"]).datasets[0] for s in steps}
    roots = [r for ds in configs.values() for r in (ds.output, ds.source.path)]
    remote = os.environ.get("SPARK_REMOTE")
    spark = get_session(SparkSettings(master="local[1]", conf={
        "spark.sql.shuffle.partitions": "2", **({} if remote else {
            "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"})}),
        roots)
    if not remote:
        spark.sparkContext.setLogLevel("ERROR")

    faults.install_from_env()
    compacting = []  # non-empty while the index is compacted (`DEDUP_FAULT_SCOPE=compact`)


    class Kill(faults.Faults):
        def at(self, point):
            if point != self.fault:
                return
            if os.environ.get("DEDUP_FAULT_SCOPE") == "compact" and not compacting:
                return
            print("KILLED AT", point, flush=True)
            if os.environ.get("DEDUP_KILL") == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(137)


    if os.environ.get(faults.FAULT_ENV):
        hooks.install(Kill(os.environ[faults.FAULT_ENV]))

    _write, _compact = core_write.write, compaction.compact


    def write(*args, **kwargs):  # a point before any output of the hour is written
        hooks.at("before_outputs")
        return _write(*args, **kwargs)


    def compact(*args, **kwargs):
        compacting.append(1)
        try:
            return _compact(*args, **kwargs)
        finally:
            compacting.pop()


    core_write.write, compaction.compact = write, compact
    failed = set()
    for step in steps:
        if step["config"] in failed:
            continue
        try:
            load_hours(spark, configs[step["config"]], step["hours"], remote=remote)
        except Exception:
            if not step.get("isolated"):
                raise
            import traceback
            failed.add(step["config"])
            print("FAILED", step["config"], json.dumps(traceback.format_exc()), flush=True)
            continue
        if step.get("copy_to"):
            from dedup_pipeline_tests.test_s3_crash import copy_prefix
            copy_prefix(configs[step["config"]].output, step["copy_to"])
    print("LOADED", flush=True)
    os._exit(0)  # deltalake's reader threads may abort a plain interpreter exit (notes)
""")


# -- S3 helpers ---------------------------------------------------------------------------------

def _client() -> Any:
    import boto3
    from botocore.config import Config

    s = objectstore.S3Settings.from_env()
    return boto3.client("s3", endpoint_url=s.endpoint, aws_access_key_id=s.access_key,
                        aws_secret_access_key=s.secret_key, region_name=s.region or "us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.split("://", 1)[1].partition("/")
    return bucket, prefix.rstrip("/")


def keys(uri: str) -> list[str]:
    """Every object key below `uri` (relative to it)."""
    bucket, prefix = _split(uri)
    out = []
    for page in _client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix + "/"):
        out += [o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])]
    return sorted(out)


def copy_prefix(src: str, dst: str) -> int:
    """Copy every object below `src` to the same place below `dst`, server-side; how many."""
    bucket, sp = _split(src)
    dbucket, dp = _split(dst)
    c = _client()
    names = [k for k in keys(src) if not k.endswith("/")]

    def one(k: str) -> None:
        c.copy_object(Bucket=dbucket, Key=f"{dp}/{k}", CopySource={"Bucket": bucket,
                                                                    "Key": f"{sp}/{k}"})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))
    return len(names)


# -- what a reader sees, from S3 only ------------------------------------------------------------

def _rows(table: pa.Table) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def snapshot(ds: DatasetConfig) -> dict[str, Any]:
    """Every output's table as deltalake reads it on s3://, the committed hours and their counts,
    the index entries of the live files the product reads (and the index's health), the pending
    and drifted hours of the tables, and any lock or move journal left behind."""
    from deltalake import DeltaTable

    opts = objectstore.S3Settings.from_env().delta_options()
    st = Storage(ds.output)
    out: dict[str, Any] = {}
    for name in OUTPUTS:
        dt = DeltaTable(f"{ds.output}/{name}", storage_options=opts)
        out[name] = _rows(dt.to_pyarrow_table())
        del dt
    records = {t: commits.read_commit(st, t) for t in sorted(commits.committed_tags(st))}
    out["commits"] = {t: {k: getattr(r, k) for k in COUNTS} if r else None
                      for t, r in records.items()}
    damage = check_index(st, ds, full=True)
    out["index_damage"] = (damage.missing, damage.unexpected, damage.corrupt,
                           damage.bad_records, damage.bad_compacted)
    entries: Counter[str] = Counter()
    for f in damage.files.values():
        with st.fs.open(st.path(INDEX, f.rel), "rb") as fh:
            entries += _rows(pq.read_table(fh))
    out["index"] = entries
    out["pending"] = lake.pending(st)
    out["drift"] = lake.drift(st, records)
    out["left"] = [k for k in keys(ds.output) if k == "_lock" or k.startswith(f"{MOVES}/")]
    return out


def assert_same(actual: dict[str, Any], expected: dict[str, Any], label: str) -> None:
    problems = []
    for key, want in expected.items():
        got = actual.get(key)
        if got == want:
            continue
        if isinstance(got, Counter) and isinstance(want, Counter):
            problems.append(f"{key}: {sum(want.values())} rows expected, {sum(got.values())} "
                            f"found; lost e.g. {list(want - got)[:2]}, doubled or extra e.g. "
                            f"{list(got - want)[:2]}")
        else:
            problems.append(f"{key}: expected {str(want)[:500]}\n   found {str(got)[:500]}")
    assert not problems, f"{label} differs from the clean run:\n" + "\n".join(problems)


# -- the module's store, server and clean runs ----------------------------------------------------

def _ev(rid: str, key: str, t: str, user: str = "u1", url: str = "/a") -> str:
    return json.dumps({"event_id": key, "user_id": user, "event_time": t, "url": url, "rid": rid})


LANDING = {
    (HOURS[0], "part-0.jsonl"): [
        _ev("a", "k1", "2026-11-01T00:10:00Z"),
        _ev("b", "k2", "2026-11-01T00:20:00Z"),
        _ev("c", "k2", "2026-11-01T00:25:00Z"),
        _ev("d", "k3", "2026-10-30T00:00:00Z"),          # expired
        "{broken",
    ],
    (HOURS[1], "part-0.jsonl"): [
        _ev("e", "k1", "2026-11-01T01:00:00Z", url="/b"),  # conflict with hour 0
        _ev("f", "k4", "2026-11-01T01:10:00Z"),
    ],
    (HOURS[2], "part-0.jsonl"): [
        _ev("g", "k2", "2026-11-01T02:00:00Z"),          # natural duplicate of hour 0
        _ev("h", "k5", "2026-11-01T02:10:00Z"),
        _ev("i", "k5", "2026-11-01T02:15:00Z", user="u2"),
        _ev("j", "k6", "2026-10-31T00:00:00Z"),          # expired
        _ev("k", "k7", "2026-11-01T02:20:00Z"),
    ],
    (HOURS[2], "part-1.jsonl"): [
        _ev("l", "k4", "2026-11-01T02:30:00Z"),
        _ev("m", "k8", "2026-11-01T02:40:00Z"),
        '{"event_id": null, "rid": "n"}',
    ],
    (HOURS[3], "part-0.jsonl"): [
        _ev("o", "k9", "2026-11-01T03:00:00Z"),
        _ev("p", "k1", "2026-11-01T03:05:00Z"),          # duplicate of hour 0
    ],
}


class Env:
    """The module's S3 bucket, configs, warm Connect server and clean runs."""

    def __init__(self, root: Path, bucket: str, remote: str) -> None:
        self.root, self.bucket, self.remote = root, bucket, remote
        self.landing = f"s3://{bucket}/landing"
        self.script = root / "load.py"
        self.script.write_text(SCRIPT)
        self.clean: dict[str, dict[str, Any]] = {}

    def uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"

    def config(self, name: str, compact_after: int | None = None) -> DatasetConfig:
        """Dataset `name`'s config (its output: ``s3://<bucket>/<name>``), written as
        `root/<name>.yaml`."""
        extra = {"index": {"compact_after": compact_after}} if compact_after is not None else {}
        raw = dataset_raw(start=HOURS[0],
                          source=source_raw(self.landing, schema={**CLICKS_SCHEMA, "rid": "string"}),
                          fingerprint=["user_id", "url"], order_by="event_time",
                          expiry={"column": "event_time", "period": "24h"},
                          output=self.uri(name), **extra)
        return pipeline_config(self.root, raw, name=f"{name}.yaml").datasets[0]

    def config_path(self, ds: DatasetConfig) -> Path:
        return self.root / f"{_split(ds.output)[1]}.yaml"

    def child_env(self, fault: str | None = None, local: bool = False,
                  **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("SPARK_REMOTE", "SPARK_MASTER_URL", "DEDUP_FAULT")}
        env.update(PYSPARK_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **extra)
        if fault:
            env["DEDUP_FAULT"] = fault
        if not local:
            env["SPARK_REMOTE"] = self.remote
        return env

    def run(self, steps: list[dict[str, Any]], env: dict[str, str]
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(self.script), json.dumps(steps)], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=600)

    def load(self, ds: DatasetConfig, hours: list[str]) -> None:
        """The next run: load `hours` (a clean process, no fault)."""
        proc = self.run([{"config": str(self.config_path(ds)), "hours": hours}], self.child_env())
        assert proc.returncode == 0 and "LOADED" in proc.stdout, \
            proc.stdout[-2000:] + proc.stderr[-6000:]

    def killed(self, ds: DatasetConfig, hours: list[str], point: str, *, local: bool = False,
               sigkill: bool = False, scope: str = "") -> subprocess.CompletedProcess[str]:
        """Load `hours` in a process that dies at `point`; it must die there, having loaded
        nothing more."""
        extra = {"DEDUP_FAULT_SCOPE": scope} if scope else {}
        if sigkill:
            extra["DEDUP_KILL"] = "SIGKILL"
        proc = self.run([{"config": str(self.config_path(ds)), "hours": hours}],
                        self.child_env(point, local=local, **extra))
        assert proc.returncode == (-9 if sigkill else 137), \
            proc.stdout[-2000:] + proc.stderr[-6000:]
        assert f"KILLED AT {point}" in proc.stdout and "LOADED" not in proc.stdout
        return proc


@pytest.fixture(scope="module")
def env(s3_store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if not s3_jars_cached():
        pytest.skip("no S3A connector jars cached: run scripts/fetch_jars.sh")
    root = tmp_path_factory.mktemp("s3crash")
    bucket = s3_store.bucket("crash")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3_store.env.items():  # the standard AWS variables, as a user sets them
            mp.setenv(k, v)
        mp.delenv("SPARK_REMOTE", raising=False)
        # the server reads and writes s3a:// itself: the S3A jars and settings on its command line,
        # its credentials from its environment (this process's, above)
        server = start_connect_server(root / "spark", master="local[1]", conf=s3_conf({}))
        try:
            c = _client()
            for (hour, name), rows in LANDING.items():
                c.put_object(Bucket=bucket,
                             Key=f"landing/date={hour[:10]}/hour={hour[11:13]}/{name}",
                             Body="".join(f"{r}\n" for r in rows).encode())
            e = Env(root, bucket, server.url)
            clean, compacted = e.config("clean"), e.config("cclean", compact_after=2)
            server.wait_ready()
            proc = e.run([
                {"config": str(e.config_path(clean)), "hours": HOURS[:2],
                 "copy_to": e.uri("base01")},
                {"config": str(e.config_path(clean)), "hours": [LAST], "copy_to": e.uri("base012")},
                {"config": str(e.config_path(clean)), "hours": [NEXT]},
                {"config": str(e.config_path(compacted)), "hours": HOURS[:1],
                 "copy_to": e.uri("cbase0")},
                {"config": str(e.config_path(compacted)), "hours": HOURS[1:]},
            ], e.child_env())
            assert proc.returncode == 0 and "LOADED" in proc.stdout, \
                proc.stdout[-2000:] + proc.stderr[-6000:]
            for name, ds in (("clean", clean), ("cclean", compacted)):
                snap = snapshot(ds)
                assert list(snap["commits"]) == TAGS, name
                assert snap["index_damage"] == ({}, [], {}, {}, []), name
                assert not snap["pending"] and not snap["drift"] and not snap["left"], name
                assert sum(snap["index"].values()) == sum(r["unique"] for r in
                                                          snap["commits"].values()), name
                e.clean[name] = snap
            assert e.clean["clean"]["index"] == e.clean["cclean"]["index"]
            assert any(is_compact_dir(d) for k in keys(compacted.output)
                       if k.startswith(f"{INDEX}/") for d in k.split("/")), "nothing compacted"
            yield e
        finally:
            server.stop()


# -- the crash cases ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A load of `hours` on a copy of `base`, killed at `point` (`how`: "exit" = exit 137,
    "sigkill" = a real SIGKILL, "local" = exit 137 of a process with its own driver JVM), then
    the next runs (`then`, in order, each a run of its own); the result must equal clean run
    `clean`. `committed`: whether the killed load's hour has its (new) record after the crash."""

    point: str
    base: str
    how: str = "exit"
    hours: tuple[str, ...] = (LAST,)
    then: tuple[tuple[str, ...], ...] = ((LAST, NEXT),)
    committed: bool = False
    scope: str = ""  # "compact": the fault fires only while the index is compacted
    clean: str = "clean"
    compact_after: int | None = None

    @property
    def rerun(self) -> bool:
        """Whether the killed load was a rerun of an already committed hour."""
        return self.base == "base012"


PUBLISH_NEXT = ((NEXT,),)  # after the record: the next run is the next hour's, which rolls forward
# The points where a store without rename differs from a local disk: the journaled directory
# moves (index files, compaction), the record created or rewritten by conditional write, the
# lease of a dead run taken over, the tables rolled forward after the record. The other crash
# points of test_crash.py (after the outputs, after the index is staged, between two tables'
# commits) run the same code on either storage and are proven there.
CASES = {
    # before the commit record: the hour is not loaded
    "before_outputs": Case("before_outputs", "base01"),
    "move_copied:index": Case("move_copied", "base01"),  # mid-way through the index files' move
    # a rerun killed just before its record, then the next run, then the rerun again
    "before_commit:rerun": Case("before_commit", "base012", "sigkill",
                                then=((LAST, NEXT), (LAST, NEXT))),
    # after the record, between the tables' commits: the next run rolls the tables forward
    "after_publish:unique": Case("after_publish:unique", "base01", "sigkill", then=PUBLISH_NEXT,
                                 committed=True),
    # index compaction after hour 1's commit, killed mid-way through its journaled move
    "move_copied:compaction": Case("move_copied", "cbase0", hours=(HOURS[1],),
                                   then=((LAST, NEXT),), committed=True, scope="compact",
                                   clean="cclean", compact_after=2),
}


def _name(case_id: str) -> str:
    return "crash-" + case_id.replace(":", "-").replace("_", "-")


def _tables(ds: DatasetConfig) -> dict[str, Counter[str]]:
    from deltalake import DeltaTable

    opts = objectstore.S3Settings.from_env().delta_options()
    out = {}
    for name in OUTPUTS:
        dt = DeltaTable(f"{ds.output}/{name}", storage_options=opts)
        out[name] = _rows(dt.to_pyarrow_table())
        del dt
    return out


def _after_crash(env: Env, case: Case, ds: DatasetConfig) -> dict[str, Any]:
    """What the dead load left, as the test reads it from S3."""
    st = Storage(ds.output)
    tag = case.hours[-1][:13]
    moves = [k for k in keys(ds.output) if k.startswith(f"{MOVES}/") and k.endswith(".json")]
    return {"keys": keys(ds.output), "moves": moves,
            "records": sorted(commits.committed_tags(st)), "tag": tag,
            "tables": _tables(ds), "pending": lake.pending(st)}


@pytest.fixture(scope="module")
def crashes(env: Env, request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    """Every selected case: a copy of its base, the load killed (two dying processes at a time),
    then one process running every case's next runs (each case's failure kept to itself), then
    what each case's dataset holds."""
    selected = {item.callspec.params["case_id"] for item in request.session.items
                if "case_id" in getattr(getattr(item, "callspec", None), "params", {})}
    out: dict[str, dict[str, Any]] = {}
    configs = {}
    for cid, case in CASES.items():
        if cid not in selected:
            continue
        assert copy_prefix(env.uri(case.base), env.uri(_name(cid))) > 0
        configs[cid] = env.config(_name(cid), case.compact_after)

    def kill(cid: str) -> None:
        case, ds = CASES[cid], configs[cid]
        res = out.setdefault(cid, {})
        try:
            env.killed(ds, list(case.hours), case.point, local=case.how == "local",
                       sigkill=case.how == "sigkill", scope=case.scope)
        except AssertionError as e:
            res["crash_error"] = str(e)
            return
        res["crash"] = _after_crash(env, case, ds)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(kill, configs))
    steps = [{"config": str(env.config_path(configs[cid])), "hours": list(hours),
              "isolated": True}
             for cid in configs if "crash" in out[cid] for hours in CASES[cid].then]
    proc = env.run(steps, env.child_env())
    assert proc.returncode == 0 and "LOADED" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-6000:]
    failed = {}
    for line in proc.stdout.splitlines():
        if line.startswith("FAILED "):
            _, path, tb = line.split(" ", 2)
            failed[path] = json.loads(tb)
    for cid, ds in configs.items():
        if "crash" not in out[cid]:
            continue
        path = str(env.config_path(ds))
        if path in failed:
            out[cid]["next_error"] = failed[path]
        else:
            try:
                out[cid]["final"] = snapshot(ds)
            except Exception as e:  # noqa: BLE001 - the case's own failure
                out[cid]["next_error"] = f"reading the result: {type(e).__name__}: {e}"
    return out


@pytest.mark.parametrize("case_id", list(CASES))
def test_killed_load_then_the_next_run_equals_a_clean_run(
        env: Env, crashes: dict[str, dict[str, Any]], case_id: str) -> None:
    case, res = CASES[case_id], crashes[case_id]
    assert "crash_error" not in res, res.get("crash_error")
    crash = res["crash"]
    tag, left = crash["tag"], crash["keys"]
    # a real crash: the dead run's lease is left behind for the next run to take over
    assert "_lock" in left
    # a rerun forgets the hour's record first (its tables keep serving that version, L1b)
    assert (tag in crash["records"]) == case.committed, crash["records"]
    if case.point == "after_output:unique":  # it really died between the outputs
        assert any(k.startswith(f"unique/load_hour={tag}/") for k in left)
        assert not any(k.startswith(f"duplicates/load_hour={tag}/") for k in left)
    if case.point == "move_copied":  # mid-way through a journaled directory move
        assert crash["moves"], left
    clean = env.clean[case.clean]
    if not case.committed:
        # before the record nothing of the dead attempt is in a table: they serve what they did
        served = set(crash["records"]) | ({tag} if case.rerun else set())
        for name in OUTPUTS:
            assert crash["tables"][name] == Counter(
                {r: n for r, n in clean[name].items() if json.loads(r)["load_hour"] in served}), name
    elif case.point.startswith(("before_publish", "after_publish")):
        assert crash["pending"] == [tag]  # the record is there, the tables lag it

    assert "next_error" not in res, res.get("next_error")
    assert_same(res["final"], clean, f"{case_id}: the runs after the kill")
