"""Kernel mode (``commprof record --kernels START:COUNT``): torch.profiler
around optimizer steps START .. START+COUNT-1 (START may be 0: the profiler
then starts when the process records its first event), exported beside the
rank's journal as ``kineto.<host>.<pid>.json.gz`` and merged into the trace.

Stopping the profiler must happen on the training thread (at the step
boundary); exporting its trace — seconds of JSON for a busy window — runs
in a background thread, into a temporary file renamed when complete, so
the training thread does not stall and a killed process never leaves a
torn kernel file behind."""
from __future__ import annotations

import os
import threading
from typing import Optional, Tuple

from ..trace.journal import kernel_trace_path
from .log import log_once

#: seconds close() waits for a running export
EXPORT_DEADLINE_S = 60.0


def parse_window(spec: str) -> Optional[Tuple[int, int]]:
    """'START:COUNT' -> (start, count); '' -> None."""
    if not spec:
        return None
    start, _, count = str(spec).partition(":")
    return int(start), int(count or 1)


class KernelWindow:
    def __init__(self, spec: str):
        self.window = parse_window(spec)
        self._profiler = None
        self._export: Optional[threading.Thread] = None

    @property
    def running(self) -> bool:
        return self._profiler is not None

    def at_step(self, step: int, run_info: dict, shard_dir: str, host: str, pid: int) -> None:
        """Start / stop the profiler when step ``step`` begins."""
        if self.window is None:
            return
        start, count = self.window
        try:
            if step == start and self._profiler is None:
                import torch

                from .device import cuda_initialized

                acts = [torch.profiler.ProfilerActivity.CPU]
                if cuda_initialized():
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                self._profiler = torch.profiler.profile(activities=acts, record_shapes=False)
                self._profiler.__enter__()
                run_info["kernel_window"] = [start, start + count]
            elif step == start + count and self._profiler is not None:
                self.stop(shard_dir, host, pid)
        except Exception as exc:
            log_once("kernels", f"kernel mode disabled: {exc!r}")
            self.window = None
            self._profiler = None

    def stop(self, shard_dir: Optional[str], host: str, pid: int) -> None:
        """Stop the profiler; export its trace when ``shard_dir`` is given."""
        prof, self._profiler = self._profiler, None
        if prof is None:
            return
        prof.__exit__(None, None, None)
        if shard_dir is not None:
            self._export = threading.Thread(target=_export, args=(prof, kernel_trace_path(shard_dir, host, pid)),
                                            name="commprof-kernel-export", daemon=True)
            self._export.start()

    def wait_exported(self) -> None:
        """At process end: let a running export finish (bounded)."""
        if self._export is not None:
            self._export.join(EXPORT_DEADLINE_S)
            self._export = None


def _export(prof, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}.json.gz"  # torch picks gzip by the name's ending
    try:
        prof.export_chrome_trace(tmp)
        os.replace(tmp, path)
    except Exception as exc:
        log_once("kernels-export", f"kernel trace not exported: {exc!r}")
        try:
            os.remove(tmp)
        except OSError:
            pass
