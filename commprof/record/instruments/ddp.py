"""DistributedDataParallel: every bucketed gradient collective the C++
Reducer issues.

The Reducer calls the process group from C++, so Python patches of
``dist.all_reduce`` never see it. Two timing points, chosen at a DDP
module's first forward:

* **Process-group hooks** (``--ddp-timing auto``, where torch has
  ``ProcessGroup.register_pre_hook``: torch >= 2.10). DDP keeps its own C++
  path (gradients divided while copied into the bucket, one pass; built-in
  C++ comm hooks too); a pre-hook on the DDP's process group takes the
  issue time, bytes and dtype of every all_reduce issued there from outside
  Python's torch.distributed API (those are timed by the ``collectives``
  instrument, which marks its calls), and a callback on the work's future
  the completion. No Python comm hook: about 0.1 ms CPU per step less than
  the hook below on the short-step workload (``benchmarks/hook_cost.py``).
  Bucket names come from DDP's own logging data once its buckets are
  rebuilt (step 1).
* **A timed comm hook** (fallback, ``--ddp-timing comm-hook``, or where a
  Python comm hook is registered): if the user registered none, commprof
  registers a hook with the Reducer's own arithmetic (each gradient times
  1 / world size, then allreduce SUM; torch's ``allreduce_hook`` divides,
  which changes the last bit at 3 ranks) wrapped in a timer. A hook the user registers (before or after) is
  wrapped the same way, so it keeps working and is timed; the process-group
  hooks of its group then stand aside (the hook's own collectives would be
  counted twice). Built-in C++ hooks cannot be wrapped: on this path such
  models are left alone.

Per bucket: issue time (the bucket became ready), completion time (the
work's / hook's future resolved), S = bucket bytes, dtype, group, sequence
number."""
from __future__ import annotations

import functools
import weakref

from .base import Instrument, compiling, tensor_bytes
from ..recorder import now


class DDPInstrument(Instrument):
    name = "ddp"

    def _install(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        import torch.distributed as dist

        self._dist = dist
        self._register = DDP.register_comm_hook  # original, used for the default hook
        self._pg_hooked = {}      # id(process group) -> _GroupHooks
        self._python_hooked = set()  # id(process group) of DDPs with a Python comm hook
        self.patch(DDP, "__init__", self._wrap_init)
        self.patch(DDP, "register_comm_hook", self._wrap_register)
        self.patch(DDP, "_register_builtin_comm_hook", self._wrap_builtin)
        self._first = {}          # id(DDP) -> its first-forward holder, until that forward or a compile
        import torch

        if hasattr(torch, "compile"):
            self.patch(torch, "compile", self._wrap_compile)

    def _wrap_init(self, original):
        inst = self

        @functools.wraps(original)
        def __init__(ddp, *args, **kwargs):
            original(ddp, *args, **kwargs)
            if inst.active:
                try:
                    inst.check_fault()
                    inst.rec.run_info.setdefault("framework", "ddp")
                    holder = {"ran": False, "compiled": False}

                    def first_forward(module, args):
                        if compiling():     # traced by Dynamo: nothing of ours in the graph (see below)
                            return
                        holder["ran"] = True
                        holder["h"].remove()
                        inst._first.pop(id(module), None)
                        inst._ensure_default_hook(module)

                    def after_first_step(ddp=ddp):
                        # a DDP whose forward runs compiled never calls the hook above
                        # (torch.compile(DDP(...)) takes it out, see _wrap_compile; in
                        # a traced hook its body is empty): its hooks are set after the
                        # first step, outside the graph
                        if not holder["ran"]:
                            inst._ensure_default_hook(ddp, compiled=True)

                    holder["h"] = ddp.register_forward_pre_hook(first_forward)
                    inst.handle(holder["h"])
                    inst._first[id(ddp)] = holder
                    inst.rec.after_step(after_first_step)
                except Exception as exc:
                    inst.fail(exc)

        return __init__

    def _wrap_compile(self, original):
        """torch.compile(DDP(...)): the DDP's first-forward pre-hook is taken
        out before Dynamo sees it (traced, it would add a graph break, and
        its removal a recompile); the DDP is then set up after the first
        step. Any other use of torch.compile is untouched."""
        inst = self

        @functools.wraps(original)
        def compile(*args, **kwargs):
            out = original(*args, **kwargs)
            try:
                inner = getattr(out, "_orig_mod", None)
                holder = inst._first.pop(id(inner), None) if inner is not None else None
                if holder is not None and not holder["ran"]:
                    holder["h"].remove()
            except Exception as exc:
                inst.fail(exc)
            return out

        return compile

    def _ensure_default_hook(self, ddp, compiled: bool = False) -> None:
        if not self.active:
            return
        if ddp._comm_hooks:
            self._hooked_in_python(ddp.process_group)
            return
        try:
            if self.rec.config.ddp_timing != "comm-hook" and hasattr(ddp.process_group, "register_pre_hook"):
                self._group_hooks(ddp, compiled)
                return
        except Exception as exc:
            self.fail(exc)
            return
        if getattr(ddp, "_commprof_builtin", False):
            return
        try:
            timed = self.timed_hook(ddp, self._reducer_arithmetic_hook(), "default")
            self._register(ddp, ddp.process_group, timed)
        except Exception as exc:
            self.fail(exc)

    def _reducer_arithmetic_hook(self):
        """A comm hook with the C++ Reducer's arithmetic: each gradient times
        (1 / world size) in the tensor's dtype, then allreduce SUM. torch's
        ``allreduce_hook`` divides instead (``div_``), which differs in the
        last bit when the world size is not a power of two: the training's
        results would change."""
        dist = self._dist

        def allreduce_like_the_reducer(process_group, bucket):
            group = process_group if process_group is not None else dist.group.WORLD
            buf = bucket.buffer()
            buf.mul_(1.0 / group.size())
            return dist.all_reduce(buf, group=group, async_op=True).get_future().then(lambda f: f.value()[0])

        return allreduce_like_the_reducer

    def _wrap_register(self, original):
        inst = self

        @functools.wraps(original)
        def register_comm_hook(ddp, state, hook):
            if inst.active and not getattr(hook, "__commprof__", None):
                try:
                    inst._hooked_in_python(ddp.process_group)
                    hook = inst.timed_hook(ddp, hook, getattr(hook, "__qualname__", repr(hook)))
                except Exception as exc:
                    inst.fail(exc)
            return original(ddp, state, hook)

        return register_comm_hook

    def _hooked_in_python(self, pg) -> None:
        """A Python comm hook times this group's DDP buckets: the group's
        process-group hooks stand aside (they would count them twice)."""
        self._python_hooked.add(id(pg))
        hooks = self._pg_hooked.get(id(pg))
        if isinstance(hooks, _NativeGroupHooks):
            hooks.native.set_enabled(False)

    def _wrap_builtin(self, original):
        @functools.wraps(original)
        def _register_builtin_comm_hook(ddp, comm_hook_type):
            ddp._commprof_builtin = True
            return original(ddp, comm_hook_type)

        return _register_builtin_comm_hook

    def _uninstall(self) -> None:
        self._pg_hooked = {}
        self._python_hooked = set()

    def _group_hooks(self, ddp, compiled: bool = False) -> None:
        pg = ddp.process_group
        hooks = self._pg_hooked.get(id(pg))
        if hooks is None or hooks.pg() is not pg:
            hooks = self._pg_hooked[id(pg)] = self._make_group_hooks(pg)
            self.handle(hooks)
        # bucket names: read after a forward (DDP rebuilds its buckets in step 1's),
        # never from the process-group hooks (the Reducer holds its lock there)
        holder = {"tries": 0}
        if compiled:    # at step ends (a hook on a compiled DDP would recompile it)
            def at_step_end():
                holder["tries"] += 1
                try:
                    if not (_note_buckets(self.rec, ddp) or holder["tries"] >= 16):
                        self.rec.after_step(at_step_end)
                except Exception:
                    pass

            self.rec.after_step(at_step_end)
            return

        def after_forward(module, args, output):
            if compiling():     # traced by Dynamo (a compiled DDP): no call of ours in its graph
                return
            holder["tries"] += 1
            try:
                if _note_buckets(self.rec, module) or holder["tries"] >= 16:  # never rebuilt: no names
                    holder["h"].remove()
            except Exception:  # names are a nicety: never a reason to stop timing
                holder["h"].remove()

        holder["h"] = ddp.register_forward_hook(after_forward)
        self.handle(holder["h"])

    def _make_group_hooks(self, pg):
        """The native hooks where they are built and can do the whole job (a
        gloo group on the host: no device times to take, CUDA or simulated;
        no --hang-timeout in-flight table), else the Python ones."""
        rec = self.rec
        if rec.config.native_hooks and not rec.track:
            try:
                from .. import native
                from ..device import cuda_initialized

                host_only = rec.timer is None and not rec.config.simulate_device_lag_ms and not cuda_initialized()
                mod = native.load_built() if host_only and _backend(pg) == "gloo" else None
                if mod is not None:
                    hooks = _NativeGroupHooks(self, pg, mod)
                    rec.run_info["ddp_hooks"] = "native"
                    return hooks
            except Exception as exc:  # the Python hooks below do the same job
                from ..log import log_once

                log_once("native", f"native process-group hooks not used ({exc!r})")
        rec.run_info.setdefault("ddp_hooks", "python")
        return _GroupHooks(self, pg)

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
                rec.note_bucket(bucket.index(), _module_names(bucket.parameters(), ddp))
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
                rec.comm_started(gname, seq, "all_reduce", nbytes, t0, dtype, "ddp_reducer", step, gsize)
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


#: the id under which commprof's pre/post hooks are registered on a process group
HOOK_ID = 0x636F6D6D  # "comm"


class _GroupHooks:
    """Pre/post hooks on one DDP process group (see the module docstring);
    ``remove()`` unregisters them.

    They run once per bucket, between the backward's kernels, where Python
    runs with cold caches: calling a Python hook at all costs ~6 µs there,
    the first pybind property read ~15 µs, where a warm loop takes 0.1 µs
    (measured in the hook; docs/benchmarks.md, "Recording overhead"). So the hooks touch
    as few objects as they can: the group's name and size are read once, a
    dtype's name and kind are cached, a bucket's bytes come from
    ``nbytes``, no NVTX call is made unless a tool listens, and the
    completion row is built in one go (pre + post + completion: median
    154 -> 105 µs per bucket in the hooks' own timing,
    ``benchmarks/ddp_hook_timing.py``). The pre-hook stays (rather
    than taking the issue time in the post-hook alone, which measured the
    same): it runs before the collective is enqueued, so a CUDA start event
    recorded there precedes the collective's kernel on the stream."""

    def __init__(self, inst: DDPInstrument, pg) -> None:
        import torch

        self.pg = weakref.ref(pg)
        allreduce = torch._C._distributed_c10d.HookOpName.ALLREDUCE
        rec, tls = inst.rec, inst.rec.tls
        python_hooked, pg_id = inst._python_hooked, id(pg)
        gname, gsize = rec.groups(inst._dist, pg)  # fixed for the group's life
        dtypes = {}  # dtype -> (name, detail): str(dtype) is a pybind call
        # op_id -> the issue's fields, until the post-hook has the work (held by
        # the hooks through self: a test sees this object freed once unregistered)
        self.pending = {}
        nvtx = rec.nvtx
        hooks = self

        def pre(args):
            if not inst.active or args.name != allreduce or getattr(tls, "depth", 0) or pg_id in python_hooked:
                return
            try:
                t0 = now()
                if inst._fault:
                    inst.check_fault()
                tensors = args.input_tensors
                t = tensors[0] if tensors else None
                nbytes = t.nbytes if len(tensors) == 1 else sum(x.nbytes for x in tensors)
                dt = None if t is None else t.dtype
                kind = dtypes.get(dt)
                if kind is None:
                    kind = dtypes[dt] = _kind(dt)
                seq = rec.next_seq(gname)
                rec.last_comm_issue = t0  # the backward's split point (Recorder.comm_issued)
                rec.comm_started(gname, seq, "all_reduce", nbytes, t0, kind[0], "ddp_reducer", rec.clock.step,
                                 gsize)
                timer = rec.timer
                hooks.pending[args.op_id] = (t0, nbytes, kind, seq, rec.clock.step,
                                             nvtx.start("all_reduce") if nvtx.enabled else None,
                                             None if timer is None else timer.begin())
            except Exception as exc:
                inst.fail(exc)

        def post(args):
            pending = hooks.pending
            if not pending:
                return
            issue = pending.pop(args.op_id, None)
            if issue is None:
                return
            t0, nbytes, kind, seq, step, rid, dev = issue

            def done(_fut):
                t1 = now()
                # the Reducer waits on this future directly, and a future wakes
                # its waiters before it runs callbacks: this one may get the GIL
                # only after the backward has returned. DDP's backward waits for
                # every bucket, so its end bounds the completion.
                end = rec.last_backward_end
                if t0 < end < t1:
                    t1 = end
                try:
                    if rid is not None:
                        nvtx.end(rid)
                    # CUDA futures run this on a stream that waits for the
                    # collective: the end event is its device completion
                    rec.collective("all_reduce", "ddp_reducer", kind[1], t0, t1, nbytes, kind[0], gname, gsize,
                                   seq, step, False, dev)
                except Exception as exc:
                    inst.fail(exc)

            try:
                # registered from inside the issuing call, before the Reducer
                # chains its own callback: it runs first, in time
                args.work.get_future().add_done_callback(done)
            except Exception as exc:
                inst.fail(exc)

        pg.register_pre_hook(HOOK_ID, pre)
        pg.register_post_hook(HOOK_ID, post)

    def remove(self) -> None:
        pg = self.pg()
        if pg is not None:
            pg.unregister_pre_hook(HOOK_ID)
            pg.unregister_post_hook(HOOK_ID)


class _NativeGroupHooks:
    """The same timing as :class:`_GroupHooks`, in C++ (``native.py``,
    ``_pghooks.cpp``): no Python per bucket. The rows wait in the
    extension's buffer until the journal writer drains them
    (``Recorder._before_flush``); the group's sequence counter lives in the
    extension while it is attached, so collectives issued from Python on the
    same group keep one numbering. Completion times are taken by a C++
    callback on the backend's thread the moment the future completes (no GIL
    to wait for), bounded by the backward's end as in the Python hooks."""

    def __init__(self, inst: DDPInstrument, pg, mod) -> None:
        import torch

        rec = inst.rec
        self.rec, self.pg = rec, weakref.ref(pg)
        self.gname, self.gsize = rec.groups(inst._dist, pg)
        kinds = {}
        for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
                   torch.uint8, torch.int8, torch.bool):
            kinds[mod.scalar_type_code(torch.empty(0, dtype=dt))] = _kind(dt)
        self._kinds = kinds
        self._held = []  # rows of a backward that has not ended yet
        # the group's counter continues where Python left it
        self.native = mod.GroupHooks(pg, HOOK_ID, rec.next_seq(self.gname))
        if hasattr(self.native, "set_ring_info") and rec.native_ring(mod):
            self.native.set_ring_info(self.gname, int(self.gsize), {code: kind[0] for code, kind in kinds.items()})
        rec.adopt_native(self.gname, self, mod)
        if id(pg) in inst._python_hooked:
            self.native.set_enabled(False)

    def rows(self, rows, final: bool = False):
        """Extension rows -> trace events (in the writer thread). A future
        wakes its waiters before it runs its callbacks, so a completion can
        be stamped just after DDP's backward returned: like the Python hooks,
        a completion is bounded by the end of the backward it was issued in.
        Rows of a backward still running are held until it ends (or
        ``final``)."""
        from bisect import bisect_left

        from ...trace.schema import Event

        rec = self.rec
        ends = list(rec.backward_end_times)
        last = ends[-1] if ends else 0
        running = rec.in_backward
        kinds, gname, gsize = self._kinds, self.gname, self.gsize
        unknown = ("unknown", "reducer")
        held = []
        for r in (self._held + rows) if self._held else rows:
            t0, t1, nbytes, code, seq, step = r
            if running and t0 >= last and not final:
                held.append(r)
                continue
            i = bisect_left(ends, t0)
            if i < len(ends) and ends[i] < t1:
                t1 = ends[i]
            dtype, detail = kinds.get(code, unknown)
            yield Event(step, "comm", "all_reduce", "ddp_reducer", detail, t0, t1, None, None, nbytes, dtype,
                        gname, gsize, seq, False)
        self._held = held

    def remove(self) -> None:
        self.native.remove()
        self.rec.release_native(self.gname, self)


def _backend(pg) -> str:
    try:
        return str(pg._get_backend_name())
    except Exception:
        return ""


def _note_buckets(rec, ddp) -> bool:
    """Once DDP has rebuilt its buckets: the modules of each bucket's
    parameters, in the bucket's order, from DDP's logging data. False while
    the buckets are not rebuilt yet."""
    data = ddp._get_ddp_logging_data()
    if not data.get("has_rebuilt_buckets"):
        return False
    params = list(ddp._module_parameters)
    for index, part in enumerate(str(data.get("rebuilt_per_bucket_param_indices", "")).split(",")):
        mods = _module_names([params[int(i)] for i in part.split()], ddp)
        if mods:
            rec.note_bucket(index, mods)
    return True


def _module_names(params, ddp) -> list:
    """The modules holding ``params``, in their order, each once per run of
    consecutive parameters (a bucket's contents for the report)."""
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    mods: list = []
    for p in params:
        m = names.get(id(p), "?").rsplit(".", 1)[0]
        if not mods or mods[-1] != m:
            mods.append(m)
    return mods


def _kind(dt) -> tuple:
    """(dtype name, detail) of a DDP all_reduce: with find_unused_parameters
    the Reducer also all-reduces its int32 map of used parameters."""
    return str(dt), "reducer" if dt is None or dt.is_floating_point else "local_used_map"
