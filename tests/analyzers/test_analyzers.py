"""Analyzers on hand-built traces with hand-computed answers."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.analyzers import breakdown, collectives, throughput
from commprof.analyzers.intervals import attribute


def ev(rank, step, category, name, t0, t1, blocking=None, nbytes=None, group_size=None, items=None,
       source="x"):
    return dict(rank=rank, step=step, category=category, name=name, source=source, detail=None,
                t_start=t0, t_end=t1, bytes=nbytes, dtype=None, group="0", group_size=group_size,
                seq=None, blocking=blocking, items=items, value=None)


def one_step(rank=0, offset=0):
    o = offset
    return [
        ev(rank, 0, "step", "step", o + 0, o + 1000, items=32),
        ev(rank, 0, "data", "dataloader", o + 0, o + 100),
        ev(rank, 0, "compute", "forward", o + 100, o + 300),
        ev(rank, 0, "compute", "backward", o + 300, o + 600),
        ev(rank, 0, "comm", "all_reduce", o + 400, o + 700, blocking=False, nbytes=1000, group_size=2),
        ev(rank, 0, "comm", "all_reduce", o + 550, o + 750, blocking=False, nbytes=1000, group_size=2),
        ev(rank, 0, "wait", "comm_wait", o + 600, o + 750),
        ev(rank, 0, "compute", "optimizer", o + 750, o + 850),
        ev(rank, 0, "comm", "all_reduce", o + 900, o + 950, blocking=True, nbytes=4, group_size=2),
    ]


def test_exposed_and_busy_by_hand():
    steps = breakdown.per_step(pd.DataFrame(one_step()))
    r = steps.iloc[0]
    assert r["step_time"] == 1000
    # data [0,100]; blocking comm: wait [600,750] + sync [900,950]; compute [100,600] + [750,850];
    # async comm entirely hidden under backward / wait; other [850,900] + [950,1000]
    assert (r["data"], r["comm"], r["compute"], r["other"]) == (100, 200, 600, 100)
    # busy comm: union of [400,750] and [900,950]
    assert r["comm_busy"] == 400
    assert r["compute_busy"] == 600 and r["data_busy"] == 100
    # comm and compute together: [400,600] (backward); HTA overlap = 200 / 400
    assert r["overlap"] == 200


def test_async_comm_exposed_only_where_nothing_else_runs():
    events = one_step() + [ev(0, 0, "comm", "broadcast", 840, 880, blocking=False, nbytes=8, group_size=2)]
    r = breakdown.per_step(pd.DataFrame(events)).iloc[0]
    # [840,850] is under the optimizer (compute); [850,880] is exposed
    assert (r["comm"], r["compute"], r["other"]) == (230, 600, 70)
    assert r["comm_busy"] == 400 + 40  # [840,880] is busy whether hidden or not


def test_events_outside_steps_are_ignored_and_shares_weighted():
    events = one_step(0) + [ev(0, 1, "compute", "forward", 5000, 6000)]  # no step event for step 1
    events += one_step(1, offset=10)
    steps = breakdown.per_step(pd.DataFrame(events))
    assert list(steps["rank"]) == [0, 1]
    sh = breakdown.shares(steps)
    assert sh == pytest.approx({"data": 10.0, "comm": 20.0, "compute": 60.0, "other": 10.0,
                                "comm_busy": 40.0, "data_busy": 10.0, "compute_busy": 60.0,
                                "overlap": 50.0})


def test_warmup_rule():
    rows = []
    for s in range(4):
        rows.append(ev(0, s, "step", "step", s * 10, s * 10 + 10))
    rows.append(ev(1, 0, "step", "step", 0, 10))  # a rank with a single step keeps it
    steps = breakdown.per_step(pd.DataFrame(rows))
    kept = breakdown.measured(steps, 2)
    assert sorted(zip(kept["rank"], kept["step"])) == [(0, 2), (0, 3), (1, 0)]


def test_bus_factors_match_nccl_tests():
    assert collectives.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert collectives.bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert collectives.bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert collectives.bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert collectives.bus_factor("broadcast", 16) == 1.0
    assert np.isnan(collectives.bus_factor("barrier", 4))


def test_per_call_bandwidths():
    calls = collectives.per_call(pd.DataFrame([
        ev(0, 0, "comm", "all_reduce", 0, 1_000_000_000, nbytes=1_000_000_000, group_size=4),
        ev(0, 0, "comm", "reduce_scatter", 0, 500_000_000, nbytes=800_000_000, group_size=4),
        ev(0, 0, "comm", "barrier", 0, 10, nbytes=0, group_size=4),
    ]))
    ar, rs, bar = calls.iloc[0], calls.iloc[1], calls.iloc[2]
    assert (ar["algbw"], ar["busbw"]) == pytest.approx((1.0, 1.5))
    assert (rs["algbw"], rs["busbw"]) == pytest.approx((1.6, 1.2))
    assert np.isnan(bar["algbw"]) and np.isnan(bar["busbw"])
    table = collectives.summary(calls, n_steps=1, n_ranks=1)
    assert list(table["op"]) == ["all_reduce", "barrier", "reduce_scatter"]


def test_throughput_by_hand():
    rows = []
    # rank 0: 4 steps of 0.5 s with 32 samples; rank 1: 4 steps of 0.25 s with 32 samples
    for r, dur in ((0, 500_000_000), (1, 250_000_000)):
        for s in range(4):
            rows.append(ev(r, s, "step", "step", s * dur, (s + 1) * dur, items=32))
    steps = breakdown.per_step(pd.DataFrame(rows))
    tp = throughput.throughput(steps)
    assert tp["steps_per_s"] == pytest.approx((2 + 4) / 2)
    assert tp["samples_per_s"] == pytest.approx(64 + 128)
    assert tp["step_ms_median"] == pytest.approx(375.0)
    assert throughput.throughput(steps, batch_size=10)["samples_per_s"] == pytest.approx(20 + 40)


intervals = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(intervals, min_size=1, max_size=4), st.lists(st.integers(1, 400), min_size=1, max_size=5))
def test_attribution_properties(classes, widths):
    bounds = np.cumsum([0] + widths)
    ws, we = bounds[:-1].astype(np.int64), bounds[1:].astype(np.int64)
    cls = [(np.array([a for a, _ in c], dtype=np.int64), np.array([a + d for a, d in c], dtype=np.int64))
           for c in classes]
    exposed, busy = attribute(cls, ws, we)
    # exposed parts add up to each window, each within [0, window]
    assert np.allclose(exposed.sum(axis=1), we - ws)
    assert (exposed >= 0).all()
    assert (busy[:, :-1] <= (we - ws)[:, None] + 1e-9).all()
    # the top-priority class is exposed exactly as long as it is busy
    assert np.allclose(exposed[:, 0], busy[:, 0])
    # brute force on integer time
    for w in range(len(ws)):
        counts = np.zeros(len(cls) + 1)
        for t in range(ws[w], we[w]):
            label = len(cls)
            for c, (s, e) in enumerate(cls):
                if ((s <= t) & (t < e)).any():
                    label = c
                    break
            counts[label] += 1
        assert np.allclose(exposed[w], counts)


CATS = ["data", "compute", "comm", "wait"]


def brute_force_step(events, t0, t1):
    """Per integer instant of [t0, t1): which category gets it (priority
    data > blocking comm > compute > comm in flight > other) and which are
    busy (compute busy and overlap count compute that ran: not while the
    thread waits for a collective)."""
    exposed = dict(data=0, comm=0, compute=0, other=0)
    busy = dict(comm_busy=0, data_busy=0, compute_busy=0, overlap=0)
    for t in range(t0, t1):
        on = [e for e in events if e["t_start"] <= t < e["t_end"]]
        data = any(e["category"] == "data" for e in on)
        blocking = any(e["category"] == "wait" or (e["category"] == "comm" and e["blocking"]) for e in on)
        compute = any(e["category"] == "compute" for e in on)
        comm = any(e["category"] == "comm" for e in on)
        busy_comm = comm or any(e["category"] == "wait" for e in on)
        exposed["data" if data else "comm" if blocking else "compute" if compute else "comm" if comm
                else "other"] += 1
        busy["comm_busy"] += busy_comm      # collectives in flight and the waits for them
        busy["data_busy"] += data
        ran = compute and not blocking      # compute that ran: the thread is not waiting for a collective
        busy["compute_busy"] += ran
        busy["overlap"] += comm and ran
    return {**exposed, **busy}


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3), st.lists(st.integers(1, 60), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 2), st.sampled_from(CATS), st.integers(0, 250), st.integers(0, 80),
                          st.booleans()), max_size=25))
def test_per_step_matches_brute_force(n_ranks, widths, raw):
    """The vectorised sweep (all ranks on one time line, bit-packed running
    counts) agrees with instant-by-instant attribution on random traces."""
    rows = []
    bounds = np.cumsum([5] + widths)
    for r in range(n_ranks):
        for s in range(len(widths)):
            rows.append(ev(r, s, "step", "step", int(bounds[s]), int(bounds[s + 1])))
    for r, cat, t, d, blocking in raw:
        if r < n_ranks:
            rows.append(ev(r, 0, cat, cat, t, t + d, blocking=blocking if cat == "comm" else None))
    steps = breakdown.per_step(pd.DataFrame(rows))
    assert len(steps) == n_ranks * len(widths)
    for _, row in steps.iterrows():
        mine = [e for e in rows if e["rank"] == row["rank"] and e["category"] != "step"]
        want = brute_force_step(mine, int(row["t_start"]), int(row["t_end"]))
        got = {k: row[k] for k in want}
        assert got == pytest.approx(want), (row["rank"], row["step"])


def test_per_step_many_concurrent_intervals():
    """More collectives in flight at once than a packed counter field holds
    (Horovod issues one allreduce per tensor): the sweep falls back to
    counting each set alone and stays exact."""
    rows = [ev(0, 0, "step", "step", 0, 100_000)]
    rows += [ev(0, 0, "comm", "all_reduce", 10 + i, 50_000 + i, blocking=False) for i in range(3000)]
    rows += [ev(0, 0, "compute", "backward", 0, 20_000)]
    r = breakdown.per_step(pd.DataFrame(rows)).iloc[0]
    assert r["comm_busy"] == 50_000 + 2999 - 10
    assert r["compute"] == 20_000 and r["comm"] == 50_000 + 2999 - 20_000
    assert r["overlap"] == 20_000 - 10


def test_a_synchronous_collective_inside_a_forward_overlaps_nothing():
    """FSDP on gloo: the layer's all_gather runs, blocking, inside the
    forward's interval. It is exposed communication, not overlap, and the
    forward's compute busy time leaves it out; an asynchronous one beside
    compute that runs is overlap."""
    rows = [ev(0, 0, "step", "step", 0, 1000), ev(0, 0, "compute", "forward", 0, 800),
            ev(0, 0, "comm", "all_gather", 100, 400, blocking=True),
            ev(0, 0, "comm", "reduce_scatter", 600, 900, blocking=False)]
    r = breakdown.per_step(pd.DataFrame(rows)).iloc[0]
    assert r["comm"] == 300 + 100          # the gather, and the async tail after the forward
    assert r["compute_busy"] == 800 - 300
    assert r["overlap"] == 200             # 600..800: async and compute that ran
    assert r["comm"] + r["overlap"] <= r["comm_busy"] == 600


def test_reversed_intervals_cover_nothing():
    """An event whose end precedes its start (a clock step) covers nothing;
    it must not cancel the coverage of the events around it."""
    rows = [ev(0, 0, "step", "step", 0, 10), ev(0, 0, "compute", "forward", 0, 10),
            ev(0, 0, "compute", "odd", 5, 2)]
    r = breakdown.per_step(pd.DataFrame(rows)).iloc[0]
    assert (r["compute"], r["other"], r["compute_busy"]) == (10, 0, 10)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(1, 60), min_size=1, max_size=5), st.integers(0, 2**31))
def test_per_step_rows_come_by_rank_then_end_whatever_the_input_order(n_ranks, widths, seed):
    """Steps recorded in order skip the sort (breakdown._by_rank_then_end);
    the same events in any order give the same frame, row for row."""
    rows = []
    bounds = np.cumsum([5] + widths)
    for r in range(n_ranks):
        for s in range(len(widths)):
            rows.append(ev(r, s, "step", "step", int(bounds[s]) + r, int(bounds[s + 1]) + r))
            rows.append(ev(r, s, "compute", "forward", int(bounds[s]) + r, int(bounds[s]) + r + 1))
    ordered = breakdown.per_step(pd.DataFrame(rows))
    shuffled = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]
    assert list(ordered["rank"]) == sorted(ordered["rank"])
    pd.testing.assert_frame_equal(breakdown.per_step(pd.DataFrame(shuffled)), ordered, check_exact=True)


@pytest.mark.parametrize("hosts", [1, 2])
def test_the_reports_timeline_is_the_timeline_of_all_the_events(tmp_path, hosts):
    """The analysis converts only the first chunk's events the timeline
    shows (analyzers/run.py ``_small_window``): the same rows as the
    timeline of every event, on one host and on two (clocks aligned)."""
    from commprof import api
    from commprof.analyzers import timeline as tl

    from tracegen import ddp_rank, write_run

    world = 10      # more ranks than the timeline shows
    metas = [{"rank": r, "world_size": world, "host": f"n{r * hosts // world}",
              "clock": {"boot_id": f"b{r * hosts // world}"}} for r in range(world)]
    p = write_run(tmp_path / "t.parquet", {r: ddp_rank(r, world, 9, arrive_ms=0.1 * r, seq0=0)
                                           for r in range(world)}, rank_metas=metas)
    ra = api.load(p).analysis(chunk_rows=10 ** 6)       # one chunk: every rank in it
    events = api.load(p).events()
    if ra.offsets:
        off = events["rank"].map(ra.offsets).fillna(0).astype(np.int64)
        events = events.assign(t_start=events["t_start"] + off, t_end=events["t_end"] + off)
    want = tl.timeline(events, ra.steps)
    assert len(want) and want["rank"].nunique() == 8 and want["step"].nunique() == 3
    pd.testing.assert_frame_equal(ra.timeline, want, check_exact=True)
