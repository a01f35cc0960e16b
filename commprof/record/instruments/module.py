"""torch.nn.Module: forward time of the *outermost* modules (the model, a DDP
wrapper, the loss), with the batch's leading dimension.

Discovery: until the first optimizer step, torch's global forward hooks
find the modules called at depth 0 ("roots"); each root then gets its own
instance hooks and the global hooks are removed, so in steady state only
the roots' calls pay for a hook (sub-modules run on torch's fast path)."""
from __future__ import annotations

from .base import Instrument, leading_dim
from ..recorder import now


def describe(module) -> str:
    name = type(module).__name__
    inner = getattr(module, "module", None)
    if inner is not None and name in ("DistributedDataParallel", "DataParallel"):
        return f"{name}({type(inner).__name__})"
    return name


class ModuleInstrument(Instrument):
    name = "module"

    def _install(self) -> None:
        from torch.nn.modules import module as m

        import torch

        self._torch = torch
        self._depth = 0
        self._discover_t0 = None
        self._roots = {}  # id(module) -> detail
        self._stack = []
        self._global = [
            m.register_module_forward_pre_hook(self._g_pre),
            m.register_module_forward_hook(self._g_post, always_call=True),
        ]
        for h in self._global:
            self.handle(h)

    def _stop_discovery(self) -> None:
        for h in self._global:
            h.remove()
        self._global = []

    # -- discovery (global hooks) -------------------------------------------
    def _g_pre(self, module, args):
        if not self.active:
            return None
        try:
            self.check_fault()
            if self._depth == 0:
                if self.rec.step >= 1:
                    self._add_root(module)
                    self._stop_discovery()
                    return None
                if id(module) not in self._roots:
                    self._add_root(module)
                    self._discover_t0 = self._begin(module, args)
            self._depth += 1
        except Exception as exc:
            self.fail(exc)
        return None

    def _g_post(self, module, args, output):
        if not self.active:
            return None
        try:
            self._depth -= 1
            if self._depth == 0 and self._discover_t0 is not None:
                self._end(module, self._discover_t0)
                self._discover_t0 = None
        except Exception as exc:
            self.fail(exc)
        return None

    # -- roots (instance hooks) ---------------------------------------------
    def _add_root(self, module) -> None:
        if id(module) in self._roots:
            return
        detail = describe(module)
        self._roots[id(module)] = detail
        self.rec.note_model(detail, sum(p.numel() for p in module.parameters()))
        self.handle(module.register_forward_pre_hook(self._pre, with_kwargs=True))
        self.handle(module.register_forward_hook(self._post, always_call=True))

    def _pre(self, module, args, kwargs):
        if not self.active:
            return None
        try:
            self._stack.append(self._begin(module, args or tuple(kwargs.values())))
        except Exception as exc:
            self.fail(exc)
        return None

    def _post(self, module, args, output):
        if not self.active:
            return None
        try:
            if self._stack:
                self._end(module, self._stack.pop())
        except Exception as exc:
            self.fail(exc)
        return None

    def _begin(self, module, args):
        self.rec.nvtx.push("forward")
        return (now(), self._torch.is_grad_enabled(), leading_dim(args), self.rec.dev_begin())

    def _end(self, module, started) -> None:
        t0, grad, items, dev = started
        t1 = now()
        self.rec.nvtx.pop()
        detail = self._roots.get(id(module)) or describe(module)
        if grad and items:
            self.rec.note_items(detail, items)
        self.rec.region_dev("compute", "forward" if grad else "eval_forward", "nn.Module",
                            detail, t0, t1, dev, items)
