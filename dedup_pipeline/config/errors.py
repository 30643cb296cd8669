"""Config errors in one line: `config error in FILE: dataset 'D', field 'F': problem` (design.md C2).

Validators raise `problem(...)`; `to_config_error` turns the first of pydantic's errors into a
`ConfigError` naming the file, the dataset and the field, so users never see pydantic's dump.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from dedup_pipeline.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration problem; the message names the file, dataset and field."""

    stage = "configuration"
    fix = "fix the dataset config, then rerun {hours}"


def config_error(source: str, dataset: Any, fld: str, msg: str) -> ConfigError:
    """The one format of a config error: `config error in FILE: dataset 'D', field 'F': problem`."""
    where = f"dataset {dataset!r}, " if dataset is not None else ""
    return ConfigError(f"config error in {source}: {where}field {fld!r}: {msg}")


def problem(msg: str, fld: str | None = None, dataset: str | None = None, key: Any = None
            ) -> PydanticCustomError:
    """A validator's error; `fld` (a path inside the dataset) names the field when the validator
    sits on a model that holds several (cross-field rules), `dataset` when it sits on the file,
    `key` the key of the mapping being validated that the error is about."""
    ctx = {"problem": msg, "field": fld, "dataset": dataset, "key": None if key is None else str(key)}
    return PydanticCustomError("config", "{problem}", {k: v for k, v in ctx.items() if v is not None})


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _message(err: Any) -> str:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "config":
        return str(ctx["problem"])
    if kind == "missing" or (value is None and kind.endswith("_type")):
        return "is required"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping, got {type(value).__name__}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {_short(value)}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{msg[:1].lower()}{msg[1:]}, got {_short(value)}"


def locate(loc: tuple[Any, ...], data: Any) -> tuple[Any, str]:
    """The dataset a location in the document is in (None outside any), named by its `name` as
    written or else its position, and the field path in it."""
    dataset = None
    if len(loc) >= 2 and loc[0] == "datasets" and isinstance(loc[1], int):
        # the list a duplicate key was found in may not be the one YAML kept (`datasets:` twice)
        items = data.get("datasets") if isinstance(data, dict) else None
        item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        name = item.get("name") if isinstance(item, dict) else None
        dataset, loc = (f"#{loc[1] + 1}" if name is None else name), loc[2:]
    return dataset, ".".join(str(p) for p in loc if isinstance(p, str) and p != "[key]")


def to_config_error(e: ValidationError, data: Any, source: str) -> ConfigError:
    """The first of pydantic's errors validating `data` in one line: file, dataset, field path,
    problem."""
    err = e.errors(include_url=False)[0]
    ctx = err.get("ctx") or {}
    dataset, fld = locate((*err["loc"], ctx.get("key")), data)
    return config_error(source, ctx.get("dataset", dataset), ctx.get("field") or fld or "<top>",
                        _message(err))
