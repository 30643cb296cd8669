"""`{ds}_explain`: where did key K go, and why, from the Launchpad (docs/design.md, "Explaining a
key").

The run config names the key (`key: {event_id: "4711"}`, null for a null; or `key_json`), and
optionally `from_hour` / `to_hour`. The result is a Markdown table on the step's output (shown in
the run's event log and its step's output), plus one log line per occurrence. It only reads (no
lock, no pool, no Spark): it runs beside the dataset's loads and reports what they had committed when it
read their commit records.
"""


import json
from collections.abc import Callable
from typing import Any

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.explain import (
    explain_command,
    explain_key,
    markdown,
    parse_key_args,
    sample_keys,
)
from dedup_pipeline.hours import parse_hour, to_tag
from dedup_pipeline.orchestration import names, runs


def explain_job_name(dataset: str) -> str:
    return f"{dataset}{names.EXPLAIN_JOB_SUFFIX}"


def _text(value: Any) -> str | None:
    """A run-config value as the CLI's `--key` text: YAML strings verbatim, numbers / booleans as
    JSON text, null as a null."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


def build_explain_job(ds: DatasetConfig) -> dg.JobDefinition:
    key_fields = {k: dg.Field(dg.Any, is_required=False,
                              description=f"value of key column {k} ({ds.source.schema[k]}); "
                                          "null for a null")
                  for k in ds.key}

    @dg.op(name=f"{ds.name}_explain_key", config_schema={
        "key": dg.Field(key_fields, is_required=False,
                        description="the key, one value per key column (as text: typed by the "
                                    "dataset's schema, like `dedup-pipeline explain --key`)"),
        "key_json": dg.Field(dg.Noneable(str), is_required=False, default_value=None,
                             description="or the key as a JSON object (like --key-json)"),
        "from_hour": dg.Field(dg.Noneable(str), is_required=False, default_value=None,
                              description="first load hour to search, e.g. 2026-11-27-07:00"),
        "to_hour": dg.Field(dg.Noneable(str), is_required=False, default_value=None,
                            description="last load hour to search (inclusive)"),
    }, out=dg.Out(dg.Nothing))
    def explain_op(context: dg.OpExecutionContext) -> Any:
        cfg = context.op_config
        raw = cfg.get("key") or {}
        pairs = [f"{k}={v}" for k, v in ((k, _text(v)) for k, v in raw.items()) if v is not None]
        nulls = {k: None for k, v in raw.items() if v is None}
        extra = json.loads(cfg["key_json"]) if cfg.get("key_json") else {}
        key_json = json.dumps({**nulls, **extra}) if nulls or extra else None
        given = parse_key_args(ds, pairs, key_json)
        ex = explain_key(ds, given, cfg.get("from_hour"), cfg.get("to_hour"))
        for line in ex.lines():
            context.log.info(line)
        yield dg.Output(None, metadata={
            "explanation": dg.MetadataValue.md(markdown(ex)),
            "occurrences": len(ex.occurrences),
            "seen": ex.seen,
            "index_agrees": "not checked" if ex.index_agrees is None else str(ex.index_agrees),
            "json": dg.MetadataValue.json(ex.to_json()),
        })

    @dg.job(name=explain_job_name(ds.name),
            description=f"Explain a key of {ds.name!r}: every record of it, oldest first, the "
                        "output it went to and the rule that put it there. Give the key in the "
                        "Launchpad's run config (ops: ... key: {column: value}).")
    def job() -> None:
        explain_op()

    return job


def key_sampler(ds: DatasetConfig, partition_key: str) -> Callable[[bool], dict[str, Any]]:
    """For `checks.with_sample_keys`: up to 10 keys of the hour's duplicates (conflicts only, or
    all) and the explain command for the first, as check metadata. Only called when a check fails.
    """
    def sample(conflicts_only: bool) -> dict[str, Any]:
        try:
            keys = sample_keys(ds, to_tag(parse_hour(partition_key)), conflicts_only)
        except Exception as e:  # noqa: BLE001 - a sample is a convenience, never a failed load
            return {"sample_keys_error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        return sample_metadata(ds, keys)

    return sample


def sample_metadata(ds: DatasetConfig, keys: list[dict[str, str | None]]) -> dict[str, Any]:
    """Check metadata for sample keys: the keys and the explain command for the first ({} for
    none)."""
    if not keys:
        return {}
    config = runs.config_path(ds)
    return {"sample_keys": dg.MetadataValue.json(keys),
            "explain": dg.MetadataValue.text(explain_command(ds, keys[0], config))}
