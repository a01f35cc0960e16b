"""Atomic file writes: write a temporary file beside the target, then
rename it over the target, so readers never see a half-written file."""
from __future__ import annotations

import contextlib
import gzip
import os
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path; on success it replaces ``path``, on error it
    is removed and ``path`` is left as it was. A target that exists and is
    not a regular file (``/dev/null``, a FIFO, a terminal) is written in
    place: renaming over it would replace the device itself; a symbolic
    link is kept and its target replaced."""
    if os.path.islink(path):
        path = os.path.realpath(path)
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        yield path
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            try:
                os.remove(tmp)
            except OSError:
                pass


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wt"):
    """An open file that becomes ``path`` when the block ends without error
    (gzip-compressed when ``path`` ends in ``.gz``)."""
    with atomic_path(path) as tmp:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(tmp, mode) as fh:
            yield fh


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path) as fh:
        fh.write(text)


def native_cache_dir() -> str:
    """Where commprof keeps what it compiles (the native DDP hooks, the
    analyzers' kernels): ``$COMMPROF_NATIVE_DIR``, default
    ``~/.cache/commprof/native``."""
    return os.environ.get("COMMPROF_NATIVE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "commprof",
                                                                   "native")
