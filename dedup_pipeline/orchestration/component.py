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
import textwrap
from pathlib import Path
from typing import Any

import dagster as dg
from dagster.components.core.component_tree import TestComponentTree
from dagster.components.resolved.scopes import LoadContextScope
from pydantic import Field, RootModel, ValidationError

from dedup_pipeline.config import DatasetConfig, PipelineConfig, SparkConfig
from dedup_pipeline.config.errors import config_error, to_config_error
from dedup_pipeline.config.loading import component_document, error_path
from dedup_pipeline.config.models import Where, clash
from dedup_pipeline.orchestration.definitions import build_dataset_definitions, spark_resource
from dedup_pipeline.sample.generate import default_start

PYTHON_SOURCE = "<DedupDataset attributes>"


class DedupDatasetAttributes(DatasetConfig):
    """One dataset (docs/operations.md, "Configuration"); paths relative to the `defs.yaml`.
    `spark:` as in the config file (C3); the environment wins. A run has one Spark session, so
    the DedupDatasets of a code location that give one give the same (`_shared_spark`)."""

    spark: SparkConfig | None = Field(None, description=(
        "Spark for every dataset of the code location (one session per run): give it in one "
        "defs.yaml, or the same in each; SPARK_REMOTE, SPARK_MASTER_URL and DEDUP_SPARK_CONF_* win"))


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


class DedupDatasetScaffolder(dg.Scaffolder):
    """`dg scaffold defs dedup_pipeline.DedupDataset <name>`: a `defs.yaml` whose example loads
    the sample data of `dedup-pipeline generate` (the demo's dataset) under the project's `data/`."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        name = re.sub(r"[^a-z0-9_]", "_", request.target_path.name.lower()) or "clicks"
        start = default_start(24)
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(SCAFFOLD.format(
            type=request.type_name, name=name, start=start))


SCAFFOLD = textwrap.dedent("""\
    # One deduplicated dataset (dedup_pipeline): assets {name}/unique, duplicates, expired, rejected,
    # index and raw_batch, hourly partitions, checks, a landing sensor (on) and jobs, all named {name}_*.
    # Every field, described: `dg utils inspect-component {type}`, the UI's Components
    # tab and dedup_pipeline's docs/operations.md.
    # Relative paths resolve against this file's directory; the example keeps the data under the
    # project's data/. Sample data for it, from the project root:
    #   dedup-pipeline generate --out data --hours 24 --rows-per-hour 2000 --start {start} --no-config
    type: {type}
    attributes:
      name: {name}                          # asset key prefix, [a-z0-9_]+
      start: "{start}"             # first hourly partition (UTC)
      source:
        path: "{{{{ context.project_root }}}}/data/landing/{name}"   # hour H: date=YYYY-MM-DD/hour=HH/
        format: jsonl                       # jsonl | csv | parquet
        schema: {{event_id: string, user_id: string, event_time: timestamp, url: string, amount: double}}
      key: [event_id]                       # dedup key: one or more columns
      fingerprint: [user_id, url]           # same key, other fingerprint: a conflict (optional)
      order_by: event_time                  # tie-break inside a batch, earliest wins (optional)
      expiry: {{column: event_time, period: 24h, basis: event}}   # optional: older records expire
      output: "{{{{ context.project_root }}}}/data/warehouse/{name}"  # root of every output
      output_format: delta                  # each output a Delta table (default) | parquet
      # landing: {{marker: _SUCCESS, grace: 15m}}   # when an hour is complete (the landing sensor)
      # spark: {{master: "local[*]"}}                # or SPARK_REMOTE / SPARK_MASTER_URL (they win)
    """)


@dg.scaffold_with(DedupDatasetScaffolder)
class DedupDataset(dg.Component):
    """A deduplicated hourly dataset on Spark: unique, duplicates, expired and rejected Delta tables.

    Each hour's batch of at-least-once records is split into four disjoint outputs against a key
    index; loads can be rerun, backfilled and recovered after a crash without losing or doubling a
    record. The attributes are one dataset of dedup_pipeline's config (docs/operations.md,
    "Configuration"); the component adds the dataset's assets (`<name>/unique`, ...), asset checks,
    jobs, sensors, schedules and the `spark` resource. Dagster instance: a pool limit of 1 per
    dataset (`concurrency.pools: {default_limit: 1, granularity: run}`).
    """

    def __init__(self, dataset: DatasetConfig, spark: SparkConfig | None = None,
                 source: str = PYTHON_SOURCE, tree: Any = None) -> None:
        self.dataset = dataset
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
        return cls(dataset, spark, source, tree)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """This dataset's definitions, once it is checked against every other DedupDataset of
        the code location as a config file checks its datasets (C2), and given the one `spark`
        resource they share."""
        peers = _peers(self, context)
        return build_dataset_definitions(self.dataset, spark_resource(_shared_spark(peers)))


def _peers(component: DedupDataset, context: dg.ComponentLoadContext) -> list[DedupDataset]:
    """Every DedupDataset of the code location (this one first when built alone), refused with
    the config file's message if two cannot live side by side: a name shared, an output tree
    equal to, inside or around another's (C2), located at the later one's `defs.yaml` line."""
    tree = context.component_tree
    peers = ([] if isinstance(tree, TestComponentTree)  # built in Python, no defs folder
             else tree.get_all_components(of_type=DedupDataset))
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
