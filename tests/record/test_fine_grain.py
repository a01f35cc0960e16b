"""The fine grain on real processes: a 2-rank DDP job whose rank 1 is made
late before its backward has bucket waits and the critical path attributed
to rank 1; DDP's buckets name their modules; an MLP's FLOPs per sample are
counted exactly. (Horovod and DeepSpeed runs get the bucket, critical-path
and update-delay tables: tests/record/test_frameworks.py, on the runs it
records.)"""
import json
import os
import sys

import pytest

import commprof
from commprof.cli import main
from helpers import ROOT

pytestmark = pytest.mark.slow

PY = sys.executable
WL = os.path.join(ROOT, "tests", "workloads")


def test_ddp_late_rank_gates_the_buckets(record):
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", os.path.join(WL, "multinode.py"),
                        "--steps", "12", "--slow-rank", "1", "--slow-ms", "40"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = commprof.load(out).report()
    b = rep.tables["buckets"].frame
    assert len(b) >= 1 and (b["last_rank"] == 1).all() and (b["last_pct"] >= 80).all()
    assert (b["wait_ms"] >= 15).all()            # rank 0 waits ~40 ms at every bucket: mean over 2 ranks ~20
    g = rep.tables["critical_path"].frame
    top = g.iloc[0]
    assert top["rank"] == 1 and top["steps_pct"] >= 80 and top["phase"] == "forward", g
    f = rep.tables["bottlenecks"].frame
    assert f["finding"].str.startswith("critical path: bucket").any()


def test_ddp_buckets_name_their_modules(record):
    """DDP's rebuilt buckets (from step 1) list the modules of their
    parameters; ResNet-18's first bucket holds the last layers (fc first)."""
    proc, out = record(["torchrun", "--standalone", "--nproc_per_node=2", os.path.join(ROOT, "workloads", "resnet.py"),
                        "--steps", "5", "--image-size", "32", "--batch-size", "4", "--no-val", "--loader", "synthetic"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    b = commprof.load(out).buckets()
    assert len(b) >= 2
    assert b.iloc[0]["params"].startswith("fc, layer4.1.bn2")
    assert b.iloc[-1]["params"].endswith("modules)") and "conv1" in b.iloc[-1]["params"]


def test_mlp_flops_per_sample_are_exact(record):
    """tests/workloads/tiny.py's MLP, Linear(32, 64), Linear(64, 64),
    Linear(64, 10): forward FLOPs per sample = 2 x sum(in x out)."""
    proc, out = record([PY, os.path.join(WL, "tiny.py"), "--steps", "6"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = commprof.load(out)
    expected = 2 * (32 * 64 + 64 * 64 + 64 * 10)
    assert t.analysis().meta["fwd_flops_per_sample"] == expected
    bd = t.breakdown().iloc[0]
    assert bd["tflops_per_gpu"] == pytest.approx(3 * expected * bd["samples_per_s"] / 1e12, rel=1e-9)
    assert bd["mfu_pct"] != bd["mfu_pct"]        # no GPU: no peak, no MFU
    # a user's peak: MFU against it, in that report only (no state left behind)
    peak = float(bd["tflops_per_gpu"]) * 4
    assert t.report(peak_tflops=peak).tables["breakdown"].frame.iloc[0]["mfu_pct"] == pytest.approx(25.0)
    assert t.breakdown().iloc[0]["mfu_pct"] != t.breakdown().iloc[0]["mfu_pct"]
    js = os.path.join(out, "peak.json")
    assert main(["report", out, "--peak-tflops", repr(peak), "--format", "json", "-o", js]) == 0
    assert json.load(open(js))["tables"]["breakdown"][0]["mfu_pct"] == pytest.approx(25.0)
    again = commprof.compare([out]).breakdown().iloc[0]["mfu_pct"]
    assert again != again
