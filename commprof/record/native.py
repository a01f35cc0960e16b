"""commprof's native process-group hooks (``_pghooks.cpp``): DDP's bucket
allreduces timed in C++, with no Python and no GIL per bucket.

In a recorded DDP step the Python process-group hooks were the largest
cost: they run between the backward's kernels, with cold caches, ~100 µs
of CPU per bucket (docs/benchmarks.md, "Recording overhead"). The native hooks do the
same work in C++ (issue time, bytes, dtype, the group's sequence number; the
completion time from a C++ callback on the work's future) and keep the rows
in a buffer that the journal writer drains at each flush.

The extension is built once per (torch, Python, source) with
``torch.utils.cpp_extension`` (a C++ compiler and ninja; ~24 s on 2 cores)
by ``commprof record`` before it starts the job, or by :func:`build`, into
``$COMMPROF_NATIVE_DIR`` (default ``~/.cache/commprof/native/<key>``). A
recorded rank never compiles: it loads the extension if it is there and
otherwise uses the Python hooks. Where it cannot be built (no compiler) the
recording is the same, only costlier."""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from typing import Optional

from ..trace.files import native_cache_dir

NAME = "commprof_pghooks"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_pghooks.cpp")

_loaded = None  # the module, False when tried and missing, None before trying


def _torch_version() -> Optional[str]:
    """The installed torch's version, the same whether torch is imported or
    not: the launcher (no torch) builds where the ranks (torch imported)
    look. The distribution's metadata first (``torch.__version__`` may add a
    local suffix the metadata lacks), the module's only without metadata."""
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        torch = sys.modules.get("torch")
        return getattr(torch, "__version__", None)


def build_dir() -> Optional[str]:
    """Where the extension for this torch, Python and source lives."""
    tv = _torch_version()
    if tv is None:
        return None
    try:
        with open(SOURCE, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()[:12]
    except OSError:
        return None
    key = f"torch{tv}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}".replace("+", "_")
    root = native_cache_dir()
    return os.path.join(root, key)


def _library(directory: str) -> Optional[str]:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:  # ".so" among them
        path = os.path.join(directory, NAME + suffix)
        if os.path.exists(path):
            return path
    return None


def built() -> bool:
    d = build_dir()
    return d is not None and _library(d) is not None


def build(verbose: bool = False):
    """Compile the extension into :func:`build_dir` (no-op when it is there);
    returns the loaded module. Raises where it cannot be built."""
    global _loaded
    d = build_dir()
    if d is None:
        raise RuntimeError("torch is not installed")
    os.makedirs(d, exist_ok=True)
    if _library(d) is None:
        from torch.utils.cpp_extension import load

        load(NAME, [SOURCE], build_directory=d, extra_cflags=["-O2"], verbose=verbose)
    _loaded = None
    return load_built()


def load_built():
    """The extension if it has been built for this torch, else None (never
    compiles). Needs torch imported (it links against it)."""
    global _loaded
    if _loaded is None:
        _loaded = False
        if os.environ.get("COMMPROF_NATIVE") == "0":
            return None
        d = build_dir()
        path = _library(d) if d else None
        if path is not None:
            try:
                import torch  # noqa: F401  (symbols the extension links against)

                spec = importlib.util.spec_from_file_location(NAME, path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                _loaded = mod
            except Exception as exc:  # a stale or foreign build: the Python hooks do the job
                from .log import log_once

                log_once("native", f"native process-group hooks not loaded ({exc!r}); using the Python hooks")
    return _loaded or None
