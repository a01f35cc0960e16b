"""The fine grain on hand-built traces with known answers: per-bucket
timings, the critical path across ranks, delays between weight updates."""
import os
import sys

import pytest

import commprof
from commprof.analyzers import buckets as bk
from helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
import tracegen  # noqa: E402

HOP, BUS = 80e-6, 0.5e9
SIZES = (2e6, 8e6, 16e6)


def _t(n):  # transfer time of bucket size n at 2 ranks under the generator's model
    return (HOP * 1 + n * 1.0 / BUS) * 1e3


@pytest.fixture(scope="module")
def late(tmp_path_factory):
    """2 ranks; rank 1 waits 5 ms longer for its data every step; no other jitter."""
    p = str(tmp_path_factory.mktemp("late") / "late.parquet")
    tracegen.write_run(p, tracegen.modelled_run(2, 12, hop_s=HOP, bus_Bps=BUS, sizes=SIZES,
                                                ready_frac=(0.3, 0.7, 1.0), data_ms=(2.0, 2.0), late_rank=1,
                                                late_ms=5.0))
    return commprof.load(p).analysis()


def test_bucket_table_golden(late):
    b = bk.bucket_table(late.fine_phases, late.fine_grads, 2).set_index("bucket")
    assert list(b.index) == [0, 1, 2] and list(b["bytes"]) == list(SIZES)
    # ready at 30 %, 70 %, 100 % of a 30 ms backward, on each rank's own clock
    assert b["ready_ms"].tolist() == pytest.approx([9.0, 21.0, 30.0], abs=1e-3)
    # rank 1 is 5 ms late: spread 5 ms, rank 0 waits 5 ms (mean over the two ranks 2.5)
    assert b["ready_spread_ms"].tolist() == pytest.approx([5.0, 5.0, 5.0], abs=1e-3)
    assert b["wait_ms"].tolist() == pytest.approx([2.5, 2.5, 2.5], abs=1e-3)
    assert (b["last_rank"] == 1).all() and (b["last_pct"] == 100).all()
    # bucket 0 and 1 start when ready; bucket 2 (ready 9 ms after bucket 1) queues behind it
    assert b.loc[0, "transfer_ms"] == pytest.approx(_t(2e6), abs=1e-3)
    assert b.loc[1, "transfer_ms"] == pytest.approx(_t(8e6), abs=1e-3)
    queued = _t(8e6) - 9.0          # bucket 1's remaining time when bucket 2 is ready on rank 1
    assert b.loc[2, "transfer_ms"] == pytest.approx(queued + _t(16e6), abs=1e-3)
    # exposed tail after the backward: only the last bucket, on the late rank its full time
    tail_r1 = queued + _t(16e6)
    tail_r0 = tail_r1 + 5.0
    assert b.loc[2, "tail_ms"] == pytest.approx((tail_r0 + tail_r1) / 2, abs=1e-3)
    assert b.loc[0, "tail_ms"] == 0


def test_critical_path_names_the_late_rank_and_the_bucket(late):
    paths = bk.critical_paths(late.fine_phases, late.fine_grads, 2)
    assert len(paths) == 11
    # bucket 2 queued behind bucket 1, which started when rank 1 had it ready; rank 1 was late in its data
    assert set(paths["gate_bucket"]) == {1} and set(paths["gate_rank"]) == {1}
    assert set(paths["gate_phase"]) == {"data wait"}
    assert set(paths["path"]) == {"rank 1 data wait -> bucket 1 ready last on rank 1 -> bucket 1 all_reduce "
                                  "-> bucket 2 all_reduce -> optimizer"}
    g = bk.gate_table(paths, bk.bucket_table(late.fine_phases, late.fine_grads, 2))
    assert g.iloc[0]["gate"] == "bucket 1, ready last on rank 1" and g.iloc[0]["steps_pct"] == 100


def test_the_report_says_which_bucket_gates(late, tmp_path):
    p = str(tmp_path / "late.parquet")
    tracegen.write_run(p, tracegen.modelled_run(2, 12, hop_s=HOP, bus_Bps=BUS, sizes=SIZES,
                                                data_ms=(2.0, 2.0), late_rank=1, late_ms=5.0))
    rep = commprof.load(p).report()
    assert {"buckets", "critical_path", "updates"} <= set(rep.tables)
    f = rep.tables["bottlenecks"].frame
    row = f[f["finding"].str.startswith("critical path")].iloc[0]
    assert row["finding"] == "critical path: bucket 1 (7.6 MiB) gates 100 % of steps"
    assert "rank 1 is the last ready in 11 of 11 steps" in row["evidence"] and "(why: data wait)" in row["evidence"]
    assert "rank 1 waits for its data" in row["advice"]


def test_the_fine_grain_tables_built_beside_the_analysis_are_the_reports_own(late):
    """The analysis builds each run's fine-grain tables beside its per-host
    table; the report's tables from them are those it builds itself from
    the same rows (a run without them)."""
    import dataclasses

    from commprof.analyzers import report

    assert late.fine_tables is not None and late.fine_tables["gates"] is not None
    want = bk.run_tables(late.fine_phases, late.fine_grads, late.world_size, late.meta.get("ddp_buckets"))
    for k in ("updates", "buckets", "paths", "gates"):
        assert late.fine_tables[k].equals(want[k]), k
    built, own = report.fine_grain([late]), report.fine_grain([dataclasses.replace(late, fine_tables=None)])
    for k in ("buckets", "gates", "updates", "findings", "gantt"):
        assert built[k].equals(own[k]), k


def test_a_fast_network_puts_the_late_rank_on_the_path(tmp_path):
    """Tiny buckets on a fast network: nothing queues; the last bucket
    (ready when each backward ends) waits for the late rank — rank 0 here."""
    p = str(tmp_path / "fast.parquet")
    tracegen.write_run(p, tracegen.modelled_run(2, 8, hop_s=1e-6, bus_Bps=1e12, sizes=(1e3, 1e3),
                                                ready_frac=(0.3, 1.0), data_ms=(2.0, 2.0), late_rank=0,
                                                late_ms=3.0))
    a = commprof.load(p).analysis()
    paths = bk.critical_paths(a.fine_phases, a.fine_grads, 2)
    assert set(paths["gate_rank"]) == {0} and set(paths["gate_bucket"]) == {1}
    assert set(paths["gate_phase"]) == {"data wait"}
    assert set(paths["path"]) == {"rank 0 data wait -> bucket 1 ready last on rank 0 -> bucket 1 all_reduce "
                                  "-> optimizer"}


def test_update_delays_golden(late):
    u = bk.update_delays(late.fine_phases).iloc[0]
    # between two updates: data (2 ms, rank 1 7 ms), forward 10, backward 30, then waiting for the last bucket
    assert u["forward_ms"] == pytest.approx(10.0, abs=1e-3) and u["backward_ms"] == pytest.approx(30.0, abs=1e-3)
    assert u["data_ms"] == pytest.approx(4.5, abs=1e-3)
    tail_r1 = _t(8e6) - 9.0 + _t(16e6)
    assert u["waiting_ms"] == pytest.approx(((tail_r1 + 5.0) + tail_r1) / 2, abs=1e-3)
    assert u["delay_ms_p50"] == pytest.approx(u["data_ms"] + 10 + 30 + u["waiting_ms"], abs=0.6)
    assert u["updates"] == 2 * 10 and u["ranks"] == 2
    # the longest single wait per step is the communication tail: rank 0's (tail_r1 + 5) and rank 1's
    assert u["idle_ms_p50"] == pytest.approx(((tail_r1 + 5.0) + tail_r1) / 2, abs=1e-3)


def test_events_of_the_sampled_steps_are_found_by_table_and_by_search():
    """in_steps: the (rank, step) table and the sorted search both give the
    membership a set of pairs gives, steps and ranks outside the sample's
    range included."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(7)
    st = pd.DataFrame({"rank": rng.integers(3, 9, 400), "step": rng.integers(-2, 300, 400)})
    rank, step = rng.integers(0, 12, 20_000), rng.integers(-5, 320, 20_000)
    pairs = set(zip(st["rank"].tolist(), st["step"].tolist()))
    want = np.array([(r, s) in pairs for r, s in zip(rank.tolist(), step.tolist())])
    assert want.sum() > 100
    np.testing.assert_array_equal(bk.in_steps(rank, step, st), want)
    np.testing.assert_array_equal(bk._in_steps_sorted(rank, step, st), want)
    far = step.copy()
    far[0] = 10**9                          # too far apart for a table: the search
    want[0] = False
    np.testing.assert_array_equal(bk.in_steps(rank, far, st), want)


@pytest.mark.parametrize("max_steps", [1, 7, 200])
def test_the_sampled_steps_are_every_stride_th_of_each_rank_in_step_order(max_steps):
    """sampled_steps on rows in no order, ranks of unequal lengths: per
    rank, its steps in step order, every ceil(n / max_steps)-th from the
    first, each row with its own start and end (a plain loop per rank)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(3)
    rows = [(r, s) for r, n in ((0, 5), (3, 450), (4, 201), (9, 1)) for s in rng.permutation(n) + 10]
    rank, step = (np.array(c) for c in zip(*rows))
    order = rng.permutation(len(rank))
    steps = pd.DataFrame({"rank": rank[order], "step": step[order]})
    steps["t_start"], steps["t_end"] = steps["step"] * 100 + steps["rank"], steps["step"] * 100 + 50
    want = []
    for r in sorted(set(rank.tolist())):
        mine = sorted(s for q, s in rows if q == r)
        stride = max(1, -(-len(mine) // max_steps))
        want += [(r, s, s * 100 + r, s * 100 + 50) for s in mine[::stride]]
    got = bk.sampled_steps(steps, max_steps)
    assert list(got.columns) == ["rank", "step", "s0", "s1"]
    assert [tuple(int(v) for v in row) for row in got.itertuples(index=False)] == want
    assert bk.sampled_steps(steps.iloc[:0], max_steps).empty
    # the sweep's: the same rows and columns from the steps as arrays
    arrays = {c: steps[c].to_numpy() for c in steps.columns}
    pd.testing.assert_frame_equal(bk.sampled_of(arrays, max_steps), got.reset_index(drop=True))
    assert bk.sampled_of({c: v[:0] for c, v in arrays.items()}, max_steps).empty


def test_measured_steps_and_their_span_by_rank_runs_as_by_groupby():
    """The measured steps (warm-up left out, a rank with no more steps kept
    whole) and each rank's first and last measured step, read off the rank
    runs per_step gives: what pandas' groupby gives, sorted or not."""
    import numpy as np
    import pandas as pd

    from commprof.analyzers import breakdown
    from commprof.analyzers.run import _span_of

    rng = np.random.default_rng(5)
    rows = [(r, s) for r in range(7) for s in range(int(rng.integers(1, 9)))]
    steps = pd.DataFrame(rows, columns=["rank", "step"]).assign(step_time=rng.random(len(rows)))
    for frame in (steps, steps.sample(frac=1.0, random_state=1)):
        for warmup in (0, 1, 3, 50):
            got = breakdown.measured(frame, warmup)
            keep = frame["step"] >= warmup
            short = frame.groupby("rank")["step"].transform("max") < warmup
            pd.testing.assert_frame_equal(got, frame[keep | short])
            if len(got):
                pd.testing.assert_frame_equal(_span_of(got["rank"].to_numpy(), got["step"].to_numpy()),
                                              got.groupby("rank")["step"].agg(["min", "max"]))
