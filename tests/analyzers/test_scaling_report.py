"""Report-level analyzers on hand-built traces: scaling, skew, stragglers,
bottlenecks, streaming, HTML."""
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.analyzers import breakdown, stragglers
from commprof.cli import main
from commprof.api import analyze
from tracegen import MS, ddp_rank, row, write_run


def run_of(tmp_path, name, world, steps=6, **kw):
    return write_run(tmp_path / f"{name}.parquet", {r: ddp_rank(r, world, steps, **kw) for r in range(world)})


def test_speedup_and_efficiency_by_hand(tmp_path):
    # 2 ranks: 45 ms steps; 4 ranks: buckets take longer -> 50 ms steps. batch 32/rank (weak scaling).
    a = run_of(tmp_path, "w2", 2, bucket_ms=8)    # step = 2+10+20+(8 past last issue)+3 = 43 ms
    b = run_of(tmp_path, "w4", 4, bucket_ms=15)   # step = 2+10+20+15+3 = 50 ms
    report, runs = analyze([a, b], warmup=1)
    t = report.tables["breakdown"].frame.set_index("gpus")
    assert list(t.index) == [2, 4]
    assert t.loc[2, "step_ms_median"] == pytest.approx(43.0)
    assert t.loc[4, "step_ms_median"] == pytest.approx(50.0)
    thr2, thr4 = 2 * 32 / 0.043, 4 * 32 / 0.050
    assert t.loc[2, "samples_per_s"] == pytest.approx(thr2)
    assert t.loc[4, "samples_per_s"] == pytest.approx(thr4)
    assert t.loc[4, "speedup"] == pytest.approx(thr4 / thr2)
    assert t.loc[4, "efficiency_pct"] == pytest.approx(100 * (thr4 / thr2) / 2)
    assert t.loc[2, "efficiency_pct"] == pytest.approx(100.0)
    assert set(t["scaling"]) == {"weak"}
    # exposed comm at 4 GPUs = wait tail 15 ms of 50; busy comm = [10 ms, 35 ms] of backward+tail
    assert t.loc[4, "comm_pct"] == pytest.approx(30.0)
    assert t.loc[4, "comm_busy_pct"] == pytest.approx(100 * 25 / 50)
    # overlap: comm [10,20]+[20,35] inside backward [0,20] -> 10 ms of 25
    assert t.loc[4, "overlap_pct"] == pytest.approx(40.0)
    study = report.tables["study"].frame
    assert list(study["gpus"]) == [2, 4]
    assert any(c.endswith("| comm %") for c in study.columns)
    trend = report.tables["bottlenecks"].frame
    assert "communication share grows from" in " ".join(trend["evidence"])


def test_arrival_skew_and_straggler(tmp_path):
    # rank 2 computes 6 ms longer in backward, so it issues its buckets 6 ms late every step
    rows = {r: ddp_rank(r, 3, 8, bwd_ms=20, arrive_ms=6.0 if r == 2 else 0.0, period_ms=60) for r in range(3)}
    path = write_run(tmp_path / "skew.parquet", rows)
    report, runs = analyze([path], warmup=1)
    skew = report.tables["skew"].frame.iloc[0]
    assert skew["skew_ms_mean"] == pytest.approx(6.0)
    assert skew["instances"] == 7 * 2
    lat = runs[0].colls.rank_lateness().set_index("rank")
    assert lat.loc[2, "lateness_ms"] == pytest.approx(6.0)
    assert lat.loc[2, "last_pct"] == pytest.approx(100.0)
    strag = report.tables["stragglers"].frame
    assert ((strag["rank"] == 2) & (strag["metric"] == "arrival")).any()


def test_persistent_work_straggler_and_imbalance():
    def steps_of(n):
        rows = []
        for r in range(4):
            for s in range(n):
                work = 20 if r != 3 or s % 5 == 0 else 30    # rank 3 late in 4 of every 5 steps
                rows.append({"rank": r, "step": s, "step_time": 40.0 * MS, "comm": (40 - work) * MS,
                             "data": 0.0})
        return pd.DataFrame(rows)

    # 8 of 10 steps: a fair coin gives that for one of 4 ranks in 22 % of runs
    work = stragglers.stragglers(steps_of(10)).query("metric == 'work'")
    assert list(work["rank"]) == [3] and list(work["verdict"]) == ["no evidence"]
    assert work.iloc[0]["late_pct"] == pytest.approx(80.0) and 0.2 < work.iloc[0]["p"] < 0.25
    # 24 of 30 steps: beyond chance, the median excess is the whole 10 ms
    work = stragglers.stragglers(steps_of(30)).query("metric == 'work'")
    assert list(work["rank"]) == [3] and list(work["verdict"]) == ["straggler"]
    assert work.iloc[0]["excess_ms"] == pytest.approx(10.0) and work.iloc[0]["p"] < 0.01
    # mean work: ranks 0-2: 20 ms, rank 3: 28 ms -> mean 22 -> imbalance 28/22 - 1
    assert stragglers.imbalance_pct(steps_of(10)) == pytest.approx(100 * (28 / 22 - 1))


def test_bottleneck_rules(tmp_path):
    data_bound = run_of(tmp_path, "data", 2, data_ms=20)
    small = write_run(tmp_path / "small.parquet", {r: ddp_rank(r, 2, 6, buckets=12, bucket_ms=15,
                                                                 bucket_bytes=64 * 1024) for r in range(2)},
                      meta={"loader": "dali"})
    report, _ = analyze([data_bound, small], warmup=1)
    f = report.tables["bottlenecks"].frame
    data_rows = f[f["finding"] == "data loading stalls training"]
    assert len(data_rows) == 1 and "DataLoader workers" in data_rows.iloc[0]["advice"]
    assert (f["finding"] == "many small collectives").any()
    assert "bucket_cap_mb" in f[f["finding"] == "many small collectives"].iloc[0]["advice"]


def test_per_step_broadcast_finding(tmp_path):
    """A 3 ms buffer broadcast before every forward (3 / 46 ms = 6.5 % of a
    step: 2 data + 3 + 10 forward + 28 backward with its wait + 3 optimizer)
    is reported with its cost; a 0.1 ms one and none are not."""
    def findings(name, bcast_ms):
        path = run_of(tmp_path, name, 2, bcast_ms=bcast_ms)
        report, _ = analyze([path], warmup=1)
        f = report.tables["bottlenecks"].frame
        return f[f["finding"].str.startswith("a broadcast every step")]

    big = findings("big", 3)
    assert len(big) == 1
    row = big.iloc[0]
    assert "broadcast_buffers=False" in row["advice"]
    assert "1.0 broadcasts/step of 38,560 B cost 3.00 ms per step" in row["evidence"], row["evidence"]
    assert "(6.5 % of the median step, 46.00 ms)" in row["evidence"], row["evidence"]
    assert findings("small", 0.1).empty
    assert findings("none", None).empty
    # the same run twice (repeats of one configuration) is still one broadcast per step
    report, _ = analyze([run_of(tmp_path, "rep", 2, bcast_ms=3)] * 2, warmup=1)
    f = report.tables["bottlenecks"].frame
    rep = f[f["finding"].str.startswith("a broadcast every step")]
    assert len(rep) == 1 and rep.iloc[0]["evidence"].startswith("1.0 broadcasts/step"), rep


def test_streaming_chunks_give_the_same_answer(tmp_path):
    rows = {r: ddp_rank(r, 4, 7, arrive_ms=r * 0.5) for r in range(4)}
    path = write_run(tmp_path / "s.parquet", rows)
    whole, _ = analyze([path], chunk_rows=10**9)
    parts, _ = analyze([path], chunk_rows=10)  # one rank per chunk
    for name in ("breakdown", "collectives", "skew"):
        a, b = whole.tables[name].frame, parts.tables[name].frame
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def test_the_step_figures_taken_beside_the_alignment_give_the_tables_row(tmp_path):
    """The breakdown table's row of a run from the figures taken beside the
    clock alignment, from its steps in the table, and of two runs of one
    configuration (where the figures of each are not used): the same."""
    from dataclasses import replace

    from commprof.analyzers import scaling

    a = run_of(tmp_path, "a", 4, bucket_ms=9, arrive_ms=1.5)
    b = write_run(tmp_path / "b.parquet", {r: ddp_rank(r, 4, 6, bucket_ms=12) for r in range(4)})
    _, runs = analyze([a, b], warmup=1)
    assert all(r.step_figures is not None and r.step_figures["of"] is r.steps for r in runs)
    for r in runs:
        with_figures = scaling.breakdown_table([r])
        pd.testing.assert_frame_equal(with_figures, scaling.breakdown_table([replace(r, step_figures=None)]))
        # figures of other steps are not read
        other = replace(r, steps=r.steps.iloc[: len(r.steps) // 2])
        pd.testing.assert_frame_equal(scaling.breakdown_table([other]),
                                      scaling.breakdown_table([replace(other, step_figures=None)]))
        assert not scaling.breakdown_table([other]).equals(with_figures)
    same = [replace(r, label="one", world_size=4) for r in runs]
    pd.testing.assert_frame_equal(scaling.breakdown_table(same),
                                  scaling.breakdown_table([replace(r, step_figures=None) for r in same]))


def test_hosts_are_aligned_by_wall_clock(tmp_path):
    # rank 1 lives on another host whose monotonic clock is 5 s behind: after
    # alignment both ranks issue at the same instant (skew 0).
    rows = {0: ddp_rank(0, 2, 5), 1: ddp_rank(1, 2, 5, t0=-5_000 * MS)}
    metas = [{"rank": 0, "world_size": 2, "clock": {"boot_id": "a", "wall_ns_at_start": 10**18, "mono_ns_at_start": 0}},
             {"rank": 1, "world_size": 2, "clock": {"boot_id": "b", "wall_ns_at_start": 10**18,
                                                     "mono_ns_at_start": -5_000 * MS}}]
    path = write_run(tmp_path / "h.parquet", rows, rank_metas=metas)
    report, _ = analyze([path], warmup=1)
    assert report.tables["skew"].frame.iloc[0]["skew_ms_mean"] == pytest.approx(0.0)


def test_html_escapes_trace_strings(tmp_path, capsys):
    evil = "<script>alert(1)</script>"
    path = write_run(tmp_path / "e.parquet", {r: ddp_rank(r, 2, 4) for r in range(2)},
                     meta={"model": evil, "labels": {"team": "<b>&"}})
    out = tmp_path / "r.html"
    assert main(["report", path, "-o", str(out)]) == 0
    text = out.read_text()
    assert evil not in text and "<b>&" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert text.count("<script>") >= 2  # plotly.js + figures
    assert "Plotly.newPlot" in text


def test_group_by_and_multiple_runs_on_the_cli(tmp_path, capsys):
    a, b = run_of(tmp_path, "a", 2), run_of(tmp_path, "b", 4)
    assert main(["report", a, b, "--group-by", "framework", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["tables"]["breakdown"]
    assert [(r["config"], r["gpus"]) for r in rows] == [("ddp", 2), ("ddp", 4)]


interval = st.tuples(st.integers(0, 400), st.integers(0, 120))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4),
       st.lists(st.tuples(st.sampled_from(["data", "compute", "comm", "wait"]), interval, st.booleans()),
                max_size=25))
def test_random_traces_shares_are_sane(n_ranks, n_steps, evs):
    rows = []
    for r in range(n_ranks):
        for s in range(n_steps):
            rows.append(dict(rank=r, step=s, category="step", name="step", t_start=s * 100, t_end=s * 100 + 100,
                             blocking=None, items=8))
        for cat, (t0, d), blocking in evs:
            rows.append(dict(rank=r, step=min(t0 // 100, n_steps - 1), category=cat, name=cat, t_start=t0,
                             t_end=t0 + d, blocking=blocking if cat == "comm" else None, items=None))
    steps = breakdown.per_step(pd.DataFrame(rows))
    assert len(steps) == n_ranks * n_steps
    parts = steps[["data", "comm", "compute", "other"]].sum(axis=1)
    assert np.allclose(parts, steps["step_time"])
    sh = breakdown.shares(steps)
    for k in ("data", "comm", "compute", "other", "comm_busy", "data_busy", "compute_busy"):
        assert 0.0 <= sh[k] <= 100.0 + 1e-9
    assert sh["overlap"] != sh["overlap"] or 0 <= sh["overlap"] <= 100 + 1e-9


def test_telemetry_table_per_rank(tmp_path):
    rows = {r: ddp_rank(r, 2, 4) for r in range(2)}
    for r in range(2):
        for i, (u, mem) in enumerate(((50.0, 1000.0), (70.0, 3000.0))):
            rows[r].append(row(1, "metric", "gpu.util", i, i, source="nvml", detail=str(r), value=u + r))
            rows[r].append(row(1, "metric", "gpu.mem_used_mib", i, i, source="nvml", detail=str(r), value=mem))
    report, _ = analyze([write_run(tmp_path / "t.parquet", rows)])
    t = report.tables["telemetry"].frame.set_index("rank")
    assert t.loc[0, "util_pct"] == pytest.approx(60.0) and t.loc[1, "util_pct"] == pytest.approx(61.0)
    assert t.loc[0, "mem_peak_mib"] == 3000.0 and t.loc[0, "samples"] == 2


def test_a_trace_reads_its_events_once_per_set_of_arguments(tmp_path, monkeypatch):
    """The report, the critical path and the bucket table share one run
    analysis; other arguments (or a filtered view) analyse again."""
    import commprof

    t = commprof.load(run_of(tmp_path, "a", 2, steps=8))
    reads = []
    chunks = t.chunks

    def counted(*a, **k):
        reads.append(1)
        return chunks(*a, **k)

    monkeypatch.setattr(t, "chunks", counted)
    first = t.analysis()
    t.report()
    t.critical_path()
    t.buckets()
    assert len(reads) == 1 and t.analysis() is first
    t.analysis(warmup=2)
    assert len(reads) == 2
    assert t.filter(ranks=[0]).analysis().n_ranks == 1
