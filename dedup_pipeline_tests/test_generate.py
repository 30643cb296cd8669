"""The sample / benchmark generator (design.md K5): layout, determinism, and the promised mix of rows.

The mix is measured by parsing the written files, not by trusting `GenerateStats`; no Spark.
"""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dedup_pipeline.config import load_config
from dedup_pipeline.hours import parse_hour
from dedup_pipeline.sample.generate import (
    COLUMNS,
    URLS,
    GenerateStats,
    default_start,
    generate_landing,
)

START = "2026-11-01-00:00"
HOURS, ROWS = 3, 2000
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _hour_dirs(stats: GenerateStats) -> list[Path]:
    return sorted(Path(stats.landing).glob("date=*/hour=*"))


@dataclass
class Row:
    hour: int
    key: str
    user: str
    url: str
    time: datetime
    raw: str


@dataclass
class Parsed:
    rows: list[Row] = field(default_factory=list)
    per_hour: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    malformed: int = 0
    null_keys: int = 0
    bad_values: int = 0


def _parse_time(text: str) -> datetime | None:
    if not TS_RE.match(text):
        return None
    return datetime.fromisoformat(text)


def _is_number(value: object, fmt: str) -> bool:
    if fmt == "jsonl":
        return isinstance(value, int | float) and not isinstance(value, bool)
    try:
        float(str(value))
    except ValueError:
        return False
    return True


def _parse(stats: GenerateStats, fmt: str) -> Parsed:
    """Classify every written line the way a reader of the files would."""
    out = Parsed()
    for h, d in enumerate(_hour_dirs(stats)):
        for f in sorted(d.glob(f"part-*.{fmt}")):
            text = f.read_text()
            if fmt == "csv":
                lines = text.splitlines()
                assert lines[0] == ",".join(COLUMNS)
                records = [(line, next(csv.reader([line]))) for line in lines[1:]]
            else:
                records = [(line, line) for line in text.splitlines()]
            for raw, rec in records:
                out.per_hour[h] += 1
                if fmt == "csv":
                    assert isinstance(rec, list)
                    if len(rec) != len(COLUMNS):
                        out.malformed += 1
                        continue
                    obj: dict = dict(zip(COLUMNS, rec, strict=True))
                else:
                    try:
                        obj = json.loads(rec)
                    except json.JSONDecodeError:
                        out.malformed += 1
                        continue
                if not obj.get("event_id"):
                    out.null_keys += 1
                    continue
                t = _parse_time(obj["event_time"])
                if t is None or not _is_number(obj["amount"], fmt):
                    out.bad_values += 1
                    continue
                assert UUID_RE.match(obj["event_id"]), obj
                assert re.match(r"^u\d{6}$", obj["user_id"]) and obj["url"] in URLS, obj
                out.rows.append(Row(h, obj["event_id"], obj["user_id"], obj["url"], t, raw))
    return out


@dataclass
class Mix:
    in_batch: int = 0
    replays: int = 0
    conflicts_same_hour: int = 0
    conflicts_earlier: int = 0
    late_over_hour: int = 0
    late_over_day: int = 0
    replay_age: list[int] = field(default_factory=list)
    conflict_age: list[int] = field(default_factory=list)


def _mix(parsed: Parsed, start: str) -> Mix:
    """Duplicates, replays and conflicts from the keys; lateness from event_time."""
    t0 = parse_hour(start)
    by_key: dict[str, list[Row]] = defaultdict(list)
    for r in parsed.rows:
        by_key[r.key].append(r)
    m = Mix()
    for rows in by_key.values():
        first_hour = min(r.hour for r in rows)
        orig = min(rows, key=lambda r: r.time)  # conflicts always come later than the original
        assert orig.hour == first_hour
        same_fp_in_first_hour = 0
        for r in rows:
            if (r.user, r.url) != (orig.user, orig.url):
                assert r.user == orig.user and r.url != orig.url  # a conflict changes the url
                assert r.time > orig.time
                if r.hour == first_hour:
                    m.conflicts_same_hour += 1
                else:
                    m.conflicts_earlier += 1
                    m.conflict_age.append(r.hour - first_hour)
            elif r.hour > first_hour:
                assert r.raw == orig.raw  # a replay is an exact copy
                m.replays += 1
                m.replay_age.append(r.hour - first_hour)
            else:
                assert r.raw == orig.raw
                same_fp_in_first_hour += 1
        m.in_batch += same_fp_in_first_hour - 1
        if len(rows) == 1:
            hour_start = t0 + timedelta(hours=orig.hour)
            late = hour_start - orig.time
            if timedelta(hours=1) < late <= timedelta(hours=22):
                m.late_over_hour += 1
            elif late > timedelta(hours=25):
                assert late <= timedelta(hours=48)
                m.late_over_day += 1
            else:  # anything else is inside its hour
                assert timedelta(0) <= -late < timedelta(hours=1), (orig, late)
    return m


def _near(actual: int, fraction: float, rows: int, hours: int) -> bool:
    """Counts are exact per hour up to rounding; allow one row per hour."""
    return abs(actual - fraction * rows * hours) <= hours


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory: pytest.TempPathFactory) -> GenerateStats:
    out = tmp_path_factory.mktemp("gen_jsonl")
    return generate_landing(out, hours=HOURS, rows_per_hour=ROWS, seed=11, start=START)


def test_layout_markers_and_exact_row_counts(jsonl: GenerateStats) -> None:
    dirs = _hour_dirs(jsonl)
    assert [f"{d.parent.name}/{d.name}" for d in dirs] == [
        "date=2026-11-01/hour=00", "date=2026-11-01/hour=01", "date=2026-11-01/hour=02"]
    for d in dirs:
        assert sorted(p.name for p in d.iterdir()) == ["_SUCCESS", "part-00000.jsonl",
                                                       "part-00001.jsonl"]
        assert (d / "_SUCCESS").stat().st_size == 0
        sizes = [len(p.read_text().splitlines()) for p in sorted(d.glob("part-*"))]
        assert sizes == [ROWS // 2, ROWS // 2]
    assert (jsonl.hours, jsonl.rows, jsonl.files) == (HOURS, HOURS * ROWS, 2 * HOURS)
    assert Path(jsonl.landing) == Path(jsonl.config).parent / "landing" / "clicks"
    assert jsonl.seconds > 0


def test_mix_of_rows_matches_stats_and_fractions(jsonl: GenerateStats) -> None:
    parsed = _parse(jsonl, "jsonl")
    assert dict(parsed.per_hour) == dict.fromkeys(range(HOURS), ROWS)
    m = _mix(parsed, START)

    assert parsed.malformed == jsonl.malformed
    assert parsed.null_keys == jsonl.null_keys
    assert parsed.bad_values == jsonl.bad_values
    assert m.in_batch == jsonl.in_batch_duplicates
    assert m.replays == jsonl.cross_batch_replays
    assert m.conflicts_same_hour + m.conflicts_earlier == jsonl.conflicts
    assert m.late_over_hour == jsonl.late_over_hour
    assert m.late_over_day == jsonl.late_over_day

    assert _near(m.in_batch, 0.01, ROWS, HOURS)
    assert _near(m.replays, 0.10, ROWS, HOURS - 1)  # the first hour has nothing to replay
    assert _near(m.conflicts_same_hour + m.conflicts_earlier, 0.01, ROWS, HOURS)
    assert m.conflicts_earlier > 0 and m.conflicts_same_hour > 0
    assert _near(m.late_over_hour, 0.05, ROWS, HOURS)
    assert _near(m.late_over_day, 0.01, ROWS, HOURS)
    assert _near(parsed.malformed, 0.002, ROWS, HOURS)
    assert _near(parsed.null_keys, 0.001, ROWS, HOURS)
    assert _near(parsed.bad_values, 0.001, ROWS, HOURS)
    assert parsed.malformed > 0 and parsed.null_keys > 0 and parsed.bad_values > 0


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = generate_landing(tmp_path / "a", hours=2, rows_per_hour=500, seed=3, start=START)
    b = generate_landing(tmp_path / "b", hours=2, rows_per_hour=500, seed=3, start=START)
    c = generate_landing(tmp_path / "c", hours=2, rows_per_hour=500, seed=4, start=START)
    fa, fb, fc = (_files(Path(s.config).parent) for s in (a, b, c))
    assert fa == fb
    assert fa.keys() == fc.keys()
    data = [k for k in fa if k.endswith(".jsonl")]
    assert data and all(fa[k] != fc[k] for k in data)


def test_rows_of_sets_each_hours_count_and_keeps_the_uniform_bytes(tmp_path: Path) -> None:
    """A thin history (benchmarks.peers --thin): hour h has rows_of(h) lines, replays of a thin
    hour stay within its rows; rows_of giving rows_per_hour everywhere writes the same bytes."""
    counts = [600, 100, 100, 600]
    st = generate_landing(tmp_path / "thin", hours=4, rows_per_hour=600, seed=3, start=START,
                          rows_of=counts.__getitem__)
    lines = [sum(len(p.read_text().splitlines()) for p in d.glob("part-*"))
             for d in _hour_dirs(st)]
    assert lines == counts and st.rows == sum(counts)
    same = generate_landing(tmp_path / "same", hours=2, rows_per_hour=500, seed=3, start=START,
                            rows_of=lambda _h: 500)
    plain = generate_landing(tmp_path / "plain", hours=2, rows_per_hour=500, seed=3, start=START)
    assert _files(Path(same.config).parent) == _files(Path(plain.config).parent)


def test_config_loads_and_points_at_the_data(jsonl: GenerateStats) -> None:
    cfg = load_config(jsonl.config)
    (ds,) = cfg.datasets
    root = Path(jsonl.config).parent.resolve()
    assert ds.name == "clicks" and ds.start == START
    assert Path(ds.source.path) == Path(jsonl.landing).resolve()
    assert Path(ds.output) == root / "warehouse" / "clicks"
    assert ds.source.format == "jsonl"
    assert ds.source.schema == {"event_id": "string", "user_id": "string",
                                "event_time": "timestamp", "url": "string", "amount": "double"}
    assert ds.key == ("event_id",) and ds.fingerprint == ("user_id", "url")
    assert ds.order_by == "event_time"
    assert ds.expiry is not None
    assert (ds.expiry.column, ds.expiry.period_text, ds.expiry.basis) == (
        "event_time", "24h", "event")
    assert "landing/clicks" in Path(jsonl.config).read_text()  # relative, so the tree can move


def test_csv_variant(tmp_path: Path) -> None:
    assert not any(set(u) & set(',"\r\n') for u in URLS)  # so no value ever needs quoting
    stats = generate_landing(tmp_path, hours=2, rows_per_hour=ROWS, seed=5, start=START,
                             fmt="csv", files_per_hour=3, name="events")
    assert load_config(stats.config).datasets[0].source.format == "csv"
    for d in _hour_dirs(stats):
        assert sorted(p.name for p in d.iterdir()) == [
            "_SUCCESS", "part-00000.csv", "part-00001.csv", "part-00002.csv"]
    parsed = _parse(stats, "csv")
    assert dict(parsed.per_hour) == {0: ROWS, 1: ROWS}
    assert (parsed.malformed, parsed.null_keys, parsed.bad_values) == (
        stats.malformed, stats.null_keys, stats.bad_values)
    assert parsed.malformed > 0 and parsed.null_keys > 0 and parsed.bad_values > 0
    m = _mix(parsed, START)
    assert (m.in_batch, m.replays, m.late_over_day) == (
        stats.in_batch_duplicates, stats.cross_batch_replays, stats.late_over_day)


def test_replays_mostly_recent_some_expired(tmp_path: Path) -> None:
    """Replays and conflicts stay inside the 24h window, except the few old replays (expired)."""
    stats = generate_landing(tmp_path, hours=30, rows_per_hour=200, seed=1, start=START)
    m = _mix(_parse(stats, "jsonl"), START)
    assert m.replays == stats.cross_batch_replays
    assert all(1 <= a <= 22 or a >= 25 for a in m.replay_age)
    old = sum(a >= 25 for a in m.replay_age)
    assert 0 < old < 0.2 * len(m.replay_age)
    assert m.conflict_age and all(1 <= a <= 22 for a in m.conflict_age)


def test_rerun_replaces_parts_and_reports_progress(tmp_path: Path) -> None:
    generate_landing(tmp_path, hours=1, rows_per_hour=100, start=START, files_per_hour=4)
    seen: list[str] = []
    stats = generate_landing(tmp_path, hours=2, rows_per_hour=100, start=START,
                             files_per_hour=1, progress=seen.append)
    assert seen == ["generated 2026-11-01-00:00: 100 rows", "generated 2026-11-01-01:00: 100 rows"]
    for d in _hour_dirs(stats):
        assert sorted(p.name for p in d.iterdir()) == ["_SUCCESS", "part-00000.jsonl"]


def test_default_start_ends_at_last_complete_hour() -> None:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    first = parse_hour(default_start(5))
    assert first + timedelta(hours=4) == now - timedelta(hours=1)


def test_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        generate_landing(tmp_path, hours=1, rows_per_hour=10, fmt="parquet")
    with pytest.raises(ValueError):
        generate_landing(tmp_path, hours=0, rows_per_hour=10)
    future = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%d-%H:00")
    with pytest.raises(ValueError):
        generate_landing(tmp_path, hours=1, rows_per_hour=10, start=future)
