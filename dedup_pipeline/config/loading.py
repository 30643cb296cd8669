"""Reading a config file (design.md C1, C2): UTF-8 YAML, no key given twice, validated as
`PipelineConfig` with paths relative to the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dedup_pipeline.config.errors import ConfigError, config_error, locate, to_config_error
from dedup_pipeline.config.models import PipelineConfig, Where


def parse_config(data: Any, source: str, base_dir: Path | None) -> PipelineConfig:
    """Validate an already-parsed YAML document; `base_dir` resolves relative paths."""
    if not isinstance(data, dict):
        raise config_error(source, None, "<top>", f"expected a mapping, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data, context=Where(source, base_dir))
    except ValidationError as e:
        raise to_config_error(e, data, source) from None


def _given_twice(node: yaml.Node | None, loc: tuple[Any, ...] = ()
                 ) -> tuple[tuple[Any, ...], int, int] | None:
    """The first key a mapping gives twice (YAML silently keeps the last): its location and lines."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            name = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            if name in seen:
                return (*loc, name), seen[name] + 1, k.start_mark.line + 1
            seen[name] = k.start_mark.line
            if found := _given_twice(v, (*loc, name)):
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            if found := _given_twice(item, (*loc, i)):
                return found
    return None


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
        twice = _given_twice(yaml.compose(text, Loader=yaml.SafeLoader))
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config error in {p}: not valid YAML: {e}") from None
    if twice is not None:  # a config that says a thing twice is refused
        (dataset, fld), (first, second) = locate(twice[0], data), twice[1:]
        raise config_error(str(p), dataset, fld, f"given twice (lines {first} and {second}); YAML "
                           "would silently keep the last")
    return parse_config(data, str(p), p.resolve().parent)
