"""How each rank ended, from what survives it in the shard folder
(``record/forensics.py`` writes the files, ``trace/ring.py`` the ring):

- ``signal``: a fatal signal, from faulthandler's report (the signal, the
  stack of the thread it hit and of every other thread),
- ``exception``: an uncaught Python exception (type, message, frame),
- ``killed``: neither, and the rank never closed its journal: SIGKILL (the
  OOM killer, a launcher ending the job) or the node went down,
- ``exit``: the journal was closed (the interpreter exited normally).

Standard library only."""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional

from .journal import END_SUFFIX, FATAL_SUFFIX

#: faulthandler's words for the signals it handles
FATAL_NAMES = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
               "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
               "Illegal instruction": "SIGILL"}

#: a line the native hooks' std::terminate handler writes before the abort (record/_pghooks.cpp)
TERMINATE_PREFIX = "commprof terminate: "
NATIVE_BEGIN, NATIVE_END = "commprof native stack:", "commprof native stack end"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')


def parse_fatal(text: str) -> Optional[Dict[str, Any]]:
    """faulthandler's report -> signal, the threads' frames (innermost
    first), where it happened (the crashing thread's innermost Python frame,
    or the main thread's where the crash hit a thread without Python, as a
    backend's worker) and the innermost frame in the job's own code."""
    m = re.search(r"Fatal Python error: (.+)", text)
    if not m:
        return None
    what = m.group(1).strip()
    threads: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append({"current": line.startswith("Current"), "frames": []})
        elif threads:
            f = _FRAME.match(line)
            if f:
                threads[-1]["frames"].append(f"{os.path.basename(f['file'])}:{f['line']} in {f['func']}"
                                             + ("" if _own(f["file"]) else " [lib]"))
    # the C++ exception that ended the process, where the native hooks' terminate handler saw it,
    # and the C-level stack of the thread it ended in
    lines = text.splitlines()
    error = [line[len(TERMINATE_PREFIX):].strip() for line in lines if line.startswith(TERMINATE_PREFIX)]
    native: List[str] = []
    if NATIVE_BEGIN in lines:
        i = lines.index(NATIVE_BEGIN) + 1
        while i < len(lines) and lines[i] != NATIVE_END and len(native) < 48:
            native.append(lines[i].strip())
            i += 1
    current = next((t for t in threads if t["current"]), None)
    with_frames = [t for t in threads if t["frames"]]
    hit = current if current and current["frames"] else (with_frames[-1] if with_frames else None)
    frames = hit["frames"] if hit else []
    user = next((f for f in frames if not f.endswith(" [lib]")), frames[0] if frames else "")
    return {"how": "signal", "signal": FATAL_NAMES.get(what, what), "fault": what,
            "where": frames[0].replace(" [lib]", "") if frames else "",
            "user_where": user.replace(" [lib]", ""),
            "in_backend_thread": bool(current is not None and not current["frames"]),
            **({"message": error[0][:2000]} if error else {}),
            **({"native_stack": native} if native else {}),
            "threads": [t["frames"][:12] for t in threads][:16]}


_LIB = re.compile(r"(site-packages|dist-packages|/lib/python\d|^<frozen)")


def _own(path: str) -> bool:
    """A frame of the job's own code (not Python's library, a package, commprof)."""
    return not _LIB.search(path) and f"{os.sep}commprof{os.sep}" not in path


def end_of(folder: str, meta: Dict[str, Any]) -> Dict[str, Any]:
    """How the rank of ``meta`` (host, pid, status) ended."""
    host, pid = meta.get("host"), meta.get("pid")
    fatal_path = os.path.join(folder, f"{host}.{pid}{FATAL_SUFFIX}")
    end: Optional[Dict[str, Any]] = None
    try:
        with open(fatal_path, errors="replace") as fh:
            end = parse_fatal(fh.read())
        if end is not None:
            end["wall_ns"] = os.stat(fatal_path).st_mtime_ns
    except OSError:
        pass
    if end is None:
        try:
            with open(os.path.join(folder, f"{host}.{pid}{END_SUFFIX}")) as fh:
                end = json.load(fh)
        except (OSError, ValueError):
            end = None
    if end is None:
        if meta.get("status") == "complete":
            end = {"how": "exit"}
        else:
            end = {"how": "killed"}
    clock = meta.get("clock") or {}
    end.setdefault("wall_ns", clock.get("wall_ns_at_end"))
    return end
