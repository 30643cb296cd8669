"""What the engine's records on disk are made of: frozen pydantic models, checked when read.

`Record` is the base of a commit record and of its entries (engine/core/commits.py, the index files
of engine/core/index/layout.py, the landing files of engine/core/parse.py). Read from disk they are
validated strictly (`read_json`: JSON types as written, no "3" taken for 3 nor true for 1); built
in code they are validated laxly (a list for a tuple). A field a load may leave unset
(`optional()`) is left out of the JSON while unset. `problem` turns a `ValidationError` into the one line
an error message quotes: where, what it is, what was expected.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

WANTED = "wanted"  # the error type of `Count` and `Number`: "expected <what>"


def _want(what: str, ok: Any) -> BeforeValidator:
    def check(v: Any) -> Any:
        if not ok(v):
            raise PydanticCustomError(WANTED, "expected {what}", {"what": what})
        return v
    return BeforeValidator(check)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# A row, byte or file count (a JSON integer >= 0; not true, not 1.0).
Count = Annotated[int, _want("a count", _is_count)]
# A finite JSON number kept as written: an int stays an int (expiry values in microseconds exceed
# a float's exact integers only past 2**53, and a record must not turn 5 into 5.0).
Number = Annotated[int | float, _want("a number", _is_number)]
NumberOrNull = Annotated[int | float | None,
                         _want("a number or null", lambda v: v is None or _is_number(v))]


def _is_none(v: Any) -> bool:
    return v is None


def optional() -> Any:
    """A field a load may leave unset: None until set, and left out of the JSON while None."""
    return Field(default=None, exclude_if=_is_none)


class Record(BaseModel):
    """A frozen record of a file on disk (unknown keys of a nested entry are ignored)."""

    model_config = ConfigDict(frozen=True)

    def to_json(self) -> dict[str, Any]:
        """The record as stored: JSON types, unset optional fields left out."""
        return self.model_dump(mode="json")

    @classmethod
    def read_json(cls, text: str | bytes, context: dict[str, Any] | None = None) -> Self:
        """The record from its JSON text, strictly; `ValueError` with `problem`'s line if not."""
        try:
            return cls.model_validate_json(text, strict=True, context=context)
        except ValidationError as e:
            raise ValueError(problem(e, text)) from None


_EXPECTED = {  # pydantic's error types, as the words an operator reads
    "int_type": "an integer", "float_type": "a number", "finite_number": "a finite number",
    "string_type": "a string", "bool_type": "true or false", "dict_type": "an object",
    "model_type": "an object", "model_attributes_type": "an object", "list_type": "a list",
    "tuple_type": "a list",
}


def problem(e: ValidationError, text: str | bytes) -> str:
    """The first thing wrong with a record's JSON `text`, in one line.

    ``field 'index_files[0].size' is -1, expected a count``; ``field 'rows_in' is missing``;
    ``not valid JSON: ...``; ``not a JSON object but list``; a model's own check as it says it.
    """
    err = e.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return f"not valid JSON: {(err.get('ctx') or {}).get('error', err['msg'])}"
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    path = _path(err["loc"], doc, missing=err["type"] == "missing")
    if not path:
        if err["type"] in ("model_type", "dict_type"):
            return f"not a JSON object but {type(doc).__name__}"
        return err["msg"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)[1:]
    if err["type"] == "missing":
        return f"field {where!r} is missing"
    if err["type"] == "literal_error":  # a field with one allowed value (a format)
        return f"field {where!r} is {err['input']!r}, expected {err['ctx']['expected']}"
    if err["type"] not in (WANTED, *_EXPECTED):
        return err["msg"]  # a model's own check (e.g. a record of another hour)
    wanted = (err.get("ctx") or {}).get("what") if err["type"] == WANTED else _EXPECTED[err["type"]]
    return f"field {where!r} is {err['input']!r}, expected {wanted}"


def _path(loc: tuple[Any, ...], doc: Any, missing: bool = False) -> list[Any]:
    """The keys and indexes of `loc` that are in the document: pydantic's loc can also name the
    alternative of a union or the validator that failed, which are not."""
    out: list[Any] = []
    for i, p in enumerate(loc):
        key = isinstance(doc, dict) and isinstance(p, str) and p in doc
        index = isinstance(doc, list) and isinstance(p, int) and 0 <= p < len(doc)
        if key or index:
            doc = doc[p]
        elif not (missing and i == len(loc) - 1):  # the missing key itself is in the path
            continue
        out.append(p)
    return out
