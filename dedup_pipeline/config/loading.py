"""Reading a config file (SPEC C1, C2): UTF-8 YAML, no key given twice, validated as
`PipelineConfig` with paths relative to the file; the built-in demo when none is given.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dedup_pipeline.config.errors import ConfigError, config_error, to_config_error
from dedup_pipeline.config.models import BUILTIN_DEMO, PipelineConfig, Where
from dedup_pipeline.hours import PARTITION_FMT


def parse_config(data: Any, source: str, base_dir: Path | None) -> PipelineConfig:
    """Validate an already-parsed YAML document; `base_dir` resolves relative paths."""
    if not isinstance(data, dict):
        raise config_error(source, None, "<top>", f"expected a mapping, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data, context=Where(source, base_dir))
    except ValidationError as e:
        raise to_config_error(e, PipelineConfig, data, source) from None


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
