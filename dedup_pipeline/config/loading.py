"""Reading a config file (design.md C1, C2): UTF-8 YAML, no key given twice, validated as
`PipelineConfig` with paths relative to the file. A `DedupDataset` component's `defs.yaml` (D8) is
a config file of its one dataset, so every command takes either.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dedup_pipeline.config.errors import ConfigError, config_error, locate, to_config_error
from dedup_pipeline.config.models import PipelineConfig, Where

COMPONENT_TYPE = "dedup_pipeline.DedupDataset"
PROJECT_FILE = "pyproject.toml"  # marks a dg project's root, `{{ context.project_root }}`
_TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")


# a component's attributes that are not the dataset's: how Dagster shows and runs it
COMPONENT_ONLY = ("spark", "sensors", "group_name")


def component_document(attributes: Any, source: str) -> dict[str, Any]:
    """A component's attributes as a config document of its one dataset: the dataset, and its
    `spark:` section (C3); `sensors:` and `group_name:` are the component's own."""
    if not isinstance(attributes, dict):
        raise config_error(source, None, "attributes",
                           f"expected a mapping, got {type(attributes).__name__}")
    return {"datasets": [{k: v for k, v in attributes.items() if k not in COMPONENT_ONLY}],
            "spark": attributes.get("spark")}


def project_root(path: Path) -> Path | None:
    """The dg project a file is in: the nearest directory above it holding a pyproject.toml."""
    return next((d for d in path.resolve().parents if (d / PROJECT_FILE).is_file()), None)


def _render(value: Any, path: Path) -> Any:
    """The two templates Dagster renders in a `defs.yaml` that a path or a setting needs:
    `{{ context.project_root }}` and `{{ env.NAME }}`; any other is refused, naming it."""
    if isinstance(value, dict):
        return {k: _render(v, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, path) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        expr = m.group(1)
        if expr == "context.project_root":
            if (root := project_root(path)) is None:
                raise config_error(str(path), None, "attributes", f"{m.group(0)}: no {PROJECT_FILE} "
                                   "in a directory above the file, so no dg project root")
            return str(root)
        if (env := re.fullmatch(r"env\.(\w+)", expr)) or (
                env := re.fullmatch(r"env\(\s*['\"](\w+)['\"]\s*\)", expr)):
            if env.group(1) not in os.environ:
                raise config_error(str(path), None, "attributes",
                                   f"{m.group(0)}: the environment variable is not set")
            return os.environ[env.group(1)]
        raise config_error(str(path), None, "attributes", f"{m.group(0)}: the command line renders "
                           "only {{ context.project_root }} and {{ env.NAME }}")

    return _TEMPLATE.sub(one, value)


def error_path(err: ValidationError) -> list[Any]:
    """Where in a component's `attributes:` the first error of validating its config document
    lies: the field path inside the one dataset (or the `spark:` section), down to the field a
    cross-field rule names or the unknown key itself, so `defs.yaml:LINE` is that field's line."""
    first = err.errors(include_url=False)[0]
    loc = list(first["loc"])
    path = loc[2:] if loc[:1] == ["datasets"] else loc
    ctx = first.get("ctx") or {}
    field, key = ctx.get("field"), ctx.get("key")
    # a cross-field rule names its field; an unknown key is the key itself, at its own line
    inner = str(field).split(".") if field else [key] if key is not None else []
    return [p for p in [*path, *inner] if p != "[key]"]


def _line(node: yaml.Node | None, keys: list[Any]) -> int | None:
    """The line of the deepest mapping entry along `keys` (1-based)."""
    line = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            break
        found = next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)
        if found is None:
            break
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def _component_config(data: dict[str, Any], tree: yaml.Node | None, p: Path) -> PipelineConfig:
    """A `defs.yaml` of the DedupDataset component: its attributes, templates rendered; an error
    names `defs.yaml:LINE`."""
    if data.get("type") != COMPONENT_TYPE:
        raise config_error(str(p), None, "type", f"a component file of type {data.get('type')!r}; "
                           f"the command line reads those of {COMPONENT_TYPE}")
    doc = component_document(_render(data.get("attributes"), p), str(p))
    try:
        cfg = PipelineConfig.model_validate(doc, context=Where(str(p), p.resolve().parent))
    except ValidationError as e:
        line = _line(tree, ["attributes", *error_path(e)])
        raise to_config_error(e, doc, f"{p}:{line}" if line else str(p)) from None
    return cfg


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
        tree = yaml.compose(text, Loader=yaml.SafeLoader)
        twice = _given_twice(tree)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config error in {p}: not valid YAML: {e}") from None
    if twice is not None:  # a config that says a thing twice is refused
        (dataset, fld), (first, second) = locate(twice[0], data), twice[1:]
        raise config_error(str(p), dataset, fld, f"given twice (lines {first} and {second}); YAML "
                           "would silently keep the last")
    if isinstance(data, dict) and "attributes" in data and "type" in data:
        return _component_config(data, tree, p)
    return parse_config(data, str(p), p.resolve().parent)
