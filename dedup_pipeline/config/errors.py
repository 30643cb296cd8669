"""Config errors in one line: `config error in FILE: dataset 'D', field 'F': problem` (SPEC C2).

Validators raise `problem(...)`; `to_config_error` turns the first of pydantic's errors into a
`ConfigError` naming the file, the dataset and the field, so users never see pydantic's dump.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ValidationError
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


def problem(msg: str, fld: str | None = None, dataset: str | None = None) -> PydanticCustomError:
    """A validator's error; `fld` (a path inside the dataset) names the field when the validator
    sits on a model that holds several (cross-field rules), `dataset` when it sits on the file."""
    ctx = {k: v for k, v in (("problem", msg), ("field", fld), ("dataset", dataset)) if v is not None}
    return PydanticCustomError("config", "{problem}", ctx)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (through Optional, Annotated, tuple[...]), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _allowed_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The keys the mapping at `loc` below model `root` may hold, for an 'unknown key' message."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        fld = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = _model_in(fld.annotation) if fld is not None else None
    if model is None:
        return ""
    names = sorted(f.alias or n for n, f in model.model_fields.items())
    return f" (allowed: {', '.join(names)})"


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _message(root: type[BaseModel], err: Any) -> str:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "config":
        return str(ctx["problem"])
    if kind == "missing" or (value is None and kind.endswith("_type")):
        return "is required"
    if kind == "extra_forbidden":
        return "unknown key" + _allowed_keys(root, err["loc"][:-1])
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping, got {type(value).__name__}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {_short(value)}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{msg[:1].lower()}{msg[1:]}, got {_short(value)}"


def _dataset_label(data: Any, i: int) -> Any:
    """How a message names dataset i: its `name` as written, else its position."""
    try:
        name = data["datasets"][i].get("name")
    except (AttributeError, IndexError, KeyError, TypeError):
        name = None
    return name if name is not None else f"#{i + 1}"


def locate(loc: tuple[Any, ...], data: Any) -> tuple[Any, str]:
    """The dataset a location in the document is in (None outside any) and the field path in it."""
    dataset = None
    if len(loc) >= 2 and loc[0] == "datasets" and isinstance(loc[1], int):
        dataset, loc = _dataset_label(data, loc[1]), loc[2:]
    return dataset, ".".join(str(p) for p in loc if isinstance(p, str) and p != "[key]")


def to_config_error(e: ValidationError, root: type[BaseModel], data: Any, source: str) -> ConfigError:
    """The first of pydantic's errors validating `data` as `root` in one line: file, dataset,
    field path, problem."""
    err = e.errors(include_url=False)[0]
    ctx = err.get("ctx") or {}
    dataset, fld = locate(tuple(err["loc"]), data)
    return config_error(source, ctx.get("dataset", dataset), ctx.get("field") or fld or "<top>",
                        _message(root, err))
