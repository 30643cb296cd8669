"""The config's models (design.md C1): the YAML as frozen pydantic models that forbid unknown keys.

A field's own shape is its type; rules that tie fields together are one after-validator of the
model holding them all (`DatasetConfig._fits_its_schema`, `PipelineConfig._datasets_apart`).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dedup_pipeline.config.errors import ConfigError, problem
from dedup_pipeline.hours import PARTITION_FMT
from dedup_pipeline.units import ExpiryKind, default_slice_span, in_units, kind_of, parse_duration_micros
from dedup_pipeline.uris import comparable_root, file_in_the_way, local_path, resolve_path

ColumnType = Literal["string", "long", "double", "boolean", "timestamp", "date"]
Format = Literal["jsonl", "csv", "parquet"]
Basis = Literal["event", "processing"]
NAME_RE = re.compile(r"^[a-z0-9_]+$")
BUILTIN_DEMO = "<built-in demo>"


# --- field types: the shape of a value, with its own message -------------------------------------

def _written(v: Any) -> Any:
    """A value YAML typed (a number, a date) read as the text it was written as ('24', '0.5')."""
    return v if v is None or isinstance(v, bool | list | dict) else str(v)


def _unique(what: str) -> Any:
    """A validator: one name or a list of them -> a tuple of unique names (`what` are they)."""
    def check(v: Any) -> Any:
        if isinstance(v, str) and what == "column":
            v = [v]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
            raise problem(f"expected a non-empty list of {what} names")
        if len(set(v)) != len(v):
            raise problem(f"lists a {what} twice")
        return tuple(v)
    return check


_names = _unique("column")


def _optional_names(v: Any) -> Any:
    return () if v is None else _names(v)  # absent (null) is none


def _seconds(v: Any) -> Any:
    """`landing.grace` is written as a duration and kept in seconds."""
    try:
        return parse_duration_micros(v) / 1e6
    except ValueError as e:
        raise problem(str(e)) from None


def _none_is_empty(v: Any) -> Any:
    """An empty section (`index:` with nothing under it) means its defaults."""
    return {} if v is None else v


# `json_schema_input_type`: what YAML may hold before the validator (the component's JSON schema,
# which `dg check yaml` and the UI's docs read, orchestration/component.py)
Written = Annotated[str, BeforeValidator(_written, json_schema_input_type=str | int | float)]
Names = Annotated[tuple[str, ...], BeforeValidator(_names, json_schema_input_type=str | list[str])]
Seconds = Annotated[float, BeforeValidator(_seconds, json_schema_input_type=str | int | float)]


def _section(model: type) -> BeforeValidator:
    return BeforeValidator(_none_is_empty, json_schema_input_type=model | None)


class _Model(BaseModel):
    """Frozen, no unknown keys, no silent coercion (`"yes"` is not a boolean)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """An unknown key is named with the keys allowed where it stands."""
        if isinstance(data, dict):
            allowed = sorted(f.alias or n for n, f in cls.model_fields.items())
            if (key := next((k for k in data if k not in allowed), None)) is not None:
                raise problem(f"unknown key (allowed: {', '.join(allowed)})", key=key)
        return data


@dataclass(frozen=True)
class Where:
    """The validation context: the file the document came from, its directory for relative paths."""

    source: str
    base: Path | None


def _resolved(v: str, info: ValidationInfo) -> str:
    """A path made absolute against the config file's directory (URIs are kept as written)."""
    return resolve_path(info.context.base if isinstance(info.context, Where) else None, v)


PathText = Annotated[str, AfterValidator(_resolved)]
_DELTA_UNSAFE = re.compile(r"%[0-9A-Fa-f]{2}|[\\\x00-\x1f\x7f]")


class _FromFile(_Model):
    """A model that remembers the config file it was read from (commands in messages name it)."""

    _config_file: str = PrivateAttr(BUILTIN_DEMO)

    def model_post_init(self, context: Any, /) -> None:
        if isinstance(context, Where):
            self._config_file = context.source

    @property
    def config_file(self) -> str:
        """The config file, or BUILTIN_DEMO."""
        return self._config_file


# --- the models -----------------------------------------------------------------------------------

class CsvConfig(_Model):
    """`source.csv`: RFC 4180 files with or without a header line."""

    header: bool = True
    delimiter: str = Field(",", min_length=1, max_length=1)


class SourceConfig(_Model):
    """`source`: where hour H's files land ({path}/date=YYYY-MM-DD/hour=HH/) and how to read them."""

    path: PathText
    format: Format
    schema_: dict[str, ColumnType] = Field(alias="schema", min_length=1)
    csv: Annotated[CsvConfig, _section(CsvConfig)] = CsvConfig()

    @field_validator("schema_")
    @classmethod
    def _column_names(cls, v: dict[str, str]) -> dict[str, str]:
        for col in v:
            if not col or col.startswith("_"):
                raise problem(f"bad column name {col!r} (names starting with _ are reserved for "
                              "the pipeline's own columns)")
        return v

    @property
    def schema(self) -> dict[str, str]:  # type: ignore[override]
        """column -> declared type (`schema` is a BaseModel method name, hence the alias)."""
        return self.schema_


class ExpiryConfig(_Model):
    """The `expiry:` section (R6); the period as written (`DatasetConfig.expiry_period` reads it)."""

    column: str
    period_text: Written = Field(alias="period")
    basis: Basis = "event"
    categories: Annotated[tuple[str, ...], BeforeValidator(_unique("category"))] | None = None


class IndexConfig(_Model):
    """`index`: how the key index is kept (R2, R7); every field has a default."""

    store_keys: bool = False
    buckets: int = Field(8, ge=1, le=4096)  # hash buckets of the index when no expiry is configured
    slice_span: Written | None = None  # an index slice's width as written (`DatasetConfig.slice_span`)
    retention_lag_hours: int = Field(168, ge=0)  # keep expired index slices this long (R7, R10)
    compact_after: int = 8  # merge a slice's per-load directories once it has this many; 0: never

    @field_validator("compact_after")
    @classmethod
    def _never_or_two(cls, v: int) -> int:
        if v == 1 or v < 0:
            raise problem(f"expected 0 (never) or an integer >= 2, got {v!r}")
        return v


class LandingConfig(_Model):
    """When an hour's input is complete (the landing sensor, design.md D2)."""

    marker: str | None = "_SUCCESS"  # file whose presence in the hour's directory closes the hour
    grace_s: Seconds = Field(900.0, alias="grace")  # without a marker: complete this long after
    watch_hours: int = Field(48, ge=0)  # how many loaded hours back to look for late files
    # how often the landing sensor looks (Dagster's minimum interval between its ticks)
    check_every_s: Seconds = Field(30.0, alias="check_every", ge=5, le=3600)

    @field_validator("marker")
    @classmethod
    def _file_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or "/" in v):
            raise problem(f"expected a file name or null, got {v!r}")
        return v


def _whole(v: Any) -> Any:
    """`max_index_keys: 1.0e9` reads as the integer it names."""
    return int(v) if isinstance(v, float) and math.isfinite(v) and v >= 0 else v


class ChecksConfig(_Model):
    """Thresholds of the asset checks (design.md D4); a breach is a WARN, not a failure."""

    max_index_keys: Annotated[int, BeforeValidator(_whole, json_schema_input_type=int | float)] = Field(
        1_000_000_000, ge=0)
    max_duplicate_rate: float = Field(0.5, ge=0, le=1)
    max_conflict_rate: float = Field(0.05, ge=0, le=1)
    max_rejected_rate: float = Field(0.05, ge=0, le=1)


class DatasetConfig(_FromFile):
    """One dataset (C1). A `start` in the future is accepted: no hour is ready before it."""

    name: str
    start: Written  # partition key of the first hour (UTC)
    source: SourceConfig
    key: Names
    fingerprint: Annotated[tuple[str, ...], BeforeValidator(
        _optional_names, json_schema_input_type=str | list[str] | None)] = ()  # or "all"
    order_by: str | None = None
    expiry: ExpiryConfig | None = None
    output: PathText
    index: Annotated[IndexConfig, _section(IndexConfig)] = IndexConfig()
    landing: Annotated[LandingConfig, _section(LandingConfig)] = LandingConfig()
    checks: Annotated[ChecksConfig, _section(ChecksConfig)] = ChecksConfig()
    on_damaged_index: Literal["fail", "rebuild"] = "fail"
    # delta: each output is a Delta table over its Parquet files (engine/lake.py), readers see
    # committed hours only; parquet: plain Hive-partitioned Parquet directories
    output_format: Literal["delta", "parquet"] = "delta"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise problem(f"must match [a-z0-9_]+, got {v!r}")
        return v

    @field_validator("start")
    @classmethod
    def _on_the_hour(cls, v: str) -> str:
        try:
            dt = datetime.strptime(v, PARTITION_FMT)
        except ValueError:
            raise problem(f"expected 'YYYY-MM-DD-HH:00' (UTC), got {v!r}") from None
        if dt.minute:
            raise problem(f"must be on the hour, got {v!r}")
        return dt.strftime(PARTITION_FMT)

    @field_validator("output")
    @classmethod
    def _output_dir(cls, v: str) -> str:
        if (why := file_in_the_way(v)) is not None:
            raise problem(why)
        return v

    @model_validator(mode="after")
    def _delta_can_open_the_root(self) -> DatasetConfig:
        """delta-rs decodes a local table's path once more when it creates the table: a root
        holding a percent escape (`%41`), a backslash or a control character would put the
        table's log where it never reads it (docs/design.md R9a). Every other character works."""
        local = local_path(self.output) if self.output_format == "delta" else None
        if local is not None and (m := _DELTA_UNSAFE.search(local)) is not None:
            raise problem(f"the Delta tables cannot live under {self.output!r}: it holds "
                          f"{m.group()!r}, which the Delta library (delta-rs) cannot keep in a "
                          "table's path; rename the directory, or set output_format: parquet",
                          "output")
        return self

    @model_validator(mode="before")
    @classmethod
    def _fingerprint_all(cls, data: Any) -> Any:
        """`fingerprint: all` names every non-key column of the schema (R5)."""
        if not isinstance(data, dict) or data.get("fingerprint") != "all":
            return data
        source, key = data.get("source"), data.get("key")
        schema = source.get("schema") if isinstance(source, dict) else None
        if not isinstance(schema, dict) or not isinstance(key, str | list):
            return {**data, "fingerprint": None}  # their own error is reported
        cols = [c for c in schema if c not in ([key] if isinstance(key, str) else key)]
        if not cols:
            raise problem("'all' needs at least one non-key column", "fingerprint")
        return {**data, "fingerprint": cols}

    @model_validator(mode="after")
    def _fits_its_schema(self) -> DatasetConfig:
        """The columns named are in the schema; the expiry column's type decides what an expiry
        can be and how its period and the index slice span read (in the expiry value's units)."""
        schema, e = self.source.schema, self.expiry
        named = [("key", c) for c in self.key] + [("fingerprint", c) for c in self.fingerprint]
        named += [("order_by", self.order_by)] if self.order_by is not None else []
        named += [("expiry.column", e.column)] if e is not None else []
        for fld, c in named:
            if c not in schema:
                raise problem(f"column {c!r} is not in source.schema", fld)
        if e is None:
            if self.index.slice_span is not None:
                raise problem("only applies when expiry is configured", "index.slice_span")
            return self
        ctype, categorical = schema[e.column], e.categories is not None
        kind = kind_of(ctype, categorical)
        if kind is None:
            raise problem(f"a categorical expiry needs a string column, {e.column!r} is {ctype}"
                          if categorical else f"{e.column!r} has type {ctype}; expiry needs timestamp, "
                          "date, long, double, or a string column with categories", "expiry.column")
        if e.basis != "event" and (categorical or kind != "timestamp"):
            raise problem("a categorical expiry only supports basis 'event'" if categorical
                          else "basis 'processing' needs a timestamp column", "expiry.basis")
        for fld, written in (("expiry.period", e.period_text), ("index.slice_span", self.index.slice_span)):
            if written is None:
                continue
            try:
                value = in_units(kind, written)
            except ValueError as err:
                raise problem(str(err), fld) from None
            if fld == "index.slice_span" and value <= 0:
                raise problem("must be > 0", fld)
        return self

    @property
    def expiry_type(self) -> ExpiryKind | None:
        """Kind of the expiry value: the expiry column's type, or 'category' (units.kind_of)."""
        if self.expiry is None:
            return None
        return kind_of(self.source.schema[self.expiry.column], self.expiry.categories is not None)

    @property
    def expiry_period(self) -> float:
        """The expiry period in the expiry value's units (`units.in_units` of the column's kind)."""
        kind = self.expiry_type
        assert self.expiry is not None and kind is not None
        return in_units(kind, self.expiry.period_text)

    @property
    def slice_span(self) -> float:
        """Width of one index slice in expiry-value units (Apex's bucket span): the configured
        `index.slice_span`, else `units.default_slice_span` of the period."""
        kind = self.expiry_type
        assert self.expiry is not None and kind is not None
        if self.index.slice_span is not None:
            return in_units(kind, self.index.slice_span)
        return default_slice_span(kind, self.expiry_period)


def _spark_conf(v: Any) -> Any:
    """Spark settings are strings; `spark.executor.cores: 2` is written as a YAML number."""
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else _none_is_empty(v)


class SparkConfig(_Model):
    """The file's `spark:` section (C3); the environment overrides it (engine/session.py)."""

    master: str | None = None
    remote: str | None = None
    conf: Annotated[dict[str, str], BeforeValidator(
        _spark_conf, json_schema_input_type=dict[str, str | int | float | bool] | None)] = {}

    @model_validator(mode="after")
    def _master_or_remote(self) -> SparkConfig:
        if self.master and self.remote:
            raise problem("set master or remote, not both (Spark rejects the pair)")
        return self


def _datasets(v: Any) -> Any:
    if not isinstance(v, list) or not v:
        raise problem("expected a non-empty list of datasets")
    return tuple(v)


class PipelineConfig(_FromFile):
    """The whole file: its datasets and the Spark settings."""

    datasets: Annotated[tuple[DatasetConfig, ...], BeforeValidator(_datasets)]
    spark: Annotated[SparkConfig, _section(SparkConfig)] = SparkConfig()

    @model_validator(mode="after")
    def _datasets_apart(self) -> PipelineConfig:
        """C2: names are unique and each dataset owns its output tree (one output equal to or
        inside another corrupts it)."""
        names = [d.name for d in self.datasets]
        if (twice := next((n for i, n in enumerate(names) if n in names[:i]), None)) is not None:
            raise problem("two datasets share this name", "name", twice)
        roots = [(d, comparable_root(d.output)) for d in self.datasets]
        for (d, root), (other, other_root) in itertools.permutations(roots, 2):
            if root == other_root:
                raise problem(f"{d.output} is also the output of dataset {other.name!r}", "output", d.name)
            if root.startswith(other_root):
                raise problem(f"{d.output} lies inside the output of dataset {other.name!r} "
                              f"({other.output}); each dataset needs its own directory", "output", d.name)
        return self

    def dataset(self, name: str | None) -> DatasetConfig:
        """The dataset called `name`; None picks the only one (commands' `--dataset`)."""
        found = [d for d in self.datasets if name is None or d.name == name]
        if len(found) == 1:
            return found[0]
        names = ", ".join(d.name for d in self.datasets)
        raise ConfigError(f"{self.config_file}: " + (
            f"several datasets ({names}); choose one with --dataset" if name is None
            else f"no dataset named {name!r} (have: {names})"))
