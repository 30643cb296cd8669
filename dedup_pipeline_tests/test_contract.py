"""The dataset contract (engine/contract.py, docs/design.md "The dataset contract"), without Spark:
every config field's classification, the contract files (format 1, nothing else), tentative and
pending versions, a history without a contract. The end-to-end behaviour (loads, rebuild, verify,
readers, migrate, Dagster) is in test_contract_loads.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from dedup_pipeline.config import DatasetConfig, PipelineConfig, parse_config
from dedup_pipeline.engine import contract
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import HourSet
from dedup_pipeline_tests.conftest import CLICKS_SCHEMA, dataset_raw, source_raw

pytestmark = pytest.mark.fast

FIRST = "2026-11-01-00:00"
TAG0, TAG3 = "2026-11-01-00", "2026-11-01-03"
NEXT = "2026-11-01-04:00"
EXPIRY = {"column": "event_time", "period": "24h"}


def ds_of(tmp: Path, raw: dict[str, Any], source: str = "/etc/dedup.yaml") -> DatasetConfig:
    cfg = parse_config({"datasets": [raw]}, source, tmp)
    return cfg.datasets[0]


def base(**fields: Any) -> dict[str, Any]:
    fields.setdefault("source", source_raw(schema={**CLICKS_SCHEMA, "amount": "double"}))
    return dataset_raw(fingerprint=["user_id", "url"], order_by="event_time", **fields)


def pinned(tmp: Path, raw: dict[str, Any]) -> Storage:
    """Hours 00..03 'loaded' under `raw`: its contract v1 recorded, effective from hour 00."""
    ds = ds_of(tmp, raw)
    st = Storage(ds.output)
    v = contract.check(st, ds, FIRST, set())
    assert v.new is not None and v.new.version == 1 and v.new.format == 1
    contract.record(st, v)
    return st


def check(tmp: Path, raw: dict[str, Any]) -> contract.Verdict:
    ds = ds_of(tmp, raw)
    return contract.check(Storage(ds.output), ds, NEXT, {TAG0, TAG3})


def edit(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return out


DELETE = object()
WITH_EXPIRY = base(expiry=EXPIRY, index={"slice_span": "6h"})
CATEGORIES = base(source=source_raw(schema={**CLICKS_SCHEMA, "tier": "string"}),
                  expiry={"column": "tier", "period": "1", "categories": ["a", "b", "c"]})

# (field of contract.FIELDS, base config, edit path, new value, expected kind)
CASES: list[tuple[str, dict[str, Any], str, Any, str]] = [
    ("name", base(), "name", "clicks_v2", "free"),
    ("asset_key_prefix", base(), "asset_key_prefix", ["team"], "free"),
    ("start", base(), "start", "2026-10-01-00:00", "free"),
    ("source.path", base(), "source.path", "elsewhere", "free"),
    ("source.format", base(), "source.format", "csv", "free"),
    ("source.csv.header", base(), "source.csv", {"header": False}, "free"),
    ("source.csv.delimiter", base(), "source.csv", {"delimiter": ";"}, "free"),
    ("source.schema", base(), "source.schema",
     {**CLICKS_SCHEMA, "amount": "double", "country": "string"}, "evolvable"),
    ("source.schema", base(), "source.schema", dict(CLICKS_SCHEMA), "breaking"),  # removed
    ("source.schema", base(), "source.schema",
     {**CLICKS_SCHEMA, "country": "string"}, "breaking"),  # renamed (amount -> country)
    ("source.schema", base(), "source.schema", {**CLICKS_SCHEMA, "amount": "long"},
     "breaking"),  # a type changed (narrowed)
    ("source.schema", base(), "source.schema", {**CLICKS_SCHEMA, "amount": "string"},
     "breaking"),  # a type changed (widened to text)
    ("source.schema", base(), "source.schema",
     {"country": "string", **CLICKS_SCHEMA, "amount": "double"}, "breaking"),  # inserted first
    ("key", base(), "key", ["event_id", "user_id"], "breaking"),
    ("fingerprint", base(), "fingerprint", ["url"], "breaking"),
    ("order_by", base(), "order_by", DELETE, "breaking"),
    ("expiry", base(), "expiry", EXPIRY, "breaking"),
    ("expiry.column", base(source=source_raw(schema={**CLICKS_SCHEMA, "seen": "timestamp"}),
                           expiry=EXPIRY), "expiry.column", "seen", "breaking"),
    ("expiry.basis", base(expiry=EXPIRY), "expiry.basis", "processing", "breaking"),
    ("expiry.categories", CATEGORIES, "expiry.categories", ["a", "c", "b"], "breaking"),
    ("expiry.period", WITH_EXPIRY, "expiry.period", "12h", "evolvable"),  # shortened
    ("expiry.period", WITH_EXPIRY, "expiry.period", "48h", "evolvable"),  # lengthened, all held
    ("index.slice_span", base(expiry=EXPIRY), "expiry.period", "12h", "breaking"),  # the default
    ("output", base(), "output", "warehouse2", "free"),
    ("index.store_keys", base(), "index.store_keys", True, "breaking"),
    ("index.buckets", base(), "index.buckets", 16, "breaking"),
    ("index.buckets", WITH_EXPIRY, "index.buckets", 16, "free"),  # unused with expiry
    ("index.slice_span", WITH_EXPIRY, "index.slice_span", "3h", "breaking"),
    ("index.retention_lag_hours", WITH_EXPIRY, "index.retention_lag_hours", 1, "free"),
    ("index.compact_after", base(), "index.compact_after", 0, "free"),
    ("landing", base(), "landing", {"marker": None, "grace": "5m", "watch_hours": 2}, "free"),
    ("checks", base(), "checks", {"max_duplicate_rate": 0.9, "max_index_keys": 10}, "free"),
    ("on_damaged_index", base(), "on_damaged_index", "rebuild", "free"),
    ("output_format", base(), "output_format", "parquet", "free"),
]


def _id(case: tuple[str, dict[str, Any], str, Any, str]) -> str:
    fld, _, path, value, kind = case
    return f"{fld}:{kind}:{path}={json.dumps(value if value is not DELETE else None)[:30]}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_each_classification(tmp_path: Path, case: tuple[str, dict[str, Any], str, Any, str]
                             ) -> None:
    fld, raw, path, value, kind = case
    st = pinned(tmp_path, raw)
    new_raw = edit(raw, path, value)
    if fld == "output":  # another output is another table (nothing loaded): its own contract
        ds = ds_of(tmp_path, new_raw)
        v = contract.check(Storage(ds.output), ds, NEXT, set())
        assert v.current is None and v.new is not None and v.new.version == 1
        return
    if kind == "breaking":
        with pytest.raises(contract.ContractError) as e:
            check(tmp_path, new_raw)
        msg = str(e.value)
        assert msg.startswith("contract error: dataset 'clicks': ")
        assert fld.split(".")[0] in msg and "since 2026-11-01-00:00" in msg
        assert "dedup-pipeline migrate --config /etc/dedup.yaml --dataset clicks" in msg
        assert "\n" not in msg
        assert sorted(p.name for p in (tmp_path / "warehouse" / "_contract").iterdir()) == \
            ["v0001.json"]  # nothing written
        return
    v = check(tmp_path, new_raw)
    if kind == "free":
        assert v.new is None and v.current is not None and v.version == 1
    else:
        assert v.new is not None and v.new.version == 2 and v.new.effective_from == NEXT
        assert v.new.changes and all(fld.split(".")[0] in c for c in v.new.changes)
        contract.record(st, v)
        # recorded, and in force once hour 04 has committed: the same config checks clean
        ds = ds_of(tmp_path, new_raw)
        again = contract.check(st, ds, "2026-11-01-05:00", {TAG0, TAG3, "2026-11-01-04"})
        assert again.new is None and again.version == 2


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    out = set()
    for name, f in model.model_fields.items():
        path = prefix + (f.alias or name)
        sub = next((a for a in (f.annotation, *get_args(f.annotation))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is None:  # Annotated[Model, ...]: look one level further
            sub = next((b for a in get_args(f.annotation) for b in (a, *get_args(a))
                        if isinstance(b, type) and issubclass(b, BaseModel)), None)
        if sub is not None and path not in contract.FIELDS:
            out |= _leaf_fields(sub, path + ".")
        else:
            out.add(path)
    return out


def test_every_config_field_is_classified_and_tested() -> None:
    """The table covers every field of DatasetConfig (a new field must be classified), and each
    classification has a case above."""
    fields = _leaf_fields(DatasetConfig)
    assert "key" in fields and "index.slice_span" in fields and "source.csv.header" in fields
    assert fields - set(contract.FIELDS) == set()
    assert "spark" in contract.FIELDS and set(PipelineConfig.model_fields) == {"datasets", "spark"}
    tested = {c[0] for c in CASES} | {"spark", "index format", "digest version"}
    assert set(contract.FIELDS) - tested == set()


@pytest.mark.parametrize("term", ["index format", "digest version"])
def test_a_package_with_another_index_format_or_digest_is_breaking(tmp_path: Path,
                                                                    term: str) -> None:
    raw = base()
    pinned(tmp_path, raw)
    path = tmp_path / "warehouse" / "_contract" / "v0001.json"
    doc = json.loads(path.read_text())
    if term == "index format":
        doc["terms"]["index"]["format"] = 2
    else:
        doc["terms"]["digest_version"] = 0
    path.write_text(json.dumps(doc))
    with pytest.raises(contract.ContractError, match=f"{term} changed from"):
        check(tmp_path, raw)


def test_spark_section_is_not_a_term(tmp_path: Path) -> None:
    raw = base()
    pinned(tmp_path, raw)
    cfg = parse_config({"datasets": [raw], "spark": {"master": "local[1]", "conf": {"a": "b"}}},
                       "x.yaml", tmp_path)
    ds = cfg.datasets[0]
    assert contract.check(Storage(ds.output), ds, NEXT, {TAG0}).new is None


def test_key_message_is_the_documented_line(tmp_path: Path) -> None:
    pinned(tmp_path, base())
    with pytest.raises(contract.ContractError) as e:
        check(tmp_path, edit(base(), "key", ["event_id", "user_id"]))
    assert str(e.value) == (
        "contract error: dataset 'clicks': key changed from [event_id] to [event_id, user_id] "
        "since 2026-11-01-00:00 (contract v1); revert the change, or to re-key the history run: "
        "dedup-pipeline migrate --config /etc/dedup.yaml --dataset clicks")


def test_period_lengthened_beyond_what_retention_kept_is_breaking(tmp_path: Path) -> None:
    """Lengthening is evolvable only while the index still holds the longer window: here
    retention deleted everything below the latest point minus 30h, so 48h is not held, 30h is."""
    st = pinned(tmp_path, WITH_EXPIRY)
    latest = 1_000 * 3_600_000_000
    st.write_json_atomic(st.path("index", "_retention.json"), {"kept_from": latest - 30 * 3_600_000_000})
    ds48 = ds_of(tmp_path, edit(WITH_EXPIRY, "expiry.period", "48h"))
    with pytest.raises(contract.ContractError, match=r"expiry.period changed from 24h to 48h \(the "
                       "index no longer holds"):
        contract.check(st, ds48, NEXT, {TAG0, TAG3}, latest_of_last=latest)
    ds30 = ds_of(tmp_path, edit(WITH_EXPIRY, "expiry.period", "30h"))
    assert contract.check(st, ds30, NEXT, {TAG0, TAG3}, latest_of_last=latest).new is not None


def test_slice_span_message_says_how_to_keep_the_layout(tmp_path: Path) -> None:
    pinned(tmp_path, base(expiry=EXPIRY))
    with pytest.raises(contract.ContractError, match=r"index.slice_span changed from 6h to 3h "
                       r"\(index.slice_span follows expiry.period unless set; to keep the layout "
                       r"set index.slice_span: 6h\)"):
        check(tmp_path, base(expiry={**EXPIRY, "period": "12h"}))
    # ...and with it set, the shortened period is accepted
    assert check(tmp_path, base(expiry={**EXPIRY, "period": "12h"},
                                index={"slice_span": "6h"})).new is not None


def test_contract_file_is_validated_when_read(tmp_path: Path) -> None:
    pinned(tmp_path, base())
    path = tmp_path / "warehouse" / "_contract" / "v0001.json"
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and doc["terms"]["key"] == ["event_id"]
    assert doc["terms"]["schema"][-1] == ["amount", "double"]
    assert not list(path.parent.glob(".tmp-*"))  # written through a temp file and a rename
    path.write_text(json.dumps({**doc, "terms": {**doc["terms"], "key": 5}}))
    with pytest.raises(contract.ContractError, match=r"v0001.json is damaged"):
        check(tmp_path, base())
    path.write_text('{"truncated')
    with pytest.raises(contract.ContractError, match=r"v0001.json is damaged"):
        check(tmp_path, base())


def test_a_version_whose_first_hour_never_committed_is_tentative(tmp_path: Path) -> None:
    """A load that recorded v2 and crashed before its commit record leaves no contract in force
    that no hour obeys: with the config set back, the check is clean against v1."""
    st = pinned(tmp_path, base())
    evolved = edit(base(), "source.schema", {**CLICKS_SCHEMA, "amount": "double", "c": "long"})
    v = check(tmp_path, evolved)
    contract.record(st, v)  # v2, effective from 04, which never committed
    assert check(tmp_path, base()).new is None  # committed: 00, 03
    ds = ds_of(tmp_path, evolved)
    with_04 = contract.check(st, ds, "2026-11-01-05:00", {TAG0, TAG3, "2026-11-01-04"})
    assert with_04.current is not None and with_04.version == 2  # in force once 04 committed


def test_unfinished_migration_refuses_every_check(tmp_path: Path) -> None:
    st = pinned(tmp_path, base())
    ds = ds_of(tmp_path, base())
    terms = contract.Terms.of(ds)
    mig = contract.Contract(dataset="clicks", version=2, effective_from=NEXT, recorded_at="x",
                            migration=contract.Migration(from_version=1, changes=("key",)),
                            terms=terms)
    st.write_json_atomic(contract.contract_path(st, 2), mig.to_json())
    with pytest.raises(contract.ContractError, match="migration to contract v2 .* did not finish; "
                       "finish it: dedup-pipeline migrate"):
        check(tmp_path, base())
    st.write_json_atomic(contract.done_path(st, 2), {})
    assert check(tmp_path, base()).version == 2


def test_hours_loaded_without_a_contract_are_refused_naming_migrate(tmp_path: Path) -> None:
    ds = ds_of(tmp_path, base())
    st = Storage(ds.output)
    hours = HourSet.of([TAG0, "2026-11-01-01", "2026-11-01-02"])
    with pytest.raises(contract.ContractError) as e:
        contract.check(st, ds, "2026-11-01-03:00", hours)
    assert str(e.value) == (
        f"contract error: dataset 'clicks': hours since {FIRST} are loaded but "
        f"{st.path('_contract')} holds no contract; restore it from a backup, or record the "
        "current config as the history's contract: dedup-pipeline migrate --config "
        "/etc/dedup.yaml --dataset clicks")


@pytest.mark.parametrize(("found", "said"), [(None, "no format"), (2, "format 2"),
                                             ("1", 'format "1"')])
def test_a_contract_of_another_format_is_refused_in_one_line(tmp_path: Path, found: object,
                                                             said: str) -> None:
    pinned(tmp_path, base())
    path = tmp_path / "warehouse" / "_contract" / "v0001.json"
    doc = json.loads(path.read_text())
    assert doc["format"] == 1
    if found is None:
        del doc["format"]
    else:
        doc["format"] = found
    path.write_text(json.dumps(doc))
    with pytest.raises(contract.ContractError) as e:
        check(tmp_path, base())
    assert str(e.value) == (
        f"contract error: {path} is of {said}, expected format 1; migrate the dataset: "
        "dedup-pipeline migrate --config <file> --dataset <name>")
    # migrate reads around it (and replaces it): the history is left with no contract in force
    hist = contract.read_history(Storage(str(tmp_path / "warehouse")), TAG3, other_formats=True)
    assert hist.versions == () and hist.other_formats == (str(path),)


def test_commit_record_names_its_contract_version() -> None:
    doc = json.loads((Path(__file__).parent / "fixtures" / "records" / "format_1.json")
                     .read_text())
    tag = doc["load_hour"]
    assert commits.CommitRecord.from_json({**doc, "contract_version": 3}, tag).contract_version == 3
    with pytest.raises(commits.RecordProblem, match="field 'contract_version' is missing"):
        commits.CommitRecord.from_json({k: v for k, v in doc.items() if k != "contract_version"},
                                       tag)
    with pytest.raises(commits.RecordProblem, match="field 'contract_version' is 'v3', expected a count"):
        commits.CommitRecord.from_json({**doc, "contract_version": "v3"}, tag)
