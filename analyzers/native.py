"""The analyzers' compiled kernels (``_kernels.c``): the breakdown's
cover-pattern sweep and per-rank time lines (both in one call for a chunk
whose ranks come in runs), the sweep's row masks and
the collectives' per-instance reduction and the straggler tests' order
statistics, each in one or two passes where
numpy needs a dozen over every row
(benchmarks/results/report_speed/).

Built once per source with the system's C compiler (``$CC``, else ``cc``;
~0.3 s) into ``$COMMPROF_NATIVE_DIR`` (default
``~/.cache/commprof/native``), then loaded with ctypes. Where it cannot be
built or loaded (no compiler, a read-only home), or with
``COMMPROF_ANALYZERS_NATIVE=0``, the numpy path computes the same
results, bit for bit (tests/analyzers/test_native_kernels.py)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import threading
from typing import Any, Optional

from ..trace.files import native_cache_dir

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kernels.c")
ENV_SWITCH = "COMMPROF_ANALYZERS_NATIVE"

_lock = threading.Lock()
_lib: Any = None      # the loaded library; False when tried and unavailable
_why = ""             # why it is unavailable, for :func:`status`


def library_path() -> Optional[str]:
    """Where the built kernel for this source and machine lives."""
    try:
        with open(SOURCE, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()[:12]
    except OSError:
        return None
    root = native_cache_dir()
    return os.path.join(root, f"kernels-{sys.platform}-{platform.machine()}-{digest}.so")


def build(path: str) -> bool:
    """Compile the kernel to ``path`` (atomically: a file of its own, then
    renamed; two processes building at once both succeed)."""
    global _why
    cc = os.environ.get("CC") or "cc"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".building-", suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        proc = subprocess.run([cc, "-O2", "-std=c99", "-shared", "-fPIC", "-o", tmp, SOURCE],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[0]
            _why = f"the C compiler {cc!r} failed: {first[:200]}"
            return False
        os.chmod(tmp, 0o755)        # mkstemp's 0600: others sharing the folder could not load it
        os.replace(tmp, path)
        return True
    except (OSError, subprocess.SubprocessError) as exc:
        _why = f"no C compiler ({cc!r}: {exc.__class__.__name__})" if isinstance(exc, FileNotFoundError) \
            else f"could not build ({exc!r})"
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _off() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def status() -> str:
    """Which path the analyzers use, in words (``commprof report --timings``)."""
    if _off():
        return f"numpy ({ENV_SWITCH}={os.environ.get(ENV_SWITCH)})"
    if kernel() is not None:
        return f"compiled ({library_path()})"
    return f"numpy ({_why or 'the compiled kernels could not be loaded'})"


_P = ctypes.c_void_p
#: the kernels: name -> (argument types, result type)
SIGNATURES = {
    "commprof_pattern_sweep": ([_P, _P, _P, ctypes.c_int64, _P, ctypes.c_int, _P, ctypes.c_int64], ctypes.c_int),
    "commprof_pattern_weighted": ([_P, _P, _P, ctypes.c_int64, _P, _P, ctypes.c_int, _P, ctypes.c_int, _P,
                                   ctypes.c_int64], ctypes.c_int),
    "commprof_event_masks": ([ctypes.c_int64, _P, _P, _P, ctypes.c_int64, _P, _P, ctypes.c_int, _P, ctypes.c_int,
                              ctypes.c_int64, ctypes.c_int64, _P, _P, _P], ctypes.c_int64),
    "commprof_reduce_instances": ([ctypes.c_int64, _P, _P, _P], ctypes.c_int64),
    "commprof_run_sums": ([ctypes.c_int64, _P, _P, ctypes.c_int64, ctypes.c_int64, _P, ctypes.c_int64, _P,
                           ctypes.c_int64, _P, _P, _P, _P], ctypes.c_int64),
    "commprof_reduce_runs": ([ctypes.c_int64, _P, _P, ctypes.c_int, _P, _P, _P, ctypes.c_int64, _P, _P, _P, _P, _P,
                              _P], ctypes.c_int64),
    "commprof_rank_lines": ([ctypes.c_int64, _P, _P, _P, ctypes.c_int64, ctypes.c_int64, _P, _P, _P],
                            ctypes.c_int64),
    "commprof_rank_keys": ([ctypes.c_int64, _P, _P, _P, ctypes.c_int64, _P, _P, ctypes.c_int, _P, _P], None),
    "commprof_argsort_near": ([ctypes.c_int64, _P, _P, ctypes.c_int64], ctypes.c_int64),
    "commprof_step_sweep": ([ctypes.c_int64, _P, _P, _P, _P, _P, _P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, _P, ctypes.c_int, _P, _P, _P, _P, _P, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64], ctypes.c_int64),
    "commprof_others_median": ([ctypes.c_int64, ctypes.c_int64, _P, _P, _P], ctypes.c_int64),
    "commprof_column_kth": ([ctypes.c_int64, ctypes.c_int64, _P, ctypes.c_int64, _P, _P, _P], ctypes.c_int64),
}


def kernel(name: str = "commprof_pattern_sweep") -> Any:
    """A compiled kernel by name, or None where the numpy path is to be used."""
    global _lib
    if _off():
        return None
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load()
    return getattr(_lib, name) if _lib else None


def _load() -> Any:
    global _why
    path = library_path()
    if path is None:
        _why = f"its source is missing ({SOURCE})"
        return False
    try:
        if not os.path.exists(path) and not build(path):
            return False
        lib = ctypes.CDLL(path)
        for name, (args, res) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
    except (OSError, AttributeError) as exc:
        _why = f"could not build or load {path} ({exc!r})"
        return False
    return lib
