"""torch.optim: every optimizer step is compute (``optimizer``) and closes a
training step. Uses torch's global optimizer step hooks, so every optimizer
class (including ones created before commprof was installed) is seen. With
a closure (``optimizer.step(closure)``: Lightning, LBFGS) the region starts
when the closure (forward and backward) returns."""
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
        self._closure = False
        self.handle(register_optimizer_step_pre_hook(self._pre))
        self.handle(register_optimizer_step_post_hook(self._post))

    def _pre(self, optimizer, args, kwargs):
        if not self.active:
            return None
        try:
            self.check_fault()
            self._depth += 1
            if self._depth == 1:
                closure = kwargs.get("closure") if "closure" in kwargs else (args[0] if args else None)
                if callable(closure):
                    return self._with_timed_closure(closure, args, kwargs)
                self._t0 = now()
                self._dev = self.rec.dev_begin()
                self.rec.nvtx.push("optimizer")
        except Exception as exc:
            self.fail(exc)
        return None

    def _with_timed_closure(self, closure, args, kwargs):
        """``optimizer.step(closure)`` (Lightning, LBFGS): the closure runs
        the forward and backward; the optimizer's own time starts when it
        returns (the last time, for an optimizer that calls it again). The
        closure's value is returned unchanged."""
        inst = self
        self._t0 = None
        self._closure = True

        def closure_then_optimizer(*a, **k):
            out = closure(*a, **k)
            if inst._t0 is None:
                inst.rec.nvtx.push("optimizer")
            inst._t0 = now()
            inst._dev = inst.rec.dev_begin()
            return out

        if "closure" in kwargs:
            return args, dict(kwargs, closure=closure_then_optimizer)
        return (closure_then_optimizer,) + tuple(args[1:]), kwargs

    def _post(self, optimizer, args, kwargs):
        if not self.active:
            return None
        try:
            self._depth -= 1
            if self._depth == 0 and (self._t0 is not None or self._closure):
                t1 = now()
                if self._t0 is not None:        # (None: a closure the optimizer never called)
                    self.rec.nvtx.pop()
                    self.rec.region_dev("compute", "optimizer", "torch.optim",
                                        type(optimizer).__name__, self._t0, t1, self._dev)
                self._t0 = None
                self._closure = False
                self.rec.optimizer_done(t1, "torch.optim")
        except Exception as exc:
            self.fail(exc)
        return None
