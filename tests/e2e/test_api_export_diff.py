"""Notebook API, Chrome/Perfetto export (checked by Holistic Trace
Analysis), diff."""
import gzip
import json
import os

import pytest

import commprof
from commprof.analyzers import kernels
from commprof.cli import main
from commprof.convert.chrome import as_device_view, validate
from tracegen import MS, ddp_rank, write_run


@pytest.fixture
def runs(tmp_path):
    a = write_run(tmp_path / "a.parquet", {r: ddp_rank(r, 2, 8, arrive_ms=r * 0.7) for r in range(2)})
    b = write_run(tmp_path / "b.parquet", {r: ddp_rank(r, 4, 8, bucket_ms=14, data_ms=5) for r in range(4)})
    return a, b


def test_load_filters_and_methods(runs):
    t = commprof.load(runs[0])
    assert t.meta["world_size"] == 2 and len(t.ranks) == 2
    ev = t.filter(ranks=[1], steps=(2, 3), categories=["comm"]).events()
    assert set(ev["rank"]) == {1} and set(ev["step"]) == {2, 3} and set(ev["category"].astype(str)) == {"comm"}
    w = t.filter(window=(10 * MS, 20 * MS)).events()
    assert (w["t_start"] < 20 * MS).all() and (w["t_end"] > 10 * MS).all()
    # filters compose: ranks then steps
    assert t.filter(ranks=[0]).filter(steps=(0, 0)).events()["rank"].unique().tolist() == [0]
    assert t.breakdown().iloc[0]["gpus"] == 2
    assert len(t.per_step()) == 16
    assert set(t.collectives()["op"]) == {"all_reduce"}
    fig = t.plot_timeline(steps=(2, 3))
    assert len(fig.data) == 4  # data, compute, comm wait, comm lanes
    both = commprof.load(list(runs))
    assert list(both.breakdown()["gpus"]) == [2, 4]
    assert len(both.plot_breakdown().data) == 4 and len(both.plot_scaling().data) == 2


def test_diff_api_and_cli(runs, capsys):
    d = commprof.diff(*runs).set_index(["what", "metric"])
    a, b = commprof.load(runs[0]).breakdown().iloc[0], commprof.load(runs[1]).breakdown().iloc[0]
    row = d.loc[("data", "share of step %")]
    assert row["a"] == pytest.approx(a["data_pct"]) and row["b"] == pytest.approx(b["data_pct"])
    assert row["delta"] == pytest.approx(b["data_pct"] - a["data_pct"])
    assert d.loc[("all_reduce", "calls/step")]["delta"] == pytest.approx(0.0)
    assert main(["diff", *runs, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["tables"]["diff"]) == len(d)


def test_chrome_export_merged_is_valid_with_flows(runs, tmp_path):
    out = str(tmp_path / "timeline.json.gz")
    assert main(["export", "chrome", runs[0], "-o", out, "--steps", "1:3"]) == 0
    with gzip.open(out, "rt") as fh:
        doc = json.load(fh)
    assert validate(doc) == []
    assert doc["distributedInfo"]["world_size"] == 2
    ev = doc["traceEvents"]
    procs = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"rank 0 host", "rank 1 host", "rank 0 device", "rank 1 device"} <= procs
    steps = sorted(e["name"] for e in ev if e["name"].startswith("ProfilerStep#") and e["dur"] > 0)
    assert steps == ["ProfilerStep#1", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#2",
                     "ProfilerStep#3", "ProfilerStep#3"]
    nccl = [e for e in ev if e["ph"] == "X" and e["name"].startswith("ncclKernel_AllReduce")]
    assert len(nccl) == 2 * 3 * 2 and all(e["args"]["bytes"] == 4 * MS for e in nccl)
    starts = [e for e in ev if e["ph"] == "s"]
    ends = [e for e in ev if e["ph"] == "f"]
    assert len(starts) == len(ends) == 3 * 2  # one arrow per collective instance, 2 ranks
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    bad = {"traceEvents": [{"ph": "X", "name": "x", "ts": "0", "pid": 1, "tid": 1}]}
    assert validate(bad)  # missing dur, ts not a number


def test_hta_reads_the_export_and_agrees(runs, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis")
    folder = tmp_path / "hta"
    folder.mkdir()
    assert main(["export", "chrome", runs[1], "-o", str(folder / "t.json.gz"), "--per-rank"]) == 0
    assert sorted(os.listdir(folder)) == [f"t.rank{r}.json.gz" for r in range(4)]
    analysis = hta.TraceAnalysis(trace_dir=str(folder))
    theirs = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    ours = kernels.temporal_breakdown(as_device_view(commprof.load(runs[1]).events())).set_index("rank")
    assert sorted(theirs.index) == [0, 1, 2, 3]
    for r in range(4):
        # HTA rounds timestamps inward to whole microseconds; events here are ms long
        assert theirs.loc[r, "idle_time_pctg"] == pytest.approx(ours.loc[r, "idle_pct"], abs=0.05)
        assert theirs.loc[r, "compute_time_pctg"] == pytest.approx(ours.loc[r, "compute_pct"], abs=0.05)
        assert theirs.loc[r, "non_compute_time_pctg"] == pytest.approx(ours.loc[r, "non_compute_pct"], abs=0.05)
        assert overlap.loc[r, "comp_comm_overlap_pctg"] == pytest.approx(ours.loc[r, "overlap_pct"], abs=0.05)


def test_export_bad_inputs(runs, tmp_path, capsys):
    assert main(["export", "chrome", runs[0], "-o", str(tmp_path / "x.json"), "--steps", "100:200"]) == 2
    assert "no events" in capsys.readouterr().err
    assert main(["export", "chrome", runs[0], "-o", str(tmp_path / "x.json"), "--ranks", "a-b"]) == 2
    assert main(["export", "chrome", str(tmp_path / "none"), "-o", str(tmp_path / "x.json")]) == 2


@pytest.mark.slow
def test_one_gpu_baseline_joins_the_ddp_configuration(tmp_path):
    """The same script at 1 process (plain python, no framework) and at 2
    ranks (torchrun, DDP) is one configuration with a 1 -> 2 row, speedup
    and efficiency; grouped by hand, the user's grouping wins."""
    import commprof
    from helpers import TINY, commprof_cmd, run

    outs = []
    for k, extra in enumerate(([], ["--nproc", "2"])):
        out = str(tmp_path / f"r{k}")
        proc = run(commprof_cmd("record", "-o", out, *extra, "--", "python", TINY, "--steps", "8"), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(out)
    assert commprof.load(outs[0]).meta["world_size"] == 1
    bd = commprof.compare(outs).breakdown()
    assert bd["config"].nunique() == 1 and bd["config"].iloc[0].startswith("ddp")
    assert sorted(bd["gpus"]) == [1, 2]
    two = bd[bd["gpus"] == 2].iloc[0]
    assert two["speedup"] > 0 and two["efficiency_pct"] == pytest.approx(100 * two["speedup"] / 2)
    by_hand = commprof.compare(outs, group_by=["framework"]).breakdown()
    assert by_hand["config"].nunique() == 2
