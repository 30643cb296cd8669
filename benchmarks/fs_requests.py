"""File-system requests made through `engine.storage.Storage`, by kind: what the bookkeeping
benchmark counts, because on an object store each is a billed round trip.

Counting is installed only inside `count_requests()`: every `Storage` (also one made before) then
reaches its file system through a counting proxy, and the calls `Storage` makes with `os`
directly on a local root count themselves (one listing is one `ls`, one stat an `info`, one
atomic write a `put`, one rename an `mv`). Only the calls of this package count, not the calls
an fsspec implementation makes internally.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from dedup_pipeline.engine.core.storage import Storage

_COUNTED = frozenset({"ls", "find", "info", "exists", "isdir", "open", "rm", "mv", "makedirs",
                      "cat_file", "pipe_file", "glob", "walk", "du"})
# Storage's methods that call `os` directly on a local root, and the request each one is
_LOCAL = {"list_names": "ls", "dir_mtime": "info", "write_text_atomic": "put", "move": "mv"}


class _CountingFS:
    def __init__(self, fs: Any, out: Counter[str]) -> None:
        self._fs, self._out = fs, out

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name not in _COUNTED or not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._out[name] += 1
            return attr(*args, **kwargs)
        return counted


class _CountedFS:
    """`Storage.fs` while counting: a data descriptor, so it also wraps the file system of a
    `Storage` made before the `with` (its own `fs` stays in its `__dict__`)."""

    def __init__(self, out: Counter[str]) -> None:
        self._out = out

    def __get__(self, st: Storage | None, owner: type) -> Any:
        return self if st is None else _CountingFS(st.__dict__["fs"], self._out)

    def __set__(self, st: Storage, fs: Any) -> None:
        st.__dict__["fs"] = fs


def _local(method: Callable[..., Any], kind: str, out: Counter[str]) -> Callable[..., Any]:
    @functools.wraps(method)
    def counted(self: Storage, *args: Any, **kwargs: Any) -> Any:
        if self.local:
            out[kind] += 1
        return method(self, *args, **kwargs)
    return counted


@contextlib.contextmanager
def count_requests() -> Iterator[Counter[str]]:
    """The requests made through `Storage` inside the `with`, by kind."""
    out: Counter[str] = Counter()
    saved = {name: getattr(Storage, name) for name in _LOCAL}
    try:
        Storage.fs = _CountedFS(out)  # type: ignore[attr-defined]
        for name, kind in _LOCAL.items():
            setattr(Storage, name, _local(saved[name], kind, out))
        yield out
    finally:
        del Storage.fs  # type: ignore[attr-defined]
        for name, method in saved.items():
            setattr(Storage, name, method)
