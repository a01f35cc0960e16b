"""torch.distributed collectives called from Python.

Patched in both ``torch.distributed`` and ``torch.distributed.distributed_c10d``
(code may hold either). Each call records its type (nccl-tests names),
S in bytes as nccl-tests define it, dtype, group, group size, the per-group
sequence number, issue time, and completion time: the return time for
blocking calls, the completion of the Work's future for ``async_op=True``.
Calls made from inside another recorded collective (the DDP hook's own
allreduce, object collectives) are not recorded twice. A call FSDP issues
(tagged by instruments/fsdp.py) is recorded with source ``fsdp`` and detail
``"<phase> <layer>"`` (ZeRO-3's, tagged by instruments/deepspeed.py: source
``zero3``); one Lightning or Accelerate issued (a metric sync, a
broadcast, a barrier) with source ``lightning`` / ``accelerate``."""
from __future__ import annotations

import functools
import sys

from .base import Instrument, tensor_bytes
from ..log import log_once
from ..recorder import now

# function -> (op name, parameter names in order, how S is computed)
#   "t": bytes of the first tensor, "tn": first tensor x group size,
#   "out": bytes of the first (output) tensor, "in": bytes of the second,
#   "inlist": sum over the list in second position, "none": 0
SPECS = {
    "all_reduce": ("all_reduce", ("tensor", "op", "group", "async_op"), "t"),
    "broadcast": ("broadcast", ("tensor", "src", "group", "async_op"), "t"),
    "reduce": ("reduce", ("tensor", "dst", "op", "group", "async_op"), "t"),
    "all_gather": ("all_gather", ("tensor_list", "tensor", "group", "async_op"), "in_x_n"),
    "all_gather_into_tensor": ("all_gather", ("output_tensor", "input_tensor", "group", "async_op"), "out"),
    "all_gather_single": ("all_gather", ("output_tensor", "input_tensor", "group", "async_op"), "out"),
    "_all_gather_base": ("all_gather", ("output_tensor", "input_tensor", "group", "async_op"), "out"),
    "reduce_scatter": ("reduce_scatter", ("output", "input_list", "op", "group", "async_op"), "inlist"),
    "reduce_scatter_tensor": ("reduce_scatter", ("output", "input", "op", "group", "async_op"), "in"),
    "reduce_scatter_single": ("reduce_scatter", ("output", "input", "op", "group", "async_op"), "in"),
    "_reduce_scatter_base": ("reduce_scatter", ("output", "input", "op", "group", "async_op"), "in"),
    "all_to_all_single": ("all_to_all", ("output", "input", "output_split_sizes",
                                         "input_split_sizes", "group", "async_op"), "in"),
    "all_to_all": ("all_to_all", ("output_tensor_list", "input_tensor_list", "group", "async_op"), "inlist"),
    "gather": ("gather", ("tensor", "gather_list", "dst", "group", "async_op"), "tn"),
    "gather_single": ("gather", ("tensor", "gather_tensor", "dst", "group", "async_op"), "tn"),
    "gather_into_tensor": ("gather", ("tensor", "gather_tensor", "dst", "group", "async_op"), "tn"),
    "scatter": ("scatter", ("tensor", "scatter_list", "src", "group", "async_op"), "tn"),
    "barrier": ("barrier", ("group", "async_op", "device_ids"), "none"),
    # DDP's construction-time broadcast of parameters and buffers from rank 0
    # (torch.distributed.utils._sync_params_and_buffers); S = all of them
    "_broadcast_coalesced": ("broadcast", ("process_group", "tensors", "buffer_size", "src"), "inlist"),
}


#: training frameworks whose own collectives (metric syncs, broadcasts,
#: barriers) are recorded under their name: module prefix -> source
DRIVERS = (("pytorch_lightning", "lightning"), ("lightning_fabric", "lightning"), ("lightning", "lightning"),
           ("accelerate", "accelerate"))
_driver_of_code: dict = {}      # code object of the first caller outside torch -> source or None


def driver_of(frame) -> "str | None":
    """The framework that issued a collective: the module of the first
    calling frame outside torch and commprof, when it is one of
    :data:`DRIVERS` (cached per code object: a short walk up the stack)."""
    f = frame
    for _ in range(24):
        if f is None:
            return None
        name = f.f_globals.get("__name__", "") or ""
        if not (name.startswith("torch.") or name.startswith("commprof.") or name in ("functools", "contextlib")):
            code = f.f_code
            hit = _driver_of_code.get(code, 0)
            if hit == 0:
                hit = next((src for prefix, src in DRIVERS if name == prefix or name.startswith(prefix + ".")), None)
                _driver_of_code[code] = hit
            return hit
        f = f.f_back
    return None


def size_of(rule, values, group_size):
    first = values[0] if values else None
    if rule == "none":
        return 0, None
    if rule in ("t", "out"):
        return tensor_bytes(first), str(first.dtype)
    if rule == "tn":
        return tensor_bytes(first) * group_size, str(first.dtype)
    if rule == "in":
        t = values[1]
        return tensor_bytes(t), str(t.dtype)
    if rule == "in_x_n":
        t = values[1]
        return tensor_bytes(t) * group_size, str(t.dtype)
    if rule == "inlist":
        lst = values[1]
        return sum(tensor_bytes(t) for t in lst), (str(lst[0].dtype) if lst else None)
    if rule == "list0":
        lst = values[0]
        return sum(tensor_bytes(t) for t in lst), (str(lst[0].dtype) if lst else None)
    raise ValueError(rule)


class CollectivesInstrument(Instrument):
    name = "collectives"
    #: recorded as the events' source
    source = "torch.distributed"
    specs = SPECS

    def _modules(self):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        return [dist, c10d] if dist.is_available() else []

    def _install(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        for mod in self._modules():
            for fname in self.specs:
                if hasattr(mod, fname):
                    self.patch(mod, fname, functools.partial(self._wrap, fname))

    def _wrap(self, fname, original):
        inst = self
        rec = self.rec
        source = self.source
        op, params, rule = self.specs[fname]
        tls = rec.tls
        n_params = len(params)
        i_group = params.index("group") if "group" in params else params.index("process_group")
        i_async = params.index("async_op") if "async_op" in params else None

        @functools.wraps(original)
        def collective(*args, **kwargs):
            if not inst.active or getattr(tls, "depth", 0):
                return original(*args, **kwargs)
            try:
                inst.check_fault()
                values = list(args[:n_params]) + [None] * (n_params - min(len(args), n_params))
                for i, p in enumerate(params):
                    if p in kwargs:
                        values[i] = kwargs[p]
                is_async = bool(values[i_async]) if i_async is not None else False
                gname, gsize = rec.groups(inst._dist, values[i_group])
                nbytes, dtype = size_of(rule, values, gsize)
                seq = rec.next_seq(gname)
                step = rec.step
                tag = getattr(tls, "fsdp", None)    # issued by FSDP (instruments/fsdp.py): its phase and layer
                src, det = (source, fname) if tag is None else (tag[2], f"{tag[0]} {tag[1]}")
                if tag is None and src == "torch.distributed":
                    src = driver_of(sys._getframe(1)) or src   # Lightning's, Accelerate's own
                rid = rec.nvtx.start(op)
                t0 = now()
                dev = rec.dev_begin()
                if is_async and tag is None:    # (FSDP's async gathers do not split the backward: not buckets)
                    rec.comm_issued(t0)
                rec.comm_started(gname, seq, op, nbytes, t0, dtype, src, step, gsize)
            except Exception as exc:
                inst.fail(exc)
                return original(*args, **kwargs)
            tls.depth = 1
            native = rec.native  # native DDP hooks on the group: this call is timed here, not there
            if native is not None:
                native.suppress(True)
            try:
                work = original(*args, **kwargs)
            finally:
                tls.depth = 0
                if native is not None:
                    native.suppress(False)
            try:
                if not is_async or work is None:
                    t1 = now()
                    rec.nvtx.end(rid)
                    # after a blocking call the current stream waits for the
                    # work (NCCL): the end event marks its device completion
                    rec.collective(op, src, det, t0, t1, nbytes, dtype,
                                   gname, gsize, seq, step, blocking=True, dev=dev)
                else:
                    def done(fut, _rid=rid, src=src, det=det):
                        t1 = now()
                        try:
                            rec.nvtx.end(_rid)
                            # torch runs done-callbacks of CUDA futures on a
                            # stream that waits for the work
                            rec.collective(op, src, det, t0, t1, nbytes, dtype,
                                           gname, gsize, seq, step, blocking=False, dev=dev)
                        except Exception as exc:
                            inst.fail(exc)
                    try:
                        work.get_future().add_done_callback(done)
                    except Exception:
                        log_once("nofuture", f"{fname}: Work has no future on this backend; "
                                 "completion time not recorded")
            except Exception as exc:
                inst.fail(exc)
            return work

        return collective
