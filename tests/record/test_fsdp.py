"""FSDP2 and FSDP1 recorded unchanged (real torchrun jobs, gloo on CPU):
every gather and reduce-scatter with its layer and phase, counted against
torch's own CommDebugMode (an oracle commprof does not write), bytes against
the model's parameters, prefetch seen in the exposed times, FSDP's own
findings."""
import json
import os

import numpy as np
import pytest
import pandas as pd

import commprof
from helpers import ROOT, documented_record, run, why_failed

WL = os.path.join(ROOT, "tests", "workloads", "fsdp.py")
STEPS = 6
LAYERS = {"layers.0", "layers.1", "layers.2", "head"}


def _job(*args, steps=STEPS):
    """The FSDP guide's record command, its script this workload."""
    options, cmd = documented_record("docs/fsdp.md", "torchrun", script=[WL, "--steps", str(steps), *args])
    assert not options
    return cmd


def _fsdp_comm(out):
    ev = commprof.load(out).events()
    c = ev[(ev["category"] == "comm") & (ev["source"] == "fsdp")].copy()
    c["phase"] = c["detail"].astype(str).str.split(" ").str[0]
    c["layer"] = c["detail"].astype(str).str.split(" ").str[1]
    return ev, c


def test_fsdp2_collectives_match_torchs_own_count_with_layers_phases_and_bytes(record_once, tmp_path):
    oracle = str(tmp_path / "oracle")
    proc, out = record_once(_job("--oracle", oracle))
    assert proc.returncode == 0, why_failed(proc)
    with open(os.path.join(oracle, "oracle.json")) as fh:
        want = json.load(fh)
    ev, c = _fsdp_comm(out)
    meta = commprof.load(out).analysis().meta
    assert meta["framework"] == "fsdp2" and meta["model"] == "Net", (meta["framework"], meta["model"])
    # every collective of the training steps is FSDP's (none left untagged)
    steps = c[c["step"] < STEPS]
    plain = ev[(ev["category"] == "comm") & (ev["step"] < STEPS) & (ev["source"] != "fsdp")
               & ev["name"].isin(["all_gather", "reduce_scatter"])]
    assert plain.empty, plain[["name", "source", "detail"]]
    for rank in (0, 1):
        mine = steps[steps["rank"] == rank]
        for s in range(STEPS):
            got = mine[mine["step"] == s]["name"].value_counts().to_dict()
            assert got.get("all_gather", 0) == want["counts"][s]["c10d._allgather_base_"], (rank, s, got)
            assert got.get("reduce_scatter", 0) == want["counts"][s]["c10d._reduce_scatter_base_"], (rank, s, got)
        # per step, each layer: one forward gather, one backward re-gather, one reduce-scatter
        for s in range(STEPS):
            one = mine[mine["step"] == s]
            assert set(one["layer"]) == LAYERS
            for layer in LAYERS:
                kinds = sorted(one[one["layer"] == layer]["phase"].str.replace("_prefetch", ""))
                assert kinds == ["backward", "forward", "reduce"], (rank, s, layer, kinds)
    # bytes: the layer's parameters (S: the full array), unpadded in the metadata
    params = want["params"]
    for layer in LAYERS:
        nbytes = 4 * sum(n for name, n in params.items() if name.startswith(layer + "."))
        assert meta["fsdp_groups"][layer]["bytes"] == nbytes, layer
        sent = steps[steps["layer"] == layer]["bytes"].unique()
        assert list(sent) == [nbytes], (layer, sent)
    assert all(g["reduce_dtype"] == "float32" for g in meta["fsdp_groups"].values())


def test_recording_fsdp2_leaves_its_losses_unchanged(record_once, tmp_path):
    oracle, bare = str(tmp_path / "a"), str(tmp_path / "b")
    proc, _out = record_once(_job("--oracle", oracle))
    assert proc.returncode == 0, why_failed(proc)
    plain = run(_job("--oracle", bare))
    assert plain.returncode == 0, why_failed(plain)
    with open(os.path.join(oracle, "oracle.json")) as a, open(os.path.join(bare, "oracle.json")) as b:
        assert json.load(a)["losses"] == json.load(b)["losses"]


def _layers(out):
    trace = commprof.load(out)
    return trace.report(), trace.fsdp_layers().set_index("layer")


def test_a_prefetched_gather_hides_behind_the_previous_layers_compute(record_once):
    """30 ms of compute planted in layer 1's forward: with forward prefetch
    (asynchronous unshard) layer 2's gather runs under it and is about 0
    exposed; without prefetch it is exposed in full. Either way the
    layers' exposed times add up to the breakdown's exposed comm."""
    runs = {}
    for name, extra in (("plain", ()), ("prefetch", ("--prefetch",))):
        proc, out = record_once(_job("--delay-layer", "1", "--delay-ms", "30", *extra, steps=8))
        assert proc.returncode == 0, why_failed(proc)
        runs[name] = _layers(out)
    for name, (rep, t) in runs.items():
        bd = rep.tables["breakdown"].frame.iloc[0]
        exposed_ms = (t["gather exposed ms"] + t["regather exposed ms"] + t["reduce exposed ms"]).sum()
        # per measured step and rank (the table) against the breakdown's time-weighted share
        step_ms = 1e3 / bd["steps_per_s"]
        assert abs(exposed_ms - bd["comm_pct"] / 100 * step_ms) <= 0.05 * exposed_ms + 0.2, \
            (name, exposed_ms, bd["comm_pct"], step_ms)
        assert bd["comm_pct"] + bd["overlap_pct"] * bd["comm_busy_pct"] / 100 <= bd["comm_busy_pct"] + 0.5, name
    plain, pre = runs["plain"][1].loc["layers.2"], runs["prefetch"][1].loc["layers.2"]
    assert plain["prefetched %"] == 0 and pre["prefetched %"] == 100
    assert plain["gather exposed ms"] >= 0.9 * plain["gather ms"], plain
    assert pre["gather exposed ms"] <= 0.1 * pre["gather ms"] and pre["gather ms"] > 5, pre
    finds = runs["plain"][0].tables["bottlenecks"].frame
    assert "FSDP forward all-gathers are exposed" in set(finds["finding"])


def test_an_fsdp_job_gets_fsdps_advice_and_no_ddp_or_horovod_advice(record_once):
    proc, out = record_once(_job())
    assert proc.returncode == 0, why_failed(proc)
    rep = commprof.load(out).report()
    finds = rep.tables["bottlenecks"].frame
    text = " ".join(finds["advice"].fillna("")) + " ".join(finds["finding"])
    for word in ("bucket_cap_mb", "HOROVOD", "DDP", "static_graph", "broadcast_buffers"):
        assert word not in text, (word, finds[["finding", "advice"]].to_string())
    assert any(f.startswith("FSDP ") for f in finds["finding"]), finds["finding"].tolist()
    assert any(f.startswith("critical path: the step's last wait is ") for f in finds["finding"])
    assert "buckets" not in rep.tables
    bd = rep.tables["breakdown"].frame.iloc[0]
    # the gathers on gloo are synchronous: exposed, not overlapped
    assert bd["overlap_pct"] < 5 and bd["comm_pct"] <= bd["comm_busy_pct"] + 0.5


def test_fsdp1_collectives_have_layers_and_phases(record_once):
    proc, out = record_once(_job("--fsdp1"))
    assert proc.returncode == 0, why_failed(proc)
    ev, c = _fsdp_comm(out)
    meta = commprof.load(out).analysis().meta
    assert meta["framework"] == "fsdp1" and meta["model"] == "Net", meta["model"]
    steps = c[(c["step"] < STEPS) & (c["rank"] == 0)]
    assert {"layers.0", "layers.1", "layers.2"} <= set(steps["layer"])
    for s in range(STEPS):
        one = steps[steps["step"] == s]
        rs = one[one["name"] == "reduce_scatter"]
        assert set(rs["phase"]) == {"reduce"} and {"layers.0", "layers.1", "layers.2"} <= set(rs["layer"])
        ag = one[one["name"] == "all_gather"]
        assert {"forward", "backward"} <= set(ag["phase"].str.replace("_prefetch", "")), ag["phase"].tolist()
    plain = ev[(ev["category"] == "comm") & (ev["step"] < STEPS) & (ev["source"] != "fsdp")
               & ev["name"].isin(["all_gather", "reduce_scatter"])]
    assert plain.empty


def test_the_model_class_is_named_through_torch_compile():
    import torch

    from commprof.record.instruments.module import describe

    class Net(torch.nn.Module):
        def forward(self, x):
            return x

    assert describe(torch.compile(Net())) == "Net"
    ddp_like = type("DistributedDataParallel", (torch.nn.Module,), {})()
    ddp_like.module = torch.compile(Net())
    assert describe(ddp_like) == "DistributedDataParallel(Net)"
    assert describe(torch.compile(ddp_like)) == "DistributedDataParallel(Net)"


def test_exposure_goes_to_the_collective_the_thread_waits_for():
    """analyzers/fsdp.py on hand-made events: an asynchronous gather under
    compute is hidden, its wait is exposed; a blocking one inside the
    forward is exposed in full; the exposed times add up to the step's
    exposed comm."""
    from commprof.analyzers import breakdown, fsdp

    def e(cat, name, src, detail, t0, t1, blocking=None, nbytes=None):
        return dict(rank=0, step=1, category=cat, name=name, source=src, detail=detail, t_start=t0, t_end=t1,
                    bytes=nbytes, blocking=blocking)

    rows = [e("step", "step", "torch.optim", None, 0, 1000),
            e("compute", "forward", "nn.Module", "Net", 0, 600),
            e("comm", "all_gather", "fsdp", "forward layers.0", 0, 100, True, 8),
            e("comm", "all_gather", "fsdp", "forward_prefetch layers.1", 100, 400, False, 8),
            e("wait", "fsdp_unshard_wait", "fsdp", "forward layers.1", 350, 400),
            e("compute", "backward", "autograd", None, 600, 900),
            e("comm", "reduce_scatter", "fsdp", "reduce layers.0", 800, 950, True, 8)]
    df = pd.DataFrame(rows)
    st = pd.DataFrame({"rank": [0], "step": [1], "s0": [0], "s1": [1000]})
    got = fsdp.rank_rows(df[df["category"] != "step"], st).set_index(["layer", "phase", "op"])
    assert got.loc[("layers.0", "forward", "all_gather"), "exposed_ns"] == 100
    assert got.loc[("layers.1", "forward_prefetch", "all_gather"), "exposed_ns"] == 0
    assert got.loc[("layers.1", "forward", "wait"), "exposed_ns"] == 50
    assert got.loc[("layers.0", "reduce", "reduce_scatter"), "exposed_ns"] == 150
    assert got.loc[("layers.0", "reduce", "reduce_scatter"), "after_bwd_ns"] == 50
    assert got.loc[("layers.0", "reduce", "reduce_scatter"), "last"] == 1
    step = breakdown.per_step(df.assign(step=np.where(df["category"] == "step", 1, 1))).iloc[0]
    assert got["exposed_ns"].sum() == step["comm"] == 300
    t = fsdp.layer_table(got.reset_index()).set_index("layer")
    assert t.loc["layers.1", "prefetched %"] == 100 and t.loc["layers.1", "gather exposed ms"] == 50 / 1e6
    assert list(t.index) == ["layers.0", "layers.1"]


def test_zero3_collectives_are_read_per_layer_with_deepspeeds_advice(record_once):
    """DeepSpeed ZeRO-3 (every parameter gathered per module:
    stage3_param_persistence_threshold 0): its gathers and reduce-scatters
    tagged with layer and phase, the same per-layer table, ZeRO-3's own
    advice (its config keys), none of FSDP's."""
    pytest.importorskip("deepspeed")
    ds = os.path.join(ROOT, "tests", "workloads", "tiny_ds.py")
    proc, out = record_once(["torchrun", "--standalone", "--nproc_per_node=2", ds, "--zero", "3", "--persist", "0",
                             "--steps", "6"])
    assert proc.returncode == 0, why_failed(proc)
    trace = commprof.load(out)
    ev = trace.events()
    z = ev[(ev["source"] == "zero3") & (ev["category"] == "comm") & ev["step"].between(1, 5)]
    for (_r, _s), d in z.groupby(["rank", "step"]):
        rs = d[d["name"] == "reduce_scatter"]
        ag = d[d["name"] == "all_gather"]
        # the model's gradients, reduced and scattered once a step; its parameters gathered before use
        assert rs["bytes"].sum() == 4 * (32 * 64 + 64 + 64 * 10 + 10) and len(ag) >= 1
        assert set(rs["detail"].str.split(" ").str[0]) == {"reduce"}
        assert set(ag["detail"].str.split(" ").str[0]) <= {"forward", "forward_prefetch", "backward",
                                                           "backward_prefetch"}
    t = trace.fsdp_layers()
    assert len(t) and (t["reduce ms"] > 0).any() and (t["gather ms"] > 0).any(), t
    meta = trace.analysis().meta
    assert meta["fsdp_groups"]["0"]["bytes"] == 4 * (32 * 64 + 64)
    finds = trace.bottlenecks()
    text = " ".join(finds["advice"].fillna(""))
    assert "set_modules_to_forward_prefetch" not in text and "bucket_cap_mb" not in text
    assert finds["finding"].str.startswith("ZeRO-3 ").any(), finds["finding"].tolist()
