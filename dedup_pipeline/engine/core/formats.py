"""The format of the JSON documents the engine persists (design.md L4).

A commit record, the commit log's summary, a dataset contract version and a compacted index
directory's manifest each carry ``"format": 1``, written by every load. A document without it, or
with another value, was written by another version of the package: it is refused with one line
naming the file, the format found, the format expected and the command that applies
(`FormatProblem.line`). Nothing reads a document of another format "as best it can".
Pure Python, below everything that reads or writes those documents; also the one home of the
commands a fix names (`run_command`, `rebuild_command`, `migrate_command`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FORMAT = 1
FIELD = "format"


# --- the commands a fix names ------------------------------------------------------------------

def run_command(first: str, last: str, dataset: str | None = None, config: str = "<file>") -> str:
    """The command that loads hours `first`..`last` in one run (`--dataset` where the message
    knows it; `<file>` is filled in with the config file where it is known)."""
    named = f" --dataset {dataset}" if dataset else ""
    return f"dedup-pipeline run --config {config}{named} --from {first} --to {last}"


def rebuild_command(dataset: str = "<name>", config: str = "<file>") -> str:
    """The command that rebuilds a dataset's index from unique: every message that finds the
    index damaged names it."""
    return f"dedup-pipeline rebuild-index --config {config} --dataset {dataset}"


def migrate_command(dataset: str = "<name>", config: str = "<file>") -> str:
    """The command that moves a dataset to the contract of its current config."""
    return f"dedup-pipeline migrate --config {config} --dataset {dataset}"


# What to run, per document kind, when one of another format is found
RELOAD = ("the dataset was loaded by another version: move its output aside and load it again "
          f"from its start ({run_command('<start>', '<latest hour>', '<name>')})")
REBUILD = f"rebuild the index: {rebuild_command()}"
MIGRATE = f"migrate the dataset: {migrate_command()}"


@dataclass(frozen=True)
class FormatProblem:
    """A document of another format: where it is, what it holds instead, and what to run."""

    path: str
    found: Any  # the document's "format" value; None when it has none
    fix: str

    @property
    def line(self) -> str:
        found = "no format" if self.found is None else f"format {json.dumps(self.found)}"
        return f"{self.path} is of {found}, expected format {FORMAT}; {self.fix}"


def found_in(doc: Any) -> Any | None:
    """The "format" value of a parsed JSON object, None when it has none."""
    return doc.get(FIELD) if isinstance(doc, dict) else None


def problem(path: str, doc: Any, fix: str) -> FormatProblem | None:
    """A `FormatProblem` if the parsed JSON object `doc` is not of `FORMAT` (a document that is
    not an object is not judged here: its reader reports it as damaged)."""
    if not isinstance(doc, dict):
        return None
    found = found_in(doc)
    if found == FORMAT and type(found) is int:
        return None
    return FormatProblem(path, found, fix)


def problem_in_text(path: str, text: str | bytes, fix: str) -> FormatProblem | None:
    """`problem` of a document's JSON text; None for text that is not JSON (damage, not format)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return problem(path, doc, fix)
