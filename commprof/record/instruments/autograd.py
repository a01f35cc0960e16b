"""torch.autograd.backward (and so ``Tensor.backward``): backward compute.

When collectives are issued during a backward (DDP's bucketed allreduce),
the backward is split: compute up to the last collective issued, then a
``wait`` region until backward returns. DDP's reducer blocks there until
every bucket's allreduce has completed, so that tail is exposed
communication, not compute."""
from __future__ import annotations

import functools

from .base import Instrument
from ..recorder import now


class AutogradInstrument(Instrument):
    name = "autograd"

    def _install(self) -> None:
        import torch.autograd

        self._depth = 0
        self.patch(torch.autograd, "backward", self._wrap)

    def _wrap(self, original):
        inst = self
        rec = self.rec

        @functools.wraps(original)
        def backward(*args, **kwargs):
            if not inst.active or inst._depth:
                return original(*args, **kwargs)
            try:
                inst.check_fault()
                inst._depth = 1
                rec.nvtx.push("backward")
                t0 = now()
                dev = rec.dev_begin()
                rec.backward_begins()
            except Exception as exc:
                inst._depth = 0
                inst.fail(exc)
                return original(*args, **kwargs)
            try:
                return original(*args, **kwargs)
            finally:
                t1 = now()
                inst._depth = 0
                try:
                    rec.nvtx.pop()
                    rec.backward_ends(t1)
                    last = rec.comm_issue_time()
                    if t0 < last < t1:
                        # device times (CUDA) of the split backward cover the whole call
                        rec.region_dev("compute", "backward", "autograd", None, t0, last, dev)
                        rec.region("wait", "comm_wait", "autograd", "backward", last, t1)
                    else:
                        rec.region_dev("compute", "backward", "autograd", None, t0, t1, dev)
                except Exception as exc:
                    inst.fail(exc)

        return backward
