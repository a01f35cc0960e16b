"""torch.cuda.CUDAGraph: while a graph is being captured, device timing
stands still — no timing events are recorded (they would become part of
the graph) and the writer thread queries none (``Event.query()`` from
another thread is illegal during a capture in torch's default capture
mode). Regions inside a capture keep their host times."""
from __future__ import annotations

import functools

from .base import Instrument


class CudaGraphInstrument(Instrument):
    name = "cudagraph"

    def _install(self) -> None:
        from torch.cuda import graphs

        cls = getattr(graphs, "CUDAGraph", None)
        if cls is None or not hasattr(cls, "capture_begin"):
            return
        self.patch(cls, "capture_begin", self._wrap_begin)
        self.patch(cls, "capture_end", self._wrap_end)

    def _wrap_begin(self, original):
        rec = self.rec

        @functools.wraps(original)
        def capture_begin(graph, *args, **kwargs):
            out = original(graph, *args, **kwargs)
            rec.capture_begins()  # after: a capture that failed to start never counts
            return out

        return capture_begin

    def _wrap_end(self, original):
        rec = self.rec

        @functools.wraps(original)
        def capture_end(graph, *args, **kwargs):
            try:
                return original(graph, *args, **kwargs)
            finally:
                rec.capture_ends()

        return capture_end
