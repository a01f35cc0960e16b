"""Horovod, DeepSpeed and DALI recorded with the same zero-code record
(real processes on CPU: horovodrun --gloo, torchrun + DeepSpeed ZeRO, a DALI
CPU pipeline), compared side by side with DDP."""
import json
import os
import sys

import pytest

# Imported up front: these packages add their own import hooks to
# sys.meta_path, which the leak fixture would otherwise blame on commprof.
# Every test here needs all three frameworks (make install brings them).
deepspeed = pytest.importorskip("deepspeed")
dc = pytest.importorskip("deepspeed.comm")
hvd = pytest.importorskip("horovod.torch")
mpi_ops = pytest.importorskip("horovod.torch.mpi_ops")
hopt = pytest.importorskip("horovod.torch.optimizer")
dali = pytest.importorskip("nvidia.dali.plugin.pytorch")

pytestmark = pytest.mark.slow

import commprof
from commprof import assemble
from commprof.record import session
from commprof.cli import main
from commprof.record.config import Config
from helpers import ROOT, TINY, documented_record

PY = sys.executable
WL = os.path.join(ROOT, "tests", "workloads")
STEPS = 6


def _hvd():
    """The Horovod guide's command, its script a tiny model (the user's train_hvd.py)."""
    options, cmd = documented_record("docs/frameworks.md", "horovodrun",
                                     script=[os.path.join(WL, "tiny_hvd.py"), "--steps", str(STEPS),
                                             "--result-dir", "{res}"])
    return (cmd, *options)


HVD = _hvd()


def ds_zero(zero):
    return ["torchrun", "--standalone", "--nproc_per_node=2", os.path.join(WL, "tiny_ds.py"), "--zero", str(zero),
            "--steps", "5", "--result-dir", "{res}"]


def test_horovodrun_two_ranks(record_once):
    proc, out = record_once(*HVD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = proc.results
    run = assemble.load(out)
    ev = run.table.to_pandas()
    assert run.meta["framework"] == "horovod" and run.meta["world_size"] == 2
    assert sorted(ev["rank"].unique()) == [0, 1]
    for r in (0, 1):
        c = ev[(ev["rank"] == r) & (ev["category"] == "comm")]
        ar = c[(c["name"] == "all_reduce") & (c["step"] < STEPS)]
        # DistributedOptimizer: one allreduce per parameter per step, summing to the gradients
        assert (ar.groupby("step").size() == 4).all()
        assert (ar.groupby("step")["bytes"].sum() == res[r]["grad_bytes"]).all()
        # broadcast_parameters: the whole state once
        assert c[c["name"] == "broadcast"]["bytes"].sum() == res[r]["state_bytes"]
        assert set(ar["detail"].astype(str)) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # tensor names
        # time blocked in synchronize() is exposed communication
        assert (ev[(ev["rank"] == r)]["name"] == "hvd_synchronize").sum() >= 4 * STEPS
        assert (ev[(ev["rank"] == r) & (ev["category"] == "step")].shape[0]) == STEPS
    # HOROVOD_TIMELINE phases, parsed from the real file rank 0 wrote
    ph = ev[ev["category"] == "phase"]
    names = set(ph["name"].astype(str))
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER"} <= names
    assert set(ph["rank"]) == {0}
    assert (ph["t_end"] >= ph["t_start"]).all()
    # phases sit inside the recorded run on rank 0's clock
    r0 = ev[ev["rank"] == 0]
    assert ph["t_start"].min() >= r0["t_start"].min() - 5_000_000_000
    assert ph["t_end"].max() <= r0["t_end"].max() + 5_000_000_000


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_deepspeed_zero_stages(record_once, zero):
    proc, out = record_once(ds_zero(zero))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = proc.results
    run = assemble.load(out)
    ev = run.table.to_pandas()
    assert run.meta["framework"] == "deepspeed" and run.meta["zero_stage"] == zero
    c = ev[(ev["rank"] == 0) & (ev["category"] == "comm") & (ev["step"] < 5)]
    # recorded once, at the deepspeed.comm level (ZeRO-3's own gathers and reduce-scatters: tagged zero3)
    assert set(c["source"].astype(str)) == ({"deepspeed.comm", "zero3"} if zero == 3 else {"deepspeed.comm"})
    params = res[0]["param_bytes"]
    per_step = c.groupby(["step", c["name"].astype(str)])["bytes"].sum().unstack(fill_value=0)
    if zero == 0:
        assert (per_step["all_reduce"] >= params).all()
    elif zero == 2:
        # gradients reduced, updated partitions gathered back: both cover all parameters
        assert (per_step["all_reduce"] >= params).all()
        assert (per_step["all_gather"] >= params).all()
    else:
        assert (per_step["reduce_scatter"] >= params).all()
        assert (per_step["all_gather"] > 0).all()
    assert (ev[(ev["rank"] == 0) & (ev["category"] == "step")].shape[0]) == 5


@pytest.mark.parametrize("launch", [HVD, (ds_zero(0),), (ds_zero(2),)], ids=["horovod", "deepspeed-zero0",
                                                                              "deepspeed-zero2"])
def test_horovod_and_deepspeed_get_the_fine_grain(record_once, launch):
    """The same runs as above: the bucket, critical-path and update-delay
    tables from Horovod's and DeepSpeed's calls."""
    proc, out = record_once(*launch)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = commprof.load(out).report()
    for name in ("buckets", "critical_path", "updates"):
        assert name in rep.tables and len(rep.tables[name].frame), (name, list(rep.tables))
    b = rep.tables["buckets"].frame
    assert (b["bytes"] > 0).all() and b["samples"].min() >= 2 * 4
    u = rep.tables["updates"].frame.iloc[0]
    assert u["delay_ms_p50"] > 0 and u["ranks"] == 2


def test_deepspeed_launcher(record):
    options, cmd = documented_record("docs/frameworks.md", "deepspeed --num_gpus",
                                     script=[os.path.join(WL, "tiny_ds.py"), "--zero", "1", "--steps", "3",
                                             "--result-dir", "{res}"])
    proc, out = record(cmd, *options)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = assemble.load(out)
    assert run.meta["launcher"] == "deepspeed" and run.meta["ranks_recorded"] == 2


def test_dali_cpu_pipeline(record, tmp_path):
    options, cmd = documented_record("docs/frameworks.md", "train_with_dali.py",
                                     script=[os.path.join(WL, "tiny_dali.py"), "--data", str(tmp_path / "img"),
                                             "--result-dir", "{res}"])
    proc, out = record(cmd, *options)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = assemble.load(out)
    ev = run.table.to_pandas()
    assert run.meta["loader"] == "dali"
    d = ev[ev["category"] == "data"]
    assert set(d["name"].astype(str)) == {"dali"} and set(d["source"].astype(str)) == {"DALI"}
    steps = ev[ev["category"] == "step"]
    assert len(steps) == 4 and (steps["items"] == 4).all() or (steps["items"].iloc[1:] == 4).all()
    assert len(proc.results[0]["labels"]) == 16


def test_side_by_side_report(record, record_once, capsys):
    """DDP, Horovod and DeepSpeed runs of the same tiny model in one report
    (the Horovod and ZeRO-2 runs are the ones the tests above read)."""
    ddp = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--steps", str(STEPS)])
    outs = [ddp[1], record_once(*HVD)[1], record_once(ds_zero(2))[1]]
    assert all(os.path.isfile(os.path.join(o, "trace.parquet")) for o in outs)
    assert main(["report", *outs, "--group-by", "framework", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["tables"]["breakdown"]
    assert sorted(r["config"] for r in rows) == ["ddp", "deepspeed", "horovod"]
    assert all(r["gpus"] == 2 and r["comm_busy_pct"] > 0 for r in rows)


def test_framework_patches_are_removed(tmp_path):
    before = (mpi_ops._allreduce_async, mpi_ops.synchronize, hvd.synchronize, hopt.synchronize,
              dc.all_reduce, dc.comm.reduce_scatter_fn, deepspeed.initialize, dali.DALIGenericIterator.__next__)
    s = session.start(Config(out_dir=str(tmp_path / "o"), run_id="t"), hook_exits=False)
    assert {"horovod", "deepspeed", "dali"} <= set(s.instruments)
    assert mpi_ops._allreduce_async is not before[0] and hopt.synchronize is not before[3]
    assert dc.all_reduce is not before[4] and dali.DALIGenericIterator.__next__ is not before[7]
    session.stop()
    after = (mpi_ops._allreduce_async, mpi_ops.synchronize, hvd.synchronize, hopt.synchronize,
             dc.all_reduce, dc.comm.reduce_scatter_fn, deepspeed.initialize, dali.DALIGenericIterator.__next__)
    assert all(a is b for a, b in zip(before, after))


def test_deepspeed_per_call_latency_is_right_where_its_logger_is_not(record):
    """commprof's per-call all_reduce latency matches the script's own clock
    around each blocking call; DeepSpeed's comms logger reports running
    totals (its timer is never reset), so its figures grow with every call."""
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", os.path.join(WL, "ds_latency.py"),
                        "--calls", "8", "--result-dir", "{res}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = proc.results[0]
    mine = res["mine_ms"]
    ev = assemble.load(out).table.to_pandas()
    c = ev[(ev["rank"] == 0) & (ev["category"] == "comm") & (ev["name"] == "all_reduce")].sort_values("seq")
    ours = ((c["t_end"] - c["t_start"]) / 1e6).tolist()
    assert len(ours) == len(mine) == 8
    # Every span lies inside the script's own clock; from the second call on
    # it covers nearly all of it (the first call also pays one-time set-up in
    # DeepSpeed's wrapper and gloo, before the collective starts).
    for i, (a, b) in enumerate(zip(ours, mine)):
        assert a <= b + 0.05, (ours, mine)
        if i:
            assert b - a <= 0.25 * b + 0.5, (ours, mine)
    logged = next(v["latencies_ms"] for k, v in res["deepspeed_logger"].items() if k.startswith("all_reduce"))
    assert logged == sorted(logged)                          # running totals
    assert logged[-1] == pytest.approx(sum(mine), rel=0.3)   # ~ the sum of all calls so far
    assert sum(logged) / len(logged) > 2 * sum(mine) / len(mine)


def test_horovods_timeline_is_written_to_its_last_phase_on_a_busy_machine(tmp_path):
    """Horovod's shutdown stops its timeline writer without writing what is
    still queued. Two busy processes beside a job that allreduces 4,000
    tensors in one call and exits leave the phases that close last queued:
    without the stop at exit none of the 4,000 ALLREDUCE phases reached the
    trace in three runs. Recorded with --horovod-timeline, the timeline is
    stopped first at exit: every one is in the trace."""
    import subprocess

    n = 4000
    burners = [subprocess.Popen([PY, "-c", "import time\nt = time.time() + 60\nwhile time.time() < t: pass"])
               for _ in range(2)]
    try:
        out = tmp_path / "rec"
        proc = subprocess.run([PY, "-m", "commprof", "record", "--horovod-timeline", "-o", str(out), "--",
                               PY, os.path.join(WL, "hvd_burst.py"), str(n)],
                              capture_output=True, text=True, timeout=240)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = assemble.load(str(out)).table.to_pandas()
    ar = ev[(ev["category"] == "phase") & (ev["name"].astype(str) == "ALLREDUCE")]
    assert len(ar) == n and ar["detail"].nunique() == n


def test_stopping_horovods_timeline_at_exit_never_holds_the_exit():
    """Horovod not initialised (or already shut down): nothing to write,
    the stop returns at once."""
    import time

    from commprof.record.instruments.horovod import drain_timeline

    t0 = time.perf_counter()
    assert drain_timeline(wait_s=5.0) is True
    assert time.perf_counter() - t0 < 5.0
