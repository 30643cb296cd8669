"""The rule ids the code cites and the ones docs/design.md defines are the same set.

Defined: the ids in bold at the start of a list item of design.md (`- **R10a Exclusive writer.**`,
`- **D4a / D5a ...**`), and the targets its "Targets (T)" section names (`T1-T6` as a range, and
each one listed). Cited: tokens shaped like an id (one of C L R D K E N T, one or two digits, an
optional lower-case letter) in the comments and docstrings of the .py files under dedup_pipeline/,
benchmarks/, scripts/ and dedup_pipeline_tests/, and in the comments of the shell scripts under
scripts/ and .ci/. Other string literals are data, not citations (a test's key "K9", an f-string's
`{T1}`), and a token followed by `=` is a formula's variable (`L0 = 00:50`, hour 0's latest point).
"""

from __future__ import annotations

import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
PY_TREES = ("dedup_pipeline", "benchmarks", "scripts", "dedup_pipeline_tests")
SHELL_TREES = ("scripts", ".ci")

ID = r"[CLRDKENT]\d{1,2}[a-z]?"
CITED = re.compile(rf"\b{ID}\b(?!\s*=)")
# `- **C1**`, `- **R10a Exclusive writer.**`, `- **D4a / D5a Per-hour truth in the UI.**`
DEFINING_ITEM = re.compile(rf"^\s*- \*\*((?:{ID})(?:\s*/\s*{ID})*)\b")
T_ID = re.compile(r"\bT\d{1,2}[a-z]?\b")
T_RANGE = re.compile(r"\bT(\d{1,2})-T(\d{1,2})\b")

Places = dict[str, list[str]]


def defined_ids() -> Places:
    """id -> where design.md defines it (`docs/design.md:LINE`)."""
    found: Places = defaultdict(list)
    in_targets = False
    for n, line in enumerate(DESIGN.read_text(encoding="utf-8").splitlines(), 1):
        where = f"docs/design.md:{n}"
        if line.startswith("## "):
            in_targets = line.strip() == "## Targets (T)"
            continue
        m = DEFINING_ITEM.match(line)
        if m:
            for i in re.split(r"\s*/\s*", m.group(1)):
                found[i].append(where)
        if in_targets:
            ids = set(T_ID.findall(line))
            for lo, hi in T_RANGE.findall(line):
                ids.update(f"T{k}" for k in range(int(lo), int(hi) + 1))
            for i in ids:
                found[i].append(where)
    return dict(found)


def _python_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file. A docstring here is a string
    that is a statement on its own (a module's, class's or function's docstring, or a string
    standing as a comment); every other string literal is data."""
    skip = {tokenize.NL, tokenize.COMMENT}
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
    significant = [t for t in tokens if t.type not in skip]
    starts = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    ends = {tokenize.NEWLINE, tokenize.ENDMARKER}
    out = [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    for k, t in enumerate(significant):
        if t.type != tokenize.STRING:
            continue
        before = significant[k - 1].type if k else tokenize.NEWLINE
        after = significant[k + 1].type if k + 1 < len(significant) else tokenize.ENDMARKER
        if before in starts and after in ends:
            out.append((t.start[0], t.string))
    return out


def _shell_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment of a shell script (from a `#` that starts a word to the end of
    the line; the `#!` line is not a comment)."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if n == 1 and line.startswith("#!"):
            continue
        m = re.search(r"(?:^|\s)#(.*)$", line)
        if m:
            out.append((n, m.group(1)))
    return out


def _is_shell(path: Path) -> bool:
    if path.suffix == ".sh":
        return True
    with path.open("rb") as f:
        first = f.readline()
    return first.startswith(b"#!") and (b"sh" in first.split(b"/")[-1])


def cited_ids() -> Places:
    """id -> where the code cites it (`path:LINE`), this file left out."""
    me = Path(__file__).resolve()
    texts: list[tuple[str, int, str]] = []
    for tree in PY_TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if path.resolve() != me and ".venv" not in path.parts:
                texts += [(str(path.relative_to(ROOT)), n, s) for n, s in _python_texts(path)]
    for tree in SHELL_TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            if path.is_file() and _is_shell(path):
                texts += [(str(path.relative_to(ROOT)), n, s) for n, s in _shell_texts(path)]
    found: Places = defaultdict(list)
    for rel, line, text in texts:
        for m in CITED.finditer(text):
            found[m.group()].append(f"{rel}:{line + text.count(chr(10), 0, m.start())}")
    return dict(found)


def _listing(ids: Places) -> str:
    return "\n".join(f"  {i}: {', '.join(ids[i][:5])}{' ...' if len(ids[i]) > 5 else ''}"
                     for i in sorted(ids))


@pytest.mark.fast
def test_design_md_defines_ids_of_every_kind() -> None:
    """The parse of design.md finds ids of every kind, so the two checks below compare real sets."""
    defined = defined_ids()
    kinds = {i[0] for i in defined}
    assert kinds == set("CLRDKENT"), f"docs/design.md: no ids found of kinds {set('CLRDKENT') - kinds}"
    assert {"R10a", "D4a", "D5a", "T1", "T8", "T6f"} <= defined.keys()


@pytest.mark.fast
def test_every_cited_id_is_defined_in_design_md() -> None:
    defined, cited = defined_ids(), cited_ids()
    unknown = {i: where for i, where in cited.items() if i not in defined}
    assert not unknown, ("ids cited in the code that docs/design.md does not define (define them "
                         f"there or fix the citation):\n{_listing(unknown)}")


@pytest.mark.fast
def test_every_id_design_md_defines_is_cited_in_the_code() -> None:
    defined, cited = defined_ids(), cited_ids()
    uncited = {i: where for i, where in defined.items() if i not in cited}
    assert not uncited, ("ids docs/design.md defines that no code cites (cite each where it is "
                         f"implemented, e.g. \"(design.md R10a)\"):\n{_listing(uncited)}")
