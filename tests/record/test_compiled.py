"""torch.compile'd DDP recorded unchanged (real torchrun jobs, gloo, CPU):
Dynamo compiles the same graphs with the same breaks as without commprof,
the model is named by its class, the buckets are timed, and a step that
compiles is left out of the step statistics."""
import json
import os

import commprof
from helpers import ROOT, run, why_failed

WL = os.path.join(ROOT, "tests", "workloads", "compiled.py")


def _job(res, *args, steps=6):
    return ["torchrun", "--standalone", "--nproc_per_node=2", WL, "--steps", str(steps), "--result-dir", res, *args]


def _counters(res):
    with open(os.path.join(res, "rank0.json")) as fh:
        r = json.load(fh)
    return [(s["unique_graphs"], s["graph_breaks"], s["frames_ok"]) for s in r["per_step"]], r["losses"]


def test_recording_adds_no_graph_and_no_graph_break(record_once, tmp_path):
    bare = str(tmp_path / "bare")
    plain = run(_job(bare))
    assert plain.returncode == 0, why_failed(plain)
    proc, out = record_once(_job("{res}"))
    assert proc.returncode == 0, why_failed(proc)
    assert _counters(proc.res_dir) == _counters(bare)        # per step: graphs, breaks, frames; the losses
    trace = commprof.load(out)
    assert trace.analysis().meta["model"] == "Net"
    b = trace.buckets()
    # the gradients' bytes: Linear(64, 64) + Linear(64, 10) in fp32, in DDP's buckets
    assert b["bytes"].sum() == 4 * (64 * 64 + 64 + 64 * 10 + 10), b


def test_a_step_that_compiles_is_left_out_like_the_warm_up(record_once):
    proc, out = record_once(_job("{res}", "--compile-at", "4", steps=8))
    assert proc.returncode == 0, why_failed(proc)
    graphs = [g for g, _b, _f in _counters(proc.res_dir)[0]]
    assert graphs[3] < graphs[4], graphs                      # the new batch size compiled at step 4
    trace = commprof.load(out)
    ev = trace.events()
    hot = ev[ev["name"] == "compiled_graphs"]
    assert sorted(set(hot["step"])) == [0, 4] and set(hot["rank"]) == {0, 1}
    rep = trace.report()
    bd = rep.tables["breakdown"].frame.iloc[0]
    assert bd["steps"] == 6              # 8 steps per rank, the warm-up and step 4 left out
    ps = trace.per_step()
    slow = ps[ps["step"] == 4]["step_time"].min() / 1e6
    assert bd["step_ms_p95"] < slow, (bd["step_ms_p95"], slow)
    assert any("torch.compile compiled graphs are left out" in n for n in rep.notes), rep.notes
