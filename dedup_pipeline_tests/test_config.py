"""Configuration (design.md C1, C2): bad files fail at load time naming the file, dataset and field.

No Spark here: every test writes a YAML file into tmp_path and calls `load_config` on it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from dedup_pipeline.config import ConfigError, load_config
from dedup_pipeline_tests.conftest import CLICKS_SCHEMA, dataset_raw, source_raw


def _dataset(**overrides: Any) -> dict[str, Any]:
    return dataset_raw(**{
        "source": source_raw("landing/clicks",
                             schema={**CLICKS_SCHEMA, "n": "long", "flag": "boolean"}),
        "fingerprint": ["user_id", "url"],
        "order_by": "event_time",
        "expiry": {"column": "event_time", "period": "24h", "basis": "event"},
        "output": "warehouse/clicks",
        "index": {"store_keys": False},
        **overrides,
    })


def _write(tmp_path: Path, doc: Any, name: str = "dedup.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _error(tmp_path: Path, dataset: dict[str, Any]) -> str:
    p = _write(tmp_path, {"datasets": [dataset]})
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    return str(ei.value)


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """The base dataset with one nested entry set (path of dict keys)."""
    raw = copy.deepcopy(_dataset())
    node = raw
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return raw


# (id, dataset, dataset name the message must show, field path the message must show)
BAD = [
    ("unknown key at dataset level", _with(("colour",), "blue"), "clicks", "colour"),
    ("unknown key in source", _with(("source", "compression"), "gzip"), "clicks",
     "source.compression"),
    ("unknown key in expiry", _with(("expiry", "window"), "1h"), "clicks", "expiry.window"),
    ("unknown key in index", _with(("index", "bloom"), True), "clicks", "index.bloom"),
    ("key column not in schema", _with(("key",), ["event_id", "session_id"]), "clicks", "key"),
    ("bad type name", _with(("source", "schema", "n"), "integer"), "clicks", "source.schema.n"),
    ("expiry on a boolean column", _with(("expiry",), {"column": "flag", "period": 1}), "clicks",
     "expiry.column"),
    ("expiry on a plain string column", _with(("expiry",), {"column": "url", "period": 1}),
     "clicks", "expiry.column"),
    ("unparseable period", _with(("expiry", "period"), "24x"), "clicks", "expiry.period"),
    ("non-numeric period on a long column",
     _with(("expiry",), {"column": "n", "period": "ten"}), "clicks", "expiry.period"),
    ("bad dataset name", _with(("name",), "Clicks!"), "Clicks!", "name"),
    ("processing basis on a long column",
     _with(("expiry",), {"column": "n", "period": 5, "basis": "processing"}), "clicks",
     "expiry.basis"),
    ("fingerprint column missing", _with(("fingerprint",), ["user_id", "referrer"]), "clicks",
     "fingerprint"),
    ("order_by column missing", _with(("order_by",), "ts"), "clicks", "order_by"),
    ("bad format", _with(("source", "format"), "xml"), "clicks", "source.format"),
    ("store_keys not a boolean", _with(("index", "store_keys"), "yes"), "clicks",
     "index.store_keys"),
]


@pytest.mark.parametrize(("dataset", "ds_name", "fld"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
@pytest.mark.fast
def test_bad_config_names_file_dataset_and_field(tmp_path: Path, dataset: dict, ds_name: str,
                                                 fld: str) -> None:
    msg = _error(tmp_path, dataset)
    assert str(tmp_path / "dedup.yaml") in msg
    assert f"dataset {ds_name!r}" in msg
    assert f"field {fld!r}" in msg


@pytest.mark.fast
def test_unknown_key_is_reported_in_the_second_dataset(tmp_path: Path) -> None:
    good = _dataset()
    bad = _dataset(name="orders", output="warehouse/orders")
    bad["source"] = {**bad["source"], "path": "landing/orders", "encoding": "latin1"}
    p = _write(tmp_path, {"datasets": [good, bad]})
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert str(p) in msg and "dataset 'orders'" in msg and "field 'source.encoding'" in msg


@pytest.mark.fast
def test_unknown_key_at_file_level_names_file_and_field(tmp_path: Path) -> None:
    p = _write(tmp_path, {"datasets": [_dataset()], "sparkk": {"master": "local[1]"}})
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert str(p) in str(ei.value) and "field 'sparkk'" in str(ei.value)


@pytest.mark.fast
def test_valid_multi_dataset_file_resolves_paths_against_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative paths must not depend on the working directory
    orders = {
        "name": "orders_v2",
        "start": "2026-10-01-05:00",
        "source": {"path": "../landing/orders", "format": "csv",
                   "schema": {"order_id": "string", "line": "long", "amount": "double",
                              "day": "date"},
                   "csv": {"header": True, "delimiter": ";"}},
        "key": ["order_id", "line"],
        "fingerprint": "all",
        "expiry": {"column": "day", "period": "7d"},
        "output": "out/orders",
        "index": {"store_keys": True},
    }
    logs = {
        "name": "logs",
        "start": "2026-11-01-00:00",
        "source": {"path": str(tmp_path / "abs" / "logs"), "format": "parquet",
                   "schema": {"id": "long", "region": "string"}},
        "key": ["id"],
        "expiry": {"column": "region", "period": 1, "categories": ["a", "b", "c"]},
        "output": "out/logs",
    }
    p = _write(conf_dir, {"datasets": [_dataset(), orders, logs]})
    cfg = load_config(p)
    assert [d.name for d in cfg.datasets] == ["clicks", "orders_v2", "logs"]
    clicks, o, lg = cfg.datasets
    real = conf_dir.resolve()
    assert clicks.source.path == str(real / "landing" / "clicks")
    assert clicks.output == str(real / "warehouse" / "clicks")
    assert o.source.path == str((real / ".." / "landing" / "orders").resolve())
    assert o.output == str(real / "out" / "orders")
    assert lg.source.path == str(tmp_path / "abs" / "logs")  # absolute stays as written
    assert clicks.key == ("event_id",) and o.key == ("order_id", "line")
    assert clicks.fingerprint == ("user_id", "url")
    assert o.fingerprint == ("amount", "day")  # "all": every non-key column
    assert clicks.expiry is not None and clicks.expiry_period == 24 * 3600 * 1_000_000
    assert o.expiry is not None and o.expiry_period == 7  # days for a date column
    assert lg.expiry is not None and lg.expiry.categories == ("a", "b", "c")
    assert o.source.csv.delimiter == ";" and o.index.store_keys is True
    assert o.start == "2026-10-01-05:00"
    assert cfg.dataset("logs") is lg


def test_errors_are_one_line_without_pydantic_s_dump(tmp_path: Path) -> None:
    """A pydantic error reads as today's one line: file, dataset, field, problem; no URL."""
    msg = _error(tmp_path, _with(("index", "buckets"), "many"))
    assert msg == (f"config error in {tmp_path / 'dedup.yaml'}: dataset 'clicks', "
                   "field 'index.buckets': input should be a valid integer, got 'many'")
    for text in (_error(tmp_path, _with(("colour",), 1)),
                 _error(tmp_path, _with(("landing",), {"grace": "soon"})),
                 _error(tmp_path, _with(("source", "schema"), ["a"]))):
        assert "\n" not in text and "pydantic" not in text and "http" not in text
    assert msg.count("field") == 1
    assert "unknown key (allowed: " in _error(tmp_path, _with(("colour",), 1))


def test_an_unknown_key_names_the_keys_allowed_where_it_stands(tmp_path: Path) -> None:
    """design.md C1's key lists, at the file, the dataset and inside a section (keys as the YAML spells
    them: `schema`, `grace`, not the models' attribute names)."""
    f = tmp_path / "dedup.yaml"
    top = _write(tmp_path, {"datasets": [_dataset()], "sparkk": {}})
    with pytest.raises(ConfigError) as ei:
        load_config(top)
    assert str(ei.value) == f"config error in {f}: field 'sparkk': unknown key (allowed: datasets, spark)"
    assert _error(tmp_path, _with(("landing",), {"grace_s": "1h"})) == (
        f"config error in {f}: dataset 'clicks', field 'landing.grace_s': unknown key (allowed: "
        "check_every, grace, marker, watch_hours)")
    assert _error(tmp_path, _with(("source", "csv"), {"header": True, "quote": "'"})) == (
        f"config error in {f}: dataset 'clicks', field 'source.csv.quote': unknown key (allowed: "
        "delimiter, header)")
    assert _error(tmp_path, _with(("shema",), {})).endswith(
        "field 'shema': unknown key (allowed: asset_key_prefix, checks, expiry, fingerprint, index, "
        "key, landing, name, on_damaged_index, order_by, output, output_format, source, start)")


def test_a_dataset_without_a_name_is_named_by_its_position(tmp_path: Path) -> None:
    raw = _dataset()
    del raw["name"]
    msg = _error(tmp_path, raw)
    assert "dataset '#1', field 'name': is required" in msg


def test_models_are_frozen_and_periods_read_in_the_expiry_value_s_units(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from dedup_pipeline.units import default_slice_span

    ds = load_config(_write(tmp_path, {"datasets": [_dataset(
        index={"slice_span": "2h"}, landing={"grace": "90s", "marker": None})]})).datasets[0]
    with pytest.raises(ValidationError):
        ds.name = "other"  # type: ignore[misc]
    assert ds.expiry is not None and ds.expiry.period_text == "24h"
    assert ds.expiry_type == "timestamp" and ds.slice_span == 2 * 3600 * 1_000_000
    assert ds.index.slice_span == "2h"  # as written; `ds.slice_span` is it in v's units
    assert ds.landing.grace_s == 90.0 and ds.landing.marker is None
    assert ds.source.csv.header is True and ds.source.csv.delimiter == ","
    plain = load_config(_write(tmp_path, {"datasets": [_dataset()]})).datasets[0]
    assert plain.slice_span == default_slice_span("timestamp", 24 * 3600 * 1_000_000)


def test_a_start_in_the_future_is_accepted(tmp_path: Path) -> None:
    """A config prepared for tomorrow loads (no wall-clock check); no hour is ready before it."""
    ds = load_config(_write(tmp_path, {"datasets": [_dataset(start="2099-01-01-00:00")]}))
    assert ds.datasets[0].start == "2099-01-01-00:00"


@pytest.mark.parametrize(("column", "period", "span", "fld", "problem"), [
    ("day", "36h", None, "expiry.period", "whole number of days"),
    ("n", "1.5", None, "expiry.period", "whole number"),
    ("event_time", "24h", "0s", "index.slice_span", "must be > 0"),
    ("day", "7d", "12h", "index.slice_span", "whole number of days"),
])
def test_periods_and_spans_follow_the_column_type(tmp_path: Path, column: str, period: str,
                                                  span: str | None, fld: str, problem: str) -> None:
    raw = _dataset(expiry={"column": column, "period": period})
    raw["source"]["schema"]["day"] = "date"
    if span is not None:
        raw["index"] = {"slice_span": span}
    msg = _error(tmp_path, raw)
    assert f"field {fld!r}" in msg and problem in msg


_TWO = """\
datasets:
  - name: clicks
    start: "2026-11-01-00:00"
    source: {path: l/c, format: jsonl, schema: {k: string, j: string}}
    key: [k]
    output: w/c
  - {name}
    start: "2026-11-01-00:00"
    source:
      path: l/v
      format: jsonl
      schema: {k: string, j: string}
      {twice}
    key: [k]
    output: w/v
{top}"""


@pytest.mark.parametrize(("name", "twice", "top", "where", "lines"), [
    ("name: views", "", "datasets: []\n", "field 'datasets'", (1, 16)),  # a file-level key
    ("name: views", "format: csv", "", "dataset 'views', field 'source.format'", (11, 13)),
    ("start: x", "", "", "dataset '#2', field 'start'", (7, 8)),  # unnamed: by its position
])
def test_a_key_given_twice_names_where_and_both_lines(tmp_path: Path, name: str, twice: str,
                                                      top: str, where: str,
                                                      lines: tuple[int, int]) -> None:
    """YAML keeps the last of two equal keys silently; the config refuses it, naming the dataset,
    the field path and the two lines (design.md C2)."""
    p = tmp_path / "twice.yaml"
    p.write_text(_TWO.replace("{name}", name).replace("{twice}", twice).replace("{top}", top))
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert str(ei.value) == (f"config error in {p}: {where}: given twice (lines {lines[0]} and "
                             f"{lines[1]}); YAML would silently keep the last")


def test_a_key_given_twice_inside_a_list_given_twice_is_a_config_error(tmp_path: Path) -> None:
    """The dataset holding the duplicate is in the first `datasets:` list, which YAML drops: still
    one config error, naming the dataset by its position."""
    p = tmp_path / "twice.yaml"
    p.write_text("datasets:\n  - name: a\n  - name: b\n    key: x\n    key: y\ndatasets:\n  - name: c\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert str(ei.value) == (f"config error in {p}: dataset '#2', field 'key': given twice (lines 4 "
                             "and 5); YAML would silently keep the last")
