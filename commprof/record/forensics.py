"""How a rank ended, kept where a dead process cannot lose it.

- A fatal signal (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL): faulthandler,
  a C-level handler, writes the signal and every thread's Python stack to
  ``<host>.<pid>.fatal.txt`` in the shard folder, then the process dies of
  the same signal as without commprof (the exit status is unchanged).
  Where the job had enabled faulthandler itself (``-X faulthandler``,
  ``PYTHONFAULTHANDLER``: to stderr), the file says so on its first line
  and ``commprof record`` copies the report to its stderr when the job ends
  (faulthandler writes to one file only).
- An uncaught exception: its type, message and innermost frame go to
  ``<host>.<pid>.end.json`` before Python's own hook prints it.
- A C++ exception that ends the process (a backend's worker thread
  throwing, as gloo does on a size mismatch): where the native hooks are
  loaded, their ``std::terminate`` handler writes its message into the
  same file first (``commprof terminate: ...``).
- SIGKILL (or a power cut) runs no handler: the assembler infers it from a
  journal its rank never closed, with neither file.

The collectives the rank was inside are in its ring (``trace/ring.py``)."""
from __future__ import annotations

import json
import os
import sys
import traceback

from ..trace.files import atomic_write
from ..trace.journal import END_SUFFIX, FATAL_SUFFIX

_state: dict = {"fatal": None, "hooked": False, "end_path": None}
#: first line of a fatal report whose job had enabled faulthandler itself
JOB_ENABLED = "# the job enabled faulthandler: commprof record copies this report to its stderr"


def install(shard_dir: str, host: str, pid: int) -> None:
    import faulthandler

    if _state["fatal"] is None:
        fh = open(os.path.join(shard_dir, f"{host}.{pid}{FATAL_SUFFIX}"), "w")
        if faulthandler.is_enabled():
            fh.write(JOB_ENABLED + "\n")
            fh.flush()
        faulthandler.enable(file=fh, all_threads=True)
        _state["fatal"] = fh  # kept open for the process's life
    if not _state["hooked"]:
        _state["hooked"] = True
        path = _state["end_path"] = os.path.join(shard_dir, f"{host}.{pid}{END_SUFFIX}")
        previous = sys.excepthook

        def hook(etype, value, tb):
            try:
                note(path, etype, value, tb)
            except Exception:
                pass
            previous(etype, value, tb)

        sys.excepthook = hook


def note(path: str, etype, value, tb) -> None:
    frames = traceback.extract_tb(tb)
    inner = frames[-1] if frames else None
    user = next((f for f in reversed(frames) if "site-packages" not in f.filename
                 and f"{os.sep}commprof{os.sep}" not in f.filename), inner)
    import time

    text = json.dumps({"how": "exception", "type": getattr(etype, "__name__", str(etype)), "wall_ns": time.time_ns(),
                       "message": str(value)[:2000],
                       "where": _where(inner), "user_where": _where(user)})
    atomic_write(path, text)


def _where(f) -> str:
    return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" if f is not None else ""


def note_sigterm(frame) -> None:
    """SIGTERM (commprof's handler finalises the journal, then the process
    dies of it): the signal and the frame it arrived in."""
    import time

    path = _state.get("end_path")
    if not path:
        return
    frames = traceback.extract_stack(frame) if frame is not None else []
    inner = frames[-1] if frames else None
    user = next((f for f in reversed(frames) if "site-packages" not in f.filename
                 and f"{os.sep}commprof{os.sep}" not in f.filename), inner)
    atomic_write(path, json.dumps({"how": "signal", "signal": "SIGTERM", "fault": "Terminated",
                                   "wall_ns": time.time_ns(), "where": _where(inner), "user_where": _where(user)}))


def fatal_fd():
    """The fatal report's file descriptor (None where faulthandler is not ours)."""
    return _state["fatal"].fileno() if _state["fatal"] is not None else None


def after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) must not report into its
    parent's file."""
    if _state["fatal"] is not None:
        import faulthandler

        faulthandler.disable()
        _state["fatal"] = None
