"""torch.optim: every optimizer step is compute (``optimizer``) and closes a
training step. Uses torch's global optimizer step hooks, so every optimizer
class (including ones created before commprof was installed) is seen."""
from __future__ import annotations

from .base import Instrument
from ..recorder import now


class OptimizerInstrument(Instrument):
    name = "optim"

    def _install(self) -> None:
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        self._t0 = None
        self._dev = None
        self._depth = 0
        self.handle(register_optimizer_step_pre_hook(self._pre))
        self.handle(register_optimizer_step_post_hook(self._post))

    def _pre(self, optimizer, args, kwargs):
        if not self.active:
            return None
        try:
            self.check_fault()
            self._depth += 1
            if self._depth == 1:
                self._t0 = now()
                self._dev = self.rec.dev_begin()
                self.rec.nvtx.push("optimizer")
        except Exception as exc:
            self.fail(exc)
        return None

    def _post(self, optimizer, args, kwargs):
        if not self.active:
            return None
        try:
            self._depth -= 1
            if self._depth == 0 and self._t0 is not None:
                t1 = now()
                self.rec.nvtx.pop()
                self.rec.region_dev("compute", "optimizer", "torch.optim",
                                    type(optimizer).__name__, self._t0, t1, self._dev)
                self._t0 = None
                self.rec.optimizer_done(t1, "torch.optim")
        except Exception as exc:
            self.fail(exc)
        return None
