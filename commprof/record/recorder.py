"""The recorder of one process: event emission, and the lifecycle that ties
together the step clock (:mod:`.steps`), the journal writer (:mod:`.writer`),
device timing (:mod:`.device`), telemetry and kernel mode
(:mod:`.kernelmode`).

Hot path: instruments call ``region`` / ``collective`` / ``metric``, which
build one :class:`~commprof.trace.schema.Event` and ``deque.append`` it
(atomic under the GIL, no lock). The writer thread drains the queue into the
journal every ``flush_interval`` seconds, so a process killed with SIGKILL
keeps every event older than about one flush interval. When the process
ends normally (atexit, SIGTERM, ``os._exit``) what is queued is written
synchronously and the journal is marked complete; it becomes Parquet only
when the shards are merged, outside the training processes.

A process becomes a *rank* only when it records its first event; the
torchrun agent and other launcher processes never do, and DataLoader worker
processes are recognised and stay silent.
"""
from __future__ import annotations

import collections
import itertools
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from ..trace.schema import Event
from . import ranks as _ranks
from .config import Config
from .device import DRAIN_DEADLINE_S
from .kernelmode import KernelWindow
from .log import warn
from .nvtx import make as make_nvtx
from .steps import StepClock
from .writer import Flusher

now = time.monotonic_ns


class GroupNames:
    """Stable, rank-independent (name, size) of process groups, cached."""

    def __init__(self):
        self._cache = {}

    def __call__(self, dist, group):
        key = id(group) if group is not None else 0
        hit = self._cache.get(key)
        if hit is None:
            pg = group if group is not None else dist.distributed_c10d._get_default_group()
            name = getattr(pg, "group_name", None) or str(key)
            hit = self._cache[key] = (str(name), int(pg.size()))
        return hit


class Recorder:
    def __init__(self, config: Config):
        self.config = config
        self.nvtx = make_nvtx(config.nvtx)
        self._reset()

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        self.q: collections.deque = collections.deque()
        self.state = "idle"  # idle -> active -> closed, or off
        #: the thread running close() (a SIGTERM arriving then waits for it: see session._on_sigterm)
        self.closing: Optional[int] = None
        #: a SIGTERM arrived while close() ran: close() ends by dying of it
        self.sigterm_pending = False
        self.clock = StepClock()
        self.run_info: Dict[str, Any] = {}
        #: root module -> forward FLOPs of its first training batch and that batch's size
        self.model_flops: Dict[str, Dict[str, int]] = {}
        #: DDP bucket index -> module names of its parameters (first sight of each bucket)
        self.ddp_buckets: Dict[str, list] = {}
        self.last_comm_issue = 0
        self.last_backward_end = 0
        self.in_backward = False
        #: recent backward ends (increasing): bounds of native rows' completions
        self.backward_end_times: collections.deque = collections.deque(maxlen=4096)
        #: group name -> native process-group hooks (``native.py``), and the
        #: extension module while any is attached
        self.native_groups: Dict[str, Any] = {}
        self.native = None
        self.timer = None
        #: callbacks run once when the current step ends (after_step)
        self.at_step_end: List[Callable[[], None]] = []
        #: Dynamo's counters once torch.compile is in use, and its graph count at the last step end
        self._dynamo = None
        self._graphs = 0
        self.capturing = 0
        self.telemetry = None
        self.kernels = KernelWindow(self.config.kernels)
        self.tls = threading.local()
        self.groups = GroupNames()
        self._seq: Dict[str, Any] = {}
        self.rank_info: Optional[_ranks.RankInfo] = None
        self.flusher: Optional[Flusher] = None
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._clock0 = (time.time_ns() + _WALL_ERROR_NS, now())
        # --hang-timeout: in-flight collectives and the last one completed
        self.track = bool(self.config.progress)
        self.inflight: Dict[tuple, tuple] = {}
        self.last_done: Optional[tuple] = None
        self.n_done = 0
        # the crash-proof collective ring (trace/ring.py), opened at the first collective
        self.ring = None
        self._native_ring = None
        self._forensics = False

    def after_fork_in_child(self) -> None:
        """A forked child starts with a fresh, idle recorder (and becomes a
        rank only if it records something and is not a DataLoader worker).
        The parent's device timer is kept alive, untouched: destroying its
        CUDA events would be a CUDA call in the forked child."""
        from .device import orphan_after_fork

        orphan_after_fork(self.timer)
        if self._forensics:
            from . import forensics

            forensics.after_fork_in_child()
        self._reset()

    @property
    def step(self) -> int:
        """Index of the current optimizer step (events are stamped with it)."""
        return self.clock.step

    # --------------------------------------------------------------- emission
    def emit(self, row: Event) -> None:
        if self.state != "active":
            if self.state != "idle" or not self._activate():
                return
        self.q.append(row)

    def region(self, category: str, name: str, source: str, detail: Optional[str],
               t0: int, t1: int, items: Optional[int] = None) -> None:
        self.clock.activity(t0)
        self.emit(Event(self.clock.step, category, name, source, detail, t0, t1, items=items))

    def dev_begin(self):
        """A device start event when device timing is on, else None."""
        timer = self.timer
        if timer is None:
            return None
        return timer.begin()

    def _check_timer(self) -> None:
        """Start device timing once this process uses CUDA: checked when the
        process becomes a rank and at every step end until then (a forward
        may well run before CUDA is initialised)."""
        if self.timer is not None or not self.config.device_timing:
            return
        from .device import make_timer

        self.timer = make_timer(self.config.simulate_device_lag_ms)
        if self.timer is not None:
            self.timer.capturing = self.capturing

    def capture_begins(self) -> None:
        """A CUDA graph capture starts: no events are recorded or queried."""
        self.capturing += 1
        if self.timer is not None:
            self.timer.capturing = self.capturing

    def capture_ends(self) -> None:
        self.capturing = max(0, self.capturing - 1)
        if self.timer is not None:
            self.timer.capturing = self.capturing

    def region_dev(self, category: str, name: str, source: str, detail: Optional[str],
                   t0: int, t1: int, dev, items: Optional[int] = None) -> None:
        """Like region(); with a CUDA start event the row waits for its
        device times (resolved by the writer thread)."""
        if dev is None or self.timer is None:
            self.region(category, name, source, detail, t0, t1, items)
            return
        self.clock.activity(t0)
        if self.state != "active" and (self.state != "idle" or not self._activate()):
            return
        self.timer.end(dev, Event(self.clock.step, category, name, source, detail, t0, t1, items=items))

    def collective(self, name: str, source: str, detail: Optional[str], t0: int, t1: int,
                   nbytes: Optional[int], dtype: Optional[str], group: str,
                   group_size: int, seq: int, step: int, blocking: bool, dev=None) -> None:
        """A collective issued at ``t0`` that returned / completed on the host
        at ``t1``. With ``dev`` (``dev_begin()`` at issue), call this where
        the device work is known to be complete on the current stream — after
        a blocking call, or in the work's future callback — and the row waits
        for its device times. (Called once per collective, often from a
        future's callback between kernels: the row is built positionally and
        queued without a further call.)"""
        row = Event(step, "comm", name, source, detail, t0, t1, None, None, nbytes, dtype, group, group_size,
                    seq, blocking)
        if self.ring is not None:
            try:
                self.ring.done(group, seq, t1)
            except Exception as exc:
                self._ring_failed(exc)
        if self.track:
            self.inflight.pop((group, seq), None)
            self.last_done = (group, seq, name, nbytes, t1)
            self.n_done += 1
        if dev is not None and self.timer is not None:
            if self.state != "active" and (self.state != "idle" or not self._activate()):
                return
            self.timer.end(dev, row)
        elif self.state == "active":
            self.q.append(row)
        else:
            self.emit(row)

    def metric(self, name: str, value: float, t: Optional[int] = None, source: str = "user",
               detail: Optional[str] = None) -> None:
        t = now() if t is None else t
        self.emit(Event(self.clock.step, "metric", name, source, detail, t, t, value=float(value)))

    def next_seq(self, group: str) -> int:
        hooks = self.native_groups.get(group)
        if hooks is not None:  # the group's counter lives in its native hooks while they are attached
            return hooks.native.next_seq()
        counter = self._seq.get(group)
        if counter is None:
            counter = self._seq.setdefault(group, itertools.count())
        return next(counter)

    def backward_begins(self) -> None:
        """A backward pass starts: no collective issued in it yet."""
        self.last_comm_issue = 0
        self.in_backward = True

    def backward_ends(self, t1: int) -> None:
        """A backward pass returned at ``t1`` (DDP has waited for every bucket by then)."""
        self.last_backward_end = t1
        self.in_backward = False
        if self.native_groups:
            self.backward_end_times.append(t1)

    def comm_issue_time(self) -> int:
        """When the last collective was issued (the backward's split point),
        native hooks included."""
        last = self.last_comm_issue
        for hooks in self.native_groups.values():
            t = hooks.native.last_issue()
            if t > last:
                last = t
        return last

    def adopt_native(self, group: str, hooks, module) -> None:
        """Native hooks time ``group`` from now on (its sequence counter has
        moved into them)."""
        self.native_groups[group] = hooks
        self.native = module
        module.set_step(self.clock.step)

    def release_native(self, group: str, hooks) -> None:
        """The native hooks of ``group`` are gone: their last rows join the
        queue and the group's counter continues in Python."""
        if self.native_groups.get(group) is not hooks:
            return
        self._drain_native(final=True)
        del self.native_groups[group]
        self._seq[group] = itertools.count(hooks.native.next_seq())
        if not self.native_groups:
            self.native = None

    def _drain_native(self, final: bool = False) -> None:
        append = self.q.append
        for hooks in list(self.native_groups.values()):
            for row in hooks.rows(hooks.native.drain(), final):
                append(row)

    def comm_issued(self, t0: int) -> None:
        """A collective was issued at ``t0`` (the backward split point)."""
        self.last_comm_issue = t0

    def comm_started(self, group: str, seq: int, name: str, nbytes, t0: int, dtype: Optional[str] = None,
                     source: str = "", step: int = 0, group_size: int = 0) -> None:
        """A collective is about to enter the backend: into the ring (before
        the call, so that it survives the process's death inside it) and,
        for --hang-timeout, the in-flight table."""
        ring = self.ring
        if ring is None and not self._forensics:
            ring = self.start_forensics()
        if ring is not None:
            try:
                ring.issue(group, seq, name, nbytes, dtype, source, step, t0, group_size)
            except Exception as exc:
                self._ring_failed(exc)
        if self.track:
            self.inflight[(group, seq)] = (name, nbytes, t0)

    def start_forensics(self):
        """Once per rank: the collective ring, the fatal-signal report
        (faulthandler to a file, unless the job enabled it itself) and the
        uncaught-exception note, all in the shard folder; returns the ring
        (None where it cannot be made: the recording goes on without)."""
        if self._forensics or _in_dataloader_worker():
            return self.ring
        self._forensics = True
        if os.environ.get("COMMPROF_RING") == "0":  # the paired overhead benchmark's off switch
            return None
        try:
            from ..trace import ring as _ring
            from . import forensics

            os.makedirs(self.shard_dir, exist_ok=True)
            forensics.install(self.shard_dir, self.host, self.pid)
            self.ring = _ring.RingWriter(_ring.ring_path(self.shard_dir, self.host, self.pid, "py"),
                                         self.config.ring_size, pid=self.pid)
        except Exception as exc:
            warn(f"the collective ring is off in pid {self.pid}: {exc!r}")
            self.ring = None
        return self.ring

    def native_ring(self, module) -> bool:
        """The native hooks' own ring (one per process, set once in the
        extension); False where there is none."""
        if self._native_ring is None:
            self._native_ring = False
            self.start_forensics()
            if self.ring is not None:
                try:
                    import ctypes

                    from ..trace import ring as _ring

                    mm = _ring.create(_ring.ring_path(self.shard_dir, self.host, self.pid, "native"),
                                      self.config.ring_size, pid=self.pid)
                    self.native_ring_addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
                    module.set_ring(self.native_ring_addr, self.config.ring_size)
                    self._native_ring = mm  # mapped for the process's life: the extension writes into it
                    from . import forensics

                    fd = forensics.fatal_fd()
                    if fd is not None and hasattr(module, "set_terminate_fd"):
                        module.set_terminate_fd(fd)  # a C++ exception's message before the abort
                except Exception as exc:
                    warn(f"no collective ring for the native hooks in pid {self.pid}: {exc!r}")
        return self._native_ring is not False

    def _ring_failed(self, exc: Exception) -> None:
        warn(f"the collective ring failed in pid {self.pid} and is off: {exc!r}")
        self.ring = None

    def progress(self) -> Dict[str, Any]:
        """What the hang watchdog reads: where this rank is (monotonic ns)."""
        info = self.rank_info or _ranks.detect()
        last = self.last_done
        return {
            "rank": info.rank, "world_size": info.world_size, "host": self.host, "pid": self.pid,
            "step": self.clock.step, "done": self.n_done, "mono_ns": now(), "wall_ns": time.time_ns(),
            "last": None if last is None else {"group": last[0], "seq": last[1], "op": last[2],
                                               "bytes": last[3], "at_ns": last[4]},
            "inflight": [{"group": g, "seq": q, "op": v[0], "bytes": v[1], "since_ns": v[2]}
                         for (g, q), v in list(self.inflight.items())],
        }

    # ------------------------------------------------------- step boundaries
    def note_items(self, detail: str, n: int) -> None:
        self.clock.note_items(detail, n)

    def note_data_items(self, n: int) -> None:
        self.clock.note_data_items(n)

    def note_model(self, detail: str, params: int) -> None:
        self.clock.note_model(detail, params)

    def note_bucket(self, index: int, modules) -> None:
        """The modules whose parameters DDP bucket ``index`` holds."""
        self.ddp_buckets[str(index)] = list(modules)

    def note_flops(self, detail: str, flops: int, items: int, device: Optional[str] = None) -> None:
        """Forward FLOPs of one root module's first training batch (counted
        once, for FLOP/s and MFU in the report)."""
        self.model_flops[detail] = {"flops": int(flops), "items": int(items)}
        if device:
            self.run_info.setdefault("device_name", device)

    def optimizer_done(self, t1: int, source: str) -> None:
        """An optimizer step ended at ``t1``; closes the training step unless
        a framework step holds it."""
        if self.clock.optimizer_done():
            self.end_step(t1, source)

    def hold_step(self) -> None:
        """A framework step (DeepSpeed's engine.step) began."""
        self.clock.hold()

    def release_step(self, source: str) -> None:
        """The framework step returned: the training step ends now if an
        optimizer step ran inside it."""
        if self.clock.release():
            self.end_step(now(), source)

    def _compiled_in(self, step: int, t_end: int) -> None:
        """A step in which torch.compile compiled graphs gets a metric
        ``compiled_graphs`` (source ``torch.compile``, value: how many): the
        report leaves such steps out of its step statistics, like the
        warm-up."""
        dyn = self._dynamo
        if dyn is None:
            utils = sys.modules.get("torch._dynamo.utils")
            if utils is None:
                return
            dyn = self._dynamo = getattr(utils, "counters", None)
            if dyn is None:
                return
        try:
            graphs = int(dyn["stats"]["unique_graphs"])
        except Exception:
            return
        if graphs != self._graphs:
            self.emit(Event(step, "metric", "compiled_graphs", "torch.compile", None, t_end, t_end,
                            value=float(graphs - self._graphs)))
            self._graphs = graphs

    def after_step(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once when the current step ends (an instrument's
        work that must not happen inside a compiled region)."""
        self.at_step_end.append(fn)

    def end_step(self, t_end: int, source: str) -> None:
        """Close the current step at ``t_end``."""
        step, start, items = self.clock.close(t_end)
        self.emit(Event(step, "step", "step", source, None, start, t_end, items=items))
        if self.native is not None:
            self.native.set_step(self.clock.step)
        if self.at_step_end:
            todo, self.at_step_end = self.at_step_end, []
            for fn in todo:
                fn()
        self._compiled_in(step, t_end)
        if self.kernels.window is not None:
            self.kernels.at_step(self.clock.step, self.run_info,
                                 self.shard_dir if self.state == "active" else None, self.host, self.pid)
        if self.timer is None:
            self._check_timer()
        # the rank is re-detected by the writer thread before each flush,
        # not here: nothing per step that is not needed per step

    # ------------------------------------------------------------- lifecycle
    def _activate(self) -> bool:
        if _in_dataloader_worker():
            self.state = "off"
            return False
        try:
            os.makedirs(self.shard_dir, exist_ok=True)
        except OSError as exc:
            warn(f"cannot create {self.shard_dir}: {exc}; not recording this process")
            self.state = "off"
            return False
        self._refresh_rank()
        self.state = "active"
        self.start_forensics()
        self._check_timer()
        if self.kernels.window is not None and self.clock.step == 0:
            self.kernels.at_step(0, self.run_info, self.shard_dir, self.host, self.pid)
        self._start_telemetry()
        if self.track:
            try:
                from .hang import install_stack_dump

                install_stack_dump(self.shard_dir, self.host, self.pid)
            except Exception as exc:
                warn(f"cannot install the stack dump for --hang-timeout: {exc!r}")
        self.flusher = Flusher(self.q, self.shard_dir, self.host, self.pid, self.config.flush_interval,
                               self.rank_meta, self._before_flush, self._flush_failed,
                               progress=self.progress if self.track else None)
        self.flusher.start()
        return True

    def _flush_failed(self) -> None:
        self.state = "off"

    def _before_flush(self, deadline: Optional[float]) -> None:
        """Under the writer's lock: device times resolved since the last
        flush join the queue (at close: waiting until ``deadline``)."""
        if self.rank_info is None or not self.rank_info.final:
            self._refresh_rank()
        if self.native_groups:
            self._drain_native(final=deadline is not None)
        if self.timer is not None and self.timer.pending:
            self.timer.resolve(self.q.append, deadline)

    def _start_telemetry(self) -> None:
        mode = self.config.telemetry
        if mode == "off":
            return
        if mode == "auto":
            from .device import cuda_present

            if not cuda_present():
                return
        from .telemetry import Sampler, device_index

        sampler = Sampler(self, self.config.telemetry_interval)
        if sampler.start(device_index()):
            self.telemetry = sampler

    @property
    def shard_dir(self) -> str:
        return os.path.join(self.config.out_dir, "shards")

    def _refresh_rank(self) -> None:
        info = _ranks.detect()
        if self.rank_info is None or info.final or not self.rank_info.final:
            self.rank_info = info
        if info.final and "backend" not in self.run_info:
            try:
                self.run_info["backend"] = str(sys.modules["torch.distributed"].get_backend())
            except Exception:
                pass

    def flush(self) -> None:
        """Move queued events into the journal now."""
        if self.flusher is not None:
            self.flusher.flush()

    def rank_meta(self, status: str) -> Dict[str, Any]:
        info = self.rank_info or _ranks.detect()
        wall0, mono0 = self._clock0
        meta = {
            "rank": info.rank, "world_size": info.world_size, "local_rank": info.local_rank,
            "rank_source": info.source, "host": self.host, "pid": self.pid,
            "launcher": self.config.launcher, "run_id": self.config.run_id,
            "node_rank": _node_rank(), "record_pid": _record_pid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "clock": {"wall_ns_at_start": wall0, "mono_ns_at_start": mono0,
                      "wall_ns_at_end": time.time_ns(), "mono_ns_at_end": now(),
                      "boot_id": _boot_id()},
            "models": dict(self.clock.models), "model_flops": dict(self.model_flops),
            "ddp_buckets": dict(self.ddp_buckets),
            "steps": self.clock.step, "status": status,
            "python": sys.version.split()[0],
        }
        meta.update(self.run_info)
        return meta

    def close(self) -> None:
        """Flush everything into the journal and mark it complete (pure
        Python and a few writes: fast enough for a SIGTERM handler).
        Idempotent; safe to call from atexit, signal handlers and os._exit."""
        if self.state != "active" or self.pid != os.getpid():
            return
        self.state = "closed"
        self.closing = threading.get_ident()
        self.flusher.stop()
        try:
            if _TEST_SIGTERM_IN_CLOSE:
                os.kill(os.getpid(), signal.SIGTERM)
            if self.telemetry is not None:
                self.telemetry.stop()
            if self.kernels.running:
                self.kernels.stop(self.shard_dir, self.host, self.pid)
            self.kernels.wait_exported()
            self.flusher.flush(deadline=time.monotonic() + DRAIN_DEADLINE_S)
            self.flusher.close()
        except Exception as exc:
            warn(f"could not finalise the trace of pid {self.pid}: {exc!r} "
                 "(the journal is kept and will be salvaged)")
        finally:
            self.closing = None
            if self.sigterm_pending:    # finalised: now die of it, exactly as without commprof
                # (pending only where the handler interrupted this close: the main thread)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)


#: Test knob (the multi-host clock tests): error added to this process's
#: wall clock reading at start, as a host with a badly synchronised clock would have.
try:
    _WALL_ERROR_NS = int(float(os.environ.get("COMMPROF_TEST_WALL_ERROR_MS", "0")) * 1e6)
except ValueError:
    _WALL_ERROR_NS = 0
#: Test knob: the process sends itself SIGTERM inside close(), before the final flush (a launcher
#: terminating a rank that is already exiting, e.g. after a collective's connection reset)
_TEST_SIGTERM_IN_CLOSE = os.environ.get("COMMPROF_TEST_SIGTERM_IN_CLOSE") == "1"


def _node_rank() -> Optional[int]:
    for key in ("GROUP_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK"):
        try:
            return int(os.environ[key])
        except (KeyError, ValueError):
            continue
    return None


def _record_pid() -> Optional[int]:
    try:
        return int(os.environ["COMMPROF_RECORD_PID"])
    except (KeyError, ValueError):
        return None


def _boot_id() -> Optional[str]:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _in_dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return False
    try:
        return data.get_worker_info() is not None
    except Exception:
        return False
