"""Kernel mode (``commprof record --kernels START:COUNT``): torch.profiler
around optimizer steps START .. START+COUNT-1, exported beside the rank's
journal as ``kineto.<host>.<pid>.json.gz`` and merged into the trace."""
from __future__ import annotations

from typing import Optional, Tuple

from ..trace.journal import kernel_trace_path
from .log import log_once


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

                acts = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
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
            prof.export_chrome_trace(kernel_trace_path(shard_dir, host, pid))
