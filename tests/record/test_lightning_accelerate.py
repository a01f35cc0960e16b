"""Lightning (``ddp`` and ``ddp_spawn``) and ``accelerate launch`` recorded
unchanged, real processes on CPU: the framework's own collectives
(Lightning's metric sync, broadcast, barrier; Accelerate's gather) are its
own, never DDP's; ``optimizer.step(closure)`` splits into forward, backward
and optimizer; a spawning parent is not a rank."""
import os

import pytest

import commprof
from helpers import ROOT, documented_record, why_failed

pytest.importorskip("pytorch_lightning")

WL = os.path.join(ROOT, "tests", "workloads", "tiny_lightning.py")
STEPS = 8


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_lightnings_collectives_are_lightnings(record_once, strategy):
    options, cmd = documented_record("docs/fsdp.md", "-- python train.py",
                                     script=[WL, "--strategy", strategy, "--steps", str(STEPS)])
    proc, out = record_once(cmd, *options)
    assert proc.returncode == 0, why_failed(proc)
    trace = commprof.load(out)
    assert trace.analysis().meta["world_size"] == 2 and sorted(trace.events()["rank"].unique()) == [0, 1]
    colls = trace.collectives()
    by = colls.groupby(["op", "source"])["calls_per_step"].sum().to_dict()
    # the gradients through DDP's reducer; Lightning's 8-byte broadcast, barrier and loss sync its own
    assert by.get(("all_reduce", "ddp_reducer"), 0) == 1.0, by
    for op in ("broadcast", "barrier", "all_reduce"):
        assert by.get((op, "lightning"), 0) >= 1.0, (op, by)
    assert not any(src == "torch.distributed" for _op, src in by), by
    finds = trace.bottlenecks()
    assert not finds["finding"].str.contains("broadcast every step").any(), finds["finding"].tolist()
    assert not finds["advice"].fillna("").str.contains("broadcast_buffers|Horovod|HOROVOD|DeepSpeed").any()
    # optimizer.step(closure): the optimizer's region starts after the closure's backward
    ev = trace.events()
    comp = ev[(ev["category"] == "compute") & (ev["step"].between(1, STEPS - 1))]
    for (_r, _s), d in comp.groupby(["rank", "step"]):
        fwd, bwd, opt = (d[d["name"] == n] for n in ("forward", "backward", "optimizer"))
        assert len(fwd) and len(bwd) and len(opt) == 1, d[["name", "t_start", "t_end"]]
        assert opt["t_start"].iloc[0] >= bwd["t_end"].max() >= fwd["t_end"].max()
    assert len(trace.buckets()) == 1        # the bucket is found between backward and optimizer


def test_accelerates_collectives_are_accelerates(record_once):
    pytest.importorskip("accelerate")
    wl = os.path.join(ROOT, "tests", "workloads", "tiny_accelerate.py")
    options, cmd = documented_record("docs/fsdp.md", "accelerate launch", script=[wl, "--steps", str(STEPS)])
    proc, out = record_once(cmd, *options)
    assert proc.returncode == 0, why_failed(proc)
    trace = commprof.load(out)
    by = trace.collectives().groupby(["op", "source"])["calls_per_step"].sum().to_dict()
    assert by.get(("all_reduce", "ddp_reducer"), 0) == 1.0 and by.get(("all_gather", "accelerate"), 0) == 1.0, by
    assert trace.analysis().meta["world_size"] == 2
