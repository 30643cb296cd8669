"""The S3 tier: a dataset whose landing zone and outputs live on a real S3 server (SeaweedFS,
dedup_pipeline_tests/s3_store.py), driven as a user drives it: the standard AWS variables set, the
config naming ``s3://`` roots, every command a `dedup-pipeline` process.

Proven here: several hours loaded end to end equal the reference model's outputs (every row of
every output, read through its Delta table on S3); the commit records carry the lease generation;
no lease or move journal is left behind; `verify`, `explain` (no JVM), `rebuild-index`, a rerun,
`vacuum` and `migrate` work on S3; deltalake, DuckDB, Polars and Spark read the ``s3://`` tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from dedup_pipeline.config import load_config
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import parse_hour
from dedup_pipeline.objectstore import S3Settings
from dedup_pipeline.sample.generate import generate_landing
from dedup_pipeline_tests.reference import Reference, normalise_raw
from dedup_pipeline_tests.test_reference import _pylist

pytestmark = pytest.mark.slow

START = "2026-11-01-00:00"
HOURS = 4
TAGS = [f"{parse_hour(START) + timedelta(hours=i):%Y-%m-%d-%H}" for i in range(HOURS)]
LAST = f"{TAGS[-1]}:00"
OUTPUTS = ("unique", "duplicates", "expired", "rejected")
CLI = str(Path(sys.executable).parent / "dedup-pipeline")


def cli(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=1500)
    if ok:
        assert r.returncode == 0, f"{args}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def upload(store: Any, local: Path, uri: str) -> None:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    c = store.client()
    for f in sorted(local.rglob("*")):
        if f.is_file():
            c.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(local).as_posix()}")


def generated_on_s3(store: Any, tmp: Path, root: str, hours: int, rows_per_hour: int,
                    cfg: Path) -> Path:
    """`hours` generated hours from START in `tmp`, their landing files uploaded under
    `root`/landing, and the generated config rewritten to `cfg` with the dataset on S3."""
    generate_landing(tmp, hours=hours, rows_per_hour=rows_per_hour, start=START)
    upload(store, tmp / "landing", f"{root}/landing")
    raw = yaml.safe_load((tmp / "dedup.yaml").read_text())
    ds = raw["datasets"][0]
    ds["source"]["path"] = f"{root}/landing/clicks"
    ds["output"] = f"{root}/warehouse/clicks"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    return cfg


def table(ds_output: str, name: str) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(f"{ds_output}/{name}", storage_options=S3Settings.from_env().delta_options())


def engine_rows(ds: Any, name: str, tag: str) -> Counter:
    """One hour of one output as read through its Delta table on S3, in the reference's terms."""
    t = table(ds.output, name).to_pyarrow_table(filters=[("load_hour", "=", tag)])
    cols = {c: _pylist(t.column(c)) for c in t.column_names}
    base = [c.rsplit("/", 1)[-1] for c in cols["_source_file"]]
    n = t.num_rows
    if name == "rejected":
        return Counter((base[i], cols["_reject_reason"][i],
                        normalise_raw(ds, cols["_reject_reason"][i], cols["_raw"][i]))
                       for i in range(n))
    extra = {"unique": [], "duplicates": ["_duplicate_kind", "_first_load_hour"],
             "expired": ["_expiry_point"]}[name]
    src = list(ds.source.schema)
    return Counter((*(cols[c][i] for c in src), base[i], *(cols[c][i] for c in extra))
                   for i in range(n))


def reference_rows(local_cfg: Path) -> dict[str, dict[str, Counter]]:
    ds = load_config(str(local_cfg)).datasets[0]
    ref = Reference(ds)
    return {tag: ref.load(parse_hour(f"{tag}:00")).rows for tag in TAGS}


@pytest.fixture(scope="module")
def loaded(s3_store: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Four generated hours (duplicates in and across batches, conflicts, late and expired
    records, malformed lines, null keys) uploaded to S3 and loaded by `dedup-pipeline run`."""
    import uuid

    tmp = tmp_path_factory.mktemp("s3loads")
    root = f"s3://{s3_store.lake}/loads-{uuid.uuid4().hex[:8]}"
    cfg = generated_on_s3(s3_store, tmp, root, HOURS + 1, 400, tmp / "s3.yaml")
    env = {**os.environ, **s3_store.env, "DAGSTER_HOME": str(tmp / "dh")}
    (tmp / "dh").mkdir()
    old = {k: os.environ.get(k) for k in s3_store.env}
    os.environ.update(s3_store.env)  # this process reads the tables as a user's script would
    r = cli(env, "run", "--config", str(cfg), "--from", START, "--to", LAST)
    yield {"tmp": tmp, "cfg": cfg, "env": env, "root": root, "local": tmp / "dedup.yaml",
           "ds": load_config(str(cfg)).datasets[0], "run": r}
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_hours_load_on_s3_exactly_as_the_reference_model(loaded: dict[str, Any]) -> None:
    ds = loaded["ds"]
    want = reference_rows(loaded["local"])
    st = Storage(ds.output)
    assert st.s3
    assert commits.committed_tags(st) == set(TAGS)
    for tag in TAGS:
        rec = commits.read_commit(st, tag)
        assert rec is not None and rec.lock_generation is not None, tag
        for name in OUTPUTS:
            assert engine_rows(ds, name, tag) == want[tag][name], (tag, name)
    # nothing of the run's machinery is left: no lease, no move journal, no temp outputs
    assert not st.exists(st.path("_lock"))
    assert st.list_all(st.path("_moves")) == {}
    assert st.list_all(st.path("_tmp")) == {}


def test_verify_explain_and_rebuild_index_on_s3(loaded: dict[str, Any]) -> None:
    cfg, env, ds = str(loaded["cfg"]), loaded["env"], loaded["ds"]
    r = cli(env, "verify", "--config", cfg)
    assert "OK" in r.stdout, r.stdout
    uniq = table(ds.output, "unique").to_pyarrow_table(filters=[("load_hour", "=", TAGS[1])])
    key = uniq.column("event_id")[0].as_py()
    r = cli(env, "explain", "--config", cfg, "--key", f"event_id={key}", "--json")
    got = json.loads(r.stdout)
    assert [(o["load_hour"], o["output"]) for o in got["occurrences"]] == [(TAGS[1], "unique")]
    assert got["index_agrees"] is True and got["inconsistencies"] == [], got
    assert got["occurrences"][0]["source_file"].startswith(loaded["root"]), got
    st = Storage(ds.output)
    before = entries(st)
    cli(env, "rebuild-index", "--config", cfg)
    assert entries(st) == before
    r = cli(env, "verify", "--config", cfg)
    assert "OK" in r.stdout, r.stdout


def entries(st: Storage) -> Counter:
    """The index's entries (digest, load hour) as rows, read from S3 with pyarrow."""
    import pyarrow.parquet as pq

    out: Counter = Counter()
    for f in st.list_files(st.path("index"), ".parquet"):
        with st.fs.open(f, "rb") as fh:
            t = pq.read_table(fh)
        out.update(json.dumps(r, sort_keys=True, default=str) for r in t.to_pylist())
    return out


def test_readers_see_committed_hours_only_during_a_rerun_and_vacuum_changes_no_row(
        loaded: dict[str, Any]) -> None:
    """While `run` reloads the last two hours (same landing files: the same rows), every read of
    every table through deltalake, and of unique through DuckDB and Polars, sees exactly the
    committed rows: no hour missing, none doubled, no half-written file; then `vacuum` deletes
    replaced files and changes no row."""
    cfg, env, ds = str(loaded["cfg"]), loaded["env"], loaded["ds"]

    def rows(name: str) -> Counter:
        return Counter(json.dumps(r, sort_keys=True, default=str)
                       for r in table(ds.output, name).to_pyarrow_table().to_pylist())

    before = {n: rows(n) for n in OUTPUTS}
    versions = {n: table(ds.output, n).version() for n in OUTPUTS}
    proc = subprocess.Popen([CLI, "run", "--config", cfg, "--from", f"{TAGS[2]}:00", "--to", LAST],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    import duckdb
    import polars as pl

    opts = S3Settings.from_env().delta_options()
    ids = Counter(json.loads(r)["event_id"] for r in before["unique"])
    reads = 0
    while proc.poll() is None:
        for n in OUTPUTS:
            assert rows(n) == before[n], f"a reader of {n} saw other rows during the rerun"
            reads += 1
        dataset = table(ds.output, "unique").to_pyarrow_dataset()  # noqa: F841 - DuckDB reads it
        assert Counter(r[0] for r in duckdb.sql("SELECT event_id FROM dataset").fetchall()) == ids
        assert Counter(pl.scan_delta(f"{ds.output}/unique", storage_options=opts, use_pyarrow=True)
                       .select("event_id").collect()["event_id"].to_list()) == ids
    out = proc.communicate()[0]
    assert proc.returncode == 0, out[-3000:]
    assert reads >= 8, reads
    cli(env, "vacuum", "--config", cfg, "--retention-hours", "1")
    for n in OUTPUTS:
        assert table(ds.output, n).version() > versions[n], n
        assert rows(n) == before[n], n


def test_readers_read_the_s3_tables(loaded: dict[str, Any]) -> None:
    """deltalake, DuckDB (over the table's Arrow dataset), Polars and Spark read `s3://` tables
    with the same variables a user set for the product."""
    import duckdb
    import polars as pl

    ds = loaded["ds"]
    uri = f"{ds.output}/unique"
    want = table(ds.output, "unique").to_pyarrow_table(columns=["event_id"]).column(0).to_pylist()
    dataset = table(ds.output, "unique").to_pyarrow_dataset()  # noqa: F841 - read by DuckDB
    by_duck = [r[0] for r in duckdb.sql("SELECT event_id FROM dataset").fetchall()]
    by_polars = pl.scan_delta(uri, storage_options=S3Settings.from_env().delta_options(),
                              use_pyarrow=True).select("event_id").collect()["event_id"].to_list()
    assert Counter(by_duck) == Counter(want) == Counter(by_polars)
    script = (
        "import json, sys\n"
        "from dedup_pipeline.engine.session import SparkSettings, get_session\n"
        "spark = get_session(SparkSettings(master='local[1]'), [sys.argv[1]])\n"
        "files = json.loads(sys.argv[2])\n"
        "rows = spark.read.parquet(*files).select('event_id').collect()\n"
        "print(json.dumps([r[0] for r in rows]))\n")
    t = table(ds.output, "unique")
    files = [f.replace("s3://", "s3a://", 1) for f in t.file_uris()]
    r = subprocess.run([sys.executable, "-c", script, uri, json.dumps(files)], env=loaded["env"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert Counter(json.loads(r.stdout.strip().splitlines()[-1])) == Counter(want)


def test_a_missing_connector_is_one_clear_error_before_any_work(
        loaded: dict[str, Any], tmp_path: Path) -> None:
    env = {**loaded["env"], "DEDUP_SPARK_JARS_CACHE": str(tmp_path / "none"),
           "DAGSTER_HOME": str(tmp_path)}
    st = Storage(loaded["ds"].output)
    before = sorted(st.list_all(st.path("_commits")))
    r = cli(env, "run", "--config", str(loaded["cfg"]), "--from", f"{TAGS[-1]}:00", "--to", LAST,
            ok=False)
    assert r.returncode != 0
    text = r.stdout + r.stderr
    assert "S3A connector" in text and "scripts/fetch_jars.sh" in text, text[-2000:]
    assert sorted(st.list_all(st.path("_commits"))) == before


def test_migrate_on_s3_retypes_a_column_in_one_commit(loaded: dict[str, Any]) -> None:
    """A retyped column (`amount` double -> string) is migrated on S3: one overwrite commit per
    table, every row kept with its value in the new type; `verify` then holds."""
    from dedup_pipeline_tests.reference import java_double

    cfg, env, ds = loaded["cfg"], loaded["env"], loaded["ds"]
    before = {n: table(ds.output, n).to_pyarrow_table() for n in ("unique", "duplicates")}
    raw = yaml.safe_load(cfg.read_text())
    raw["datasets"][0]["source"]["schema"]["amount"] = "string"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    cli(env, "migrate", "--config", str(cfg))
    for n, old in before.items():
        t = table(ds.output, n).to_pyarrow_table()
        assert str(t.schema.field("amount").type) == "string", n
        want = Counter((e, None if a is None else java_double(a))
                       for e, a in zip(old.column("event_id").to_pylist(),
                                       old.column("amount").to_pylist(), strict=True))
        got = Counter(zip(t.column("event_id").to_pylist(), t.column("amount").to_pylist(),
                          strict=True))
        assert got == want, n
    r = cli(env, "verify", "--config", str(cfg))
    assert "OK" in r.stdout, r.stdout
