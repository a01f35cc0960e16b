"""Device-accurate times on CUDA: CUDA events on the current stream around
forward, backward and the optimizer step, resolved off the hot path.

``begin()`` records a timing event on the current stream and returns it;
``end(start, row)`` records the end event and parks the row. The flush
thread calls ``resolve()``, which turns every parked pair whose end event
has completed (``Event.query()``, never a synchronisation) into device
times on the host's monotonic clock and emits the row with dev_start /
dev_end filled. The mapping to the host clock comes from one reference
event, synchronised once when device timing starts (before the first timed
region, outside the steady state). At process end, ``drain()`` waits for
what is still pending.

On CPU (or without CUDA) nothing here is used."""
from __future__ import annotations

import collections
import time
from typing import Optional


class CudaTimer:
    def __init__(self, torch_module):
        self.torch = torch_module
        self.pending: collections.deque = collections.deque()
        self._ref = None
        self._ref_ns = 0

    @staticmethod
    def available() -> bool:
        import sys

        torch = sys.modules.get("torch")
        try:
            return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())
        except Exception:
            return False

    def _calibrate(self) -> None:
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        ev.synchronize()
        self._ref_ns = time.monotonic_ns()
        self._ref = ev

    def begin(self):
        if self._ref is None:
            self._calibrate()
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def end(self, start, row: tuple) -> None:
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        self.pending.append((start, ev, row))

    def _to_host(self, ev) -> int:
        return self._ref_ns + int(self._ref.elapsed_time(ev) * 1e6)

    def resolve(self, emit, wait: bool = False) -> int:
        """Emit every parked row whose events completed (in order); with
        ``wait`` synchronise on the remaining ones (process end only)."""
        n = 0
        while self.pending:
            start, end, row = self.pending[0]
            if not end.query():
                if not wait:
                    break
                end.synchronize()
            self.pending.popleft()
            emit(row._replace(dev_start=self._to_host(start), dev_end=self._to_host(end)))
            n += 1
        return n


def maybe_timer() -> Optional[CudaTimer]:
    if not CudaTimer.available():
        return None
    import sys

    return CudaTimer(sys.modules["torch"])
