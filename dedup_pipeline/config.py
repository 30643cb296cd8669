"""Dataset configuration (SPEC C1, C2): parse and validate the YAML, fail fast with file/dataset/field.

Pure Python: no Spark, no Dagster. Loading a bad file raises `ConfigError` whose message names the
file, the dataset and the field, so nothing runs on a bad config.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from dedup_pipeline.hours import PARTITION_FMT

TYPES = ("string", "long", "double", "boolean", "timestamp", "date")
FORMATS = ("jsonl", "csv", "parquet")
BASES = ("event", "processing")
NAME_RE = re.compile(r"^[a-z0-9_]+$")
DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h|d|w)\s*$")
UNIT_MICROS = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
    "w": 604_800_000_000,
}
MICROS_PER_DAY = UNIT_MICROS["d"]
BUILTIN_DEMO = "<built-in demo>"


class ConfigError(ValueError):
    """A configuration problem; the message names the file, dataset and field."""


@dataclass(frozen=True)
class ExpiryConfig:
    column: str
    period: float  # in expiry-value units: micros (timestamp), days (date), number, positions
    period_text: str
    basis: str = "event"
    categories: tuple[str, ...] | None = None


@dataclass(frozen=True)
class IndexConfig:
    store_keys: bool = False
    buckets: int = 8  # hash buckets of the index when no expiry is configured
    slice_span: float | None = None  # width of an index slice in expiry-value units
    retention_lag_hours: int = 168  # keep expired index slices this long for reruns (R7, R10)
    compact_after: int = 8  # merge a slice's per-load directories once it has this many; 0: never


@dataclass(frozen=True)
class LandingConfig:
    """When an hour's input is complete (the landing sensor, SPEC D2)."""

    marker: str | None = "_SUCCESS"  # file whose presence in the hour's directory closes the hour
    grace_s: float = 900.0  # without a marker: the hour is complete this long after it ended
    watch_hours: int = 48  # how many loaded hours back the sensor looks for late-arriving files


@dataclass(frozen=True)
class ChecksConfig:
    """Thresholds of the asset checks (SPEC D4); a breach is a WARN, not a failure."""

    max_index_keys: int = 1_000_000_000
    max_duplicate_rate: float = 0.5
    max_conflict_rate: float = 0.05
    max_rejected_rate: float = 0.05


@dataclass(frozen=True)
class SourceConfig:
    path: str
    format: str
    schema: dict[str, str]
    csv_header: bool = True
    csv_delimiter: str = ","


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    start: str  # partition key of the first hour, "YYYY-MM-DD-HH:MM"
    source: SourceConfig
    key: tuple[str, ...]
    output: str
    fingerprint: tuple[str, ...] = ()
    order_by: str | None = None
    expiry: ExpiryConfig | None = None
    index: IndexConfig = field(default_factory=IndexConfig)
    landing: LandingConfig = field(default_factory=LandingConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    on_damaged_index: str = "fail"  # fail | rebuild

    @property
    def expiry_type(self) -> str | None:
        """Declared type of the expiry column, or 'category' for a categorical expiry."""
        if self.expiry is None:
            return None
        if self.expiry.categories is not None:
            return "category"
        return self.source.schema[self.expiry.column]

    @property
    def slice_span(self) -> float:
        """Width of one index slice in expiry-value units (Apex's bucket span).

        Default: a quarter of the expiry period, so a load reads at most ~5 slices of which one is
        partly expired, and late data spreads a load's entries over few files.
        """
        assert self.expiry is not None
        if self.index.slice_span is not None:
            return self.index.slice_span
        kind = self.expiry_type
        period = self.expiry.period
        if kind == "timestamp":
            return float(max(UNIT_MICROS["s"], int(period // 4)))
        if kind in ("date", "long", "category"):
            return float(max(1, int(period // 4)))
        return period / 4 if period > 0 else 1.0


@dataclass(frozen=True)
class SparkConfig:
    master: str | None = None
    remote: str | None = None
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineConfig:
    datasets: tuple[DatasetConfig, ...]
    spark: SparkConfig
    source: str  # the file it came from, or BUILTIN_DEMO

    def dataset(self, name: str | None) -> DatasetConfig:
        if name is None:
            if len(self.datasets) == 1:
                return self.datasets[0]
            names = ", ".join(d.name for d in self.datasets)
            raise ConfigError(f"{self.source}: several datasets ({names}); choose one with --dataset")
        for d in self.datasets:
            if d.name == name:
                return d
        names = ", ".join(d.name for d in self.datasets)
        raise ConfigError(f"{self.source}: no dataset named {name!r} (have: {names})")


def parse_duration_micros(text: str) -> int:
    """'90s', '30m', '24h', '7d' -> microseconds. Raises ValueError on anything else."""
    m = DURATION_RE.match(str(text))
    if not m:
        raise ValueError(f"cannot parse duration {text!r} (use e.g. 30m, 24h, 7d)")
    micros = float(m.group(1)) * UNIT_MICROS[m.group(2)]
    if micros != int(micros):
        raise ValueError(f"duration {text!r} is not a whole number of microseconds")
    return int(micros)


class _Ctx:
    """Carries 'where am I' so that every error names file, dataset and field."""

    def __init__(self, source: str, dataset: str | None = None):
        self.source = source
        self.dataset = dataset

    def fail(self, fld: str, msg: str) -> ConfigError:
        where = f"dataset {self.dataset!r}, " if self.dataset else ""
        return ConfigError(f"config error in {self.source}: {where}field {fld!r}: {msg}")


def _check_keys(ctx: _Ctx, prefix: str, obj: Any, allowed: set[str], required: set[str]) -> dict:
    if not isinstance(obj, dict):
        raise ctx.fail(prefix or "<top>", f"expected a mapping, got {type(obj).__name__}")
    for k in obj:
        if k not in allowed:
            raise ctx.fail(
                f"{prefix}.{k}" if prefix else str(k),
                f"unknown key (allowed: {', '.join(sorted(allowed))})",
            )
    for k in sorted(required):
        if k not in obj or obj[k] is None:
            raise ctx.fail(f"{prefix}.{k}" if prefix else k, "is required")
    return obj


def _str_list(ctx: _Ctx, fld: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ctx.fail(fld, "expected a non-empty list of column names")
    if len(set(value)) != len(value):
        raise ctx.fail(fld, "lists a column twice")
    return tuple(value)


def _resolve_path(base: Path | None, p: str) -> str:
    if "://" in p or p.startswith("file:") or os.path.isabs(p) or base is None:
        return p if ("://" in p or p.startswith("file:")) else os.path.abspath(p)
    return str((base / p).resolve())


def _parse_number(ctx: _Ctx, fld: str, value: Any, integral: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ctx.fail(fld, f"expected a number, got {value!r}")
    try:
        num = float(value)
    except ValueError:
        raise ctx.fail(fld, f"cannot parse period {value!r} as a number") from None
    if not math.isfinite(num) or num < 0:
        raise ctx.fail(fld, f"period must be a finite number >= 0, got {value!r}")
    if integral and num != int(num):
        raise ctx.fail(fld, f"period must be a whole number for this column type, got {value!r}")
    return num


def _parse_expiry(ctx: _Ctx, raw: Any, schema: dict[str, str]) -> ExpiryConfig:
    allowed = {"column", "period", "basis", "categories"}
    raw = _check_keys(ctx, "expiry", raw, allowed, {"column", "period"})
    col = raw["column"]
    if not isinstance(col, str) or col not in schema:
        raise ctx.fail("expiry.column", f"{col!r} is not a column of source.schema")
    basis = raw.get("basis", "event")
    if basis not in BASES:
        raise ctx.fail("expiry.basis", f"must be one of {', '.join(BASES)}, got {basis!r}")
    ctype = schema[col]
    cats = raw.get("categories")
    period_raw = raw["period"]
    if cats is not None:
        if not isinstance(cats, list) or not cats or not all(isinstance(c, str) for c in cats):
            raise ctx.fail("expiry.categories", "expected a non-empty list of category names")
        if len(set(cats)) != len(cats):
            raise ctx.fail("expiry.categories", "lists a category twice")
        if ctype != "string":
            raise ctx.fail(
                "expiry.column", f"a categorical expiry needs a string column, {col!r} is {ctype}"
            )
        if basis != "event":
            raise ctx.fail("expiry.basis", "a categorical expiry only supports basis 'event'")
        period = _parse_number(ctx, "expiry.period", period_raw, integral=True)
        return ExpiryConfig(col, period, str(period_raw), basis, tuple(cats))
    if ctype in ("timestamp", "date"):
        try:
            micros = parse_duration_micros(period_raw)
        except ValueError as e:
            raise ctx.fail("expiry.period", str(e)) from None
        if ctype == "date":
            if micros % MICROS_PER_DAY:
                raise ctx.fail("expiry.period", "a date column needs a whole number of days (7d)")
            if basis != "event":
                raise ctx.fail("expiry.basis", "basis 'processing' needs a timestamp column")
            return ExpiryConfig(col, float(micros // MICROS_PER_DAY), str(period_raw), basis)
        return ExpiryConfig(col, float(micros), str(period_raw), basis)
    if ctype in ("long", "double"):
        if basis != "event":
            raise ctx.fail("expiry.basis", "basis 'processing' needs a timestamp column")
        period = _parse_number(ctx, "expiry.period", period_raw, integral=(ctype == "long"))
        return ExpiryConfig(col, period, str(period_raw), basis)
    raise ctx.fail(
        "expiry.column",
        f"{col!r} has type {ctype}; expiry needs timestamp, date, long, double, "
        "or a string column with categories",
    )


def _parse_index(ctx: _Ctx, raw: Any, expiry: ExpiryConfig | None, ctype: str | None) -> IndexConfig:
    if raw is None:
        return IndexConfig()
    allowed = {"store_keys", "buckets", "slice_span", "retention_lag_hours", "compact_after"}
    raw = _check_keys(ctx, "index", raw, allowed, set())
    store_keys = raw.get("store_keys", False)
    if not isinstance(store_keys, bool):
        raise ctx.fail("index.store_keys", f"expected true or false, got {store_keys!r}")
    buckets = raw.get("buckets", 8)
    if isinstance(buckets, bool) or not isinstance(buckets, int) or not 1 <= buckets <= 4096:
        raise ctx.fail("index.buckets", f"expected an integer in 1..4096, got {buckets!r}")
    lag = raw.get("retention_lag_hours", 168)
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
        raise ctx.fail("index.retention_lag_hours", f"expected an integer >= 0, got {lag!r}")
    compact = raw.get("compact_after", 8)
    if isinstance(compact, bool) or not isinstance(compact, int) or compact == 1 or compact < 0:
        raise ctx.fail("index.compact_after", f"expected 0 (never) or an integer >= 2, got {compact!r}")
    span: float | None = None
    if "slice_span" in raw:
        if expiry is None:
            raise ctx.fail("index.slice_span", "only applies when expiry is configured")
        val = raw["slice_span"]
        if ctype == "timestamp":
            try:
                span = float(parse_duration_micros(val))
            except ValueError as e:
                raise ctx.fail("index.slice_span", str(e)) from None
        elif ctype == "date":
            try:
                micros = parse_duration_micros(val)
            except ValueError as e:
                raise ctx.fail("index.slice_span", str(e)) from None
            if micros % MICROS_PER_DAY:
                raise ctx.fail("index.slice_span", "a date column needs whole days")
            span = float(micros // MICROS_PER_DAY)
        else:
            span = _parse_number(ctx, "index.slice_span", val, integral=ctype in ("long", "category"))
        if span <= 0:
            raise ctx.fail("index.slice_span", "must be > 0")
    return IndexConfig(store_keys, buckets, span, lag, compact)


def _parse_dataset(src: str, base: Path | None, raw: Any, i: int) -> DatasetConfig:
    ctx = _Ctx(src, raw.get("name") if isinstance(raw, dict) else None)
    if ctx.dataset is None:
        ctx.dataset = f"#{i + 1}"
    allowed = {"name", "start", "source", "key", "fingerprint", "order_by", "expiry", "output",
               "index", "landing", "checks", "on_damaged_index"}
    raw = _check_keys(ctx, "", raw, allowed, {"name", "start", "source", "key", "output"})
    name = raw["name"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ctx.fail("name", f"must match [a-z0-9_]+, got {name!r}")
    start = raw["start"]
    try:
        dt = datetime.strptime(str(start), PARTITION_FMT)
    except ValueError:
        raise ctx.fail("start", f"expected 'YYYY-MM-DD-HH:00' (UTC), got {start!r}") from None
    if dt.minute:
        raise ctx.fail("start", f"must be on the hour, got {start!r}")
    if dt.replace(tzinfo=UTC) > datetime.now(UTC):
        raise ctx.fail("start", f"{start!r} is in the future")

    s = _check_keys(ctx, "source", raw["source"], {"path", "format", "schema", "csv"},
                    {"path", "format", "schema"})
    fmt = s["format"]
    if fmt not in FORMATS:
        raise ctx.fail("source.format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    schema = s["schema"]
    if not isinstance(schema, dict) or not schema:
        raise ctx.fail("source.schema", "expected a mapping of column: type")
    for col, typ in schema.items():
        if not isinstance(col, str) or not col or col.startswith("_"):
            raise ctx.fail("source.schema", f"bad column name {col!r} (names starting with _ are "
                           "reserved for the pipeline's own columns)")
        if typ not in TYPES:
            raise ctx.fail(f"source.schema.{col}", f"unknown type {typ!r} (one of {', '.join(TYPES)})")
    header, delim = True, ","
    if "csv" in s:
        c = _check_keys(ctx, "source.csv", s["csv"], {"header", "delimiter"}, set())
        header = c.get("header", True)
        delim = c.get("delimiter", ",")
        if not isinstance(header, bool):
            raise ctx.fail("source.csv.header", f"expected true or false, got {header!r}")
        if not isinstance(delim, str) or len(delim) != 1:
            raise ctx.fail("source.csv.delimiter", f"expected one character, got {delim!r}")
    if not isinstance(s["path"], str):
        raise ctx.fail("source.path", "expected a path")
    source = SourceConfig(_resolve_path(base, s["path"]), fmt, dict(schema), header, delim)

    key = _str_list(ctx, "key", raw["key"])
    for k in key:
        if k not in schema:
            raise ctx.fail("key", f"column {k!r} is not in source.schema")
    fp_raw = raw.get("fingerprint")
    fingerprint: tuple[str, ...] = ()
    if fp_raw == "all":
        fingerprint = tuple(c for c in schema if c not in key)
        if not fingerprint:
            raise ctx.fail("fingerprint", "'all' needs at least one non-key column")
    elif fp_raw is not None:
        fingerprint = _str_list(ctx, "fingerprint", fp_raw)
        for c in fingerprint:
            if c not in schema:
                raise ctx.fail("fingerprint", f"column {c!r} is not in source.schema")
    order_by = raw.get("order_by")
    if order_by is not None and (not isinstance(order_by, str) or order_by not in schema):
        raise ctx.fail("order_by", f"{order_by!r} is not a column of source.schema")
    expiry = _parse_expiry(ctx, raw["expiry"], schema) if raw.get("expiry") is not None else None
    ctype = None
    if expiry is not None:
        ctype = "category" if expiry.categories is not None else schema[expiry.column]
    index = _parse_index(ctx, raw.get("index"), expiry, ctype)
    if not isinstance(raw["output"], str):
        raise ctx.fail("output", "expected a path")
    _check_output_not_a_file(ctx, _resolve_path(base, raw["output"]))
    on_damaged = raw.get("on_damaged_index", "fail")
    if on_damaged not in ("fail", "rebuild"):
        raise ctx.fail("on_damaged_index", f"must be 'fail' or 'rebuild', got {on_damaged!r}")
    return DatasetConfig(
        name=name,
        start=dt.strftime(PARTITION_FMT),
        source=source,
        key=key,
        output=_resolve_path(base, raw["output"]),
        fingerprint=fingerprint,
        order_by=order_by,
        expiry=expiry,
        index=index,
        landing=_parse_landing(ctx, raw.get("landing")),
        checks=_parse_checks(ctx, raw.get("checks")),
        on_damaged_index=on_damaged,
    )


def _parse_landing(ctx: _Ctx, raw: Any) -> LandingConfig:
    if raw is None:
        return LandingConfig()
    raw = _check_keys(ctx, "landing", raw, {"marker", "grace", "watch_hours"}, set())
    marker = raw.get("marker", "_SUCCESS")
    if marker is not None and (not isinstance(marker, str) or not marker or "/" in marker):
        raise ctx.fail("landing.marker", f"expected a file name or null, got {marker!r}")
    grace_s = 900.0
    if "grace" in raw:
        try:
            grace_s = parse_duration_micros(raw["grace"]) / 1e6
        except ValueError as e:
            raise ctx.fail("landing.grace", str(e)) from None
    watch = raw.get("watch_hours", 48)
    if isinstance(watch, bool) or not isinstance(watch, int) or watch < 0:
        raise ctx.fail("landing.watch_hours", f"expected an integer >= 0, got {watch!r}")
    return LandingConfig(marker, grace_s, watch)


def _parse_checks(ctx: _Ctx, raw: Any) -> ChecksConfig:
    if raw is None:
        return ChecksConfig()
    names = {"max_index_keys", "max_duplicate_rate", "max_conflict_rate", "max_rejected_rate"}
    raw = _check_keys(ctx, "checks", raw, names, set())
    values: dict[str, Any] = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise ctx.fail(f"checks.{k}", f"expected a number >= 0, got {v!r}")
        if k.endswith("_rate") and v > 1:
            raise ctx.fail(f"checks.{k}", f"a rate is between 0 and 1, got {v!r}")
        values[k] = int(v) if k == "max_index_keys" else float(v)
    return ChecksConfig(**values)


def _parse_spark(ctx: _Ctx, raw: Any) -> SparkConfig:
    if raw is None:
        return SparkConfig()
    raw = _check_keys(ctx, "spark", raw, {"master", "remote", "conf"}, set())
    conf = raw.get("conf") or {}
    if not isinstance(conf, dict):
        raise ctx.fail("spark.conf", "expected a mapping of Spark settings")
    if raw.get("master") and raw.get("remote"):
        raise ctx.fail("spark", "set master or remote, not both (Spark rejects the pair)")
    return SparkConfig(raw.get("master"), raw.get("remote"), {str(k): str(v) for k, v in conf.items()})


def parse_config(data: Any, source: str, base_dir: Path | None) -> PipelineConfig:
    """Validate an already-parsed YAML document; `base_dir` resolves relative paths."""
    ctx = _Ctx(source)
    data = _check_keys(ctx, "", data, {"datasets", "spark"}, {"datasets"})
    raw_ds = data["datasets"]
    if not isinstance(raw_ds, list) or not raw_ds:
        raise ctx.fail("datasets", "expected a non-empty list of datasets")
    datasets = tuple(_parse_dataset(source, base_dir, d, i) for i, d in enumerate(raw_ds))
    seen: set[str] = set()
    for d in datasets:
        if d.name in seen:
            raise _Ctx(source, d.name).fail("name", "two datasets share this name")
        seen.add(d.name)
    _check_outputs_apart(source, datasets)
    return PipelineConfig(datasets, _parse_spark(ctx, data.get("spark")), source)


def _local_path(uri: str) -> str | None:
    """The local path a dataset path names, or None for a non-local URI."""
    if uri.startswith("file:"):
        rest = uri[len("file:"):]
        if rest.startswith("//"):
            rest = rest[2:]
            host, _, tail = rest.partition("/")
            rest = "/" + tail if host in ("", "localhost") else ""
        return os.path.normpath(rest) if rest else None
    if "://" in uri:
        return None
    return os.path.normpath(uri)


def _check_output_not_a_file(ctx: _Ctx, output: str) -> None:
    """An output root (or one of its parents) that is a file would fail at the first write."""
    local = _local_path(output)
    if local is None:
        return
    p = Path(local)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                what = "is a file" if q == p else f"lies under {q}, which is a file"
                raise ctx.fail("output", f"{output} {what}, not a directory")
            return


def _comparable_root(uri: str) -> str:
    local = _local_path(uri)
    return (local if local is not None else uri).rstrip("/") + "/"


def _check_outputs_apart(source: str, datasets: tuple[DatasetConfig, ...]) -> None:
    """C2: each dataset owns its output tree; one output equal to or inside another corrupts it."""
    roots = [(d, _comparable_root(d.output)) for d in datasets]
    for d, root in roots:
        for other, other_root in roots:
            if other is d:
                continue
            if root == other_root:
                raise _Ctx(source, d.name).fail(
                    "output", f"{d.output} is also the output of dataset {other.name!r}")
            if root.startswith(other_root):
                raise _Ctx(source, d.name).fail(
                    "output", f"{d.output} lies inside the output of dataset {other.name!r} "
                    f"({other.output}); each dataset needs its own directory")


def _check_duplicate_keys(node: yaml.Node | None, src: str, fld: str = "",
                          dataset: str | None = None) -> None:
    """YAML keeps the last of two equal keys silently; a config that says a thing twice is refused.

    `fld` is the field path inside the dataset (or the file, outside any dataset).
    """
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            name = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            here = f"{fld}.{name}" if fld else name
            if name in seen:
                raise _Ctx(src, dataset).fail(
                    here, f"given twice (lines {seen[name] + 1} and {k.start_mark.line + 1}); "
                    "YAML would silently keep the last")
            seen[name] = k.start_mark.line
            if fld == "" and dataset is None and name == "datasets" \
                    and isinstance(v, yaml.SequenceNode):
                for i, item in enumerate(v.value):
                    ds_name = f"#{i + 1}"
                    if isinstance(item, yaml.MappingNode):
                        for dk, dv in item.value:
                            if getattr(dk, "value", None) == "name" \
                                    and isinstance(dv, yaml.ScalarNode):
                                ds_name = dv.value
                    _check_duplicate_keys(item, src, "", ds_name)
                continue
            _check_duplicate_keys(v, src, here, dataset)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicate_keys(item, src, f"{fld}[{i}]", dataset)


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"config error: cannot read {p}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"config error in {p}: not UTF-8 text (byte 0x{raw[e.start]:02x} on "
                          f"line {line}); save the file as UTF-8") from None
    try:
        _check_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), str(p))
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config error in {p}: not valid YAML: {e}") from None
    return parse_config(data, str(p), p.resolve().parent)


def demo_config(root: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """The built-in demo dataset, used when no config is given (SPEC C1).

    `dedup-pipeline demo` writes `demo/dedup.yaml` beside its generated data; if that file exists
    (under DEDUP_DEMO_DIR or ./demo) it is the demo config. Otherwise an empty demo dataset whose
    24 hours end at the last complete hour is shown, so `dagster dev` always has something to load.
    """
    base = Path(root or os.environ.get("DEDUP_DEMO_DIR", "demo")).resolve()
    written = base / "dedup.yaml"
    if written.exists():
        return load_config(written)
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = (now - timedelta(hours=24)).strftime(PARTITION_FMT)
    data = {"datasets": [dict(DEMO_DATASET, start=start)]}
    return parse_config(data, BUILTIN_DEMO, base)


DEMO_DATASET: dict[str, Any] = {
    "name": "clicks",
    "source": {
        "path": "landing/clicks",
        "format": "jsonl",
        "schema": {"event_id": "string", "user_id": "string", "event_time": "timestamp",
                   "url": "string", "amount": "double"},
    },
    "key": ["event_id"],
    "fingerprint": ["user_id", "url"],
    "order_by": "event_time",
    "expiry": {"column": "event_time", "period": "24h", "basis": "event"},
    "output": "warehouse/clicks",
}


def config_from_env() -> PipelineConfig:
    """DEDUP_CONFIG if set, else the built-in demo (C1)."""
    path = os.environ.get("DEDUP_CONFIG")
    return load_config(path) if path else demo_config()
