"""horovod.torch: every collective Horovod enqueues, with its completion.

Every public collective of ``horovod.torch`` (``allreduce[_async][_]``,
``grouped_allreduce*``, ``allgather*``, ``broadcast*`` and so
``broadcast_parameters``, ``alltoall*``, ``reducescatter*``) goes through a
private ``_<op>_async`` function in ``horovod.torch.mpi_ops`` that returns a
handle; those are patched, so calls made by ``hvd.DistributedOptimizer``
(which copies the public functions into ``horovod.torch.optimizer`` at
import) are seen too. ``synchronize(handle)`` — patched wherever Horovod
keeps a reference: ``mpi_ops``, ``horovod.torch``, ``optimizer``,
``functions`` — marks completion: the collective's event runs from the
enqueue to the return of ``synchronize``, and the time the caller spent
blocked in ``synchronize`` is a ``wait`` region (exposed communication,
e.g. inside ``optimizer.step()``).

Per collective: tensor name (``detail``), bytes (S, nccl-tests convention),
dtype, process set, its size, and a per-process-set sequence number.
"""
from __future__ import annotations

import functools
import sys

from .base import Instrument, tensor_bytes
from ..recorder import now

# private function -> (op name, how S is computed: "t" tensor, "list" sum of
# tensors, "gather" tensor x n)
PRIVATE = {
    "_allreduce_async": ("all_reduce", "t"),
    "_grouped_allreduce_async": ("all_reduce", "list"),
    "_allgather_async": ("all_gather", "gather"),
    "_grouped_allgather_async": ("all_gather", "gather_list"),
    "_broadcast_async": ("broadcast", "t"),
    "_alltoall_async": ("all_to_all", "t"),
    "_reducescatter_async": ("reduce_scatter", "t"),
    "_grouped_reducescatter_async": ("reduce_scatter", "list"),
}
SYNC_HOLDERS = ("horovod.torch.mpi_ops", "horovod.torch", "horovod.torch.optimizer", "horovod.torch.functions")


class HorovodInstrument(Instrument):
    name = "horovod"
    trigger = "horovod.torch"

    def _install(self) -> None:
        mpi_ops = sys.modules["horovod.torch.mpi_ops"]
        self._pending = {}
        self._sets = {}
        for fname, (op, rule) in PRIVATE.items():
            if hasattr(mpi_ops, fname):
                self.patch(mpi_ops, fname, functools.partial(self._wrap_async, op, rule))
        for modname in SYNC_HOLDERS:
            mod = sys.modules.get(modname)
            if mod is not None and hasattr(mod, "synchronize"):
                self.patch(mod, "synchronize", self._wrap_sync)
        self.rec.run_info.setdefault("framework", "horovod")
        try:
            import horovod

            self.rec.run_info["horovod"] = getattr(horovod, "__version__", None)
        except Exception:
            pass

    def _set_info(self, process_set):
        key = getattr(process_set, "process_set_id", 0)
        hit = self._sets.get(key)
        if hit is None:
            try:
                size = int(process_set.size())
            except Exception:
                return f"hvd{key}", None
            hit = self._sets[key] = (f"hvd{key}", size)
        return hit

    def _wrap_async(self, op, rule, original):
        inst = self
        rec = self.rec

        @functools.wraps(original)
        def enqueue(tensor, *args, **kwargs):
            if not inst.active:
                return original(tensor, *args, **kwargs)
            try:
                inst.check_fault()
                t0 = now()
                process_set = kwargs.get("process_set", args[-1] if args else None)
                group, size = inst._set_info(process_set)
                if rule == "list":
                    nbytes = sum(tensor_bytes(t) for t in tensor)
                    dtype = str(tensor[0].dtype) if tensor else None
                elif rule == "gather_list":
                    nbytes = sum(tensor_bytes(t) for t in tensor) * (size or 1)
                    dtype = str(tensor[0].dtype) if tensor else None
                else:
                    nbytes = tensor_bytes(tensor) * ((size or 1) if rule == "gather" else 1)
                    dtype = str(tensor.dtype)
                name = kwargs.get("name")
                if name is None:
                    name = next((a for a in args if isinstance(a, str)), None)
                info = (op, t0, nbytes, dtype, name, group, size, rec.next_seq(group), rec.step)
                rec.comm_started(group, info[7], op, nbytes, t0, dtype, "horovod", info[8], size or 0)
            except Exception as exc:
                inst.fail(exc)
                return original(tensor, *args, **kwargs)
            handle = original(tensor, *args, **kwargs)
            inst._pending[handle] = info
            rec.comm_issued(info[1])
            return handle

        return enqueue

    def _wrap_sync(self, original):
        inst = self
        rec = self.rec

        @functools.wraps(original)
        def synchronize(handle):
            if not inst.active:
                return original(handle)
            t_call = now()
            try:
                return original(handle)
            finally:
                t1 = now()
                info = inst._pending.pop(handle, None)
                if info is not None:
                    try:
                        op, t0, nbytes, dtype, name, group, size, seq, step = info
                        rec.collective(op, "horovod", name, t0, t1, nbytes, dtype, group, size or 0, seq,
                                       step, blocking=False)
                        rec.region("wait", "hvd_synchronize", "horovod", name, t_call, t1)
                    except Exception as exc:
                        inst.fail(exc)

        return synchronize
