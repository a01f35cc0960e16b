"""Per-process recorder: the in-memory event queue, the step clock, the
crash-safe journal and the per-rank Parquet shard.

Hot path: instruments build one tuple per event and ``deque.append`` it
(atomic under the GIL, no lock). A daemon thread drains the queue every
``flush_interval`` seconds into an Arrow IPC stream (``<host>.<pid>.arrows``)
written with plain ``write()`` calls, so a process killed with SIGKILL keeps
every event older than about one flush interval. When the process ends
normally (atexit, SIGTERM, ``os._exit``) the journal is rewritten as the
rank's Parquet shard ``rank00000.<host>.<pid>.parquet`` and removed.

A process becomes a *rank* only when it records its first event; the
torchrun agent and other launcher processes never do, and DataLoader worker
processes are recognised and stay silent.
"""
from __future__ import annotations

import collections
import itertools
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from . import ranks as _ranks
from .config import Config
from .log import log_once, warn
from .nvtx_ranges import make as make_nvtx


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

now = time.monotonic_ns



def journal_paths(shard_dir: str, host: str, pid: int):
    base = os.path.join(shard_dir, f"{host}.{pid}")
    return base + ".arrows", base + ".meta.json"


class Recorder:
    def __init__(self, config: Config):
        self.config = config
        self.nvtx = make_nvtx(config.nvtx)
        self._reset()

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        self.q: collections.deque = collections.deque()
        self.state = "idle"  # idle -> active -> closed, or off
        self.step = 0
        self.step_start: Optional[int] = None
        self.first_activity: Optional[int] = None
        self.step_items: Dict[str, int] = {}
        self.step_data_items = 0
        self.models: Dict[str, int] = {}
        self.run_info: Dict[str, Any] = {}
        self.last_comm_issue = 0
        # A framework's own step (DeepSpeed's engine.step) can hold the step
        # boundary until it returns: optimizer steps inside only count.
        self.hold_step = 0
        self.held_optimizer_steps = 0
        self.timer = None
        self._timer_checked = False
        self.telemetry = None
        self.kernel_window = _parse_window(self.config.kernels)
        self._profiler = None
        self.tls = threading.local()
        self.groups = GroupNames()
        self._seq: Dict[str, Any] = {}
        self.rank_info: Optional[_ranks.RankInfo] = None
        self._lock = threading.Lock()
        self._writer = None
        self._sink = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._meta_written: Optional[str] = None
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.events = 0
        self._clock0 = (time.time_ns(), now())

    def after_fork_in_child(self) -> None:
        """A forked child starts with a fresh, idle recorder (and becomes a
        rank only if it records something and is not a DataLoader worker)."""
        self._reset()

    # --------------------------------------------------------------- emission
    def emit(self, row: tuple) -> None:
        if self.state != "active":
            if self.state != "idle" or not self._activate():
                return
        self.q.append(row)

    def region(self, category: str, name: str, source: str, detail: Optional[str],
               t0: int, t1: int, items: Optional[int] = None) -> None:
        if self.first_activity is None:
            self.first_activity = t0
        self.emit((self.step, category, name, source, detail, t0, t1,
                   None, None, None, None, None, None, None, None, items, None))

    def dev_begin(self):
        """A CUDA start event when device timing is on, else None."""
        timer = self.timer
        if timer is None:
            if self._timer_checked or not self.config.device_timing:
                return None
            from .device import maybe_timer

            timer = self.timer = maybe_timer()
            if timer is None:
                if sys.modules.get("torch") is not None:
                    self._timer_checked = True
                return None
        return timer.begin()

    def region_dev(self, category: str, name: str, source: str, detail: Optional[str],
                   t0: int, t1: int, dev, items: Optional[int] = None) -> None:
        """Like region(); with a CUDA start event the row waits for its
        device times (resolved by the flush thread)."""
        if dev is None or self.timer is None:
            self.region(category, name, source, detail, t0, t1, items)
            return
        if self.first_activity is None:
            self.first_activity = t0
        if self.state != "active" and (self.state != "idle" or not self._activate()):
            return
        self.timer.end(dev, (self.step, category, name, source, detail, t0, t1,
                             None, None, None, None, None, None, None, None, items, None))

    def collective(self, name: str, source: str, detail: Optional[str], t0: int, t1: int,
                   nbytes: Optional[int], dtype: Optional[str], group: str,
                   group_size: int, seq: int, step: int, blocking: bool) -> None:
        self.emit((step, "comm", name, source, detail, t0, t1, None, None,
                   nbytes, dtype, group, group_size, seq, blocking, None, None))

    def metric(self, name: str, value: float, t: Optional[int] = None, source: str = "user",
               detail: Optional[str] = None) -> None:
        t = now() if t is None else t
        self.emit((self.step, "metric", name, source, detail, t, t,
                   None, None, None, None, None, None, None, None, None, float(value)))

    def next_seq(self, group: str) -> int:
        counter = self._seq.get(group)
        if counter is None:
            counter = self._seq.setdefault(group, itertools.count())
        return next(counter)

    def note_items(self, detail: str, n: int) -> None:
        self.step_items[detail] = self.step_items.get(detail, 0) + n

    def end_step(self, t_end: int, source: str) -> None:
        """Close the current step at ``t_end`` (end of an optimizer step)."""
        start = self.step_start
        if start is None:
            start = self.first_activity if self.first_activity is not None else t_end
        self.emit((self.step, "step", "step", source, None, start, t_end,
                   None, None, None, None, None, None, None, None, self._items_this_step(), None))
        self.step += 1
        self.step_start = t_end
        if self.kernel_window is not None:
            self._kernel_mode()
        self.step_items = {}
        self.step_data_items = 0
        if self.rank_info is None or not self.rank_info.final:
            self._refresh_rank()

    def _kernel_mode(self) -> None:
        """Start / stop torch.profiler at step boundaries of the window."""
        start, count = self.kernel_window
        try:
            if self.step == start and self._profiler is None:
                import torch

                acts = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                self._profiler = torch.profiler.profile(activities=acts, record_shapes=False)
                self._profiler.__enter__()
                self.run_info["kernel_window"] = [start, start + count]
            elif self.step == start + count and self._profiler is not None:
                self._stop_profiler()
        except Exception as exc:
            log_once("kernels", f"kernel mode disabled: {exc!r}")
            self.kernel_window = None
            self._profiler = None

    def _stop_profiler(self) -> None:
        prof, self._profiler = self._profiler, None
        if prof is None:
            return
        prof.__exit__(None, None, None)
        if self.state == "active":
            path = os.path.join(self.shard_dir, f"kineto.{self.host}.{self.pid}.json.gz")
            prof.export_chrome_trace(path)

    def _items_this_step(self) -> Optional[int]:
        """Samples this rank processed in the step: what the data loader
        delivered if it was used (sums micro-batches of gradient
        accumulation, ignores repeated forwards of one batch), else the
        leading dimension of the inputs of the largest root module."""
        if self.step_data_items:
            return self.step_data_items
        best, best_params = None, 0
        for detail, n in self.step_items.items():
            p = self.models.get(detail, 0)
            if p > best_params:
                best, best_params = n, p
        return best

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
        self._start_telemetry()
        self._thread = threading.Thread(target=self._flush_loop, name="commprof-flush", daemon=True)
        self._thread.start()
        return True

    def _start_telemetry(self) -> None:
        mode = self.config.telemetry
        if mode == "off":
            return
        if mode == "auto":
            torch = sys.modules.get("torch")
            try:
                if torch is None or not torch.cuda.is_available():
                    return
            except Exception:
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

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.config.flush_interval):
            try:
                self.flush()
            except Exception as exc:  # never take the training down
                log_once("flush", f"journal flush failed: {exc!r}; recording stopped")
                self.state = "off"
                return

    def flush(self) -> None:
        with self._lock:
            if self.rank_info is None or not self.rank_info.final:
                self._refresh_rank()
            if self.timer is not None and self.timer.pending:
                self.timer.resolve(self.q.append)
            n = len(self.q)
            if n:
                from . import schema

                rows = [self.q.popleft() for _ in range(n)]
                batch = schema.rows_to_batch(rows)
                if self._writer is None:
                    import pyarrow as pa
                    import pyarrow.ipc as ipc

                    path, _ = journal_paths(self.shard_dir, self.host, self.pid)
                    self._sink = pa.OSFile(path, "wb")
                    self._writer = ipc.new_stream(self._sink, schema.JOURNAL_SCHEMA)
                self._writer.write_batch(batch)
                self.events += n
            self._write_meta()

    def rank_meta(self, status: str) -> Dict[str, Any]:
        info = self.rank_info or _ranks.detect()
        wall0, mono0 = self._clock0
        meta = {
            "rank": info.rank, "world_size": info.world_size, "local_rank": info.local_rank,
            "rank_source": info.source, "host": self.host, "pid": self.pid,
            "launcher": self.config.launcher, "run_id": self.config.run_id,
            "clock": {"wall_ns_at_start": wall0, "mono_ns_at_start": mono0,
                      "wall_ns_at_end": time.time_ns(), "mono_ns_at_end": now(),
                      "boot_id": _boot_id()},
            "models": dict(self.models), "steps": self.step, "status": status,
            "python": sys.version.split()[0],
        }
        meta.update(self.run_info)
        return meta

    def _write_meta(self) -> None:
        if self._writer is None:
            return
        meta = self.rank_meta("journal")
        key = json.dumps({k: v for k, v in meta.items() if k != "clock"}, sort_keys=True, default=str)
        if key == self._meta_written:
            return
        _, mpath = journal_paths(self.shard_dir, self.host, self.pid)
        tmp = mpath + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(meta, fh, default=str)
        os.replace(tmp, mpath)
        self._meta_written = key

    def close(self) -> None:
        """Flush everything and turn the journal into the rank's Parquet shard.
        Idempotent; safe to call from atexit, signal handlers and os._exit."""
        if self.state != "active" or self.pid != os.getpid():
            return
        self.state = "closed"
        self._stop.set()
        try:
            if self.telemetry is not None:
                self.telemetry.stop()
            if self._profiler is not None:
                self.state = "active"
                try:
                    self._stop_profiler()
                finally:
                    self.state = "closed"
            if self.timer is not None and self.timer.pending:
                self.timer.resolve(self.q.append, wait=True)
            self.flush()
            with self._lock:
                if self._writer is None:
                    return
                self._writer.close()
                self._sink.close()
                self._writer = None
                finalize_journal(self.shard_dir, self.host, self.pid, self.rank_meta("complete"))
        except Exception as exc:
            warn(f"could not finalise the trace of pid {self.pid}: {exc!r} "
                 "(the journal is kept and will be salvaged)")


def _parse_window(spec: str):
    """'START:COUNT' -> (start, count); '' -> None."""
    if not spec:
        return None
    start, _, count = str(spec).partition(":")
    return int(start), int(count or 1)


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


def read_journal(path: str) -> List:
    """Every complete record batch of a journal (a killed writer may have left
    a torn batch at the end; it is dropped)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    batches = []
    try:
        reader = ipc.open_stream(pa.OSFile(path, "rb"))
    except (pa.ArrowInvalid, OSError):
        return batches
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError, EOFError):
            break
    return batches


def shard_name(rank: int, host: str, pid: int) -> str:
    return f"rank{rank:05d}.{host}.{pid}.parquet"


def finalize_journal(shard_dir: str, host: str, pid: int, meta: Dict[str, Any]) -> Optional[str]:
    """Rewrite ``<host>.<pid>.arrows`` as a Parquet shard; remove the journal."""
    import pyarrow as pa

    from . import schema

    jpath, mpath = journal_paths(shard_dir, host, pid)
    batches = read_journal(jpath)
    rank = int(meta.get("rank", 0))
    meta["events"] = sum(b.num_rows for b in batches)
    table = pa.Table.from_batches([schema.add_rank(b, rank) for b in batches], schema=schema.TRACE_SCHEMA)
    out = os.path.join(shard_dir, shard_name(rank, host, pid))
    write_trace(table, out, {}, [meta])
    for p in (jpath, mpath):
        try:
            os.remove(p)
        except OSError:
            pass
    return out


def write_trace(table, path: str, run: Dict[str, Any], rank_metas) -> None:
    """Write a trace table atomically (temporary file, then rename)."""
    import pyarrow.parquet as pq

    from . import schema

    table = table.replace_schema_metadata(schema.encode_meta(run, rank_metas))
    tmp = path + ".tmp"
    pq.write_table(table, tmp, compression="zstd", row_group_size=1 << 20,
                   use_dictionary=True, write_statistics=True)
    os.replace(tmp, path)
