"""Device timing on CPU: the arithmetic, error handling, deadlines, fork
and CUDA-graph safety of the device timer, run over simulated device
events (host-clock events that complete a fixed lag after they are
recorded, elapsed times rounded to float32 ms as CUDA reports them)."""
import gc
import os
import time
import weakref

import numpy as np
import pytest
import torch

from commprof import assemble
from commprof.record import device, session, telemetry
from commprof.record.config import Config
from commprof.record.device import DeviceTimer, SimulatedEvents, float32_ms
from commprof.trace.schema import Event
from helpers import TINY

HOUR = 3600 * 10**9


class FakeClock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def _row(i):
    return Event(0, "compute", "forward", "nn.Module", "M", i, i + 1)


def test_float32_milliseconds_lose_resolution_over_a_long_run():
    # the reason for the reference chain: one reference 10 hours back
    err = abs(float32_ms(10 * HOUR + 1_234_567) * 1e6 - (10 * HOUR + 1_234_567))
    assert err > 1_000_000  # > 1 ms lost (float32 steps are 4 ms there)


class LateWaker(SimulatedEvents):
    """Each wait returns late by the next of ``lateness`` ns (a sleep's
    wake-up, a preemption)."""

    def __init__(self, clock, lateness):
        super().__init__(lag_ns=4_000_000, clock=clock)
        self.lateness = list(lateness)

    def synchronize(self, ev):
        self.clock.t = ev.t + self.lateness.pop(0)


def test_the_anchor_keeps_the_earliest_of_its_waits():
    """A wait for an event can only return late; the chain's anchor is the
    least late of its waits (0.1 ms here), not the first (5 ms)."""
    clock = FakeClock(10**9)
    events = LateWaker(clock, [5_000_000, 100_000, 3_000_000])
    timer = DeviceTimer(events, clock=clock)
    timer.begin()
    ev0, host0 = timer._refs[0]
    assert host0 - ev0.t == pytest.approx(100_000, abs=200)
    assert events.lateness == []


@pytest.mark.parametrize("hours, bound_ns", [(0, 500), (1, 6_000), (24, 40_000)])
def test_device_times_stay_precise_for_any_run_length(hours, bound_ns):
    """A region every ~2 s (jittered) for up to a day: the chain of
    references keeps every event within a few µs (a random walk of float32
    roundings, ~c·sqrt(T·link)); one fixed reference would be off by up to
    half a float32 step: 125 µs after an hour, 4 ms after a day."""
    import random

    rnd = random.Random(7)
    clock = FakeClock(10**9)
    timer = DeviceTimer(SimulatedEvents(lag_ns=0, clock=clock), clock=clock)
    rows, expected = [], []
    t = clock.t
    end_t = clock.t + hours * HOUR
    naive_worst = 0
    while True:
        clock.t = t
        ev = timer.begin()
        clock.t = t + 3_200_123
        timer.end(ev, _row(len(expected)))
        expected.append((t, t + 3_200_123))
        naive_worst = max(naive_worst, abs(float32_ms(t - 10**9) * 1e6 - (t - 10**9)))
        if t >= end_t:
            break
        t += 2_000_000_000 + rnd.randrange(0, 100_000_000)
        clock.t = t
        if len(expected) % 50 == 0:
            timer.resolve(rows.append)
    clock.t = t + 10**10
    timer.resolve(rows.append)
    assert len(rows) == len(expected)
    worst = max(max(abs(r.dev_start - a), abs(r.dev_end - b)) for r, (a, b) in zip(rows, expected))
    assert worst <= bound_ns, f"{worst} ns off after {hours} h"
    if hours >= 24:
        assert naive_worst > 50 * worst  # what one fixed reference would have lost
    assert len(timer._refs) <= 2  # references nothing pending needs are dropped


class Pooled(SimulatedEvents):
    """Counts the events created; ``foreign`` events refuse to be recorded
    again (CUDA: an event of another device than the current stream's)."""

    def __init__(self, clock):
        super().__init__(0, clock=clock)
        self.created = 0
        self.foreign = set()

    def record(self):
        self.created += 1
        return super().record()

    def record_again(self, ev):
        if id(ev) in self.foreign:
            raise RuntimeError("Event device 1 does not match recording stream's device 0")
        super().record_again(ev)


def test_completed_events_are_recorded_again_not_created():
    """Events whose times were read go back to a pool: in steady state a
    step creates no event (creating one cost the training thread ~55 µs on
    an H200 host), and the times stay exact; one that refuses a new record
    (another device's) is dropped and a fresh one is made."""
    clock = FakeClock(10**9)
    ev = Pooled(clock)
    timer = DeviceTimer(ev, clock=clock)
    out, expected = [], []
    for step in range(40):
        for region in range(4):
            t = clock.t
            start = timer.begin()
            clock.t += 1_000 + 17 * region
            timer.end(start, _row(len(expected)))
            expected.append((t, clock.t))
            clock.t += 500
        timer.resolve(out.append)
        if step == 1:
            after_warmup = ev.created
    assert [(r.dev_start, r.dev_end) for r in out] == expected
    assert ev.created == after_warmup  # 38 steps, 304 events recorded, none created
    pooled = list(timer.free)
    ev.foreign.update(id(e) for e in pooled)
    start = timer.begin()
    timer.end(start, _row(len(expected)))
    assert ev.created == after_warmup + 2 and not set(map(id, timer.free)) & {id(start[1])}
    assert len(timer.free) == len(pooled) - 2  # the two refused ones are gone


def test_a_region_still_open_keeps_its_reference_while_inner_rows_resolve():
    """A backward longer than the reference interval: its buckets' rows
    resolve (and references are pruned) before it ends; the reference its
    start needs stays, so it gets device times too (it kept host times only
    when that reference was pruned)."""
    clock = FakeClock(10**9)
    timer = DeviceTimer(SimulatedEvents(0, clock=clock), clock=clock)
    out = []
    outer = timer.begin()                       # the backward: reference 0
    t_outer = clock.t
    clock.t += 3 * device.REF_INTERVAL_NS // 2  # a long backward
    inner = timer.begin()                       # a bucket's all_reduce: reference 1
    t_inner = clock.t
    clock.t += 10_000
    timer.end(inner, _row(1))
    timer.resolve(out.append)                   # a flush while the backward runs
    clock.t += 10_000
    timer.end(outer, _row(0))
    timer.resolve(out.append)
    assert [r.t_start for r in out] == [1, 0]
    got = [(r.dev_start, r.dev_end) for r in out]
    want = [(t_inner, t_inner + 10_000), (t_outer, clock.t)]
    # float32 ms over 1.5 s: within ~100 ns
    assert np.allclose(np.array(got, float), np.array(want, float), rtol=0, atol=200), (got, want)
    assert len(timer._refs) <= 2 and not timer._open


def test_a_region_that_never_ends_stops_holding_references():
    clock = FakeClock(10**9)
    timer = DeviceTimer(SimulatedEvents(0, clock=clock), clock=clock)
    timer.begin()                               # never ended (its instrument failed)
    out = []
    for _ in range(device.OPEN_KEEP_REFS + 50):
        clock.t += device.REF_INTERVAL_NS
        timer.end(timer.begin(), _row(0))
        timer.resolve(out.append)
    assert len(timer._refs) <= device.OPEN_KEEP_REFS + 2
    assert all(r.dev_start is not None for r in out)


def test_pruning_while_training_threads_add_rows():
    """The writer prunes while training threads park rows: no 'deque mutated
    during iteration' (it escaped the flush and stopped the recording)."""
    import sys
    import threading

    class Pending(SimulatedEvents):  # rows never complete: they pile up
        def done(self, ev):
            return False

    timer = DeviceTimer(Pending(0))
    timer.end(timer.begin(), _row(0))
    stop, errors = threading.Event(), []

    def train():
        i = 1
        while not stop.is_set():
            timer.end(timer.begin(), _row(i))
            i += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=train)
    t.start()
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                timer._prune()
            except RuntimeError as exc:
                errors.append(exc)
                break
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert not errors, errors


class Flaky(SimulatedEvents):
    """Reading one particular event fails (a CUDA error, a destroyed event)."""

    def __init__(self, bad):
        super().__init__(0)
        self.bad = bad

    def elapsed_ns(self, a, b):
        if b is self.bad:
            raise RuntimeError("cudaErrorInvalidResourceHandle")
        return super().elapsed_ns(a, b)


def test_one_unreadable_row_keeps_host_times_and_the_rest_resolve():
    ev = Flaky(None)
    timer = DeviceTimer(ev)
    starts = [timer.begin() for _ in range(3)]
    for i, s in enumerate(starts):
        timer.end(s, _row(i))
    ev.bad = timer.pending[1][1]
    out = []
    assert timer.resolve(out.append) == 3
    assert [r.dev_start is not None for r in out] == [True, False, True]
    assert [r.t_start for r in out] == [0, 1, 2]


def test_pending_work_at_exit_waits_only_until_the_deadline():
    timer = DeviceTimer(SimulatedEvents(lag_ns=3600 * 10**9))  # never completes in this test
    timer._add_ref(timer.ev.record(), time.monotonic_ns())  # anchored (no synchronise)
    timer.end(timer.begin(), _row(0))
    out = []
    assert timer.resolve(out.append) == 0  # not complete: stays parked
    t0 = time.monotonic()
    assert timer.resolve(out.append, deadline=time.monotonic() + 0.2) == 1
    assert time.monotonic() - t0 < 2
    assert out[0].dev_start is None and out[0].t_start == 0  # host times kept, nothing lost


class Counting(SimulatedEvents):
    def __init__(self):
        super().__init__(0)
        self.queries = 0

    def done(self, ev):
        self.queries += 1
        return super().done(ev)


def test_nothing_recorded_or_queried_while_a_cuda_graph_is_captured():
    ev = Counting()
    timer = DeviceTimer(ev)
    timer.end(timer.begin(), _row(0))
    timer.capturing = 1
    assert timer.begin() is None
    timer.end(None, _row(1))
    q = ev.queries
    assert timer.resolve([].append) == 0 and ev.queries == q
    timer.capturing = 0
    out = []
    assert timer.resolve(out.append) == 2
    assert out[0].dev_start is not None and out[1].dev_start is None


def test_cudagraph_instrument_counts_captures(tmp_path):
    s = session.start(Config(out_dir=str(tmp_path), run_id="t", simulate_device_lag_ms=1), hook_exits=False)
    try:
        import torch.cuda.graphs as graphs

        assert graphs.CUDAGraph.capture_begin.__commprof__ == "cudagraph"
        rec = s.recorder
        rec.capture_begins()
        rec.region("compute", "forward", "x", None, 1, 2)  # activates; the timer sees the capture
        assert rec.timer.capturing == 1 and rec.dev_begin() is None
        rec.capture_ends()
        assert rec.timer.capturing == 0 and rec.dev_begin() is not None
    finally:
        session.stop()


def test_after_fork_the_parents_timer_is_kept_alive_untouched(tmp_path):
    s = session.start(Config(out_dir=str(tmp_path), run_id="t", simulate_device_lag_ms=1), hook_exits=False)
    try:
        rec = s.recorder
        rec.region("compute", "forward", "x", None, 1, 2)
        old = weakref.ref(rec.timer)
        rec.after_fork_in_child()  # what os.register_at_fork runs in a child
        gc.collect()
        assert old() is not None and old() in device._FORK_ORPHANS
        assert rec.timer is None
    finally:
        device._FORK_ORPHANS.clear()
        session.stop()


def test_recording_never_asks_torch_whether_cuda_is_available(tmp_path, monkeypatch):
    """torch.cuda.is_available() (and device_count / init) before CUDA is
    initialised poisons fork(); a recorded CPU job must never call them —
    here with DataLoader workers started by fork, while recording."""
    calls = []
    for name in ("is_available", "device_count", "init", "_lazy_init"):
        real = getattr(torch.cuda, name)
        monkeypatch.setattr(torch.cuda, name, lambda *a, _r=real, _n=name, **k: (calls.append(_n), _r(*a, **k))[1])
    from torch.utils.data import DataLoader, TensorDataset

    s = session.start(Config(out_dir=str(tmp_path / "o"), run_id="t", telemetry="auto", kernels=""),
                      hook_exits=False)
    try:
        s.install_for("torch")
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8,
                            num_workers=2, multiprocessing_context="fork")
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        assert s.recorder.run_info.get("cuda") is False
    finally:
        session.stop()
    assert calls == []
    table = assemble.load(str(tmp_path / "o")).table
    assert set(table.column("category").to_pylist()) >= {"data", "compute", "step"}


def test_device_timing_starts_once_cuda_is_initialised(tmp_path, monkeypatch):
    state = {"up": False}
    monkeypatch.setattr(device, "cuda_initialized", lambda: state["up"])
    monkeypatch.setattr(device, "CudaEvents", lambda torch_module: SimulatedEvents(0))
    s = session.start(Config(out_dir=str(tmp_path), run_id="t"), hook_exits=False)
    try:
        rec = s.recorder
        rec.region("compute", "forward", "x", None, 1, 2)  # a forward before CUDA is up
        assert rec.timer is None
        rec.end_step(3, "test")
        assert rec.timer is None  # still no CUDA: checked again next step, not switched off for good
        state["up"] = True
        rec.end_step(4, "test")
        assert rec.timer is not None
    finally:
        session.stop()


def test_kernel_mode_from_step_zero(tmp_path):
    s = session.start(Config(out_dir=str(tmp_path / "o"), run_id="t", kernels="0:2"), hook_exits=False)
    try:
        s.install_for("torch")
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        assert s.recorder.run_info["kernel_window"] == [0, 2]
    finally:
        session.stop()
    shards = os.listdir(tmp_path / "o" / "shards")
    assert any(n.startswith("kineto.") and n.endswith(".json.gz") and ".tmp" not in n for n in shards), shards


@pytest.mark.parametrize("visible, current, want", [
    ("", 1, ("index", 1)),
    ("2,3", 1, ("index", 3)),
    ("GPU-5c7a0f1e-aaaa-bbbb-cccc-0123456789ab,1", 0, ("uuid", "GPU-5c7a0f1e-aaaa-bbbb-cccc-0123456789ab")),
    ("MIG-1f2e3d4c-0000-1111-2222-333344445555", 0, ("uuid", "MIG-1f2e3d4c-0000-1111-2222-333344445555")),
    ("0,bogus,1", 1, ("index", 1)),  # CUDA stops at the first invalid entry: device 1 is not listed
    (" 4 , 5 ", 0, ("index", 4)),
])
def test_telemetry_device_from_cuda_visible_devices(visible, current, want):
    assert telemetry.nvml_target(visible, current) == want


class FakeNvml:
    """NVML as a MIG instance answers it: no power reading."""
    NVML_CLOCK_SM = 1

    class _U:
        gpu = 37

    class _M:
        used = 3 * 2**20

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._U()

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._M()

    def nvmlDeviceGetPowerUsage(self, h):
        raise RuntimeError("NVMLError_NotSupported")

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980


class _Rec:
    def __init__(self):
        self.rows = []

    def metric(self, name, value, source=None, detail=None):
        self.rows.append((name, value))


def test_telemetry_samples_at_once_and_drops_only_what_nvml_cannot_give():
    rec = _Rec()
    s = telemetry.Sampler(rec, interval=60)
    s._nvml, s._handle, s.index = FakeNvml(), object(), 0
    s._stop.set()  # stop after the first sample: it happens at start, not one interval later
    s._loop()
    assert rec.rows == [("gpu.util", 37.0), ("gpu.mem_used_mib", 3.0), ("gpu.sm_clock_mhz", 1980.0)]
    s.sample()
    assert [n for n, _ in rec.rows[3:]] == ["gpu.util", "gpu.mem_used_mib", "gpu.sm_clock_mhz"]


@pytest.mark.slow
def test_simulated_device_through_the_whole_pipeline(record):
    """2 ranks under `commprof record` with a simulated device that lags
    4 ms behind the host: every timed row — forward, backward, optimizer
    and every collective (DDP buckets in their future callback, blocking
    calls after they return) — carries device times, none earlier than its
    host issue, and the report reads them."""
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--steps", "6"],
                       "--simulate-device-lag-ms", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = assemble.load(out).table.to_pandas()
    timed = ev[ev["name"].astype(str).isin(["forward", "backward", "optimizer"]) | (ev["category"] == "comm")]
    # the very first region of a process starts before it is a rank (its start
    # event precedes the timer); from step 1 on every timed row has device times
    later = timed[timed["step"] >= 1]
    assert len(later) and later["dev_start"].notna().all() and later["dev_end"].notna().all()
    timed = timed[timed["dev_start"].notna()]
    assert (timed["dev_start"] >= timed["t_start"]).all()
    assert (timed["dev_end"] >= timed["dev_start"]).all()
    lag = (timed["dev_start"] - timed["t_start"]) / 1e6
    assert lag.median() == pytest.approx(4.0, abs=0.5)
    comm = ev[ev["category"] == "comm"]
    assert set(comm["source"].astype(str)) >= {"ddp_reducer"}
    from commprof.api import analyze

    report, _ = analyze([out])
    assert len(report.tables["collectives"].frame) > 0


def test_close_racing_flushes_emits_every_device_row_exactly_once(tmp_path):
    """Device rows are resolved under the writer's lock, at close too: with
    flushes running concurrently from other threads, every row lands in the
    journal exactly once."""
    import threading

    s = session.start(Config(out_dir=str(tmp_path / "o"), run_id="t", simulate_device_lag_ms=0.001,
                             flush_interval=0.01), hook_exits=False)
    rec = s.recorder
    rec.region("compute", "warmup", "x", None, 0, 1)  # becomes a rank; the timer starts
    n = 3000
    for i in range(n):
        rec.region_dev("compute", "forward", "x", None, 10 + i, 11 + i, rec.dev_begin())
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            rec.flush()

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        session.stop()
    finally:
        stop.set()
        for t in threads:
            t.join()
    ev = assemble.load(str(tmp_path / "o" / "shards")).table.to_pandas()
    fwd = ev[ev["name"] == "forward"]
    assert len(fwd) == n and fwd["t_start"].is_unique
    assert fwd["dev_start"].notna().all()
