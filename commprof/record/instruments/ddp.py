"""DistributedDataParallel: every bucketed gradient collective the C++
Reducer issues.

The Reducer calls the process group from C++, so Python patches of
``dist.all_reduce`` never see it. DDP's comm-hook API does: at a DDP
module's first forward, if the user registered no hook, commprof registers
torch's own ``allreduce_hook`` (divide by world size, allreduce SUM — the
same arithmetic as the built-in reducer path) wrapped in a timer. A hook the
user registers (before or after) is wrapped the same way, so it keeps
working and is timed. Built-in C++ hooks (``_register_builtin_comm_hook``)
cannot be timed; such models are left alone.

Per bucket: issue time (hook called, i.e. the bucket became ready),
completion time (the hook's future resolved), S = bucket bytes, dtype,
group, sequence number."""
from __future__ import annotations

import functools

from .base import Instrument, tensor_bytes
from ..recorder import now


class DDPInstrument(Instrument):
    name = "ddp"

    def _install(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        import torch.distributed as dist

        self._dist = dist
        self._register = DDP.register_comm_hook  # original, used for the default hook
        self.patch(DDP, "__init__", self._wrap_init)
        self.patch(DDP, "register_comm_hook", self._wrap_register)
        self.patch(DDP, "_register_builtin_comm_hook", self._wrap_builtin)

    def _wrap_init(self, original):
        inst = self

        @functools.wraps(original)
        def __init__(ddp, *args, **kwargs):
            original(ddp, *args, **kwargs)
            if inst.active:
                try:
                    inst.check_fault()
                    inst.rec.run_info.setdefault("framework", "ddp")
                    holder = {}

                    def first_forward(module, args):
                        holder["h"].remove()
                        inst._ensure_default_hook(module)

                    holder["h"] = ddp.register_forward_pre_hook(first_forward)
                    inst.handle(holder["h"])
                except Exception as exc:
                    inst.fail(exc)

        return __init__

    def _ensure_default_hook(self, ddp) -> None:
        if not self.active or ddp._comm_hooks or getattr(ddp, "_commprof_builtin", False):
            return
        try:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            timed = self.timed_hook(ddp, allreduce_hook, "default")
            self._register(ddp, ddp.process_group, timed)
        except Exception as exc:
            self.fail(exc)

    def _wrap_register(self, original):
        inst = self

        @functools.wraps(original)
        def register_comm_hook(ddp, state, hook):
            if inst.active and not getattr(hook, "__commprof__", None):
                try:
                    hook = inst.timed_hook(ddp, hook, getattr(hook, "__qualname__", repr(hook)))
                except Exception as exc:
                    inst.fail(exc)
            return original(ddp, state, hook)

        return register_comm_hook

    def _wrap_builtin(self, original):
        @functools.wraps(original)
        def _register_builtin_comm_hook(ddp, comm_hook_type):
            ddp._commprof_builtin = True
            return original(ddp, comm_hook_type)

        return _register_builtin_comm_hook

    def timed_hook(self, ddp, hook, hook_name):
        inst = self
        rec = self.rec
        pg = ddp.process_group
        tls = rec.tls
        seen_buckets = set()

        def note_bucket(bucket):
            """Once per bucket index: which parameters it holds (for the
            report's bucket table), as module names in the bucket's order."""
            seen_buckets.add(bucket.index())
            try:
                names = {id(p): n for n, p in ddp.module.named_parameters()}
                mods = []
                for p in bucket.parameters():
                    m = names.get(id(p), "?").rsplit(".", 1)[0]
                    if not mods or mods[-1] != m:
                        mods.append(m)
                rec.note_bucket(bucket.index(), mods)
            except Exception:  # names are a nicety: never a reason to stop timing
                pass

        def new_bucket(bucket):
            # from step 1: DDP rebuilds its buckets (in gradient-ready order) after the first backward
            return rec.step >= 1 and len(seen_buckets) < 4096 and bucket.index() not in seen_buckets

        def hook_timed(state, bucket):
            if not inst.active:
                return hook(state, bucket)
            try:
                inst.check_fault()
                t0 = now()
                if new_bucket(bucket):
                    note_bucket(bucket)
                buf = bucket.buffer()
                nbytes = tensor_bytes(buf)
                dtype = str(buf.dtype)
                gname, gsize = rec.groups(inst._dist, pg)
                seq = rec.next_seq(gname)
                step = rec.step
                rec.comm_issued(t0)
                if rec.track:
                    rec.comm_started(gname, seq, "all_reduce", nbytes, t0)
                rid = rec.nvtx.start("all_reduce")
                dev = rec.dev_begin()
            except Exception as exc:
                inst.fail(exc)
                return hook(state, bucket)
            tls.depth = 1
            try:
                fut = hook(state, bucket)
            finally:
                tls.depth = 0

            def done(f):
                t1 = now()
                try:
                    rec.nvtx.end(rid)
                    # runs on a stream that waits for the allreduce (CUDA
                    # futures): the end event is its device completion
                    rec.collective("all_reduce", "ddp_reducer", hook_name, t0, t1, nbytes,
                                   dtype, gname, gsize, seq, step, blocking=False, dev=dev)
                except Exception as exc:
                    inst.fail(exc)
                return f.value()

            try:
                # a then() chain, not a done-callback: DDP waits for the chained
                # future, so the completion is recorded before the backward
                # returns (a done-callback may run after DDP's own one, once the
                # backward has ended: tests/record/test_fidelity.py)
                return fut.then(done)
            except Exception as exc:
                inst.fail(exc)
                return fut

        hook_timed.__qualname__ = getattr(hook, "__qualname__", "hook")
        hook_timed.__name__ = getattr(hook, "__name__", "hook")
        hook_timed.__commprof__ = self.name
        return hook_timed
