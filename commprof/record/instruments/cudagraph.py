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
    #: its hooks run only where CUDA graphs are captured
    cuda_only = True

    def _install(self) -> None:
        from torch.cuda import graphs

        cls = getattr(graphs, "CUDAGraph", None)
        if cls is None or not hasattr(cls, "capture_begin"):
            return
        self.patch(cls, "capture_begin", self._wrap_begin)
        self.patch(cls, "capture_end", self._wrap_end)

    def _wrap_begin(self, original):
        inst, rec = self, self.rec

        @functools.wraps(original)
        def capture_begin(graph, *args, **kwargs):
            out = original(graph, *args, **kwargs)
            if inst.active:
                try:
                    inst.check_fault()
                    rec.capture_begins()  # after: a capture that failed to start never counts
                    graph._commprof_counted = True
                except Exception as exc:
                    inst.fail(exc)
            return out

        return capture_begin

    def _wrap_end(self, original):
        rec = self.rec

        @functools.wraps(original)
        def capture_end(graph, *args, **kwargs):
            try:
                return original(graph, *args, **kwargs)
            finally:
                if getattr(graph, "_commprof_counted", False):
                    graph._commprof_counted = False
                    rec.capture_ends()

        return capture_end
