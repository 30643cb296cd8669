"""The sample / benchmark landing-zone generator (design.md K5) behind `dedup-pipeline generate`/`demo`.

It writes hourly batches that exercise every rule the pipeline has: in-batch duplicates (R3),
cross-batch replays (R4), conflicts (R5), late and expired records (R6) and bad input (R9), plus a
`dedup.yaml` for the dataset (C1). Plain pyarrow compute and file writes: no Spark (so generating
benchmark data does not compete with the engine it feeds) and no Dagster.

Determinism: every field of a generated record is a hash of (seed, kind, hour, row number), so the
same seed writes byte-identical files, and a replay of an earlier record is rebuilt from its id
instead of being kept in memory (generation cost grows with one hour, never with the history).

Mix of one hour of `rows_per_hour` rows (exact counts, rounded; all are part of the hour's total):

- 1%    in-batch duplicates: exact copies of a fresh row of the same hour
- 10%   cross-batch replays: exact copies of fresh rows of earlier hours; 90% from the last 22
        hours (duplicates under the 24h expiry), 10% from 25 to 168 hours back when the data goes
        back that far (these are expired, as a replay keeps its original event_time)
- 1%    conflicts: the key (and user) of an earlier fresh row with another url; half from the same
        hour (event_time strictly later, so the original wins the in-batch order), half from the
        last 22 hours (the first hour has only same-hour ones)
- 5%    late: new keys, event_time 1h to 22h before the hour start (kept: within the window)
- 1%    very late: new keys, event_time 25h to 48h before the hour start (expired)
- 0.2%  malformed (truncated JSON, CSV rows with 4 or 6 fields), 0.1% null keys,
        0.1% bad values (`amount` "abc" or an unparseable `event_time`)
- the rest: fresh rows, new keys with event_time inside the hour.
"""

from __future__ import annotations

import csv
import io
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from dedup_pipeline.config import NAME_RE
from dedup_pipeline.hours import HOUR, epoch_micros, format_hour, landing_dir, parse_hour
from dedup_pipeline.sample.demo import SCHEMA, demo_dataset

COLUMNS = tuple(SCHEMA)
URLS = (
    "/", "/home", "/search", "/products", "/products/42", "/products/1337", "/cart",
    "/checkout", "/account", "/help", "/blog/at-least-once", "/pricing",
)
USERS = 100_000
MAX_CENTS = 50_000  # amounts 0.00 .. 499.99

FRACTIONS = {
    "dup": 0.01, "replay": 0.10, "conflict": 0.01, "late_hour": 0.05, "late_day": 0.01,
    "malformed": 0.002, "null_key": 0.001, "bad_value": 0.001,
}
REPLAY_WINDOW = 22  # hours back a replay or conflict stays a duplicate under the 24h expiry
OLD_REPLAY_SHARE = 0.10
OLD_REPLAY_FROM, OLD_REPLAY_TO = 25, 168
CONFLICT_MAX_DELAY_US = 600_000_000  # a same-hour conflict comes at most 10 minutes later
HOUR_US = 3_600_000_000

# Id namespaces: the kind of record is part of its id, so kinds never share a key by accident.
NS_FRESH, NS_LATE_HOUR, NS_LATE_DAY, NS_MALFORMED, NS_NULL, NS_BAD, NS_CONFLICT, NS_ORDER = range(8)

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_U64 = pa.uint64()
_STR = pa.large_string()  # 64-bit offsets: an hour of lines may pass 2 GiB


@dataclass
class GenerateStats:
    """What was written; the counts are those of the rows in the files."""

    hours: int
    rows: int
    files: int
    in_batch_duplicates: int
    cross_batch_replays: int
    conflicts: int
    late_over_hour: int  # 1h..22h late, within the expiry window (excludes late_over_day)
    late_over_day: int  # more than 25h late: expired under the 24h event-time expiry
    malformed: int
    null_keys: int
    bad_values: int
    seconds: float
    landing: str  # path of the landing root of the dataset
    config: str  # path of the written YAML config


def default_start(hours: int) -> str:
    """First hour such that the last of `hours` hours is the last complete UTC hour before now."""
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    return format_hour(now - timedelta(hours=hours))


# ---------------------------------------------------------------- vectorized hashing (pyarrow)


def _u(v: int) -> pa.Scalar:
    return pa.scalar(v & _MASK, _U64)


def _s(text: str) -> pa.Scalar:
    return pa.scalar(text, _STR)


def _mix_int(x: int) -> int:
    """splitmix64's finalizer on a Python int (for the seed)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _mix(x: pa.Array) -> pa.Array:
    """splitmix64's finalizer on a uint64 array (multiplication wraps, as it must)."""
    z = pc.bit_wise_xor(x, pc.shift_right(x, _u(30)))
    z = pc.multiply(z, _u(0xBF58476D1CE4E5B9))
    z = pc.bit_wise_xor(z, pc.shift_right(z, _u(27)))
    z = pc.multiply(z, _u(0x94D049BB133111EB))
    return pc.bit_wise_xor(z, pc.shift_right(z, _u(31)))


def _mod(x: pa.Array, m: int) -> pa.Array:
    """x % m as int64 (x uint64, 0 < m < 2**63)."""
    r = pc.subtract(x, pc.multiply(pc.divide(x, _u(m)), _u(m)))
    return r.cast(pa.int64())


def _imod(x: pa.Array, m: int) -> pa.Array:
    """x % m for a non-negative int64 array."""
    return pc.subtract(x, pc.multiply(pc.divide(x, pa.scalar(m)), pa.scalar(m)))


def _arange(start: int, n: int) -> pa.Array:
    """int64 start, start+1, ... (pyarrow has no arange)."""
    if n == 0:
        return pa.array([], pa.int64())
    ones = pa.repeat(pa.scalar(1, pa.int64()), n)
    return pc.add(pc.cumulative_sum(ones), pa.scalar(start - 1, pa.int64()))


def _int_array(values: list[int] | int, n: int | None = None) -> pa.Array:
    if isinstance(values, int):
        assert n is not None
        return pa.repeat(pa.scalar(values, pa.int64()), n)
    return pa.array(values, pa.int64())


@dataclass
class _Rows:
    """Typed columns of a block of records, before rendering."""

    key: pa.Array  # large_string, UUID-like
    user: pa.Array  # large_string
    micros: pa.Array  # int64, event_time
    url: pa.Array  # int64 index into URLS
    amount: pa.Array  # float64
    h_extra: pa.Array  # uint64: spare randomness of each record

    def __len__(self) -> int:
        return len(self.key)


class _Generator:
    """Holds the seed-derived salt and lookup tables; builds and renders blocks of records."""

    def __init__(self, seed: int, start: datetime, fmt: str):
        self.salt = _mix_int(_mix_int(seed ^ 0x5EED) + _GOLDEN)
        self.start_us = epoch_micros(start)
        self.fmt = fmt
        self.hex4 = pa.array([f"{i:04x}" for i in range(1 << 16)], _STR)
        self.urls = pa.array(URLS, _STR)

    def hashes(self, ns: int, hour: pa.Array, idx: pa.Array, k: int) -> list[pa.Array]:
        """k independent 64-bit hashes of each record id (ns, hour, idx)."""
        gid = pc.bit_wise_or(pc.shift_left(hour.cast(_U64), _u(32)), idx.cast(_U64))
        gid = pc.bit_wise_or(gid, _u(ns << 56))
        x = pc.bit_wise_xor(gid, _u(self.salt))
        return [_mix(pc.add(x, _u(_GOLDEN * (i + 1)))) for i in range(k)]

    def uuid(self, h1: pa.Array, h2: pa.Array) -> pa.Array:
        """Two 64-bit hashes -> 'xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx' (version 4, variant 1)."""
        h1 = pc.bit_wise_or(pc.bit_wise_and(h1, _u(~0xF000)), _u(0x4000))
        h2 = pc.bit_wise_or(pc.bit_wise_and(h2, _u((1 << 62) - 1)), _u(1 << 63))
        g = [pc.take(self.hex4, pc.bit_wise_and(pc.shift_right(h, _u(s)), _u(0xFFFF)))
             for h in (h1, h2) for s in (48, 32, 16, 0)]
        dash = _s("-")
        return pc.binary_join_element_wise(g[0], g[1], dash, g[2], dash, g[3], dash, g[4], dash,
                                           g[5], g[6], g[7], _s(""))

    def block(self, ns: int, hour: pa.Array, idx: pa.Array) -> _Rows:
        """The records with ids (ns, hour, idx): a pure function of the id and the seed."""
        h1, h2, h3, h4, h5, h6 = self.hashes(ns, hour, idx, 6)
        user = pc.binary_join_element_wise(
            _s("u"), pc.utf8_lpad(_mod(h3, USERS).cast(_STR), width=6, padding="0"), _s(""))
        url = _mod(pc.shift_right(h3, _u(32)), len(URLS))
        amount = pc.divide(_mod(h5, MAX_CENTS).cast(pa.float64()), pa.scalar(100.0))
        hour_start = pc.add(pc.multiply(hour, pa.scalar(HOUR_US, pa.int64())),
                            pa.scalar(self.start_us, pa.int64()))
        if ns == NS_LATE_HOUR:  # in [start - 22h, start - 1h)
            back = pc.add(_mod(h4, (REPLAY_WINDOW - 1) * HOUR_US), pa.scalar(HOUR_US + 1))
            micros = pc.subtract(hour_start, back)
        elif ns == NS_LATE_DAY:  # in [start - 48h, start - 25h)
            back = pc.add(_mod(h4, 23 * HOUR_US), pa.scalar(25 * HOUR_US + 1))
            micros = pc.subtract(hour_start, back)
        else:  # inside the hour
            micros = pc.add(hour_start, _mod(h4, HOUR_US))
        return _Rows(self.uuid(h1, h2), user, micros, url, amount, h6)

    def render(self, rows: _Rows) -> pa.Array:
        """One text line per record (with its newline): JSON object or CSV row, all vectorized."""
        # "YYYY-MM-DD HH:MM:SS.ffffff" (always 6 digits) -> ISO "T"; far faster than strftime
        ts = pc.binary_replace_slice(rows.micros.cast(pa.timestamp("us")).cast(_STR),
                                     start=10, stop=11, replacement="T")
        url = pc.take(self.urls, rows.url)
        amount = rows.amount.cast(_STR)
        if self.fmt == "csv":  # no value here needs quoting (checked on URLS in the tests)
            c = _s(",")
            return pc.binary_join_element_wise(rows.key, c, rows.user, c, ts, _s("Z,"), url, c,
                                               amount, _s("\n"), _s(""))
        return pc.binary_join_element_wise(
            _s('{"event_id":"'), rows.key, _s('","user_id":"'), rows.user,
            _s('","event_time":"'), ts, _s('Z","url":"'), url, _s('","amount":'), amount,
            _s("}\n"), _s(""))

    def spoil(self, lines: pa.Array, kind: int, rng: random.Random) -> pa.Array:
        """Turn well-formed lines into malformed / null-key / bad-value ones (few rows: Python)."""
        out = []
        for i, line in enumerate(lines.to_pylist()):
            body = line.rstrip("\n")
            if kind == NS_MALFORMED and self.fmt != "csv":  # a strict prefix of an object
                out.append(body[: rng.randrange(10, len(body) - 1)] + "\n")
                continue
            if self.fmt == "csv":
                fields = body.split(",")
                if kind == NS_MALFORMED:
                    fields = fields[:-1] if i % 2 == 0 else [*fields, "extra"]
                elif kind == NS_NULL:
                    fields[0] = ""
                elif i % 2 == 0:
                    fields[4] = "abc"
                else:
                    fields[2] = "not-a-timestamp"
                buf = io.StringIO()
                csv.writer(buf, lineterminator="\n").writerow(fields)
                out.append(buf.getvalue())
                continue
            obj = json.loads(body)
            if kind == NS_NULL:
                if i % 2 == 0:
                    obj["event_id"] = None
                else:
                    del obj["event_id"]
            elif i % 2 == 0:
                obj["amount"] = "abc"
            else:
                obj["event_time"] = "not-a-timestamp"
            out.append(json.dumps(obj, separators=(",", ":")) + "\n")
        return pa.array(out, _STR)


# ---------------------------------------------------------------- one hour


@dataclass(frozen=True)
class _Plan:
    """How many rows of each kind hour h gets; `fresh` is the remainder."""

    fresh: int
    dup: int
    replay: int
    conflict: int
    late_hour: int
    late_day: int
    malformed: int
    null_key: int
    bad_value: int


def _plan(n: int, h: int) -> _Plan:
    def part(kind: str) -> int:
        return int(n * FRACTIONS[kind] + 0.5)

    counts = {k: part(k) for k in FRACTIONS}
    if h == 0:
        counts["replay"] = 0
    fresh = n - sum(counts.values())
    if fresh < 1:  # only for absurdly small hours; keep one fresh row to copy from
        counts = dict.fromkeys(counts, 0)
        fresh = n
    return _Plan(fresh=fresh, **counts)


def _replay_sources(plan: _Plan, h: int, rng: random.Random, rows_of: Callable[[int], int]
                    ) -> tuple[list[int], list[int]]:
    """(hour, fresh row index) of each replay: distinct rows, mostly from recent hours."""
    if plan.replay == 0 or h == 0:
        return [], []
    n_old = int(plan.replay * OLD_REPLAY_SHARE + 0.5) if h >= OLD_REPLAY_FROM else 0
    window = min(h, REPLAY_WINDOW)
    back = list(range(1, window + 1))
    # recent hours are replayed more often (weight 1/k), as redeliveries mostly come soon
    counts = Counter(rng.choices(back, weights=[1 / k for k in back], k=plan.replay - n_old))
    if n_old:
        counts.update(rng.choices(range(OLD_REPLAY_FROM, min(h, OLD_REPLAY_TO) + 1), k=n_old))
    hours: list[int] = []
    idx: list[int] = []
    for k in sorted(counts):
        available = _plan(rows_of(h - k), h - k).fresh
        c = counts[k]
        assert c <= available, "more replays than fresh rows to copy"
        hours += [h - k] * c
        idx += rng.sample(range(available), c)
    return hours, idx


def _hour_lines(gen: _Generator, h: int, rows_of: Callable[[int], int], seed: int
                ) -> tuple[pa.Array, _Plan]:
    """The lines of hour h (`rows_of(h)` of them), in file order."""
    n = rows_of(h)
    plan = _plan(n, h)
    rng = random.Random(f"dedup-generate:{seed}:{h}")
    hour = _int_array(h, plan.fresh)

    fresh = gen.block(NS_FRESH, hour, _arange(0, plan.fresh))
    dup_src = rng.sample(range(plan.fresh), plan.dup)

    r_hours, r_idx = _replay_sources(plan, h, rng, rows_of)
    replays = gen.block(NS_FRESH, _int_array(r_hours), _int_array(r_idx))

    # conflicts: key and user of an earlier fresh row, another url, a later event_time
    n_same = plan.conflict if h == 0 else plan.conflict - plan.conflict // 2
    c_hours = [h] * n_same
    c_idx = rng.sample(range(plan.fresh), n_same)
    for _ in range(plan.conflict - n_same):
        k = rng.randint(1, min(h, REPLAY_WINDOW))
        c_hours.append(h - k)
        c_idx.append(rng.randrange(_plan(rows_of(h - k), h - k).fresh))
    orig = gen.block(NS_FRESH, _int_array(c_hours), _int_array(c_idx))
    new = gen.block(NS_CONFLICT, _int_array(h, plan.conflict), _arange(0, plan.conflict))
    same = pa.array([hh == h for hh in c_hours], pa.bool_())
    later = pc.add(orig.micros, pc.add(_mod(new.h_extra, CONFLICT_MAX_DELAY_US), pa.scalar(1)))
    shift = pc.add(_mod(pc.shift_right(new.h_extra, _u(40)), len(URLS) - 1), pa.scalar(1))
    conflicts = _Rows(
        key=orig.key, user=orig.user,
        micros=pc.if_else(same, later, new.micros),
        url=_imod(pc.add(orig.url, shift), len(URLS)),  # never the original url
        amount=new.amount, h_extra=new.h_extra,
    )

    late_hour = gen.block(NS_LATE_HOUR, _int_array(h, plan.late_hour), _arange(0, plan.late_hour))
    late_day = gen.block(NS_LATE_DAY, _int_array(h, plan.late_day), _arange(0, plan.late_day))
    spoilt = [
        gen.spoil(gen.render(gen.block(ns, _int_array(h, count), _arange(0, count))), ns, rng)
        for ns, count in ((NS_MALFORMED, plan.malformed), (NS_NULL, plan.null_key),
                          (NS_BAD, plan.bad_value))
    ]
    lines = pa.concat_arrays([gen.render(b) for b in (fresh, replays, conflicts, late_hour,
                                                      late_day)] + spoilt)
    # every rendered line once, plus the fresh rows copied as in-batch duplicates
    picks = pa.concat_arrays([_arange(0, len(lines)), pa.array(dup_src, pa.int64())])
    assert len(picks) == n
    # shuffle: order by a hash of the position (sorting beats a Python shuffle by far)
    order = pc.sort_indices(gen.hashes(NS_ORDER, _int_array(h, n), _arange(0, n), 1)[0])
    return pc.take(lines, pc.take(picks, order)), plan


def _write_hour(hour_dir: Path, lines: pa.Array, files: int, fmt: str) -> int:
    """Write the lines into `files` part files, then the `_SUCCESS` marker; returns the count."""
    hour_dir.mkdir(parents=True, exist_ok=True)
    for old in [*hour_dir.glob("part-*"), hour_dir / "_SUCCESS"]:
        old.unlink(missing_ok=True)  # a rerun with fewer files must not leave stale parts
    n = len(lines)
    files = max(1, min(files, n))
    _, offsets_buf, data = lines.buffers()
    offsets = pa.Array.from_buffers(pa.int64(), n + 1, [None, offsets_buf], offset=lines.offset)
    header = (",".join(COLUMNS) + "\n").encode() if fmt == "csv" else b""
    lo = 0
    for i in range(files):
        hi = lo + n // files + (1 if i < n % files else 0)
        a, b = offsets[lo].as_py(), offsets[hi].as_py()
        with open(hour_dir / f"part-{i:05d}.{fmt}", "wb") as f:
            f.write(header)
            if b > a:
                f.write(data.slice(a, b - a))
        lo = hi
    (hour_dir / "_SUCCESS").touch()
    return files


def _config_text(name: str, start: str, fmt: str, seed: int, hours: int, rows: int) -> str:
    body = yaml.safe_dump({"datasets": [demo_dataset(start, name, fmt)]}, sort_keys=False,
                          default_flow_style=False)
    return (f"# Written by the dedup_pipeline generator (seed {seed}, {hours} hours x {rows} rows, "
            f"{fmt}).\n# Relative paths resolve against this file's directory.\n{body}")


def generate_landing(out: str | Path, hours: int, rows_per_hour: int, seed: int = 7,
                     start: str | None = None, fmt: str = "jsonl", files_per_hour: int = 2,
                     name: str = "clicks", progress: Callable[[str], None] | None = None,
                     rows_of: Callable[[int], int] | None = None) -> GenerateStats:
    """Write `hours` hourly batches under `{out}/landing/{name}/` and `{out}/dedup.yaml`.

    `start` is the first hour's partition key (default: `default_start(hours)`). Same arguments,
    same bytes. Existing part files of a generated hour are replaced. `rows_of(h)`, when given,
    is the row count of hour h (0-based) instead of `rows_per_hour` (a benchmark's thin history).
    """
    count = rows_of or (lambda _h: rows_per_hour)
    if hours < 1 or files_per_hour < 1 or min(count(h) for h in range(hours)) < 1:
        raise ValueError("hours, rows_per_hour and files_per_hour must be >= 1")
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"format must be jsonl or csv, got {fmt!r}")
    if not NAME_RE.match(name):
        raise ValueError(f"dataset name must match [a-z0-9_]+, got {name!r}")
    first = parse_hour(start or default_start(hours))
    if first.minute or first.second or first.microsecond:
        raise ValueError(f"start must be on the hour, got {start!r}")
    if first > datetime.now(UTC):
        raise ValueError(f"start {start!r} is in the future (the config would be rejected)")

    t0 = time.perf_counter()
    root = Path(out).resolve()
    landing = root / "landing" / name
    gen = _Generator(seed, first, fmt)
    totals: Counter[str] = Counter()
    n_files = 0
    for h in range(hours):
        dt = first + h * HOUR
        lines, plan = _hour_lines(gen, h, count, seed)
        n_files += _write_hour(Path(landing_dir(str(landing), dt)), lines, files_per_hour, fmt)
        totals.update(plan.__dict__)
        if progress is not None:
            progress(f"generated {format_hour(dt)}: {len(lines)} rows")
    config = root / "dedup.yaml"
    config.write_text(_config_text(name, format_hour(first), fmt, seed, hours, rows_per_hour))
    return GenerateStats(
        hours=hours, rows=sum(count(h) for h in range(hours)), files=n_files,
        in_batch_duplicates=totals["dup"], cross_batch_replays=totals["replay"],
        conflicts=totals["conflict"], late_over_hour=totals["late_hour"],
        late_over_day=totals["late_day"], malformed=totals["malformed"],
        null_keys=totals["null_key"], bad_values=totals["bad_value"],
        seconds=time.perf_counter() - t0, landing=str(landing), config=str(config),
    )
