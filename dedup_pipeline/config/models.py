"""The config's models (design.md C1): the YAML as frozen pydantic models that forbid unknown keys.

A field's own shape is its type; rules that tie fields together are one after-validator of the
model holding them all (`DatasetConfig._fits_its_schema`, `PipelineConfig._datasets_apart`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
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
    WithJsonSchema,
    field_validator,
    model_validator,
)

from dedup_pipeline.config.errors import ConfigError, problem
from dedup_pipeline.hours import PARTITION_FMT
from dedup_pipeline.redaction import is_secret_setting, redact_url
from dedup_pipeline.units import (
    DURATION_RE,
    ExpiryKind,
    default_slice_span,
    in_units,
    kind_of,
    parse_duration_micros,
)
from dedup_pipeline.uris import comparable_root, file_in_the_way, local_path, resolve_path

ColumnType = Literal["string", "long", "double", "boolean", "timestamp", "date"]
Format = Literal["jsonl", "csv", "parquet"]
Basis = Literal["event", "processing"]
NAME_RE = re.compile(r"^[a-z0-9_]+$")
KEY_PART_RE = re.compile(r"^[A-Za-z0-9_]+$")  # a part of a Dagster asset key
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


def _key_prefix(v: Any) -> Any:
    """`asset_key_prefix: team` or `[team, raw]`; absent (null) or `[]` is none."""
    if v is None:
        return ()
    v = [v] if isinstance(v, str) else v
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise problem("expected a list of asset key parts, e.g. [team, raw]")
    return tuple(v)


def _seconds(v: Any) -> Any:
    """`landing.grace` is written as a duration and kept in seconds."""
    try:
        return parse_duration_micros(v) / 1e6
    except ValueError as e:
        raise problem(str(e)) from None


def _none_is_empty(v: Any) -> Any:
    """An empty section (`index:` with nothing under it) means its defaults."""
    return {} if v is None else v


# `json_schema_input_type` and `WithJsonSchema`: what YAML may hold before the validator, as the
# component's JSON schema says it (`dg check yaml` checks a defs.yaml against it before anything
# runs; `dg utils inspect-component` and the UI's docs show it, orchestration/component.py). A
# pattern there accepts all the validator accepts, and a `{{ template }}` the component renders.
_TEMPLATE = {"type": "string", "pattern": r"\{\{.*\}\}"}
_NUMBER_TEXT = r"^\s*[-+]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][-+]?\d+)?\s*$"


def _text(pattern: str, *more: dict[str, Any]) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [{"type": "string", "pattern": pattern}, *more, _TEMPLATE]})


Written = Annotated[str, BeforeValidator(_written, json_schema_input_type=str | int | float)]
# a period or span: a duration (timestamps, dates) or a number (numeric and categorical columns)
Amount = Annotated[Written, _text(f"{DURATION_RE.pattern}|{_NUMBER_TEXT}",
                                  {"type": "number", "minimum": 0})]
HourText = Annotated[Written, _text(r"^\d{4}-\d{1,2}-\d{1,2}-\d{1,2}:00?$")]
Names = Annotated[tuple[str, ...], BeforeValidator(_names, json_schema_input_type=str | list[str])]
Seconds = Annotated[float, BeforeValidator(_seconds), _text(DURATION_RE.pattern)]


def _section(model: type) -> BeforeValidator:
    return BeforeValidator(_none_is_empty, json_schema_input_type=model | None)


def _defaults_as_examples(schema: dict[str, Any]) -> None:
    """The example `defs.yaml` Dagster draws from the schema (the UI's component page) shows a
    field's `examples`, never its default: a field with a default is its own example."""
    for prop in schema.get("properties", {}).values():
        if prop.get("default") not in (None, {}, []) and "examples" not in prop:
            prop["examples"] = [prop["default"]]


class _Model(BaseModel):
    """Frozen, no unknown keys, no silent coercion (`"yes"` is not a boolean)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True,
                              json_schema_extra=_defaults_as_examples)

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

    header: bool = Field(True, description="the files' first line is a header, skipped (columns "
                         "are read by position)")
    delimiter: str = Field(",", min_length=1, max_length=1, description="one character")


class SourceConfig(_Model):
    """`source`: where hour H's files land ({path}/date=YYYY-MM-DD/hour=HH/) and how to read them."""

    path: PathText = Field(description="landing root: hour H is read from "
                           "{path}/date=YYYY-MM-DD/hour=HH/", examples=["landing/clicks"])
    format: Format = Field(description="the landing files' format", examples=["jsonl"])
    schema_: dict[str, ColumnType] = Field(
        alias="schema", min_length=1, description="column: type (CSV: in the files' order)",
        examples=[{"event_id": "string", "user_id": "string", "event_time": "timestamp",
                   "url": "string"}])
    csv: Annotated[CsvConfig, _section(CsvConfig)] = Field(
        default_factory=CsvConfig, description="CSV columns are read by position, in schema order")

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

    column: str = Field(description="the column whose value ages a record", examples=["event_time"])
    period_text: Amount = Field(alias="period", description=(
        "how long a key is held: timestamps 90s, 30m, 24h, 7d; dates whole days; numbers a number"
        ), examples=["24h"])
    basis: Basis = Field("event", description="what the period counts back from: event, the "
                         "newest value loaded so far; processing, the end of the load's hour "
                         "(timestamps only)")
    categories: Annotated[tuple[str, ...], BeforeValidator(_unique("category"))] | None = Field(
        None, description="categorical expiry: a string column's values, oldest first")


class IndexConfig(_Model):
    """`index`: how the key index is kept (R2, R7); every field has a default."""

    store_keys: bool = Field(False, description="keep each key's text beside its digest (adversarial "
                             "keys)")
    buckets: int = Field(8, ge=1, le=4096, description="hash buckets of the index when no expiry "
                         "is configured")
    slice_span: Amount | None = Field(None, description="an index slice's width, in the period's "
                                      "units (default: a quarter of the period)", examples=["6h"])
    retention_lag_hours: int = Field(168, ge=0, description="keep expired index slices this long "
                                     "(reruns of older hours need them)")
    compact_after: int = Field(8, description="merge a slice's per-load directories once it has "
                               "this many; 0: never")

    @field_validator("compact_after")
    @classmethod
    def _never_or_two(cls, v: int) -> int:
        if v == 1 or v < 0:
            raise problem(f"expected 0 (never) or an integer >= 2, got {v!r}")
        return v


class LandingConfig(_Model):
    """When an hour's input is complete (the landing sensor, design.md D2)."""

    marker: str | None = Field("_SUCCESS", description="the file whose presence in the hour's "
                               "directory closes the hour; null: the grace alone")
    grace_s: Seconds = Field(900.0, alias="grace", json_schema_extra={"default": "15m"},
                             description="without a marker: an hour is complete this long after "
                             "its newest file")
    watch_hours: int = Field(48, ge=0, description="how many loaded hours back to look for late "
                             "files")
    check_every_s: Seconds = Field(30.0, alias="check_every", ge=5, le=3600,
                                  json_schema_extra={"default": "30s"},
                                  description="how often the landing sensor looks (5s to 1h)")

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
        1_000_000_000, ge=0, description="warn when the index holds more keys")
    max_duplicate_rate: float = Field(0.5, ge=0, le=1, description="warn above this share of "
                                      "duplicates in an hour")
    max_conflict_rate: float = Field(0.05, ge=0, le=1, description="warn above this share of "
                                     "duplicates whose fingerprint differs")
    max_rejected_rate: float = Field(0.05, ge=0, le=1, description="warn above this share of "
                                     "rejected rows")


class DatasetConfig(_FromFile):
    """One dataset (C1). A `start` in the future is accepted: no hour is ready before it."""

    name: str = Field(json_schema_extra={"pattern": NAME_RE.pattern}, examples=["clicks"],
                      description="the dataset's asset key prefix and the start of its every "
                      "Dagster name, [a-z0-9_]+")
    start: HourText = Field(description="the first hourly partition, YYYY-MM-DD-HH:00 (UTC)",
                            examples=["2026-11-01-00:00"])
    source: SourceConfig = Field(description="where each hour's files land and how to read them")
    key: Names = Field(description="the dedup key: one or more columns", examples=[["event_id"]])
    fingerprint: Annotated[tuple[str, ...], BeforeValidator(
        _optional_names, json_schema_input_type=str | list[str] | None)] = Field(
        (), description="columns whose difference makes a duplicate a conflict; all: every "
        "non-key column", examples=[["user_id", "url"]])
    order_by: str | None = Field(None, description="tie-break inside a batch: the earliest "
                                 "record of a key wins", examples=["event_time"])
    expiry: ExpiryConfig | None = Field(None, description="older records expire; without it "
                                        "nothing ever does")
    output: PathText = Field(description="the root of every output of this dataset (its own "
                             "directory)", examples=["warehouse/clicks"])
    index: Annotated[IndexConfig, _section(IndexConfig)] = Field(
        default_factory=IndexConfig, description="how the key index is kept")
    landing: Annotated[LandingConfig, _section(LandingConfig)] = Field(
        default_factory=LandingConfig, description="when an hour's input is complete (the "
        "landing sensor)")
    checks: Annotated[ChecksConfig, _section(ChecksConfig)] = Field(
        default_factory=ChecksConfig, description="thresholds of the asset checks (a breach warns)")
    on_damaged_index: Literal["fail", "rebuild"] = Field(
        "fail", description="a load that finds the index damaged: fail, or rebuild it and load")
    output_format: Literal["delta", "parquet"] = Field(
        "delta", description="delta: each output a Delta table, readers see committed hours only; "
        "parquet: plain Hive-partitioned directories")
    asset_key_prefix: Annotated[tuple[str, ...], BeforeValidator(
        _key_prefix, json_schema_input_type=str | list[str] | None)] = Field(
        (), description="put the dataset's Dagster asset keys under this prefix: "
        "[*asset_key_prefix, name, output] (default: none, [name, output])",
        examples=[["team", "raw"]])

    @field_validator("asset_key_prefix")
    @classmethod
    def _key_parts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for part in v:
            if not KEY_PART_RE.match(part):
                raise problem(f"each part must match [A-Za-z0-9_]+, got {part!r}")
        return v

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

    master: str | None = Field(None, description="spark.master, e.g. local[*], spark://host:7077 "
                               "(SPARK_MASTER_URL wins)", examples=["local[*]"])
    remote: str | None = Field(None, description="a Spark Connect URL, e.g. sc://host:15002 "
                               "(SPARK_REMOTE wins)")
    conf: Annotated[dict[str, str], BeforeValidator(
        _spark_conf, json_schema_input_type=dict[str, str | int | float | bool] | None)] = Field(
        default_factory=dict, description="Spark settings, e.g. spark.driver.memory: 4g")

    @field_validator("remote")
    @classmethod
    def _no_token_in_remote(cls, v: str | None) -> str | None:
        if v is not None and redact_url(v) != v:
            raise problem("a Spark Connect token does not belong in a config file (the UI and "
                          "every run's config show it): drop ;token= and set "
                          "SPARK_CONNECT_AUTHENTICATE_TOKEN or DEDUP_SPARK_CONNECT_TOKEN_FILE "
                          "where runs start (docs/operations.md, \"Security\")")
        return v

    @field_validator("conf")
    @classmethod
    def _no_secret_settings(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if is_secret_setting(k):
                raise problem(f"{k} holds a secret, which does not belong in a config file (the "
                              "UI and every run's config show it): set it in the environment "
                              f"where runs start, as DEDUP_SPARK_CONF_{k.replace('.', '__')} "
                              "(docs/operations.md, \"Security\")", key=k)
        return v

    @model_validator(mode="after")
    def _master_or_remote(self) -> SparkConfig:
        if self.master and self.remote:
            raise problem("set master or remote, not both (Spark rejects the pair)")
        return self


@dataclass(frozen=True)
class Clash:
    """A dataset that cannot live beside another (C2): which, in which field, and why."""

    dataset: DatasetConfig
    field: str
    problem: str


def clash(datasets: Sequence[DatasetConfig], where: Callable[[DatasetConfig], str] = lambda d: ""
          ) -> Clash | None:
    """C2 across datasets, the first breach, blamed on the later dataset: a name shared, or an
    output equal to, inside or around another's (one output tree written by two datasets
    corrupts it). `where` names the file the other dataset is declared in when that is another
    (a component's `defs.yaml`)."""
    for i, d in enumerate(datasets):
        root = comparable_root(d.output)
        for other in datasets[:i]:
            other_root, file = comparable_root(other.output), where(other)
            at, also = (f" (in {file})", f", in {file}") if file else ("", "")
            if d.name == other.name:
                return Clash(d, "name", f"two datasets share this name{at}")
            if root == other_root:
                return Clash(d, "output", f"{d.output} is also the output of dataset "
                             f"{other.name!r}{at}")
            for inner, outer, verb in ((root, other_root, "lies inside"),
                                       (other_root, root, "holds")):
                if inner.startswith(outer):
                    return Clash(d, "output", f"{d.output} {verb} the output of dataset "
                                 f"{other.name!r} ({other.output}{also}); each dataset needs "
                                 "its own directory")
    return None


def _datasets(v: Any) -> Any:
    if not isinstance(v, list) or not v:
        raise problem("expected a non-empty list of datasets")
    return tuple(v)


class PipelineConfig(_FromFile):
    """The whole file: its datasets and the Spark settings."""

    datasets: Annotated[tuple[DatasetConfig, ...], BeforeValidator(_datasets)]
    spark: Annotated[SparkConfig, _section(SparkConfig)] = Field(default_factory=SparkConfig)

    @model_validator(mode="after")
    def _datasets_apart(self) -> PipelineConfig:
        if (c := clash(self.datasets)) is not None:
            raise problem(c.problem, c.field, c.dataset.name)
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
