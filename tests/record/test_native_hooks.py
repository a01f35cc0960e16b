"""The native (C++) process-group hooks time DDP's buckets exactly as the
Python ones do: same rows, one sequence numbering with Python-issued
collectives, no double counting; and a real 2-rank job uses them."""
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from commprof import assemble
from commprof.record import native, session
from commprof.record.config import Config
from helpers import TINY

COLS = ["step", "name", "source", "detail", "bytes", "dtype", "group", "group_size", "seq", "blocking"]


def _ddp_run(tmp, native_hooks, python_hook=False):
    store = dist.FileStore(os.path.join(tmp, f"store{native_hooks}{python_hook}"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    out = os.path.join(tmp, f"out{native_hooks}{python_hook}")
    sess = session.start(Config(out_dir=out, run_id="t", flush_interval=0.05, native_hooks=native_hooks),
                         hook_exits=False)
    try:
        sess.install_for("torch")
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4)),
            bucket_cap_mb=0.5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            if python_hook and step == 2:  # a Python comm hook from now on: it times the buckets
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

                model.register_comm_hook(None, allreduce_hook)
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            t = torch.ones(3)
            dist.all_reduce(t)  # timed by the collectives instrument, on the same group
        kind = type(next(iter(sess.instruments["ddp"]._pg_hooked.values()))).__name__
    finally:
        session.stop()
        dist.destroy_process_group()
    ev = assemble.load(os.path.join(out, "shards")).table.to_pandas()
    comm = ev[ev["category"] == "comm"].sort_values("seq")[COLS].reset_index(drop=True)
    return kind, comm, ev


def test_native_hooks_are_built_here(native_hooks_built):
    assert native.built(), (native_hooks_built.stderr or "")[-3000:]


def test_native_rows_equal_the_python_hooks_rows(tmp_path):
    assert native.built()
    kind_n, comm_n, ev_n = _ddp_run(str(tmp_path), True)
    kind_p, comm_p, ev_p = _ddp_run(str(tmp_path), False)
    assert (kind_n, kind_p) == ("_NativeGroupHooks", "_GroupHooks")
    ddp = comm_n[comm_n["source"] == "ddp_reducer"]
    assert len(ddp) >= 5 and ddp["bytes"].nunique() >= 2  # several buckets after the rebuild
    # same rows: buckets, sizes, dtypes, steps, and one numbering with the Python all_reduces
    assert comm_n.equals(comm_p), (comm_n, comm_p)
    assert list(comm_n["seq"]) == list(range(len(comm_n)))
    for ev in (ev_n, ev_p):
        d = ev[ev["source"] == "ddp_reducer"]
        assert (d["t_end"] >= d["t_start"]).all()
        # the backward is split at the last bucket's issue: compute, then waiting for the buckets
        bw = ev[ev["name"] == "backward"]
        wait = ev[ev["name"] == "comm_wait"]
        assert len(bw) == len(wait) == 4
        last_issue = d.groupby("step")["t_start"].max()
        assert (bw.set_index("step")["t_end"] == last_issue).all()
    meta = assemble.load(str(tmp_path / "outTrueFalse" / "shards")).ranks[0]
    assert meta["ddp_hooks"] == "native"


def test_a_python_comm_hook_switches_the_native_hooks_off(tmp_path):
    """Registered mid-run, the Python comm hook times the buckets; the
    native hooks stand aside: every bucket is counted once."""
    assert native.built()
    kind, comm, _ev = _ddp_run(str(tmp_path), True, python_hook=True)
    assert kind == "_NativeGroupHooks"
    by_step = comm[comm["name"] == "all_reduce"].groupby(["step", "source"]).size().unstack(fill_value=0)
    # steps 0-1: native rows; steps 2-3: the timed Python hook's rows, never both
    assert (by_step.loc[[0, 1], "ddp_reducer"] > 0).all()
    sources_late = set(comm[(comm["step"] >= 2) & (comm["detail"] != "all_reduce")]["detail"])
    assert sources_late and "reducer" not in sources_late, comm
    assert list(comm["seq"]) == list(range(len(comm)))


@pytest.mark.slow
def test_a_recorded_two_rank_job_uses_them(record):
    assert native.built()
    for flags, expected in (((), "native"), (("--no-native-hooks",), "python")):
        proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", TINY, "--result-dir", "{res}",
                            "--steps", "6"], *flags)
        assert proc.returncode == 0, proc.stderr[-3000:]
        run = assemble.load(out)
        assert {m["rank"]: m.get("ddp_hooks") for m in run.ranks} == {0: expected, 1: expected}
        ev = run.table.to_pandas()
        d = ev[ev["source"] == "ddp_reducer"]
        counts = d.groupby("rank").size()
        assert len(counts) == 2 and counts.iloc[0] == counts.iloc[1] >= 6
        # the same bucket has the same sequence number on both ranks (cross-rank matching)
        a, b = (d[d["rank"] == r].set_index("seq")["bytes"] for r in (0, 1))
        assert a.sort_index().equals(b.sort_index())


def test_native_hooks_are_unregistered_with_the_session(tmp_path):
    """After session.stop() the C++ hooks are off the process group: DDP
    steps then leave nothing in their buffer (which the hooks object still
    shares with the lambdas torch would call)."""
    assert native.built()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        # no periodic flush: the writer does not drain the buffer under the test's feet
        sess = session.start(Config(out_dir=str(tmp_path / "out"), run_id="t", flush_interval=3600),
                             hook_exits=False)
        sess.install_for("torch")
        model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def steps(n):
            for _ in range(n):
                model(torch.randn(4, 16)).sum().backward()
                opt.step()
                opt.zero_grad()

        def settled():
            # a bucket's completion callback runs on gloo's thread and may land
            # just after backward() returns: wait (bounded) for none in flight
            deadline = time.monotonic() + 10
            while ext.in_flight() and time.monotonic() < deadline:
                time.sleep(0.001)
            assert ext.in_flight() == 0
            return ext.drain()

        steps(2)
        (hooks,) = sess.instruments["ddp"]._pg_hooked.values()
        ext = hooks.native
        settled()
        steps(1)
        assert len(settled()) == 1  # recording: one bucket per step
        session.stop()
        steps(3)
        assert ext.drain() == [] and ext.in_flight() == 0
    finally:
        session.stop()
        dist.destroy_process_group()


def test_the_launcher_builds_where_the_ranks_look():
    """`commprof record` decides where to build without importing torch; a
    rank, with torch imported, must look in the same place."""
    import subprocess
    import sys

    code = "import sys; from commprof.record import native; print(native.build_dir()); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    without_torch, imported = proc.stdout.split()
    assert imported == "False"
    assert without_torch == native.build_dir()  # this process has torch imported
