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

With ``HOROVOD_TIMELINE`` set (``commprof record --horovod-timeline``),
``hvd.init`` is wrapped to register, after Horovod's own exit handler, one
that stops the timeline first: Horovod's shutdown ends its timeline
writer without writing what is still queued (horovod/common/timeline.cc,
``TimelineWriter::Shutdown``), and on a busy machine the whole training's
phases could be queued still. ``stop_timeline`` returns once the writer
has written every queued event and closed the file; it runs in a thread
of its own, waited for at most ``DRAIN_S`` seconds, so the exit is never
held up.
"""
from __future__ import annotations

import atexit
import functools
import os
import sys
import threading

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
#: the most seconds the exit waits for Horovod's timeline to be written
DRAIN_S = 20.0


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
        self._drain_registered = False
        if os.environ.get("HOROVOD_TIMELINE"):
            for modname in ("horovod.torch", "horovod.torch.mpi_ops"):
                mod = sys.modules.get(modname)
                if mod is not None and hasattr(mod, "init"):
                    self.patch(mod, "init", self._wrap_init)
        self.rec.run_info.setdefault("framework", "horovod")
        try:
            import horovod

            self.rec.run_info["horovod"] = getattr(horovod, "__version__", None)
        except Exception:
            pass

    def _wrap_init(self, original):
        inst = self

        @functools.wraps(original)
        def init(*args, **kwargs):
            out = original(*args, **kwargs)         # registers Horovod's shutdown at exit
            if not inst._drain_registered:
                inst._drain_registered = True
                atexit.register(drain_timeline)     # so this one runs first
            return out

        return init

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


def drain_timeline(wait_s: float = DRAIN_S) -> bool:
    """Stop Horovod's timeline (its writer empties its queue into the file,
    then closes it), in a thread of its own, waiting at most ``wait_s``
    seconds. True when it returned in time; never raises."""
    mod = sys.modules.get("horovod.torch.mpi_ops") or sys.modules.get("horovod.torch")
    stop = getattr(mod, "stop_timeline", None)
    if stop is None:
        return False

    def run():
        try:
            stop()
        except Exception:       # not initialised, already shut down: nothing to write
            pass

    t = threading.Thread(target=run, name="commprof-horovod-timeline", daemon=True)
    t.start()
    t.join(wait_s)
    return not t.is_alive()
