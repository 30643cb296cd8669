"""Asset checks of every load (design.md D4), evaluated inside the load itself.

Blocking (ERROR): conservation and unique_keys on `unique`, index_agrees on `index`. The engine
computes them from the written files before committing and raises on a breach, so a failed check
means the hour committed nothing and nothing downstream runs. WARN: index_size on `index`,
duplicate_rate and conflict_rate on `duplicates`, rejected_rate on `rejected`, against the
thresholds of the dataset's `checks:` section.

Each hour gets its own evaluation event for its partition, whatever the run's size, targeting the
hour's own materialization (see `orchestration/assets.py` for why events, not AssetCheckResults).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.checks import CONSERVATION, INDEX_AGREES, UNIQUE_KEYS
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.outputs import DUPLICATES, OUTPUTS, REJECTED, UNIQUE
from dedup_pipeline.orchestration.names import INDEX, asset_key

INDEX_SIZE = "index_size"
DUPLICATE_RATE, CONFLICT_RATE, REJECTED_RATE = "duplicate_rate", "conflict_rate", "rejected_rate"

# check name -> (asset name, blocking, description)
CHECKS: dict[str, tuple[str, bool, str]] = {
    CONSERVATION: (UNIQUE, True, "Every record read lands in exactly one output: records in = "
                   "unique + duplicates + expired + rejected, counted from the written files. "
                   "(Rule R8 in docs/design.md.)"),
    UNIQUE_KEYS: (UNIQUE, True, "No key appears twice in the hour's unique rows, nor in the kept "
                  "keys of earlier hours. (Rule R4 in docs/design.md.)"),
    INDEX_AGREES: (INDEX, True, "The hour's index entries match its unique rows: the same count "
                   "and the same checksum of the key digests."),
    INDEX_SIZE: (INDEX, False, "Warns when a load reads more index entries than "
                 "checks.max_index_keys of the config: time to shorten expiry or compact."),
    DUPLICATE_RATE: (DUPLICATES, False, "Warns when the share of duplicates, duplicates / (unique + "
                     "duplicates), is above checks.max_duplicate_rate of the config."),
    CONFLICT_RATE: (DUPLICATES, False, "Warns when the share of conflicts (same key, different "
                    "content) among unique + duplicates is above checks.max_conflict_rate."),
    REJECTED_RATE: (REJECTED, False, "Warns when the share of rejected records among the records "
                    "read is above checks.max_rejected_rate of the config."),
}


def check_specs(ds: DatasetConfig, partitions_def: dg.PartitionsDefinition) -> list[dg.AssetCheckSpec]:
    with warnings.catch_warnings():  # partitioned checks are a preview feature of Dagster 1.13
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(name, asset=asset_key(ds, asset), blocking=blocking,
                              description=desc, partitions_def=partitions_def)
            for name, (asset, blocking, desc) in CHECKS.items()
        ]


@dataclass(frozen=True)
class Evaluation:
    name: str
    passed: bool
    metadata: dict[str, Any]

    @property
    def asset(self) -> str:
        return CHECKS[self.name][0]

    @property
    def severity(self) -> dg.AssetCheckSeverity:
        return dg.AssetCheckSeverity.ERROR if CHECKS[self.name][1] else dg.AssetCheckSeverity.WARN


def evaluate(ds: DatasetConfig, r: CommitRecord) -> list[Evaluation]:
    """All checks of a committed hour (the blocking ones passed, or it would not be committed)."""
    f = r.check_figures
    rates = r.rates
    index_keys = r.index_rows_read + r.index_rows_written
    t = ds.checks
    return [
        Evaluation(CONSERVATION, True, {"rows_in": r.rows_in, "rows_out": sum(
            f.get(f"written_{o}", 0) for o in OUTPUTS)}),
        Evaluation(UNIQUE_KEYS, True, {"distinct_keys": f.get("unique_distinct_keys", r.unique),
                                       "in_live_index": f.get("unique_in_live_index", 0)}),
        Evaluation(INDEX_AGREES, True, {"index_rows": f.get("index_rows", r.index_rows_written),
                                        "unique_rows": r.unique}),
        Evaluation(INDEX_SIZE, index_keys <= t.max_index_keys,
                   {"index_keys": index_keys, "limit": t.max_index_keys}),
        Evaluation(DUPLICATE_RATE, rates[DUPLICATE_RATE] <= t.max_duplicate_rate,
                   {"rate": rates[DUPLICATE_RATE], "limit": t.max_duplicate_rate}),
        Evaluation(CONFLICT_RATE, rates[CONFLICT_RATE] <= t.max_conflict_rate,
                   {"rate": rates[CONFLICT_RATE], "limit": t.max_conflict_rate}),
        Evaluation(REJECTED_RATE, rates[REJECTED_RATE] <= t.max_rejected_rate,
                   {"rate": rates[REJECTED_RATE], "limit": t.max_rejected_rate}),
    ]


# Checks whose failure is worth a look at a few keys: up to 10 sample keys and the explain
# command for the first, in the failing evaluation's metadata (read only when it fails).
SAMPLED = {DUPLICATE_RATE: False, CONFLICT_RATE: True}  # name -> conflicts only


def with_sample_keys(evals: list[Evaluation], sample: Callable[[bool], dict[str, Any]]
                     ) -> list[Evaluation]:
    """`evals`, the failing SAMPLED ones with `sample(conflicts_only)`'s metadata added."""
    return [Evaluation(e.name, e.passed, {**e.metadata, **sample(SAMPLED[e.name])})
            if not e.passed and e.name in SAMPLED else e for e in evals]


def as_result(ds: DatasetConfig, e: Evaluation) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(asset_key=asset_key(ds, e.asset), check_name=e.name,
                               passed=e.passed, severity=e.severity, metadata=e.metadata)


def summarize(ds: DatasetConfig, per_hour: Iterable[tuple[str, list[Evaluation]]]
              ) -> list[dg.AssetCheckResult]:
    """One result per check for a ranged run: passed if every hour passed; failing hours listed.

    Dagster requires a result per check output of the step; in a ranged run it records it with no
    partition, so it never touches a partition's status (the per-hour events do that)."""
    failing: dict[str, list[str]] = {name: [] for name in CHECKS}
    hours = 0
    for pk, evals in per_hour:
        hours += 1
        for e in evals:
            if not e.passed:
                failing[e.name].append(pk)
    return [
        as_result(ds, Evaluation(name, not failing[name], {
            "hours": hours, "failing_hours": len(failing[name]),
            "first_failing_hour": failing[name][0] if failing[name] else ""}))
        for name in CHECKS
    ]
