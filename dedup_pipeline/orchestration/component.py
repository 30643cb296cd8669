"""`DedupDataset`: one deduplicated dataset as a Dagster component (design.md D8).

A team adds a dataset to its own `dg` project with `dg scaffold defs dedup_pipeline.DedupDataset
clicks`; the `defs.yaml` attributes are one dataset of the config file (docs/operations.md,
"Configuration") plus an optional `spark:` section. The attributes are validated by the config's
own pydantic models (`config/models.py`), so a bad `defs.yaml` fails with the messages of a bad
config file (`config/errors.py`), naming the `defs.yaml` and the line. The definitions come from
the same builder as the standalone code location (`definitions.build_dataset_definitions`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import dagster as dg
from dagster.components.resolved.scopes import LoadContextScope
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, create_model

from dedup_pipeline.config import DatasetConfig, PipelineConfig, SparkConfig
from dedup_pipeline.config.errors import config_error, to_config_error
from dedup_pipeline.config.loading import component_document, error_path, load_config
from dedup_pipeline.config.models import Where, clash
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import format_hour, parse_hour, to_tag
from dedup_pipeline.orchestration import names
from dedup_pipeline.orchestration.definitions import build_dataset_definitions, spark_resource
from dedup_pipeline.orchestration.names import WRITTEN
from dedup_pipeline.orchestration.partitions import hourly_partitions
from dedup_pipeline.sample.demo import SCHEMA
from dedup_pipeline.sample.generate import default_start

PYTHON_SOURCE = "<DedupDataset attributes>"


class DedupDatasetAttributes(DatasetConfig):
    """One dataset (docs/operations.md, "Configuration"); paths relative to the `defs.yaml`.
    `spark:` as in the config file (C3); the environment wins. A run has one Spark session, so
    the DedupDatasets of a code location that give one give the same (`_shared_spark`)."""

    spark: SparkConfig | None = Field(None, description=(
        "Spark for every dataset of the code location (one session per run): give it in one "
        "defs.yaml, or the same in each; SPARK_REMOTE, SPARK_MASTER_URL and DEDUP_SPARK_CONF_* win"))
    sensors: Literal["running", "stopped"] = Field("running", description=(
        "whether the dataset's sensors (landing, index recovery, run-end) and its table upkeep "
        "schedule start running, or ship stopped for a person to turn on"), examples=["running"])
    group_name: str | None = Field(None, pattern=r"^[A-Za-z0-9_]+$", description=(
        "the Dagster asset group of the dataset's assets (default: its name)"),
        examples=["clicks"])


# The attributes that are the component's, not the dataset's (`COMPONENT_ONLY` but `spark:`, which
# the config's own model reads), validated apart: `DedupDatasetAttributes`' fields, one home.
ComponentOptions = create_model(
    "ComponentOptions", __config__=ConfigDict(extra="ignore", frozen=True),
    **{n: (f.annotation, f) for n, f in DedupDatasetAttributes.model_fields.items()
       if n in ("sensors", "group_name")})


class _Attributes(RootModel[dict[str, Any]]):
    """What Dagster checks before `load`: a mapping. Its JSON schema (`dg check yaml`, `dg utils
    inspect-component`, the UI's Components tab) is `DedupDatasetAttributes`'; `load` validates
    with the config's models, so the errors are the config's own."""

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return DedupDatasetAttributes.model_json_schema(*args, **kwargs)


def _line(source: str, tree: Any, path: list[Any]) -> str:
    """`defs.yaml:LINE` of a field of the attributes: the closest YAML node to its path."""
    if tree is None:
        return source
    position, _ = tree.lookup_closest_and_path(["attributes", *path], None)
    return f"{source}:{position.start.line}"


def parse_options(data: Any, source: str, tree: Any = None) -> Any:
    """The component's own attributes (`sensors:`, `group_name:`), an error at the field's line."""
    try:
        return ComponentOptions.model_validate(data if isinstance(data, dict) else {})
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        fld = str(err["loc"][0])
        raise config_error(_line(source, tree, [fld]), data.get("name"), fld, (
            f"must be running or stopped, got {err.get('input')!r}" if fld == "sensors" else
            f"letters, digits and _ only, got {err.get('input')!r}")) from None


def parse_attributes(data: Any, source: str, base: Path | None,
                     tree: Any = None) -> tuple[DatasetConfig, SparkConfig]:
    """A `defs.yaml`'s attributes as the config's models: the dataset and the Spark settings.
    Validated as a config file of this one dataset, so the rules and messages are the file's (C2)."""
    doc = component_document(data, source)
    try:
        cfg = PipelineConfig.model_validate(doc, context=Where(source, base))
    except ValidationError as e:
        raise to_config_error(e, doc, _line(source, tree, error_path(e))) from None
    return cfg.datasets[0], cfg.spark


class ScaffoldParams(BaseModel):
    """What `dg scaffold defs dedup_pipeline.DedupDataset <name>` takes besides the name:
    `--source-format csv --key event_id --key user_id`, or `--json-params '{"source_format":
    "csv", "key": ["event_id", "user_id"]}'` (`--format` is dg's own: yaml or python)."""

    source_format: Literal["jsonl", "csv", "parquet"] = Field(
        "jsonl", description="the landing files' format: jsonl, csv or parquet")
    key: list[str] = Field(default_factory=list, description=(
        "the dedup key's columns (repeat --key), from the template's schema: "
        + ", ".join(SCHEMA) + "; default event_id"))


class DedupDatasetScaffolder(dg.Scaffolder[ScaffoldParams]):
    """A `defs.yaml` whose example loads the sample data of `dedup-pipeline generate` for this
    dataset (its name, format and landing path) under the project's `data/`: a template per
    format, every command in its comments runnable as written from the project root."""

    @classmethod
    def get_scaffold_params(cls) -> type[ScaffoldParams]:
        return ScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[ScaffoldParams]) -> None:
        params = request.params if isinstance(request.params, ScaffoldParams) else (
            ScaffoldParams.model_validate(request.params or {}))
        unknown = [k for k in params.key if k not in SCHEMA]
        if unknown:
            raise ValueError(f"--key {', '.join(unknown)}: not a column of the template's schema "
                             f"({', '.join(SCHEMA)}); scaffold with one of them, then edit "
                             "source.schema and key in the defs.yaml together")
        name = re.sub(r"[^a-z0-9_]", "_", request.target_path.name.lower()) or "clicks"
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(scaffold_text(
            request.type_name, name, default_start(24), params.source_format,
            params.key or ["event_id"]))


def scaffold_text(type_name: str, name: str, start: str, fmt: str = "jsonl",
                  key: list[str] | None = None) -> str:
    """The scaffolded `defs.yaml` of dataset `name` reading `fmt` files (the template of that
    format), keyed on `key`."""
    key = key or ["event_id"]
    fingerprint = [c for c in ("user_id", "url") if c not in key] or ["amount"]
    sample = (SAMPLE.format(name=name, start=start, fmt=fmt) if fmt in GENERATED_FORMATS
              else NO_SAMPLE.format(name=name))
    return SCAFFOLD.format(type=type_name, name=name, start=start, fmt=fmt, sample=sample,
                           key=", ".join(key), fingerprint=", ".join(fingerprint),
                           format_options=FORMAT_OPTIONS[fmt])


GENERATED_FORMATS = ("jsonl", "csv")  # what `dedup-pipeline generate` writes
SAMPLE = ("# Sample data for it (24 hours, from the project root):\n"
          "#   dedup-pipeline generate --out data --dataset {name} --format {fmt} --hours 24 "
          "--rows-per-hour 2000 --start {start} --no-config\n")
NO_SAMPLE = """\
# Land Parquet files under data/landing/{name}/date=YYYY-MM-DD/hour=HH/, columns typed as
# source.schema says (dedup-pipeline generate writes JSONL and CSV only).
"""
FORMAT_OPTIONS = {
    "jsonl": "",
    "csv": '    csv: {header: true, delimiter: ","}   # the files\' first line names the columns\n',
    "parquet": "",
}
SCAFFOLD = """\
# One deduplicated dataset (dedup_pipeline): assets {name}/unique, duplicates, expired, rejected,
# index and raw_batch, hourly partitions, checks, a landing sensor (on) and jobs, all named {name}_*.
# Every field, described: `dg utils inspect-component {type}`, the UI's Components
# tab and dedup_pipeline's docs/operations.md. Relative paths resolve against this file's
# directory; the example keeps the data under the project's data/.
# Check every dataset of the project (each field at its line, the datasets against each other):
#   dg check defs        (dg check yaml checks one defs.yaml per component type)
{sample}\
# Load its first hour, recorded where dg dev shows it (DAGSTER_HOME: the same for both):
#   dg launch --job {name}_hourly_load --partition {start}
type: {type}
attributes:
  name: {name}                          # asset key prefix, [a-z0-9_]+
  start: "{start}"             # first hourly partition (UTC)
  source:
    path: "{{{{ context.project_root }}}}/data/landing/{name}"   # hour H: date=YYYY-MM-DD/hour=HH/
    format: {fmt}                       # jsonl | csv | parquet
{format_options}\
    schema: {{event_id: string, user_id: string, event_time: timestamp, url: string, amount: double}}
  key: [{key}]                       # dedup key: one or more columns
  fingerprint: [{fingerprint}]           # same key, other fingerprint: a conflict (optional)
  order_by: event_time                  # tie-break inside a batch, earliest wins (optional)
  expiry: {{column: event_time, period: 24h, basis: event}}   # optional: older records expire
  output: "{{{{ context.project_root }}}}/data/warehouse/{name}"  # root of every output
  output_format: delta                  # each output a Delta table (default) | parquet
  # landing: {{marker: _SUCCESS, grace: 15m}}   # when an hour is complete (the landing sensor)
  # sensors: stopped                            # ship its sensors stopped (default: running)
  # group_name: {name}                           # its asset group (default: its name)
  # asset_key_prefix: [team]                     # asset keys team/{name}/unique (default {name}/unique)
  # spark: {{master: "local[*]"}}                # or SPARK_REMOTE / SPARK_MASTER_URL (they win)
"""


@dg.scaffold_with(DedupDatasetScaffolder)
class DedupDataset(dg.Component):
    """A deduplicated hourly dataset on Spark: unique, duplicates, expired and rejected Delta tables.

    Each hour's batch of at-least-once records is split into four disjoint outputs against a key
    index; loads can be rerun, backfilled and recovered after a crash without losing or doubling a
    record. The attributes are one dataset of dedup_pipeline's config (docs/operations.md,
    "Configuration"); the component adds the dataset's assets (`<name>/unique`, ...), asset checks,
    jobs, sensors, schedules and the `dedup_spark` resource. Dagster instance: a pool limit of 1 per
    dataset (`concurrency.pools: {default_limit: 1, granularity: run}`).
    """

    def __init__(self, dataset: DatasetConfig, spark: SparkConfig | None = None,
                 source: str = PYTHON_SOURCE, tree: Any = None,
                 options: Any = None) -> None:
        self.dataset = dataset
        self.options = options or ComponentOptions()
        self.spark = spark or SparkConfig()
        self.source, self._tree = source, tree

    def where(self, *path: str) -> str:
        """Where a field of this component's attributes is written: `defs.yaml:LINE`."""
        return _line(self.source, self._tree, list(path))

    @classmethod
    def get_model_cls(cls) -> type[_Attributes]:
        return _Attributes

    @classmethod
    def get_spec(cls) -> dg.ComponentTypeSpec:
        return dg.ComponentTypeSpec(tags=["spark", "delta", "deduplication"],
                                    produces=["asset", "asset_check", "job", "sensor", "schedule",
                                              "resource"])

    @classmethod
    def load(cls, attributes: Any, context: dg.ComponentLoadContext) -> DedupDataset:
        """Templates rendered (`{{ env.X }}`, `{{ context.project_root }}`), then validated as the
        config's models with paths relative to the `defs.yaml`."""
        rendering = context.with_rendering_scope({"context": LoadContextScope(context)})
        resolution = rendering.resolution_context.at_path("attributes")
        data = resolution.resolve_value(attributes.root if attributes is not None else {})
        tree = resolution.source_position_tree
        if tree is not None:
            source = tree.position.filename
            base: Path | None = Path(source).resolve().parent
        else:  # built in Python (`from_attributes_dict`): paths against the working directory
            source, base = PYTHON_SOURCE, None
        dataset, spark = parse_attributes(data, source, base, tree)
        return cls(dataset, spark, source, tree, parse_options(data, source, tree))

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """This dataset's definitions, once it is checked against every other DedupDataset of
        the code location as a config file checks its datasets (C2), and given the one `spark`
        resource they share."""
        peers = _peers(self, context)
        return build_dataset_definitions(self.dataset, spark_resource(_shared_spark(peers)),
                                         running=self.options.sensors == "running",
                                         group=self.options.group_name)


def _peers(component: DedupDataset, context: dg.ComponentLoadContext) -> list[DedupDataset]:
    """Every DedupDataset of the code location (this one first when built alone), refused with
    the config file's message if two cannot live side by side: a name shared, an output tree
    equal to, inside or around another's (C2), located at the later one's `defs.yaml` line."""
    tree = context.component_tree
    # a tree without a defs package to walk (a component built in Python for a test) has no peers
    walkable = isinstance(getattr(tree, "defs_module", None), ModuleType)
    peers = tree.get_all_components(of_type=DedupDataset) if walkable else []
    if not any(p is component for p in peers):
        peers = [component, *peers]
    by_id = {id(p.dataset): p for p in peers}
    found = clash([p.dataset for p in peers], lambda d: by_id[id(d)].source)
    if found is not None:
        at = by_id[id(found.dataset)]
        raise config_error(at.where(found.field), found.dataset.name, found.field, found.problem)
    return peers


def _shared_spark(peers: list[DedupDataset]) -> SparkConfig:
    """The Spark settings of the code location: a run has one Spark session, so the components
    that give a `spark:` section give the same one; those without take it."""
    given = [p for p in peers if p.spark != SparkConfig()]
    for p in given[1:]:
        if p.spark != given[0].spark:
            first = given[0]
            raise config_error(p.where("spark"), p.dataset.name, "spark", (
                f"differs from the spark: of dataset {first.dataset.name!r} (in {first.source}); "
                "a code location runs one Spark session: give the same settings, or give them in "
                "one defs.yaml only (the others take them)"))
    return given[0].spark if given else SparkConfig()


@dataclass(frozen=True)
class DatasetAssets:
    """What code downstream of a `DedupDataset` needs, read from its `defs.yaml` (as
    dagster-dbt's `get_asset_key_for_model`): the dataset's partitions definition, its output
    asset keys and tables, and a guard that an hour is loaded before it is read."""

    dataset: DatasetConfig
    partitions_def: dg.HourlyPartitionsDefinition

    def asset_key(self, output: str = "unique") -> dg.AssetKey:
        """The asset key of an output (unique, duplicates, expired, rejected) or the index."""
        if output not in WRITTEN:
            raise ValueError(f"no output {output!r} (have: {', '.join(WRITTEN)})")
        return names.asset_key(self.dataset, output)

    def table_path(self, output: str = "unique") -> str:
        """Where the output's table is (a Delta table unless `output_format: parquet`)."""
        self.asset_key(output)  # a known output
        return f"{self.dataset.output}/{output}"

    def require_loaded(self, partition_key: str) -> str:
        """The hour's `load_hour` value (2026-11-01-05) if the hour is loaded (its commit record
        exists); else a `dg.Failure` saying so and how to load it, so a downstream asset never
        materializes an hour that holds no rows yet as if it were empty."""
        hour = parse_hour(partition_key)
        tag = to_tag(hour)
        if CommitLog(Storage(self.dataset.output)).read(tag) is None:
            name = self.dataset.name
            raise dg.Failure(description=(
                f"{name} hour {format_hour(hour)} is not loaded (no commit record in "
                f"{self.dataset.output}/_commits), so there is nothing to read yet. Load it "
                f"first: dg launch --job {name}_hourly_load --partition {format_hour(hour)} (or "
                "the landing sensor, once the hour's files are complete); then run this again."))
        return tag


def dataset_assets(defs_yaml: str | Path) -> DatasetAssets:
    """The `DatasetAssets` of the dataset a `defs.yaml` declares (templates rendered as the
    command line renders them: `{{ context.project_root }}`, `{{ env.NAME }}`)."""
    ds = load_config(defs_yaml).datasets[0]
    return DatasetAssets(ds, hourly_partitions(ds))
