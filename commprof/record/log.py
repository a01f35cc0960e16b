"""One-line messages to stderr, each problem reported once per process."""
from __future__ import annotations

import os
import sys

_seen: set = set()


def warn(msg: str) -> None:
    try:
        sys.stderr.write(f"commprof[{os.getpid()}]: {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass


def log_once(key: str, msg: str) -> None:
    if key in _seen:
        return
    _seen.add(key)
    warn(msg)
