"""On a GPU the host only enqueues: the report's shares, latencies and
bandwidths come from device times when rows carry them (hand-built GPU
trace with known answers)."""
import numpy as np
import pytest

from commprof.analyzers import breakdown
from commprof.api import analyze
from commprof.trace.schema import Event
from tracegen import MS, write_run

P = 40  # ms per step on the device


def gpu_rank(rank, world, steps, backlog_ms=0.0, with_dev=True):
    """Per step s (device, ms from s*P + backlog): forward 2-12, backward
    12-32, one 4 MB allreduce 32-38 (after the backward: exposed), optimizer
    38-40; the host enqueues each in well under a millisecond, and waits for
    data 0-2 (host only)."""
    rows = []
    for s in range(steps):
        h = s * P * MS  # host start of the step
        d = h + int(backlog_ms * MS)

        def dev(a, b):
            return dict(dev_start=d + int(a * MS), dev_end=d + int(b * MS)) if with_dev else {}
        rows.append(Event(s, "data", "dataloader", "DataLoader", None, h, h + 2 * MS, items=32))
        rows.append(Event(s, "compute", "forward", "nn.Module", "M", h + 2 * MS, h + 3 * MS, items=32,
                          **dev(2, 12)))
        rows.append(Event(s, "compute", "backward", "autograd", None, h + 3 * MS, h + 5 * MS, **dev(12, 32)))
        rows.append(Event(s, "comm", "all_reduce", "ddp_reducer", "default", h + 4 * MS, h + 4 * MS + 20_000,
                          bytes=4_000_000, dtype="torch.float32", group="0", group_size=world, seq=s,
                          blocking=False, **dev(32, 38)))
        rows.append(Event(s, "compute", "optimizer", "torch.optim", "SGD", h + 5 * MS, h + 5 * MS + 500_000,
                          **dev(38, 40)))
        rows.append(Event(s, "step", "step", "torch.optim", None, h + 5 * MS + 500_000 - P * MS if s else h,
                          h + 5 * MS + 500_000, items=32))
    return rows


@pytest.mark.parametrize("backlog_ms", [0.0, 25.0])
def test_shares_latency_and_busbw_from_device_times(tmp_path, backlog_ms):
    path = write_run(tmp_path / "gpu.parquet", {r: gpu_rank(r, 2, 12, backlog_ms) for r in range(2)})
    report, runs = analyze([path], warmup=2)
    b = report.tables["breakdown"].frame.iloc[0]
    steps = runs[0].steps
    # device windows are 40 ms; inside: comm 6 exposed, compute 10 + 20 + 2;
    # the host's 2 ms data wait lands in the window before the forward
    assert np.allclose(steps["step_time"], P * MS)
    if backlog_ms == 0:
        assert b["comm_pct"] == pytest.approx(15.0, abs=0.01)
        assert b["data_pct"] == pytest.approx(5.0, abs=0.01)
        assert b["compute_pct"] == pytest.approx(80.0, abs=0.01)
    else:  # with a backlog the host's data wait runs under device compute (data has
        # priority), and the device idles 2 ms before its forward
        assert b["comm_pct"] == pytest.approx(15.0, abs=0.01)
        assert b["data_pct"] + b["compute_pct"] == pytest.approx(80.0, abs=0.01)
        assert b["other_pct"] == pytest.approx(5.0, abs=0.01)
    c = report.tables["collectives"].frame.iloc[0]
    assert c["lat_ms_p50"] == pytest.approx(6.0, rel=0.01)
    assert c["algbw_GBps"] == pytest.approx(4e6 / 6e-3 / 1e9, rel=0.01)
    assert c["busbw_GBps"] == pytest.approx(c["algbw_GBps"] * 2 * (2 - 1) / 2, rel=1e-6)
    # arrival skew stays on host issue times (both ranks call at the same instant)
    skew = report.tables["skew"].frame.iloc[0]
    assert skew["skew_ms_mean"] == pytest.approx(0.0, abs=1e-6)


def test_host_times_alone_would_say_no_communication(tmp_path):
    """The same job without device times: collectives look like 20 µs
    enqueues — the number commprof used to report on NCCL."""
    path = write_run(tmp_path / "host.parquet", {r: gpu_rank(r, 2, 12, with_dev=False) for r in range(2)})
    report, _ = analyze([path], warmup=2)
    assert report.tables["collectives"].frame.iloc[0]["lat_ms_p50"] == pytest.approx(0.02, rel=0.01)
    assert report.tables["breakdown"].frame.iloc[0]["comm_pct"] < 0.1


def test_per_step_mixes_device_and_host_rows(tmp_path):
    rows = gpu_rank(0, 1, 4)
    # one forward without device times (e.g. recorded before CUDA was up) keeps its host interval
    rows[1] = rows[1]._replace(dev_start=None, dev_end=None)
    from commprof.trace.schema import rows_to_table

    ps = breakdown.per_step(rows_to_table(rows, 0))
    assert len(ps) == 4
    assert (ps["step_time"] > 0).all()
