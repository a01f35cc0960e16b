"""torch.nn.Module: forward time of the *outermost* modules (the model, a DDP
wrapper, the loss), with the batch's leading dimension.

Discovery: until the first optimizer step, torch's global forward hooks
find the modules called at depth 0 ("roots"); each root then gets its own
instance hooks and the global hooks are removed, so in steady state only
the roots' calls pay for a hook (sub-modules run on torch's fast path).

FLOPs: the first training forward of each root with parameters runs under
``torch.utils.flop_counter.FlopCounterMode`` (entered in the pre-hook, left
in the post-hook; numerics unchanged, a few ms of dispatch on that one
warm-up batch): forward FLOPs and the batch size go into the rank's
metadata for FLOP/s and MFU. A failure there only switches the counting
off. A torch.compile'd root (``OptimizedModule``) is not counted: Dynamo
does not compile under a dispatch mode, so its first compile would move a
step later."""
from __future__ import annotations

from .base import Instrument, leading_dim
from ..recorder import now


def model_class(module) -> str:
    """The model's own class name: through ``torch.compile``'s
    ``OptimizedModule`` (``_orig_mod``) and FSDP2's per-module subclass
    (``FSDP<Class>``, bases ``(FSDPModule, Class)``)."""
    for _ in range(8):
        cls = type(module)
        if cls.__name__ == "OptimizedModule" and hasattr(module, "_orig_mod"):
            module = module._orig_mod
            continue
        if any(b.__name__ == "FSDPModule" for b in cls.__bases__[:-1]) and cls.__name__.startswith("FSDP"):
            return cls.__bases__[-1].__name__
        return cls.__name__
    return type(module).__name__


def describe(module) -> str:
    name = model_class(module)
    inner = getattr(module, "_orig_mod", module)
    inner = getattr(inner, "module", None)
    if inner is not None and name in ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
        return f"{name}({model_class(inner)})"
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
        self._flops_done = set()  # root details counted
        self._flop = None         # (mode, id(module), items) while counting
        self._m = m
        self._global = []
        self._paused = False      # discovery paused around a compiled root's forward
        self._start_discovery()

    def _start_discovery(self) -> None:
        m = self._m
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

    def _compiled_root(self, module) -> None:
        """A torch.compile'd root (``OptimizedModule``) at depth 0 during
        discovery: the global hooks are taken out for its forward (Dynamo
        would trace them into its graph and guard on them: their removal
        after the first step would recompile it) and put back after it;
        the root is timed by its own hooks from this call on."""
        if id(module) not in self._roots:
            self._add_root(module)
            # this call's instance pre-hooks were read before ours ran: time it here
            self._stack.append(self._begin(module, ()))
        self._stop_discovery()
        self._paused = True

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
                if type(module).__name__ == "OptimizedModule":
                    self._compiled_root(module)
                    return None
                if id(module) not in self._roots:
                    self._add_root(module)
                    self._discover_t0 = self._begin(module, args)
                    self._count_flops(module, args)
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
                self._flops_end(module)
                self._end(module, self._discover_t0)
                self._discover_t0 = None
        except Exception as exc:
            self.fail(exc)
        return None

    # -- FLOPs of the first batch --------------------------------------------
    def _count_flops(self, module, args) -> None:
        detail = self._roots.get(id(module))
        if self._flop is not None or detail in self._flops_done or not self._torch.is_grad_enabled():
            return
        try:
            if type(module).__name__ == "OptimizedModule":
                # torch.compile'd: under a FLOP counter (a dispatch mode) Dynamo
                # would run this forward eagerly and compile one step later
                self._flops_done.add(detail)
                return
            if not any(p.requires_grad for p in module.parameters()):
                return
            items = leading_dim(args)
            if not items:
                return
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False)
            mode.__enter__()
            self._flop = (mode, id(module), items)
        except Exception as exc:  # counting is optional: log once, never count again
            self._flop = None
            self._flops_done.add(detail)
            from ..log import log_once

            log_once("flops", f"FLOP counting switched off: {exc!r}")

    def _flops_end(self, module) -> None:
        if self._flop is None or self._flop[1] != id(module):
            return
        mode, _mid, items = self._flop
        self._flop = None
        detail = self._roots.get(id(module)) or describe(module)
        self._flops_done.add(detail)
        try:
            mode.__exit__(None, None, None)
            device = None
            p = next(module.parameters(), None)
            if p is not None and p.is_cuda:
                device = self._torch.cuda.get_device_name(p.device)
            self.rec.note_flops(detail, mode.get_total_flops(), items, device)
        except Exception as exc:
            from ..log import log_once

            log_once("flops", f"FLOP counting switched off: {exc!r}")

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
            if self._paused:        # after a compiled root's forward: discovery goes on
                self._paused = False
                if self.rec.step < 1:
                    self._start_discovery()
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
