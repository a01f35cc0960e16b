"""Device-accurate times: CUDA events around forward, backward, the
optimizer step and every collective, resolved off the hot path.

``begin()`` records a timing event on the current stream and returns it;
``end(start, row)`` records the end event and parks the row. The writer
thread calls ``resolve()``, which turns every parked pair whose end event
has completed (``Event.query()``, never a synchronisation) into device
times on the host's monotonic clock and emits the row with dev_start /
dev_end filled. At process end, ``resolve(deadline=...)`` waits, polling,
for what is still pending, at most until the deadline; rows whose events
never complete keep their host times only (nothing is lost).

Mapping to the host clock. CUDA reports ``elapsed_time`` between two events
as float32 milliseconds, so one fixed reference loses resolution as the run
goes on (a 24-bit mantissa: ~60 µs after 10 minutes, ~8 ms after a day).
Instead the timer keeps a chain of reference events, a new one recorded
every ``REF_INTERVAL_NS`` of host time (one extra event record, no sync);
each reference's offset from the first is the sum of the short elapsed
times between consecutive references, kept as integer nanoseconds, and an
event's time is its reference's time plus the short elapsed time from that
reference. The chain is anchored to the host clock once, before the first
timed region (outside the steady state), by a few synchronised events, the
earliest estimate kept. The chain's roundings add up as a random walk: a few
µs after an hour, tens of µs after a day of training (measured in the tests), instead
of 125 µs and 4 ms with one fixed reference. The device clock's drift
against the host's (ppm) is not corrected.

Collectives (NCCL): ProcessGroupNCCL completes a work's future when the
kernel is *enqueued*, and a blocking call returns then too, so host times
are enqueue times. The start event is recorded on the current stream when
the collective is issued (NCCL's stream waits for it); the end event in the
future's ``then`` callback, which torch runs with a current stream that
waits for the collective, or, for a blocking call, on the current stream
right after the call (which ProcessGroupNCCL makes wait for the work).

Never used while a CUDA graph is being captured (events recorded in a
capture would become part of the graph; ``query()`` from another thread is
illegal in the default capture mode): ``capturing`` is counted by the
cudagraph instrument and both sides check it.

On CPU nothing here is used, except :class:`SimulatedEvents` in tests: the
same timer over host-clock events that complete a fixed time after they are
recorded, like a device with a backlog."""
from __future__ import annotations

import collections
import struct
import threading
import time
from typing import Callable, Dict, Optional

from .log import log_once

#: host time between two reference events of the chain (elapsed times up to
#: a second are float32 milliseconds exact to ~0.06 µs)
REF_INTERVAL_NS = 1_000_000_000
#: references kept for a region still open (begun, not ended): ten minutes
#: worth; a region open longer (one that never ends) keeps host times only
OPEN_KEEP_REFS = 600
#: waits for an event at the anchor, the earliest reading kept
ANCHOR_SAMPLES = 3
#: how long close() waits, polling, for the last events to complete
DRAIN_DEADLINE_S = 5.0
#: completed events kept to be recorded again rather than created and
#: destroyed, two per timed region (14 a ResNet-18 step): on an H200 host
#: (torch 2.11) cProfile put 1.0 ms a step of the training thread in
#: commprof's event records, creation included, 0.16 ms of it in the records
#: themselves (benchmarks/results/gpu_check/)
POOL_MAX = 1024


def float32_ms(ns: int) -> float:
    """An interval as CUDA's ``cudaEventElapsedTime`` reports it: float32 ms."""
    return struct.unpack("f", struct.pack("f", ns / 1e6))[0]


class CudaEvents:
    """The event backend on CUDA (torch.cuda.Event with timing)."""

    def __init__(self, torch_module):
        self.torch = torch_module

    def record(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        self.record_again(ev)
        return ev

    @staticmethod
    def record_again(ev) -> None:
        """Record a pooled event (completed and read) again; RuntimeError if
        it belongs to another device than the current stream's."""
        ev.record()

    @staticmethod
    def done(ev) -> bool:
        return ev.query()

    @staticmethod
    def elapsed_ns(a, b) -> int:
        return int(round(a.elapsed_time(b) * 1e6))

    @staticmethod
    def synchronize(ev) -> None:
        ev.synchronize()


class _SimEvent:
    __slots__ = ("t",)

    def __init__(self, t: int):
        self.t = t


class SimulatedEvents:
    """Host-clock events that complete ``lag_ns`` after they are recorded,
    elapsed times rounded to float32 ms as CUDA reports them: a device with a
    constant backlog, for testing the timing path on machines without one
    (``commprof record --simulate-device-lag-ms``, hidden)."""

    def __init__(self, lag_ns: int, clock: Callable[[], int] = time.monotonic_ns):
        self.lag_ns = int(lag_ns)
        self.clock = clock

    def record(self):
        return _SimEvent(self.clock() + self.lag_ns)

    def record_again(self, ev) -> None:
        ev.t = self.clock() + self.lag_ns

    def done(self, ev) -> bool:
        return self.clock() >= ev.t

    @staticmethod
    def elapsed_ns(a, b) -> int:
        return int(round(float32_ms(b.t - a.t) * 1e6))

    def synchronize(self, ev) -> None:
        """Sleep, then spin the last half millisecond (as CUDA's default
        synchronisation spins), so a wake-up's lateness is not the anchor's."""
        while True:
            left = ev.t - self.clock()
            if left <= 0:
                return
            if left > 500_000:
                time.sleep((left - 500_000) / 1e9)


class DeviceTimer:
    def __init__(self, events, clock: Callable[[], int] = time.monotonic_ns):
        self.ev = events
        self.clock = clock
        self.pending: collections.deque = collections.deque()
        #: reference chain, index -> [event, host ns of the event or None
        #: until known]; references no pending row needs are dropped
        self._refs: Dict[int, list] = {}
        self._n_refs = 0
        self._last_ref_host = 0
        #: CUDA graph captures in progress (counted by the cudagraph instrument)
        self.capturing = 0
        #: completed events whose times were read, to record again (appended
        #: by the writer thread, popped by training threads: deque ops are atomic)
        self.free: collections.deque = collections.deque()
        #: reference index -> regions begun on it and not ended yet (a
        #: backward open while its buckets' rows resolve): their reference
        #: is not pruned
        self._open: Dict[int, int] = {}
        self._open_lock = threading.Lock()

    def _record(self):
        """An event recorded now on the current stream: a pooled one when
        there is one, else a new one."""
        if self.free:
            try:
                ev = self.free.pop()
                self.ev.record_again(ev)
                return ev
            except (IndexError, RuntimeError):  # emptied meanwhile; another device's event (dropped)
                pass
        return self.ev.record()

    def _release(self, ev) -> None:
        if len(self.free) < POOL_MAX:
            self.free.append(ev)

    # -- hot path (training thread) ------------------------------------------
    def _anchor(self) -> None:
        """Anchor the chain: the host time of a first event. Waiting for an
        event and reading the clock can only be late (a wake-up, a
        preemption), never early, so each of ``ANCHOR_SAMPLES`` waits gives
        an upper bound of the first event's host time (its own reading less
        the device's elapsed time since the first event) and the smallest
        bound is kept."""
        ev0 = self._record()
        self.ev.synchronize(ev0)
        best = self.clock()
        for _ in range(ANCHOR_SAMPLES - 1):
            ev = self._record()
            self.ev.synchronize(ev)
            best = min(best, self.clock() - self.ev.elapsed_ns(ev0, ev))
            self._release(ev)
        self._add_ref(ev0, best)
        self._last_ref_host = self.clock()

    def _add_ref(self, ev, host) -> None:
        self._refs[self._n_refs] = [ev, host]
        self._n_refs += 1

    def begin(self):
        """A start event on the current stream (None while capturing)."""
        if self.capturing:
            return None
        if not self._refs:
            self._anchor()
        else:
            now = self.clock()
            if now - self._last_ref_host >= REF_INTERVAL_NS:
                self._add_ref(self._record(), None)
                self._last_ref_host = now
        k = self._n_refs - 1
        with self._open_lock:
            self._open[k] = self._open.get(k, 0) + 1
        return (k, self._record())

    def end(self, start, row) -> None:
        """Park ``row`` until the end event (recorded now, on the current
        stream) has completed."""
        self.pending.append((start, None if self.capturing else self._record(), row))
        if start is not None:  # pending first: the writer's prune sees the row in one of the two
            k = start[0]
            with self._open_lock:
                n = self._open.get(k, 0) - 1
                if n > 0:
                    self._open[k] = n
                else:
                    self._open.pop(k, None)

    # -- off the hot path (writer thread) -----------------------------------
    def _ref_time(self, k: int) -> Optional[int]:
        """Host ns of reference k (the chain's sums, exact integers)."""
        refs = self._refs
        if refs[k][1] is not None:
            return refs[k][1]
        j = k
        while refs[j][1] is None:
            j -= 1
        for i in range(j + 1, k + 1):
            if not self.ev.done(refs[i][0]):
                return None
            refs[i][1] = refs[i - 1][1] + self.ev.elapsed_ns(refs[i - 1][0], refs[i][0])
        return refs[k][1]

    def _try_times(self, start, end):
        """(dev_start, dev_end); None while the events have not completed;
        () when there is nothing to measure (recorded during a capture)."""
        if end is None or start is None:
            return ()
        if not self.ev.done(end):
            return None
        k, ev0 = start
        base = self._ref_time(k)
        if base is None:
            return None
        ref = self._refs[k][0]
        return base + self.ev.elapsed_ns(ref, ev0), base + self.ev.elapsed_ns(ref, end)

    def resolve(self, emit, deadline: Optional[float] = None) -> int:
        """Emit every parked row whose events completed, in order. With a
        ``deadline`` (``time.monotonic()`` seconds) wait, polling, for the
        rest until then; rows still pending then keep host times only, as
        does a row whose times cannot be read (logged once; the others are
        unaffected). Nothing is queried while a CUDA graph is captured."""
        if self.capturing and deadline is None:
            return 0
        n = 0
        while self.pending:
            start, end, row = self.pending[0]
            try:
                times = self._try_times(start, end)
            except Exception as exc:
                log_once("device-resolve", f"a device time could not be read ({exc!r}); "
                         "that row keeps host times only")
                times = ()
            if times is None:
                if deadline is None:
                    break
                if time.monotonic() < deadline:
                    time.sleep(0.001)
                    continue
                log_once("device-deadline", "device work still pending at exit after "
                         f"{DRAIN_DEADLINE_S:.0f} s; those rows keep host times only")
                times = ()
            self.pending.popleft()
            if times:
                emit(row._replace(dev_start=times[0], dev_end=times[1]))
                # both read, both completed: recorded again from the pool
                self._release(start[1])
                self._release(end)
            else:
                emit(row)
            n += 1
        if n:
            self._prune()
        return n

    def _prune(self) -> None:
        """Drop references older than what pending rows and open regions
        need (keeping the newest one whose time is known, the chain's base)."""
        # list(): training threads append meanwhile (iterating a deque that
        # grows raises)
        needed = min((start[0] for start, _e, _r in list(self.pending) if start is not None),
                     default=self._n_refs - 1)
        with self._open_lock:
            open_min = min(self._open, default=needed)
        needed = min(needed, max(open_min, self._n_refs - 1 - OPEN_KEEP_REFS))
        base = max((k for k, (_ev, host) in list(self._refs.items()) if host is not None and k <= needed),
                   default=None)
        if base is None:
            return
        for k in [k for k in list(self._refs) if k < base]:  # list(): begin() may add one meanwhile
            self._release(self._refs.pop(k)[0])



#: In a forked child: the parent's timers, kept alive and never touched
#: again (destroying the parent's CUDA events in a forked child is a CUDA
#: call in a process that must make none).
_FORK_ORPHANS: list = []


def orphan_after_fork(timer) -> None:
    if timer is not None:
        _FORK_ORPHANS.append(timer)


def cuda_initialized() -> bool:
    """Has this process initialised CUDA? Never initialises it (and never
    calls ``torch.cuda.is_available()``, which poisons ``fork``)."""
    import sys

    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def cuda_present() -> bool:
    """Is a CUDA device usable here, without initialising CUDA? Once CUDA is
    initialised the answer is yes; before, NVML is asked (the check torch
    itself makes under ``PYTORCH_NVML_BASED_CUDA_CHECK=1``)."""
    import sys

    if cuda_initialized():
        return True
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch.version, "cuda", None):
        return False
    try:
        return int(torch.cuda._device_count_nvml()) > 0
    except Exception:
        return False


def make_timer(simulate_lag_ms: float = 0.0) -> Optional[DeviceTimer]:
    """A timer when this process uses CUDA (or simulates a device), else None."""
    if simulate_lag_ms > 0:
        return DeviceTimer(SimulatedEvents(int(simulate_lag_ms * 1e6)))
    if not cuda_initialized():
        return None
    import sys

    return DeviceTimer(CudaEvents(sys.modules["torch"]))
