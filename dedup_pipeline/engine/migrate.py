"""Migrate a dataset to a new contract: re-derive its index from `unique` under the config as it
is now, in one committed step (docs/design.md, "The dataset contract").

The outputs are not rewritten: every hour keeps the rows it was loaded with, and its commit record
the contract version it was loaded under. What a breaking change invalidates is the index (digests
of another key, another layout, fingerprints of other columns), and the index is derived data: a
function of the unique rows (`rebuild.rebuild_index`). So a migration

1. refuses, writing nothing, if `unique` holds rows that are duplicates under the new contract
   (a narrowed key, a longer window): the index under the new key would hold a key twice and
   history would contradict the new rule. It reports how many and a sample. Moving the later
   copies to `duplicates` would rewrite the outputs of past hours; it is not offered: revert the
   change, or load the landing history again under the new config into a new output;
2. refuses if a unique file a commit record lists is missing (the rebuild would drop its keys);
3. writes the new contract version, marked as a migration (atomic, fsynced): the COMMIT POINT.
   Before it the dataset is fully old; from it on every path (load, rebuild, verify) refuses with
   "finish the migration" until step 4 is done, so nothing runs on a half-migrated index;
4. rebuilds the whole index under the new contract (a staging directory swapped in, records
   updated: `rebuild_index`), then writes ``v000N.done``. Running migrate again after a crash in
   step 4 redoes step 4 (it is idempotent: entries are a function of unique).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract
from dedup_pipeline.engine.commit_log import CommitLog
from dedup_pipeline.engine.digest import H1, H2, digest_columns
from dedup_pipeline.engine.expiry import X_COL, expiry_value, is_live
from dedup_pipeline.engine.load import _fault
from dedup_pipeline.engine.outputs import DUPLICATES, EXPIRED, LOAD_HOUR, UNIQUE
from dedup_pipeline.engine.parse import V
from dedup_pipeline.engine.rebuild import _unique_sources, rebuild_index
from dedup_pipeline.engine.storage import Storage
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import HOUR, key_of, parse_key, to_key

SAMPLE = 5


class MigrationRefusedError(UserError, RuntimeError):
    """The history cannot be migrated as it is (duplicates under the new contract)."""

    stage = "the migration's duplicate check"
    fix = "nothing was written; see the error for the rows and the choices"


@dataclass(frozen=True)
class MigrateResult:
    dataset: str
    from_version: int | None
    to_version: int | None  # None: nothing to migrate
    changes: tuple[str, ...]
    loads: int = 0
    entries: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        if self.to_version is None:
            return (f"{self.dataset}: nothing to migrate: the config matches contract "
                    f"v{self.from_version}" if self.from_version else
                    f"{self.dataset}: nothing to migrate: no hour is loaded")
        return (f"{self.dataset}: migrated to contract v{self.to_version} "
                f"({'; '.join(self.changes)}); index re-derived from unique: {self.entries} "
                f"entries of {self.loads} hour(s) in {self.seconds:.1f}s")


def _outputs(spark: SparkSession, st: Storage, name: str, committed: list[str]) -> DataFrame | None:
    if not committed or not st.exists(st.path(name)):
        return None
    df = (spark.read.option("mergeSchema", "true").option("basePath", st.spark_path(name))
          .parquet(st.spark_path(name)))
    return df.filter(F.col(LOAD_HOUR).isin(committed))


def duplicates_under(spark: SparkSession, ds: DatasetConfig, st: Storage,
                     committed: list[str]) -> tuple[int, list[str]]:
    """Rows of unique that the new contract makes duplicates of an earlier unique row: how many,
    and a sample (key values and both hours). Keys compare by their digest, as the index does."""
    from dedup_pipeline.engine.verify import _expiry_points

    uniq = _outputs(spark, st, UNIQUE, committed)
    if uniq is None:
        return 0, []
    h1, h2 = digest_columns(ds.key, ds.source.schema)
    u = uniq.withColumns({H1: h1, H2: h2})
    w = Window.partitionBy(H1, H2).orderBy(LOAD_HOUR)
    u = u.withColumn("_prev_hour", F.lag(LOAD_HOUR).over(w))
    if ds.expiry is None:
        bad = u.filter(F.col("_prev_hour").isNotNull())
    else:
        frames = {n: _outputs(spark, st, n, committed) for n in (UNIQUE, DUPLICATES, EXPIRED)}
        xs = _expiry_points(spark, ds, frames, committed)
        x_df = spark.createDataFrame([(t, float(x) if x is not None else None)
                                      for t, x in xs.items()], f"{LOAD_HOUR} string, {X_COL} double")
        u = u.withColumn(V, expiry_value(ds)).withColumn("_prev_v", F.lag(V).over(w))
        u = u.join(F.broadcast(x_df), LOAD_HOUR)
        bad = u.filter(F.col("_prev_v").isNotNull()
                       & is_live(F.col("_prev_v"), F.col(X_COL)))
    bad = bad.select(*ds.key, LOAD_HOUR, "_prev_hour").persist()
    try:
        n = bad.count()
        rows = bad.orderBy(LOAD_HOUR, *ds.key).limit(SAMPLE).collect() if n else []
    finally:
        bad.unpersist()
    sample = [", ".join(f"{k}={r[k]!r}" for k in ds.key) + f" unique in {key_of(r['_prev_hour'])} "
              f"and {key_of(r[LOAD_HOUR])}" for r in rows]
    return n, sample


def migrate(spark: SparkSession, ds: DatasetConfig,
            say: Callable[[str], None] | None = None) -> MigrateResult:
    """Migrate the dataset to the contract of `ds`. The caller holds the dataset lock."""
    say = say or (lambda _m: None)
    t0 = time.perf_counter()
    st = Storage(ds.output)
    committed = sorted(CommitLog(st).committed())
    last = committed[-1] if committed else None
    hist = contract.read_history(st, last)
    terms = contract.Terms.of(ds)
    target = hist.pending
    if target is not None:
        if target.terms != terms:
            raise contract.ContractError(
                f"contract error: dataset {ds.name!r}: the migration to contract "
                f"v{target.version} did not finish, and the config now differs from what it "
                f"migrates to; set the config back to it ({contract.contract_path(st, target.version)}"
                f") and run migrate again")
        say(f"{ds.name}: finishing the migration to contract v{target.version}")
    else:
        cur = hist.current
        if cur is not None and cur.terms == terms:
            return MigrateResult(ds.name, cur.version, None, ())
        if not committed and cur is None:
            return MigrateResult(ds.name, None, None, ())
        if cur is not None:
            changes = tuple(c.describe() for c in contract.compare(
                cur.terms, terms, expiry_kind=ds.expiry_type, window_held=False))
        else:
            changes = ("the current config recorded as the contract of the history",)
        say(f"{ds.name}: migrating {len(committed)} hour(s) to a new contract: "
            f"{'; '.join(changes)}; checking unique for duplicates under it")
        n, sample = duplicates_under(spark, ds, st, committed)
        if n:
            raise MigrationRefusedError(
                f"migrate refused: dataset {ds.name!r}: {n} row(s) of unique are duplicates of "
                f"earlier unique rows under the new contract ({'; '.join(changes)}), e.g. "
                f"{' | '.join(sample)}; nothing was written. Keep the old config, or load the "
                f"landing history again under the new config into a new output")
        _unique_sources(st, committed)  # every listed unique file is there to rebuild from
        nxt = to_key(parse_key(key_of(last)) + HOUR) if last else ds.start
        target = contract.Contract(
            dataset=ds.name, version=(cur.version + 1) if cur else 1, effective_from=nxt,
            recorded_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            migration=contract.Migration(from_version=cur.version if cur else None,
                                         changes=changes),
            terms=terms)
        _fault("migrate_before_contract")
        # the commit point: from here on the dataset is under the new contract
        st.write_json_atomic(contract.contract_path(st, target.version), target.to_json())
        _fault("migrate_after_contract")
    res = rebuild_index(spark, ds, None, check_contract=False)
    _fault("migrate_before_done")
    st.write_json_atomic(contract.done_path(st, target.version),
                         {"finished_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                          "loads": res.loads, "entries": res.entries})
    assert target.migration is not None
    return MigrateResult(ds.name, target.migration.from_version, target.version,
                         target.migration.changes, res.loads, res.entries,
                         round(time.perf_counter() - t0, 3))
