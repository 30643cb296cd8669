"""Errors a user acts on: each class says where a run failed (`stage`) and what to do (`fix`).

Pure Python, below the config and the engine, so every error class can derive from `UserError`.
The Dagster layer's failure summaries (`orchestration/runs.py`) look the class up by the name a run's stored
error carries and fill in `{ds}`, `{hours}`, `{pool}` and `{rebuild_job}`; an
error of no such class (Spark, storage) is infrastructure.
"""

from __future__ import annotations

from typing import ClassVar

INFRA_STAGE = "Spark or storage (infrastructure)"
INFRA_FIX = ("fix the cause named in the error, then rerun {hours}: hours before the failing one are "
             "committed, the failing one committed nothing, and a rerun gives the same rows (R10)")


class UserError(Exception):
    """Base of the errors with their own stage and fix; subclasses set both (or inherit them)."""

    stage: ClassVar[str] = INFRA_STAGE
    fix: ClassVar[str] = INFRA_FIX
    _by_name: ClassVar[dict[str, type[UserError]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        UserError._by_name[cls.__name__] = cls


def stage_and_fix(cls_name: str | None) -> tuple[str, str]:
    """The stage and fix templates of the error class named `cls_name` (infrastructure if none)."""
    cls = UserError._by_name.get(cls_name or "")
    return (cls.stage, cls.fix) if cls is not None else (INFRA_STAGE, INFRA_FIX)
