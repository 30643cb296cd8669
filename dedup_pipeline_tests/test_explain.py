"""`dedup-pipeline explain`: every record of a key, where a load put it and why.

- Against the reference model (`reference.py`): the generated multi-hour corpus of
  `test_reference` (in-batch duplicates with order_by ties across files, natural and conflicting
  replays, expiry by event time, processing time and category, keys unique again after expiring,
  rejects), loaded by the engine, an hour rerun and the index rebuilt; then EVERY key of each
  dataset is explained in one call and its occurrences (hour, output, row, kind, first load hour,
  rule) must equal the reference's placement of that key's records, the index must agree, and its
  live state must be the reference index's.
- A composite key with a comma, quotes, unicode, a null column, and long / timestamp / date
  columns, given on the command line in the documented syntax; the Dagster explain job's table.
- The key syntax itself (fast).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner

from dedup_pipeline.cli import main
from dedup_pipeline.config import DatasetConfig, load_config, parse_config
from dedup_pipeline.engine import explain, keydigest
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.index.rebuild import rebuild_index
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline_tests.conftest import dataset_raw, source_raw, write_config, write_hour
from dedup_pipeline_tests.reference import Reference
from dedup_pipeline_tests.test_reference import DATASETS, HOUR, HOURS, SEED, START, Gen, write_landing

# --------------------------------------------------------------------------------------------
# the key syntax (no Spark)
# --------------------------------------------------------------------------------------------


@pytest.mark.fast
def test_key_syntax_takes_values_verbatim_and_json_for_nulls(tmp_path: Path) -> None:
    ds = parse_config({"datasets": [dataset_raw(key=["event_id", "user_id"])]}, "t",
                      tmp_path).datasets[0]
    got = explain.parse_key_args(ds, ['event_id=a,b="c"=d é', "user_id="])
    assert got == {"event_id": 'a,b="c"=d é', "user_id": ""}
    got = explain.parse_key_args(ds, ["event_id=4711"], '{"user_id": null}')
    assert got == {"event_id": "4711", "user_id": None}
    assert explain.parse_key_args(ds, [], '{"event_id": 4711, "user_id": "x"}') == {
        "event_id": "4711", "user_id": "x"}
    for pairs, js, needle in [
        (["event_id"], None, "is not COLUMN=VALUE"),
        (["url=/a", "event_id=1", "user_id=2"], None, "'url' is not a key column"),
        (["event_id=1", "event_id=2", "user_id=2"], None, "given twice"),
        (["event_id=1"], None, "missing user_id"),
        (["event_id=1"], "[1]", "must be a JSON object"),
        (["event_id=1"], "{user_id: 1}", "is not JSON"),
    ]:
        with pytest.raises(explain.ExplainKeyError, match=needle):
            explain.parse_key_args(ds, pairs, js)


# --------------------------------------------------------------------------------------------
# every key of the reference corpus
# --------------------------------------------------------------------------------------------

# event-time (timestamp) expiry with a rerun hour and a rebuilt index; categorical expiry;
# processing-time expiry. No expiry (the index lever) is `odd` below.
UNDER_TEST = ["clicks", "catalog", "sessions"]


def iso(us: int) -> str:
    dt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond:06d}".rstrip("0")
    return text + "Z"


def printable(ds: DatasetConfig, col: str, value: Any) -> Any:
    """A reference value as explain prints it: timestamps / dates as ISO text."""
    typ = ds.source.schema[col]
    if value is None:
        return None
    if typ == "timestamp":
        return iso(value)
    if typ == "date":
        return (date(1970, 1, 1) + timedelta(days=value)).isoformat()
    return value


def key_text(ds: DatasetConfig, col: str, value: Any) -> str:
    """A reference key value as a person types it after `--key col=`."""
    p = printable(ds, col, value)
    return p if isinstance(p, str) else json.dumps(p)


@pytest.fixture(scope="module")
def corpus(spark, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[DatasetConfig, Reference]]:
    """The reference corpus, loaded by the engine; clicks gets a rerun from hour 2 and a rebuilt
    index afterwards (explain must read the same story from them)."""
    root = tmp_path_factory.mktemp("explain_corpus")
    raws = []
    for spec in DATASETS:
        if spec["name"] not in UNDER_TEST:
            continue
        raw = json.loads(json.dumps(spec))
        raw["start"] = f"{START:%Y-%m-%d-%H:%M}"
        raw["source"]["path"] = f"landing/{spec['name']}"
        raw["output"] = f"warehouse/{spec['name']}"
        raws.append(raw)
    cfg = parse_config({"datasets": raws}, "test_explain", root)
    keys = [f"{START + i * HOUR:%Y-%m-%d-%H:%M}" for i in range(HOURS)]
    out = {}
    for ds in cfg.datasets:
        gen = Gen(ds, random.Random(f"{SEED}/{ds.name}"))
        for h in range(HOURS):
            write_landing(ds, gen, h)
        ref = Reference(ds)
        ref.run(START, HOURS)
        load_hours(spark, ds, keys)
        if ds.name == "clicks":
            load_hours(spark, ds, keys[2:])  # a rerun from hour 2 on (R11a)
            rebuild_index(spark, ds)  # a rebuilt index
        out[ds.name] = (ds, ref)
    return out


def expected_story(ds: DatasetConfig, ref: Reference) -> dict[tuple, Counter]:
    """Per key: the reference's placement of its records (rejected ones aside) as explain lists
    them: (hour, output, rule, row values, file, kind, first load hour)."""
    story: dict[tuple, Counter] = {}
    uniques_before: dict[tuple, int] = {}
    for tag, out, rec in ref.placed:
        if out == "rejected":
            continue
        key = tuple(rec.values[k] for k in ds.key)
        kind, first = ref.duplicate_of.get(id(rec), (None, None))
        if out == "unique":
            rule = "unique_again" if uniques_before.get(key) else "first_seen"
            uniques_before[key] = uniques_before.get(key, 0) + 1
        elif out == "expired":
            rule = "expired"
        elif first == tag:
            rule = "in_batch_duplicate"
        else:
            rule = "conflict" if kind == "conflict" else "natural_duplicate"
        values = tuple(printable(ds, c, rec.values[c]) for c in ds.source.schema)
        story.setdefault(key, Counter())[(tag, out, rule, values, rec.basename, kind, first)] += 1
    return story


def engine_story(ds: DatasetConfig, ex: explain.Explanation) -> Counter:
    got: Counter = Counter()
    for o in ex.occurrences:
        if o.output == "rejected":
            continue
        values = tuple(o.values[c] for c in ds.source.schema)
        kind = o.deciding.get("duplicate_kind")
        first = o.deciding.get("first_load_hour")
        got[(o.load_hour, o.output, o.rule, values, Path(o.source_file or "").name, kind,
             first)] += 1
    return got


def rejected_story(ds: DatasetConfig, ref: Reference) -> dict[str, Counter]:
    """Keys named by rejected JSON lines (a bad value elsewhere in the line) -> every rejected
    line of the reference whose text holds that key (E2: rejected lines are found by their text)."""
    if ds.source.format != "jsonl" or len(ds.key) != 1:
        return {}
    rejected = [(tag, rec) for tag, out, rec in ref.placed if out == "rejected"]
    named = set()
    for _tag, rec in rejected:
        try:
            obj = json.loads(rec.raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get(ds.key[0]), str) and obj[ds.key[0]]:
            named.add(obj[ds.key[0]])
    return {k: Counter((tag, rec.reason) for tag, rec in rejected
                       if k in rec.raw or json.dumps(k)[1:-1] in rec.raw) for k in named}


@pytest.mark.parametrize("name", UNDER_TEST)
def test_explain_matches_reference_for_every_key(spark, corpus, name: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ds, ref = corpus[name]
    story = expected_story(ds, ref)
    rejects = rejected_story(ds, ref)
    for k in rejects:
        story.setdefault((k,), Counter())
    keys = sorted(story, key=repr)
    given = [{k: key_text(ds, k, v) for k, v in zip(ds.key, key, strict=True)} for key in keys]
    never = {k: ("zz-never" if ds.source.schema[k] == "string" else "987654321") for k in ds.key}
    st = Storage(ds.output)
    recs = {t: commits.read_commit(st, t) for t in sorted(commits.committed_tags(st))}
    assert all(keydigest.usable(st, t, r) for t, r in recs.items())  # every hour has its digest
    exs = explain.explain_keys(ds, [*given, never])
    if rejects:  # the rejected lines of keys that rejected lines name
        for key, ex in zip(keys, exs, strict=False):
            if key[0] in rejects:
                got = Counter((o.load_hour, o.deciding["reason"]) for o in ex.occurrences
                              if o.output == "rejected")
                assert got == rejects[key[0]], key
    last = f"{START + (HOURS - 1) * HOUR:%Y-%m-%d-%H}"
    x_last = ref.results[last].expiry_point
    problems = []
    for key, ex in zip(keys, exs, strict=False):
        got = engine_story(ds, ex)
        if got != story[key]:
            problems.append(f"{key}: only in reference {list((story[key] - got).elements())}, "
                            f"only in explain {list((got - story[key]).elements())}")
        if ex.index_agrees is not True:
            problems.append(f"{key}: index_agrees={ex.index_agrees} {ex.inconsistencies}")
        entries = ref.index.get(key, [])
        live = bool(entries) and (x_last is None or entries[-1].v >= x_last)
        now = ex.to_json()["index_now"]
        if now["live"] != live or (live and now["first_load_hour"] != entries[-1].tag):
            problems.append(f"{key}: index now {now}, reference live={live} "
                            f"{entries[-1].tag if entries else None}")
        hours = [o.load_hour for o in ex.occurrences]
        assert hours == sorted(hours), key  # oldest first
    assert not problems, f"{name}: {len(problems)} keys differ\n" + "\n".join(problems[:10])
    # the rules the corpus exercises all appear (so the comparison covered them)
    rules = Counter(o.rule for ex in exs for o in ex.occurrences)
    must = {"first_seen", "in_batch_duplicate", "natural_duplicate"}
    must |= {"rejected"} if ds.source.format == "jsonl" else set()
    must |= {"conflict"} if ds.fingerprint else set()
    must |= {"expired", "unique_again"} if ds.expiry else set()
    assert must <= set(rules), (name, rules)
    nothing = exs[-1]
    assert not nothing.seen and nothing.hours_searched.count("..") == 1
    assert "never seen" in "\n".join(nothing.lines())
    # every hour read in full (no key digest consulted): the same explanations
    monkeypatch.setattr(keydigest, "usable", lambda *_a: None)
    in_full = explain.explain_keys(ds, [*given, never])
    assert [e.to_json() for e in in_full] == [e.to_json() for e in exs]


# --------------------------------------------------------------------------------------------
# odd keys on the command line, and the Dagster job
# --------------------------------------------------------------------------------------------

ODD_SCHEMA = {"user_id": "string", "n": "long", "ts": "timestamp", "d": "date", "url": "string"}
WEIRD = 'a,b "q" é'


@pytest.fixture(scope="module")
def odd(spark, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explain_odd")
    path = write_config(root, dataset_raw(
        name="odd", source=source_raw(schema=ODD_SCHEMA), key=["user_id", "n", "ts", "d"],
        fingerprint=["url"]))
    ds = load_config(path).datasets[0]
    k1 = {"user_id": WEIRD, "n": 4711, "ts": "2026-11-01T00:15:00.5Z", "d": "2026-11-01"}
    write_hour(ds, "2026-11-01-00:00", [
        {**k1, "url": "/a"},
        {**k1, "url": "/b"},  # same file, later: loses in the batch, a conflict
        {**k1, "user_id": None, "n": 7},  # null in a composite key: rejected
    ])
    write_hour(ds, "2026-11-01-01:00", [
        {**k1, "url": "/a", "ts": "2026-11-01 00:15:00.500"},  # same instant, other spelling
        {**k1, "url": "/c"},
        {"user_id": "日本", "n": -1, "ts": "2026-11-01T00:00:00Z", "d": "1999-12-31", "url": "/"},
    ])
    load_hours(spark, ds, ["2026-11-01-00:00", "2026-11-01-01:00"])
    return path


def cli_json(path: Path, *args: str) -> dict:
    r = CliRunner().invoke(main, ["explain", "--config", str(path), "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_odd_keys_on_the_command_line(spark, odd: Path) -> None:
    got = cli_json(odd, "--key", f"user_id={WEIRD}", "--key", "n=4711",
                   "--key", "ts=2026-11-01T00:15:00.5Z", "--key", "d=2026-11-01")
    occ = [(o["load_hour"], o["output"], o["rule"]) for o in got["occurrences"]]
    assert occ == [("2026-11-01-00", "unique", "first_seen"),
                   ("2026-11-01-00", "duplicates", "in_batch_duplicate"),
                   ("2026-11-01-01", "duplicates", "natural_duplicate"),
                   ("2026-11-01-01", "duplicates", "conflict")]
    assert got["key"] == {"user_id": WEIRD, "n": 4711, "ts": "2026-11-01T00:15:00.5Z",
                          "d": "2026-11-01"}
    lost = got["occurrences"][1]
    assert lost["deciding"]["criterion"] == "position_in_file"
    assert lost["deciding"]["fingerprint_changes"] == {"url": ["/a", "/b"]}
    assert got["occurrences"][3]["deciding"]["fingerprint_changes"] == {"url": ["/a", "/c"]}
    assert got["index_now"] == {"live": True, "first_load_hour": "2026-11-01-00",
                                "expiry_value": None, "slice": got["index_now"]["slice"]}
    assert got["index_agrees"] is True

    # a null in a composite key (--key-json), found among the rejected lines
    got = cli_json(odd, "--key-json", json.dumps({"user_id": None, "n": 7,
                                                  "ts": "2026-11-01T00:15:00.5Z",
                                                  "d": "2026-11-01"}))
    assert [(o["load_hour"], o["output"], o["deciding"]["reason"]) for o in got["occurrences"]] \
        == [("2026-11-01-00", "rejected", "null_key")]

    # unicode, a negative long, a timestamp without zone (UTC), an old date
    got = cli_json(odd, "--key", "user_id=日本", "--key", "n=-1",
                   "--key", "ts=2026-11-01 00:00:00", "--key", "d=1999-12-31")
    assert [(o["load_hour"], o["rule"]) for o in got["occurrences"]] == [
        ("2026-11-01-01", "first_seen")]

    # never seen: says so and lists the hours searched (text output)
    r = CliRunner().invoke(main, ["explain", "--config", str(odd), "--key", "user_id=x",
                                  "--key", "n=1", "--key", "ts=2026-11-01T00:00:00Z",
                                  "--key", "d=2026-11-01"])
    assert r.exit_code == 0, r.output
    assert "never seen in the committed hours searched (2026-11-01-00:00..2026-11-01-01:00)" \
        in r.stdout

    # a value that does not cast names the column, its type and the expected form
    r = CliRunner().invoke(main, ["explain", "--config", str(odd), "--key", "user_id=x",
                                  "--key", "n=12x", "--key", "ts=2026-11-01T00:00:00Z",
                                  "--key", "d=2026-11-01"])
    assert r.exit_code == 1 and "'n' is long; '12x' does not cast" in r.output

    # --from after the first hour: the later hour only
    got = cli_json(odd, "--key", f"user_id={WEIRD}", "--key", "n=4711",
                   "--key", "ts=2026-11-01T00:15:00.5Z", "--key", "d=2026-11-01",
                   "--from", "2026-11-01-01:00")
    assert {o["load_hour"] for o in got["occurrences"]} == {"2026-11-01-01"}
    assert got["index_agrees"] is None  # not checked on a part of the history


def test_outputs_carry_bloom_filters_on_the_key_columns(odd: Path) -> None:
    import pyarrow.parquet as pq

    ds = load_config(odd).datasets[0]
    for name in ("unique", "duplicates"):
        [f] = (Path(ds.output) / name / "load_hour=2026-11-01-00").glob("*.parquet")
        rg = pq.ParquetFile(f).metadata.row_group(0)
        bloom = {rg.column(i).path_in_schema for i in range(rg.num_columns)
                 if rg.column(i).bloom_filter_offset is not None}
        assert bloom == set(ds.key), (name, bloom)


def test_key_digests_name_the_hours_of_a_key_and_a_lost_one_costs_only_time(
        spark, odd: Path) -> None:
    from dedup_pipeline.engine import keydigest
    from dedup_pipeline.engine.core import commits

    ds = load_config(odd).datasets[0]
    st = Storage(ds.output)
    h0, h1 = "2026-11-01-00", "2026-11-01-01"
    recs = {t: commits.read_commit(st, t) for t in (h0, h1)}
    digests = {t: keydigest.usable(st, t, r) for t, r in recs.items()}
    assert all(digests.values()), "every committed hour lists a usable key digest"
    k1 = {"user_id": WEIRD, "n": "4711", "ts": "2026-11-01T00:15:00.5Z", "d": "2026-11-01"}
    k2 = {"user_id": "日本", "n": "-1", "ts": "2026-11-01T00:00:00Z", "d": "1999-12-31"}
    never = {"user_id": "x", "n": "1", "ts": "2026-11-01T00:00:00Z", "d": "2026-11-01"}
    typed = explain.type_keys(ds, [k1, k2, never])
    held = keydigest.hours_holding(st, digests, [k.h1 for k in typed])
    assert held == {typed[0].h1: {h0, h1}, typed[1].h1: {h1}, typed[2].h1: set()}

    def story(key: dict) -> list[tuple[str, str, str]]:
        return [(o.load_hour, o.output, o.rule) for o in explain.explain_key(ds, key)
                .occurrences]

    before = {0: story(k1), 1: story(k2)}
    assert before[1] == [(h1, "unique", "first_seen")]
    # a flipped bit in a digest's page (its CRC catches it) and in the other's footer (the
    # record's footer hash catches it), sizes unchanged: those hours are searched in their
    # outputs instead; a lost digest likewise
    import pyarrow.parquet as pq

    [f0], [f1] = digests[h0], digests[h1]
    chunk = pq.ParquetFile(f0).metadata.row_group(0).column(0)
    for f, at in ((f0, chunk.data_page_offset + chunk.total_compressed_size - 1),
                  (f1, Path(f1).stat().st_size - 20)):
        data = bytearray(Path(f).read_bytes())
        data[at] ^= 0x10
        Path(f).write_bytes(bytes(data))
    assert all(keydigest.usable(st, t, recs[t]) == digests[t] for t in (h0, h1))
    unreadable: set[str] = set()
    assert keydigest.hours_holding(st, digests, [typed[0].h1], unreadable) == {
        typed[0].h1: set()}
    assert unreadable == {h0, h1}
    assert {0: story(k1), 1: story(k2)} == before
    Path(f1).unlink()
    assert keydigest.usable(st, h1, recs[h1]) is None
    assert {0: story(k1), 1: story(k2)} == before
    # rebuilt from the committed outputs: the same hours again
    for t in (h0, h1):
        commits.write_commit(st, keydigest.rebuild(ds, st, recs[t]))
    recs = {t: commits.read_commit(st, t) for t in (h0, h1)}
    digests = {t: keydigest.usable(st, t, r) for t, r in recs.items()}
    assert all(digests.values())
    assert keydigest.hours_holding(st, digests, [k.h1 for k in typed]) == held
    assert {0: story(k1), 1: story(k2)} == before


def test_dagster_explain_job_shows_a_table(spark, odd: Path) -> None:
    from dedup_pipeline.orchestration.definitions import build_definitions

    cfg = load_config(odd)
    job = build_definitions(cfg).resolve_job_def("odd_explain")
    run_config = {"ops": {"odd_explain_key": {"config": {"key": {
        "user_id": WEIRD, "n": 4711, "ts": "2026-11-01T00:15:00.5Z", "d": "2026-11-01"}}}}}
    with dg.DagsterInstance.ephemeral() as inst:
        res = job.execute_in_process(run_config=run_config, instance=inst)
    assert res.success
    outs = [e for e in res.all_events if e.event_type_value == "STEP_OUTPUT"]
    meta = outs[0].event_specific_data.metadata
    table = meta["explanation"].value
    assert "| load hour | output | rule | why |" in table
    assert "| 2026-11-01-00:00 | unique | first_seen |" in table
    assert "| 2026-11-01-01:00 | duplicates | conflict |" in table
    assert meta["occurrences"].value == 4
    # the uncommitted state is never reported: an hour whose record is gone is not searched
    st = Storage(cfg.datasets[0].output)
    rec = Path(st.path("_commits", "load_hour=2026-11-01-01.json"))
    saved = rec.read_bytes()
    rec.unlink()
    try:
        with dg.DagsterInstance.ephemeral() as inst:
            res = job.execute_in_process(run_config=run_config, instance=inst)
        table = [e for e in res.all_events if e.event_type_value == "STEP_OUTPUT"][0] \
            .event_specific_data.metadata["explanation"].value
        assert "2026-11-01-01:00" not in table.split("\n\n")[1]
    finally:
        rec.write_bytes(saved)


def test_failing_conflict_check_shows_sample_keys_and_the_explain_command(spark, tmp_path) -> None:
    from dedup_pipeline.orchestration.definitions import build_definitions
    from dedup_pipeline.orchestration.names import RANGE_END, RANGE_START, load_job_name

    path = write_config(tmp_path, dataset_raw(fingerprint=["url"],
                                              checks={"max_conflict_rate": 0.1}))
    cfg = load_config(path)
    ds = cfg.datasets[0]

    def ev(i: int, url: str) -> dict:
        return {"event_id": f"e,{i}", "user_id": "u", "event_time": "2026-11-01T00:10:00Z",
                "url": url}

    write_hour(ds, "2026-11-01-00:00", [ev(i, "/a") for i in range(12)])
    write_hour(ds, "2026-11-01-01:00", [ev(i, "/b") for i in range(12)] + [ev(99, "/a")])
    job = build_definitions(cfg).resolve_job_def(load_job_name("clicks"))
    with dg.instance_for_test() as inst:
        res = job.execute_in_process(
            instance=inst, tags={RANGE_START: "2026-11-01-00:00", RANGE_END: "2026-11-01-01:00"})
    assert res.success
    evals = {(e.event_specific_data.partition, e.event_specific_data.check_name):
             e.event_specific_data for e in res.all_events
             if e.event_type_value == "ASSET_CHECK_EVALUATION"
             and e.event_specific_data.partition}
    failing = evals[("2026-11-01-01:00", "conflict_rate")]
    assert not failing.passed
    keys = failing.metadata["sample_keys"].value
    assert keys == [{"event_id": f"e,{i}"} for i in sorted(range(12), key=str)][:10]
    assert failing.metadata["explain"].value.startswith(
        f"dedup-pipeline explain --config {ds.config_file} --dataset clicks --key event_id=e,")
    # passing checks carry no samples (nothing was read for them)
    assert "sample_keys" not in evals[("2026-11-01-00:00", "conflict_rate")].metadata
    # the command explains the key
    cmd_key = failing.metadata["explain"].value.split("--key ")[1].strip("'")
    got = cli_json(path, "--key", cmd_key)
    assert [(o["load_hour"], o["rule"]) for o in got["occurrences"]] == [
        ("2026-11-01-00", "first_seen"), ("2026-11-01-01", "conflict")]


# --------------------------------------------------------------------------------------------
# which files are read: the committed records', and the key digests
# --------------------------------------------------------------------------------------------


def test_a_reloaded_hour_is_read_from_its_new_files_and_an_uncommitted_one_not_at_all(
        spark, tmp_path: Path) -> None:
    """A reloaded hour is read from the files its new commit record lists; an hour without a
    record is not reported (E1)."""
    ds = load_config(write_config(tmp_path, dataset_raw())).datasets[0]
    st = Storage(ds.output)
    h0, h1 = "2026-11-01-00", "2026-11-01-01"
    row = {"user_id": "u", "event_time": "2026-11-01T00:10:00Z", "url": "/a"}
    write_hour(ds, "2026-11-01-00:00", [{"event_id": "b", **row},
                                        '{"event_id": "b", "event_time": "soon"}'])
    write_hour(ds, "2026-11-01-01:00", [{"event_id": "b", **row},
                                        '{"event_id": "b", "event_time": "later"}'])
    load_hours(spark, ds, ["2026-11-01-00:00", "2026-11-01-01:00"])

    def story(event_id: str) -> list[tuple[str, str, str]]:
        ex = explain.explain_key(ds, {"event_id": event_id})
        return [(o.load_hour, o.output, o.rule) for o in ex.occurrences]

    b_before = [(h0, "unique", "first_seen"), (h0, "rejected", "rejected"),
                (h1, "duplicates", "natural_duplicate"), (h1, "rejected", "rejected")]
    assert story("b") == b_before

    # hour 01 reloaded from changed landing files: read from the files its new record names
    write_hour(ds, "2026-11-01-01:00", [{"event_id": "c", **row},
                                        '{"event_id": "c", "event_time": "later"}'])
    load_hours(spark, ds, ["2026-11-01-01:00"])
    b_after = [(h0, "unique", "first_seen"), (h0, "rejected", "rejected")]
    c_after = [(h1, "unique", "first_seen"), (h1, "rejected", "rejected")]
    assert story("b") == b_after and story("c") == c_after

    # an uncommitted hour (no record: never loaded, or being loaded again) is never reported
    record = Path(commits.commit_path(st, h1))
    saved = record.read_bytes()
    record.unlink()
    assert story("c") == [] and story("b") == b_after
    record.write_bytes(saved)


def test_verify_names_lost_lookups_and_repair_writes_them_again(spark, tmp_path: Path) -> None:
    """Digests lost, altered or never written (a record without `key_digest`) are a `verify`
    warning, not a violation, and explain tells the same story meanwhile; `verify --repair` writes
    exactly those digests again, and verify is quiet."""
    import pyarrow.parquet as pq

    from dedup_pipeline.engine import keydigest
    from dedup_pipeline.engine.verify import verify_dataset

    cfg = write_config(tmp_path, dataset_raw())
    ds = load_config(cfg).datasets[0]
    st = Storage(ds.output)
    day = "2026-11-01"
    tags = [f"{day}-{h:02d}" for h in range(24)]
    for h, tag in enumerate(tags):
        at = f"{day}T{h:02d}:10:00Z"
        write_hour(ds, f"{tag}:00", [{"event_id": f"k{h}", "user_id": "u", "event_time": at,
                                      "url": "/a"},
                                     {"event_id": "a", "user_id": "u", "event_time": at,
                                      "url": "/a"}])
    load_hours(spark, ds, [f"{t}:00" for t in tags])

    def lookup_warnings() -> list[str]:
        rep = verify_dataset(spark, ds)
        assert rep.ok, rep.violations
        return [w for w in rep.warnings if "key digest" in w]

    def story(event_id: str) -> list[tuple[str, str, str]]:
        return [(o.load_hour, o.output, o.rule)
                for o in explain.explain_key(ds, {"event_id": event_id}).occurrences]

    assert lookup_warnings() == []
    before = {k: story(k) for k in ("a", "k3", "k7", "k10")}
    assert before["a"][0] == (tags[0], "unique", "first_seen") and len(before["a"]) == 24

    # hour 03's digest lost, hour 10's footer altered (same size), hour 07's record as a release
    # without key_digest
    recs = {t: commits.read_commit(st, t) for t in tags}
    lost = Path(st.path(*keydigest.parts(tags[3])))
    for f in lost.iterdir():
        f.unlink()
    [f10] = keydigest.usable(st, tags[10], recs[tags[10]])
    data = bytearray(Path(f10).read_bytes())
    data[-20] ^= 0x10
    Path(f10).write_bytes(bytes(data))
    rec7 = Path(commits.commit_path(st, tags[7]))
    doc = json.loads(rec7.read_text())
    del doc["key_digest"]
    rec7.write_text(json.dumps(doc))
    assert lookup_warnings() == [
        "3 hour(s) without a usable key digest (2026-11-01-03:00, 2026-11-01-07:00, "
        "2026-11-01-10:00): explain reads those hours in full instead (slower, the same answer); "
        "dedup-pipeline verify --repair writes them again"]
    assert {k: story(k) for k in before} == before

    r = CliRunner().invoke(main, ["verify", "--config", str(cfg), "--repair"])
    assert r.exit_code == 0, r.output
    assert "key digests written again: 3/3 hour(s)" in r.output, r.output
    assert "without a usable key digest" not in r.output, r.output
    after = {t: commits.read_commit(st, t) for t in tags}
    for t in tags:  # exactly the three records were rewritten, each naming a digest that reads
        assert after[t].key_digest and keydigest.usable(st, t, after[t]), t
        same = after[t] == recs[t]
        assert same == (t not in (tags[3], tags[7], tags[10])), t
        for f in keydigest.usable(st, t, after[t]):
            pq.ParquetFile(f, page_checksum_verification=True).read()
    assert lookup_warnings() == []
    assert {k: story(k) for k in before} == before
    r = CliRunner().invoke(main, ["verify", "--config", str(cfg), "--repair"])
    assert r.exit_code == 0 and "every key digest matches its hours" in r.output, \
        r.output


def test_key_digest_holds_the_sorted_hashes_of_sparks_digests(spark, odd: Path,
                                                               tmp_path: Path) -> None:
    """A load writes its key digest from the collected hashes with pyarrow: the top 32 bits of
    Spark's h1 of every row, sorted, with row-group statistics and page CRCs."""
    import pyarrow.parquet as pq

    from dedup_pipeline.engine.core.digest import H1, digest_columns

    ds = load_config(odd).datasets[0]
    st = Storage(ds.output)
    h1, _ = digest_columns(ds.key, ds.source.schema)
    frame = spark.range(5000).selectExpr(
        "concat('k', id) AS user_id", "id AS n", "timestamp_micros(id) AS ts",
        "date_from_unix_date(CAST(id AS INT)) AS d").select(h1.alias(H1))
    keydigest.write_digest(st, frame, str(tmp_path / "d"))
    [f] = Path(tmp_path / "d").glob("*.parquet")
    pf = pq.ParquetFile(f, page_checksum_verification=True)
    assert all(pf.metadata.row_group(i).column(0).statistics.has_min_max
               for i in range(pf.metadata.num_row_groups))
    assert pf.read().column(keydigest.KEY_HASH).to_pylist() == sorted(
        r[H1] >> 32 for r in frame.collect())
