"""Dataset configuration (SPEC C1, C2): the YAML as frozen pydantic models; fail fast, naming
file, dataset and field.

Pure Python: no Spark, no Dagster. Every model is frozen and forbids unknown keys; a field's own
shape is its type, and the rules that tie fields together (a key column must be in the schema, a
period reads by the expiry column's type, outputs must not overlap) are validators of the model
that holds both. `parse_config` turns pydantic's `ValidationError` into a one-line `ConfigError`
naming the file, the dataset and the field, so nothing runs on a bad config and users never see
pydantic's multi-line dump.

A `start` in the future is accepted: the definitions load the same today as tomorrow, and no hour
of such a dataset is ready before its start (the sensor and schedule skip, `run` refuses).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from dedup_pipeline.engine.expiry_units import (
    DURATION_KINDS,
    ExpiryKind,
    default_slice_span,
    duration_in_units,
    kind_of,
)
from dedup_pipeline.hours import PARTITION_FMT

ColumnType = Literal["string", "long", "double", "boolean", "timestamp", "date"]
Format = Literal["jsonl", "csv", "parquet"]
Basis = Literal["event", "processing"]
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
BUILTIN_DEMO = "<built-in demo>"


class ConfigError(ValueError):
    """A configuration problem; the message names the file, dataset and field."""


def config_error(source: str, dataset: Any, fld: str, msg: str) -> ConfigError:
    """The one format of a config error: `config error in FILE: dataset 'D', field 'F': problem`."""
    where = f"dataset {dataset!r}, " if dataset is not None else ""
    return ConfigError(f"config error in {source}: {where}field {fld!r}: {msg}")


def _problem(msg: str, fld: str | None = None, dataset: str | None = None) -> PydanticCustomError:
    """A validator's error; `fld` (a path inside the dataset) names the field when the validator
    sits on a model that holds several (cross-field rules), `dataset` when it sits on the file."""
    ctx: dict[str, Any] = {"problem": msg}
    if fld is not None:
        ctx["field"] = fld
    if dataset is not None:
        ctx["dataset"] = dataset
    return PydanticCustomError("config", "{problem}", ctx)


def parse_duration_micros(text: str) -> int:
    """'90s', '30m', '24h', '7d' -> microseconds. Raises ValueError on anything else.

    The one duration parser: expiry periods, index slice spans and the landing grace use it.
    """
    m = DURATION_RE.match(str(text))
    if not m:
        raise ValueError(f"cannot parse duration {text!r} (use e.g. 30m, 24h, 7d)")
    micros = float(m.group(1)) * UNIT_MICROS[m.group(2)]
    if micros != int(micros):
        raise ValueError(f"duration {text!r} is not a whole number of microseconds")
    return int(micros)


def _parse_number(text: str, integral: bool) -> float:
    """A period or span written as a number ('5', '0.5'); ValueError says what is wrong."""
    try:
        num = float(text)
    except ValueError:
        raise ValueError(f"cannot parse period {text!r} as a number") from None
    if not math.isfinite(num) or num < 0:
        raise ValueError(f"period must be a finite number >= 0, got {text!r}")
    if integral and num != int(num):
        raise ValueError(f"period must be a whole number for this column type, got {text!r}")
    return num


def _in_units(kind: ExpiryKind, written: str) -> float:
    """A period or slice span as written in the YAML, in the units of the expiry value v."""
    if kind in DURATION_KINDS:
        return duration_in_units(kind, parse_duration_micros(written))
    return _parse_number(written, integral=kind != "double")


# --- field types: the shape of a value, with its own message -------------------------------------

def _written(v: Any) -> Any:
    """A period or span as the user wrote it: a YAML number reads as its text ('24', '0.5')."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return str(v)
    return v


def _unique(what: str) -> Any:
    """A validator: one name or a list of them -> a tuple of unique names (`what` are they)."""
    def check(v: Any) -> Any:
        if isinstance(v, str) and what == "column":
            v = [v]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
            raise _problem(f"expected a non-empty list of {what} names")
        if len(set(v)) != len(v):
            raise _problem(f"lists a {what} twice")
        return tuple(v)
    return check


_names = _unique("column")


def _seconds(v: Any) -> Any:
    """`landing.grace` is written as a duration and kept in seconds."""
    try:
        return parse_duration_micros(v) / 1e6
    except ValueError as e:
        raise _problem(str(e)) from None


def _text(v: Any) -> Any:
    """A value YAML may have typed (a date) read as the text it was written as."""
    return v if v is None else str(v)


def _none_is_empty(v: Any) -> Any:
    """An empty section (`index:` with nothing under it) means its defaults."""
    return {} if v is None else v


Written = Annotated[str, BeforeValidator(_written)]
Names = Annotated[tuple[str, ...], BeforeValidator(_names)]
Seconds = Annotated[float, BeforeValidator(_seconds)]
Section = BeforeValidator(_none_is_empty)


class _Model(BaseModel):
    """Frozen, no unknown keys, no silent coercion (`"yes"` is not a boolean)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


@dataclass(frozen=True)
class _Where:
    """The validation context: where the document came from, and its directory for relative
    paths."""

    source: str
    base: Path | None


def _base(info: ValidationInfo) -> Path | None:
    return info.context.base if isinstance(info.context, _Where) else None


# --- the models -----------------------------------------------------------------------------------

class CsvConfig(_Model):
    """`source.csv`: RFC 4180 files with or without a header line."""

    header: bool = True
    delimiter: str = Field(",", min_length=1, max_length=1)


class SourceConfig(_Model):
    """`source`: where hour H's files land ({path}/date=YYYY-MM-DD/hour=HH/) and how to read them."""

    path: str
    format: Format
    schema_: dict[str, ColumnType] = Field(alias="schema", min_length=1)
    csv: Annotated[CsvConfig, Section] = CsvConfig()

    @field_validator("path")
    @classmethod
    def _resolve(cls, v: str, info: ValidationInfo) -> str:
        return _resolve_path(_base(info), v)

    @field_validator("schema_")
    @classmethod
    def _column_names(cls, v: dict[str, str]) -> dict[str, str]:
        for col in v:
            if not col or col.startswith("_"):
                raise _problem(f"bad column name {col!r} (names starting with _ are reserved for "
                              "the pipeline's own columns)")
        return v

    @property
    def schema(self) -> dict[str, str]:  # type: ignore[override]
        """column -> declared type (`schema` is a BaseModel method name, hence the alias)."""
        return self.schema_

    @property
    def csv_header(self) -> bool:
        return self.csv.header

    @property
    def csv_delimiter(self) -> str:
        return self.csv.delimiter


class ExpiryConfig(_Model):
    """The `expiry:` section (R6). `period_text` is the period as written; `period` is it in the
    units of the expiry value (see `engine/expiry_units.py`), set by `DatasetConfig`, which knows
    the column's type."""

    column: str
    period_text: Written = Field(alias="period")
    basis: Basis = "event"
    categories: Annotated[tuple[str, ...], BeforeValidator(_unique("category"))] | None = None
    _period: float = PrivateAttr(math.nan)

    @property
    def period(self) -> float:
        return self._period


class IndexConfig(_Model):
    """`index`: how the key index is kept (R2, R7); every field has a default."""

    store_keys: bool = False
    buckets: int = Field(8, ge=1, le=4096)  # hash buckets of the index when no expiry is configured
    # width of an index slice as written (a duration or a number, like the period);
    # `DatasetConfig.slice_span` is it in expiry-value units, or the default
    slice_span: Written | None = None
    retention_lag_hours: int = Field(168, ge=0)  # keep expired index slices this long (R7, R10)
    compact_after: int = 8  # merge a slice's per-load directories once it has this many; 0: never

    @field_validator("compact_after")
    @classmethod
    def _never_or_two(cls, v: int) -> int:
        if v == 1 or v < 0:
            raise _problem(f"expected 0 (never) or an integer >= 2, got {v!r}")
        return v


class LandingConfig(_Model):
    """When an hour's input is complete (the landing sensor, SPEC D2)."""

    marker: str | None = "_SUCCESS"  # file whose presence in the hour's directory closes the hour
    grace_s: Seconds = Field(900.0, alias="grace")  # without a marker: complete this long after
    watch_hours: int = Field(48, ge=0)  # how many loaded hours back to look for late files

    @field_validator("marker")
    @classmethod
    def _file_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or "/" in v):
            raise _problem(f"expected a file name or null, got {v!r}")
        return v


def _whole(v: Any) -> Any:
    """`max_index_keys: 1.0e9` reads as the integer it names."""
    return int(v) if isinstance(v, float) and math.isfinite(v) and v >= 0 else v


class ChecksConfig(_Model):
    """Thresholds of the asset checks (SPEC D4); a breach is a WARN, not a failure."""

    max_index_keys: Annotated[int, BeforeValidator(_whole)] = Field(1_000_000_000, ge=0)
    max_duplicate_rate: float = Field(0.5, ge=0, le=1)
    max_conflict_rate: float = Field(0.05, ge=0, le=1)
    max_rejected_rate: float = Field(0.05, ge=0, le=1)


class DatasetConfig(_Model):
    """One dataset (C1). Fields are declared in dependency order: the validators of `key`,
    `fingerprint`, `order_by`, `expiry` and `index` read the fields before them (`info.data`)."""

    name: str
    start: Annotated[str, BeforeValidator(_text)]  # partition key of the first hour (UTC)
    source: SourceConfig
    key: Names
    fingerprint: tuple[str, ...] = ()
    order_by: str | None = None
    expiry: ExpiryConfig | None = None
    output: str
    index: Annotated[IndexConfig, Section] = IndexConfig()
    landing: Annotated[LandingConfig, Section] = LandingConfig()
    checks: Annotated[ChecksConfig, Section] = ChecksConfig()
    on_damaged_index: Literal["fail", "rebuild"] = "fail"
    # delta: each output is a Delta table over its Parquet files (engine/lake.py), readers see
    # committed hours only; parquet: plain Hive-partitioned Parquet directories
    output_format: Literal["delta", "parquet"] = "delta"
    _config_file: str = PrivateAttr(BUILTIN_DEMO)  # the file it came from (set by PipelineConfig)

    @property
    def config_file(self) -> str:
        """The config file this dataset was read from (commands in messages name it)."""
        return self._config_file

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise _problem(f"must match [a-z0-9_]+, got {v!r}")
        return v

    @field_validator("start")
    @classmethod
    def _on_the_hour(cls, v: str) -> str:
        try:
            dt = datetime.strptime(v, PARTITION_FMT)
        except ValueError:
            raise _problem(f"expected 'YYYY-MM-DD-HH:00' (UTC), got {v!r}") from None
        if dt.minute:
            raise _problem(f"must be on the hour, got {v!r}")
        return dt.strftime(PARTITION_FMT)

    @field_validator("key")
    @classmethod
    def _key_in_schema(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        return _in_schema(v, info)

    @field_validator("fingerprint", mode="before")
    @classmethod
    def _fingerprint(cls, v: Any, info: ValidationInfo) -> Any:
        """`all`: every non-key column (R5); absent: no fingerprint."""
        if v is None:
            return ()
        if v != "all":
            return _names(v)
        source, key = info.data.get("source"), info.data.get("key")
        if source is None or key is None:
            return ()  # their own error is reported
        cols = tuple(c for c in source.schema if c not in key)
        if not cols:
            raise _problem("'all' needs at least one non-key column")
        return cols

    @field_validator("fingerprint")
    @classmethod
    def _fingerprint_in_schema(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        return _in_schema(v, info)

    @field_validator("order_by")
    @classmethod
    def _order_by_in_schema(cls, v: str | None, info: ValidationInfo) -> str | None:
        source = info.data.get("source")
        if v is not None and source is not None and v not in source.schema:
            raise _problem(f"{v!r} is not a column of source.schema")
        return v

    @field_validator("expiry")
    @classmethod
    def _expiry_fits_column(cls, v: ExpiryConfig | None, info: ValidationInfo
                            ) -> ExpiryConfig | None:
        """The expiry column's type decides what an expiry can be and how its period reads."""
        source = info.data.get("source")
        if v is None or source is None:
            return v
        if v.column not in source.schema:
            raise _problem(f"{v.column!r} is not a column of source.schema", "expiry.column")
        ctype = source.schema[v.column]
        categorical = v.categories is not None
        kind = kind_of(ctype, categorical)
        if kind is None and categorical:
            raise _problem(f"a categorical expiry needs a string column, {v.column!r} is {ctype}",
                          "expiry.column")
        if kind is None:
            raise _problem(f"{v.column!r} has type {ctype}; expiry needs timestamp, date, long, "
                          "double, or a string column with categories", "expiry.column")
        if v.basis != "event" and categorical:
            raise _problem("a categorical expiry only supports basis 'event'", "expiry.basis")
        if v.basis != "event" and kind != "timestamp":
            raise _problem("basis 'processing' needs a timestamp column", "expiry.basis")
        try:
            period = _in_units(kind, v.period_text)
        except ValueError as e:
            raise _problem(str(e), "expiry.period") from None
        out = v.model_copy()
        out._period = period
        return out

    @field_validator("output")
    @classmethod
    def _output_dir(cls, v: str, info: ValidationInfo) -> str:
        out = _resolve_path(_base(info), v)
        _check_output_not_a_file(out)
        return out

    @field_validator("index")
    @classmethod
    def _slice_span(cls, v: IndexConfig, info: ValidationInfo) -> IndexConfig:
        if v.slice_span is None or "expiry" not in info.data:
            return v
        ds_expiry, source = info.data["expiry"], info.data.get("source")
        if ds_expiry is None:
            raise _problem("only applies when expiry is configured", "index.slice_span")
        if source is None:
            return v  # its own error is reported
        kind = kind_of(source.schema[ds_expiry.column], ds_expiry.categories is not None)
        try:
            span = _in_units(kind, v.slice_span)  # type: ignore[arg-type]
        except ValueError as e:
            raise _problem(str(e), "index.slice_span") from None
        if span <= 0:
            raise _problem("must be > 0", "index.slice_span")
        return v

    @property
    def expiry_type(self) -> ExpiryKind | None:
        """Kind of the expiry value: the expiry column's type, or 'category' (expiry_units)."""
        if self.expiry is None:
            return None
        return kind_of(self.source.schema[self.expiry.column], self.expiry.categories is not None)

    @property
    def slice_span(self) -> float:
        """Width of one index slice in expiry-value units (Apex's bucket span): the configured
        `index.slice_span`, else `expiry_units.default_slice_span` of the period."""
        kind = self.expiry_type
        assert self.expiry is not None and kind is not None
        if self.index.slice_span is not None:
            return _in_units(kind, self.index.slice_span)
        return default_slice_span(kind, self.expiry.period)


def _in_schema(cols: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
    source = info.data.get("source")
    for c in cols:
        if source is not None and c not in source.schema:
            raise _problem(f"column {c!r} is not in source.schema")
    return cols


def _spark_conf(v: Any) -> Any:
    """Spark settings are strings; `spark.executor.cores: 2` is written as a YAML number."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _problem("expected a mapping of Spark settings")
    return {str(k): str(x) for k, x in v.items()}


class SparkConfig(_Model):
    """The file's `spark:` section (C3); the environment overrides it (engine/session.py)."""

    master: str | None = None
    remote: str | None = None
    conf: Annotated[dict[str, str], BeforeValidator(_spark_conf)] = {}

    @model_validator(mode="after")
    def _master_or_remote(self) -> SparkConfig:
        if self.master and self.remote:
            raise _problem("set master or remote, not both (Spark rejects the pair)")
        return self


def _datasets(v: Any) -> Any:
    if not isinstance(v, list) or not v:
        raise _problem("expected a non-empty list of datasets")
    return tuple(v)


class PipelineConfig(_Model):
    """The whole file: its datasets and the Spark settings; `source` is the file it came from."""

    datasets: Annotated[tuple[DatasetConfig, ...], BeforeValidator(_datasets)]
    spark: Annotated[SparkConfig, Section] = SparkConfig()
    _source: str = PrivateAttr(BUILTIN_DEMO)

    def model_post_init(self, context: Any, /) -> None:
        if isinstance(context, _Where):
            self._source = context.source
        for d in self.datasets:
            d._config_file = self._source

    @property
    def source(self) -> str:
        """The file the config came from, or BUILTIN_DEMO."""
        return self._source

    @model_validator(mode="after")
    def _datasets_apart(self) -> PipelineConfig:
        """C2: names are unique and each dataset owns its output tree (one output equal to or
        inside another corrupts it)."""
        seen: set[str] = set()
        for d in self.datasets:
            if d.name in seen:
                raise _problem("two datasets share this name", "name", d.name)
            seen.add(d.name)
        roots = [(d, _comparable_root(d.output)) for d in self.datasets]
        for d, root in roots:
            for other, other_root in roots:
                if other is d:
                    continue
                if root == other_root:
                    raise _problem(f"{d.output} is also the output of dataset {other.name!r}",
                                  "output", d.name)
                if root.startswith(other_root):
                    raise _problem(f"{d.output} lies inside the output of dataset {other.name!r} "
                                  f"({other.output}); each dataset needs its own directory",
                                  "output", d.name)
        return self

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


# --- from pydantic's errors to one line -----------------------------------------------------------

def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (through Optional, Annotated, tuple[...]), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _allowed_keys(loc: tuple[Any, ...]) -> str:
    """The keys the mapping at `loc` may hold, for an 'unknown key' message."""
    model: type[BaseModel] | None = PipelineConfig
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        fld = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = _model_in(fld.annotation) if fld is not None else None
    if model is None:
        return ""
    names = sorted(f.alias or n for n, f in model.model_fields.items())
    return f" (allowed: {', '.join(names)})"


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _message(err: Any) -> str:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "config":
        return str(ctx["problem"])
    if kind == "missing" or (value is None and kind.endswith("_type")):
        return "is required"
    if kind == "extra_forbidden":
        return "unknown key" + _allowed_keys(err["loc"][:-1])
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping, got {type(value).__name__}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {_short(value)}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{msg[:1].lower()}{msg[1:]}, got {_short(value)}"


def _dataset_label(data: Any, i: int) -> Any:
    """How a message names dataset i: its `name` as written, else its position."""
    try:
        name = data["datasets"][i].get("name")
    except (AttributeError, IndexError, KeyError, TypeError):
        name = None
    return name if name is not None else f"#{i + 1}"


def _to_config_error(e: ValidationError, data: Any, source: str) -> ConfigError:
    """The first of pydantic's errors as one line: file, dataset, field path, problem."""
    err = e.errors(include_url=False)[0]
    loc, ctx = tuple(err["loc"]), err.get("ctx") or {}
    dataset = ctx.get("dataset")
    inside = loc
    if dataset is None and len(loc) >= 2 and loc[0] == "datasets" and isinstance(loc[1], int):
        dataset, inside = _dataset_label(data, loc[1]), loc[2:]
    fld = ctx.get("field") or ".".join(str(p) for p in inside
                                       if isinstance(p, str) and p != "[key]")
    return config_error(source, dataset, fld or "<top>", _message(err))


def parse_config(data: Any, source: str, base_dir: Path | None) -> PipelineConfig:
    """Validate an already-parsed YAML document; `base_dir` resolves relative paths."""
    if not isinstance(data, dict):
        raise config_error(source, None, "<top>", f"expected a mapping, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data, context=_Where(source, base_dir))
    except ValidationError as e:
        raise _to_config_error(e, data, source) from None


# --- paths ----------------------------------------------------------------------------------------

def _resolve_path(base: Path | None, p: str) -> str:
    if "://" in p or p.startswith("file:") or os.path.isabs(p) or base is None:
        return p if ("://" in p or p.startswith("file:")) else os.path.abspath(p)
    return str((base / p).resolve())


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


def _check_output_not_a_file(output: str) -> None:
    """An output root (or one of its parents) that is a file would fail at the first write."""
    local = _local_path(output)
    if local is None:
        return
    p = Path(local)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                what = "is a file" if q == p else f"lies under {q}, which is a file"
                raise _problem(f"{output} {what}, not a directory")
            return


def _comparable_root(uri: str) -> str:
    local = _local_path(uri)
    return (local if local is not None else uri).rstrip("/") + "/"


# --- loading ------------------------------------------------------------------------------------------

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
                raise config_error(
                    src, dataset, here, f"given twice (lines {seen[name] + 1} and "
                    f"{k.start_mark.line + 1}); YAML would silently keep the last")
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
