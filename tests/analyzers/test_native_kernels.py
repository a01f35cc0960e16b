"""The analyzers' compiled kernels (analyzers/_kernels.c) against the
numpy paths they replace: the same results bit for bit (the cover-pattern
table on random intervals and on a synthetic DDP trace's per-step
breakdown; its per-rank time lines on random events; the collectives'
per-instance reduction on random partials, and of a chunk's rank runs;
the straggler tests' order statistics on matrices with ties;
sums per key);
where they cannot be built the numpy paths run."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ROOT

from commprof.analyzers import native
from commprof.analyzers.intervals import pattern_table

needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler")


def both(fn, *args):
    """fn(*args) with the kernel, then with the numpy path."""
    before = os.environ.get(native.ENV_SWITCH)
    try:
        os.environ[native.ENV_SWITCH] = "1"
        fast = fn(*args)
        os.environ[native.ENV_SWITCH] = "0"
        return fast, fn(*args)
    finally:
        if before is None:
            os.environ.pop(native.ENV_SWITCH)
        else:
            os.environ[native.ENV_SWITCH] = before


@needs_cc
def test_the_kernel_is_built_and_used_where_a_compiler_is():
    assert native.kernel() is not None
    assert native.status() == f"compiled ({native.library_path()})"
    assert os.stat(native.library_path()).st_mode & 0o555 == 0o555     # others sharing the folder load it too


windows = st.lists(st.tuples(st.integers(0, 40), st.integers(-3, 60)), min_size=1, max_size=6)
members = st.lists(st.tuples(st.integers(0, 600), st.integers(-5, 200), st.integers(-1, 6)), max_size=40)


@needs_cc
@settings(max_examples=300, deadline=None)
@given(windows, members, st.integers(1, 5))
def test_kernel_equals_numpy_bit_for_bit(wins, mems, n_sets):
    """Windows laid end to end (gaps, shared ends, empty and reversed ones),
    members of n_sets sets and ignored labels, overlapping anything,
    starting and ending on the same instants as the windows and each other."""
    starts, ends, labels, t = [], [], [], 0
    for gap, width in wins:
        t += gap
        starts.append(t)
        ends.append(t + width)
        labels.append(0)
        t += max(width, 0)
    for s, w, lab in mems:
        starts.append(s)
        ends.append(s + w)
        labels.append(lab)
    args = (np.array(starts, np.int64), np.array(ends, np.int64), np.array(labels, np.int8), n_sets)
    (ft, fw), (st_, sw) = both(pattern_table, *args)
    assert np.array_equal(fw, sw)
    assert ft.shape == st_.shape and np.array_equal(ft, st_), (ft, st_)
    # figures of 0 / 1 weights added up in the kernel (its own merge of the
    # starts and the ends): the table's product, bit for bit
    weights = np.random.default_rng(len(mems) * 7 + n_sets).integers(0, 2, (1 << n_sets, 3)).astype(np.float64)
    (fp, fw2), (sp, sw2) = both(pattern_table, *args, weights)
    assert np.array_equal(fw2, sw) and np.array_equal(sw2, sw)
    assert fp.shape == sp.shape == (len(sw), 3)
    assert np.array_equal(fp, st_ @ weights) and np.array_equal(sp, st_ @ weights), (fp, st_ @ weights)


@needs_cc
def test_weights_other_than_0_or_1_take_the_product():
    """The kernel adds whole segments to a figure: a weight of 0.5 is left
    to the table's product, the same as without the kernel."""
    args = (np.array([0, 10, 2, 12], np.int64), np.array([10, 20, 15, 14], np.int64),
            np.array([0, 0, 1, 1], np.int8), 1)
    weights = np.array([[0.5, 1.0], [1.0, 0.0]])
    (fp, _), (sp, _) = both(pattern_table, *args, weights)
    assert fp.tolist() == sp.tolist() == [[2 * 0.5 + 8.0, 2.0], [5 * 0.5 + 5.0, 5.0]]


@needs_cc
def test_a_ddp_traces_breakdown_is_the_same_with_either():
    """Every step of a synthetic 8-rank DDP trace (benchmarks/synth.py),
    both paths: every column equal."""
    import pyarrow as pa

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from synth import rank_table

    from commprof.analyzers import breakdown
    from commprof.analyzers.events import Events

    table = pa.concat_tables([rank_table(r, 8, 300, 4) for r in range(8)])
    fast, slow = both(breakdown.per_step, Events.of(table))
    assert len(fast) > 2000
    assert fast.equals(slow)


def test_without_a_compiler_the_numpy_path_reports(tmp_path):
    """A compiler that fails and an empty cache: no kernel, the same report
    code runs (numpy), and nothing is left in the cache."""
    cache = tmp_path / "cache"
    code = ("from commprof.analyzers import native, intervals\nimport numpy as np\n"
            "assert native.kernel() is None\n"
            "assert native.status().startswith(\"numpy (the C compiler 'false' failed\"), native.status()\n"
            "t, w = intervals.pattern_table(np.array([0, 2]), np.array([10, 5]), np.array([0, 1]), 1)\n"
            "print(t.tolist())")
    env = dict(os.environ, CC="false", COMMPROF_NATIVE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "[[7.0, 3.0]]"
    assert not list(cache.glob("*.so")) and not list(cache.glob(".building-*"))
    for extra, said in (({"CC": "/nonexistent/cc"}, "numpy (no C compiler ('/nonexistent/cc'"),
                        ({native.ENV_SWITCH: "off"}, f"numpy ({native.ENV_SWITCH}=off)")):
        env = dict(os.environ, COMMPROF_NATIVE_DIR=str(cache), **extra)
        proc = subprocess.run([sys.executable, "-c", "from commprof.analyzers import native; print(native.status())"],
                              capture_output=True, text=True, env=env, cwd=ROOT)
        assert proc.stdout.startswith(said), proc.stdout + proc.stderr


inst_rows = st.lists(st.tuples(
    st.integers(0, 6),                                   # key
    st.integers(0, 3), st.integers(0, 3),                # op, op_max
    st.integers(0, 50), st.integers(0, 50),              # min / max start
    st.integers(-20, 20),                                # sum_end (integral, as the times are)
    st.integers(1, 3),                                   # n
    st.one_of(st.just(float("nan")), st.sampled_from([0.0, 1024.0, 4096.0, 1 << 20])),  # bytes
    st.integers(0, 7),                                   # rank
    st.integers(0, 3), st.integers(0, 3),                # source code min / max
    st.integers(-1, 2), st.integers(-1, 2),              # dtype code min / max
    st.one_of(st.just(float("nan")), st.sampled_from([2.0, 4.0, 8.0])),  # group size
), min_size=1, max_size=40)


@needs_cc
@settings(max_examples=300, deadline=None)
@given(inst_rows, st.randoms(use_true_random=False))
def test_instance_reduction_kernel_equals_numpy(rows, rnd):
    """Partial per-instance aggregates (raw calls and already reduced
    partials alike) with ties in every extreme, NaN sizes and unsorted
    keys: the kernel's reduction is the numpy one's, field by field."""
    from commprof.analyzers.collectives import _INST_FIELDS, _reduce_instances

    ranks = [rnd.randrange(8) for _ in range(6 * len(rows))]
    cols = {f: [] for f in _INST_FIELDS}
    for i, (key, op, op_max, s0, s1, se, n, nb, rank, smin, smax, dmin, dmax, gs) in enumerate(rows):
        r = ranks[6 * i:6 * i + 6]
        vals = dict(key=key, op=op, min_start=s0, max_start=s1, sum_end=float(se), n=n, bytes=nb, last_rank=rank,
                    op_max=op_max, min_bytes=nb, min_bytes_rank=r[0], max_bytes_rank=r[1], gsize=gs, src_min=smin,
                    src_max=smax, src_min_rank=r[2], src_max_rank=r[3], dt_min=dmin, dt_max=dmax,
                    dt_min_rank=r[4], dt_max_rank=r[5])
        for f in _INST_FIELDS:
            cols[f].append(vals[f])
    a = {f: np.array(v, np.float64 if f in ("sum_end", "bytes", "min_bytes", "gsize") else np.int64)
         for f, v in cols.items()}
    fast, slow = both(_reduce_instances, a)
    if not np.all(a["key"][1:] > a["key"][:-1]):        # something to combine: the kernel did it
        from commprof.analyzers.collectives import _reduce_instances_compiled

        order = np.argsort(a["key"], kind="stable")
        k = a["key"][order]
        assert _reduce_instances_compiled(a, order, np.flatnonzero(np.r_[True, k[1:] != k[:-1]])) is not None
    assert set(fast) == set(slow)
    for f in _INST_FIELDS:
        assert fast[f].dtype == slow[f].dtype, f
        assert np.array_equal(fast[f], slow[f], equal_nan=True), (f, fast[f], slow[f])


@needs_cc
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 2), st.sampled_from([0, 1, 5, (1 << 53) + 1, -7]),
                          st.sampled_from([0.0, -0.0, 1.5, 3e9, -2.25, np.nan, 1e-300, np.inf])), max_size=40),
       st.booleans(), st.booleans())
def test_run_sums_kernel_equals_the_sums_per_key(rows, by_key, ints):
    """Sums per key (a * width + b + add) of integer times less a reference
    or of sizes (NaN as 0, the others counted): the kernel's, where the
    keys' runs ascend, are :func:`_sums_per_key`'s bit for bit (zeros' signs,
    sums that round); elsewhere it gives way."""
    from commprof.analyzers.collectives import _run_sums, _sums_per_key

    if by_key:
        rows = sorted(rows, key=lambda r: (r[0], r[1]))
    a = np.array([r[0] for r in rows], np.int64)
    b = np.array([r[1] for r in rows], np.int64)
    t = np.array([r[2] for r in rows], np.int64)
    f = np.array([r[3] for r in rows], np.float64)
    width, add = 4, 5
    key = a * width + b + add
    got = _run_sums(a, b, width, add, ints=t, t_ref=3) if ints else _run_sums(a, b, width, add, floats=f)
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
    if not len(rows) or not np.all(np.diff(key[first]) > 0):
        assert got is None
        return
    assert got is not None
    w = (t - 3).astype(np.float64) if ints else np.where(np.isnan(f), 0.0, f)
    u, sums, counts = _sums_per_key(key, w)
    assert got[0].tolist() == u.tolist() and got[2].tolist() == counts.tolist()
    assert got[1].tobytes() == sums.tobytes()
    if not ints:
        assert got[3].tobytes() == _sums_per_key(key, (~np.isnan(f)).astype(np.float64))[1].tobytes()


run_rows = st.lists(st.tuples(
    st.integers(0, 3),                                   # op code
    st.integers(-5, 5),                                  # issue (a few values: ties)
    st.sampled_from([0, 1, 3, 1 << 53, (1 << 60) + 7]),  # completion (past 2**53: sums that round)
    st.one_of(st.just(float("nan")), st.sampled_from([0.0, 1024.0, 4096.0])),  # bytes
    st.integers(0, 7),                                   # rank
    st.one_of(st.just(float("nan")), st.sampled_from([2.0, 4.0])),  # group size
    st.integers(-1, 2), st.integers(-1, 2),              # source and dtype codes
), min_size=1, max_size=8)


@needs_cc
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=12, unique=True),
       st.integers(1, 9), st.data())
def test_run_reduction_kernel_equals_the_sorted_reduction(keys, n_runs, data):
    """Raw calls in runs of the same ascending keys (a chunk's ranks, each
    in every instance), with ties in every extreme, NaN sizes and
    completions whose sums round: the kernel's reduction without a sort is
    the sorted one's, field by field and type for type; it gives way to
    the sort past 8 runs, for one run and for runs whose keys differ."""
    from commprof.analyzers.collectives import _INST_FIELDS, _SEQ_BITS, _reduce_instances, _reduce_runs

    keys = sorted(keys)
    rows = [data.draw(run_rows.filter(lambda r: len(r) >= len(keys)))[:len(keys)] for _ in range(n_runs)]
    flat = [(g, q) + row for run in rows for (g, q), row in zip(keys, run)]
    gid, seq, op, ts, te, nb, rank, gs, src, dt = (np.array(c) for c in zip(*flat))
    gid, seq, op, ts, te, rank, src, dt = (np.asarray(v, np.int64) for v in (gid, seq, op, ts, te, rank, src, dt))
    nb, gs = nb.astype(np.float64), gs.astype(np.float64)
    t_ref = -3
    raw = {"key": (gid << _SEQ_BITS) | seq, "op": op, "min_start": ts, "max_start": ts,
           "sum_end": (te - t_ref).astype(np.float64), "n": np.ones(len(ts), np.int64), "bytes": nb,
           "last_rank": rank, "op_max": op, "min_bytes": nb, "min_bytes_rank": rank, "max_bytes_rank": rank,
           "gsize": gs, "src_min": src, "src_max": src, "src_min_rank": rank, "src_max_rank": rank,
           "dt_min": dt, "dt_max": dt, "dt_min_rank": rank, "dt_max_rank": rank}
    got = _reduce_runs(gid, seq, op, rank, ts, te, t_ref, nb, gs, src, dt)
    if not 2 <= n_runs <= 8:
        assert got is None
        return
    assert got is not None
    want = both(_reduce_instances, raw)[1]     # the numpy path
    for f in _INST_FIELDS:
        assert got[f].dtype == want[f].dtype, f
        assert np.array_equal(got[f], want[f], equal_nan=True), (f, got[f], want[f])
    if len(keys) > 1:   # the runs' keys not the same: the sort's
        g2 = gid.copy()
        g2[-1] = g2[0] + 3
        assert _reduce_runs(g2, seq, op, rank, ts, te, t_ref, nb, gs, src, dt) is None


events_rows = st.lists(st.tuples(st.integers(-3, 9), st.integers(-10**6, 10**6), st.integers(-10**6, 10**6)),
                       min_size=1, max_size=60)


@needs_cc
@settings(max_examples=300, deadline=None)
@given(events_rows, st.integers(0, 10**15))
def test_rank_time_lines_kernel_equals_numpy(rows, far):
    """The breakdown's per-rank time lines: ranks with gaps and negative
    ones, reversed and empty events, ranks far apart in time; keys, ranks
    and indices the same, element for element and type for type."""
    import pyarrow as pa

    from commprof.analyzers import breakdown
    from commprof.analyzers.events import Events

    rank = np.array([r for r, _, _ in rows], np.int32)
    t_start = np.array([a for _, a, _ in rows], np.int64) + rank.astype(np.int64) * far
    t_end = np.array([b for _, _, b in rows], np.int64) + rank.astype(np.int64) * far
    ev = Events.of(pa.table({"rank": rank, "step": np.zeros(len(rows), np.int64),
                             "category": pa.array(["compute"] * len(rows)).dictionary_encode(),
                             "t_start": t_start, "t_end": t_end}))
    fast, slow = both(breakdown._rank_keys, ev)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@needs_cc
def test_rank_time_lines_too_wide_for_a_key_fail_as_before():
    """Events of one rank 2**61 ns apart and many ranks: no key fits, the
    one-line error names the event, with the kernel as without it."""
    import pyarrow as pa

    from commprof.analyzers import breakdown
    from commprof.analyzers.events import Events
    from commprof.trace.schema import TraceFormatError

    n = 40
    t = np.arange(n, dtype=np.int64)
    t[-1] = 1 << 61
    ev = Events.of(pa.table({"rank": np.arange(n, dtype=np.int32) % 20, "step": np.zeros(n, np.int64),
                             "category": pa.array(["compute"] * n).dictionary_encode(), "t_start": t, "t_end": t}))
    msgs = []
    for switch in ("1", "0"):
        os.environ[native.ENV_SWITCH] = switch
        try:
            with pytest.raises(TraceFormatError) as e:
                breakdown._rank_keys(ev)
            msgs.append(str(e.value))
        finally:
            os.environ.pop(native.ENV_SWITCH)
    assert msgs[0] == msgs[1] and "far from the rank's other events" in msgs[0]


@needs_cc
@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_the_sweeps_row_masks_equal_numpys(seed):
    """The collectives of measured steps and the fine grain's events, by the
    kernel's one pass and by numpy: ranks that measured nothing, steps
    before and past a rank's span, unknown categories, sampled steps."""
    import pandas as pd

    from commprof.analyzers import buckets
    from commprof.analyzers.run import _FINE_CATS, _event_masks
    from commprof.trace.schema import CAT, CATEGORIES

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    lo = int(rng.integers(0, 50))
    rank = rng.integers(lo, lo + 6, n)
    step = rng.integers(-1, 30, n)
    cat = rng.integers(-1, len(CATEGORIES), n).astype(np.int8)

    class Ev:      # the three columns the masks read
        pass

    ev = Ev()
    ev.rank, ev.step, ev.cat = rank, step, cat
    measured = sorted(set(rng.choice(np.unique(rank), size=max(1, len(np.unique(rank)) - 1), replace=False)))
    lo_s = rng.integers(0, 10, len(measured))
    span = pd.DataFrame({"min": lo_s, "max": lo_s + rng.integers(0, 15, len(measured))},
                        index=pd.Index(np.array(measured, np.int64), name="rank"))
    sampled = pd.DataFrame({"rank": rng.choice(rank, 20), "step": rng.integers(0, 30, 20)}).drop_duplicates()
    got = _event_masks(ev, span, sampled)
    assert got is not None
    is_comm = cat == CAT["comm"]
    ranks = span.index.to_numpy(np.int64)
    pos = np.clip(np.searchsorted(ranks, rank), 0, len(ranks) - 1)
    comm = is_comm & (ranks[pos] == rank) & (step >= span["min"].to_numpy()[pos]) \
        & (step <= span["max"].to_numpy()[pos])
    fine = np.isin(cat, [CAT[c] for c in _FINE_CATS]) & buckets.in_steps(rank, step, sampled)
    assert (got[0] is None) == (not is_comm.any())
    if got[0] is not None:
        assert np.array_equal(got[0], comm)
    assert np.array_equal(got[1], fine)


@needs_cc
def test_a_ddp_traces_chunk_rows_are_the_same_with_either():
    """The collectives and fine-grain rows a chunk gives the folds, with
    the kernels and without: the same tables."""
    import pyarrow as pa

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from synth import rank_table

    from commprof.analyzers.run import sweep

    table = pa.concat_tables([rank_table(r, 8, 300, 4) for r in range(8)])
    fast, slow = both(sweep, table, 1, True)
    assert fast.comm.num_rows > 1000 and fast.comm.equals(slow.comm)
    assert fast.fine[0].equals(slow.fine[0]) and fast.fine[1].equals(slow.fine[1])
    assert fast.span.equals(slow.span)


@needs_cc
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), spread=st.integers(0, 40), values=st.integers(1, 10**6), seed=st.integers(0, 2**31))
def test_the_near_sort_is_numpys_stable_argsort(n, spread, values, seed):
    """Keys a few places from their sorted ones (ties kept in row order) by
    the kernel's insertion sort; keys far apart past NEAR_MOVES by numpy:
    either way the order numpy's stable argsort gives."""
    from commprof.analyzers.intervals import NEAR_MOVES, argsort_near

    rng = np.random.default_rng(seed)
    near = np.sort(rng.integers(0, values, n)) + rng.integers(0, spread + 1, n)
    far = rng.integers(-values, values, n)
    for keys in (near, far):
        fast, slow = both(argsort_near, keys)
        want = np.argsort(keys, kind="stable")
        assert fast.dtype == np.int64 and np.array_equal(fast, want) and np.array_equal(slow, want)
    if n > 100:                 # a reversed run moves each key past NEAR_MOVES places: numpy's sort
        fn = native.kernel("commprof_argsort_near")
        rev = np.ascontiguousarray(far[np.argsort(-far, kind="stable")], np.int64)
        assert fn(n, rev.ctypes.data, np.empty(n, np.int64).ctypes.data, NEAR_MOVES * n) == -1
        assert np.array_equal(argsort_near(rev), np.argsort(rev, kind="stable"))


def _grouped_events(seed, n_ranks, steps, extra, jitter):
    """Events of ``n_ranks`` ranks, each rank's rows together (ranks
    ascending, as a chunk of a merged trace holds them): steps end to end
    (some empty or reversed), members of every category (unknown ones too)
    with blocking flags, empty and reversed intervals, ties on window
    bounds; each rank's rows in time order moved up to ``jitter`` rows."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    cats = ["step", "data", "compute", "comm", "wait", "kernel", "metric"]
    rows = []
    for r in range(n_ranks):
        mine, t = [], int(rng.integers(0, 10**12))
        for s in range(steps):
            width = int(rng.choice([0, -5, 40, 1000, 3000])) if rng.random() < 0.1 else int(rng.integers(50, 3000))
            mine.append((r, s, "step", t, t + width, None))
            for _ in range(extra):
                c = cats[int(rng.integers(1, len(cats)))]
                a = t + int(rng.integers(-200, max(width, 1) + 200))
                b = a + int(rng.choice([0, -7, int(rng.integers(1, 2000))]))
                if rng.random() < 0.1:
                    a, b = t, t + width        # on the window's bounds
                mine.append((r, s, c, a, b, bool(rng.random() < 0.5) if c == "comm" else None))
            t += max(width, 0) + int(rng.integers(0, 50))
        mine.sort(key=lambda x: x[3])
        for i in range(len(mine) - 1):       # moved a little out of time order
            if rng.random() < jitter:
                j = min(len(mine) - 1, i + int(rng.integers(1, 4)))
                mine[i], mine[j] = mine[j], mine[i]
        rows += mine
    return pa.table({"rank": np.array([x[0] for x in rows], np.int32),
                     "step": np.array([x[1] for x in rows], np.int64),
                     "category": pa.array([x[2] for x in rows]).dictionary_encode(),
                     "t_start": np.array([x[3] for x in rows], np.int64),
                     "t_end": np.array([x[4] for x in rows], np.int64),
                     "blocking": pa.array([x[5] for x in rows], pa.bool_())})


@needs_cc
@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 5), st.integers(1, 6), st.integers(0, 12),
       st.sampled_from([0.0, 0.3, 1.0]))
def test_the_fused_step_sweep_equals_keys_then_pattern_table(seed, n_ranks, steps, extra, jitter):
    """A chunk whose ranks come in runs, swept run by run in one call
    (commprof_step_sweep), against the whole chunk's keys then the weighted
    pattern table, and the per-step frame against numpy's: the same windows
    and figures bit for bit."""
    from commprof.analyzers import breakdown
    from commprof.analyzers.events import Events
    from commprof.trace.schema import CAT

    ev = Events.of(_grouped_events(seed, n_ranks, steps, extra, jitter))
    n_steps = int((ev.cat == CAT["step"]).sum())
    fused = breakdown._step_sweep_compiled(ev, n_steps)
    assert fused is not None        # a few rows out of place: the insertion sorts take them
    ks, ke, _ranks, _ridx = breakdown._rank_keys(ev)
    label = breakdown._LABEL_OF_CAT[ev.cat]
    label[(ev.cat == CAT["comm"]) & ev.blocking] = breakdown._COMM_BLOCKING
    table, windows = pattern_table(ks, ke, label, 5, breakdown._WEIGHTS)
    assert np.array_equal(fused[1], windows)
    assert fused[0].shape == table.shape and fused[0].tobytes() == table.tobytes()
    fast, slow = both(breakdown.per_step, ev)
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)


@needs_cc
def test_the_fused_step_sweep_gives_way_where_it_cannot_sweep():
    """Ranks not in runs, times far from sorted, times too wide for the keys:
    the fused sweep declines and the general path answers (the error of a
    trace whose times are not on one clock included)."""
    from commprof.analyzers import breakdown
    from commprof.analyzers.events import Events
    from commprof.trace.schema import CAT, TraceFormatError

    table = _grouped_events(7, 3, 4, 6, 0.0)
    ev = Events.of(table)
    n_steps = int((ev.cat == CAT["step"]).sum())
    assert breakdown._step_sweep_compiled(ev, n_steps) is not None
    mixed = Events.of(table.take(np.r_[np.arange(1, table.num_rows), 0]))      # rank 0's first row last
    assert breakdown._step_sweep_compiled(mixed, n_steps) is None
    backwards = Events.of(table.take(np.arange(table.num_rows)[::-1].copy()).sort_by("rank"))
    assert breakdown._step_sweep_compiled(backwards, n_steps) is None
    fast, slow = both(breakdown.per_step, backwards)
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)
    n = 40
    t = np.arange(n, dtype=np.int64)
    t[19] = 1 << 61
    wide = Events.of(pa.table({"rank": np.arange(n, dtype=np.int32) // 20, "step": np.zeros(n, np.int64),
                               "category": pa.array(["step"] + ["compute"] * (n - 1)).dictionary_encode(),
                               "t_start": t, "t_end": t + 1}))
    assert breakdown._step_sweep_compiled(wide, 1) is None
    with pytest.raises(TraceFormatError, match="far from the rank's other events"):
        breakdown.per_step(wide)


def _matrix(seed: int, rows: int, units: int, levels: int, odd: str) -> np.ndarray:
    """rows x units of values drawn from ``levels`` levels (few levels: many
    ties), with one NaN or -0.0 among them where ``odd`` says."""
    rng = np.random.default_rng(seed)
    m = rng.integers(0, levels, size=(rows, units)).astype(np.float64) * 1.5 - levels / 2
    if odd != "none" and m.size:
        m.flat[rng.integers(0, m.size)] = np.nan if odd == "nan" else -0.0
    return m


@needs_cc
@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 60), units=st.integers(2, 70), levels=st.integers(1, 50),
       odd=st.sampled_from(["none", "none", "nan", "-0"]))
def test_the_others_median_kernel_equals_numpys_partition(seed, rows, units, levels, odd):
    """Leave-one-out medians of each row (stragglers.others_median): odd
    and even numbers of others, ties, the unit's own value on either side;
    a NaN or -0.0 sends the matrix to numpy, the same."""
    from commprof.analyzers.stragglers import others_median

    m = _matrix(seed, rows, units, levels, odd)
    fast, slow = both(others_median, m)
    assert np.array_equal(fast, slow, equal_nan=True)
    assert np.array_equal(np.signbit(fast), np.signbit(slow))


@needs_cc
@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 300), units=st.integers(1, 20), levels=st.integers(1, 400),
       odd=st.sampled_from(["none", "none", "nan", "-0"]), data=st.data())
def test_the_column_order_statistics_kernel_equals_numpys_partition(seed, rows, units, levels, odd, data):
    """Order statistics of each column (stragglers.sign_tests' medians and
    intervals): any ascending positions, columns in blocks of eight and a
    remainder, long columns past the insertion sort."""
    from commprof.analyzers.stragglers import column_kth

    m = _matrix(seed, rows, units, levels, odd)
    kth = sorted(data.draw(st.sets(st.integers(0, rows - 1), min_size=1, max_size=5)))
    fast, slow = both(column_kth, m, kth)
    assert fast.shape == (len(kth), units)
    assert np.array_equal(fast, slow, equal_nan=True)
    assert np.array_equal(np.signbit(fast), np.signbit(slow))


@needs_cc
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(4096, 9000), units=st.integers(1, 10),
       levels=st.sampled_from([3, 40, 2000, 10**6]), trend=st.booleans(), data=st.data())
def test_a_narrow_band_of_order_statistics_equals_numpys_partition(seed, rows, units, levels, trend, data):
    """Long columns, positions in a band narrow against them (a median and
    its interval, as sign_tests reads): selected among the values between
    two sampled pivots, or over the whole column where the band misses
    them (few levels: long runs of ties at the pivots; a trend down the
    column: the sample's order is not the values')."""
    from commprof.analyzers.stragglers import column_kth

    m = _matrix(seed, rows, units, levels, "none")
    if trend:
        m += np.arange(rows)[:, None] * (levels / rows)
    c = data.draw(st.integers(rows // 16, rows - rows // 16 - 1))
    w = data.draw(st.integers(0, rows // 32))
    kth = sorted(data.draw(st.sets(st.integers(max(c - w, 0), min(c + w, rows - 1)), min_size=1, max_size=5)))
    fast, slow = both(column_kth, m, kth)
    assert np.array_equal(fast, slow)
