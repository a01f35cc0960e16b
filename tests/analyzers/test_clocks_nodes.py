"""Clock alignment from collectives, per-node views (synthetic, exact inputs)."""
import numpy as np
import pandas as pd

from commprof.analyzers import clocks, nodes

S = 1_000_000_000


def metas(wall_error_ns=0, hosts=("a", "b"), offset_ns=1000 * S):
    out = []
    for r, h in enumerate(hosts):
        mono0 = 5 * S + (offset_ns if h == "b" else 0)
        wall0 = 1_700_000_000 * S + (wall_error_ns if h == "b" else 0)
        out.append({"rank": r, "host": h, "clock": {"boot_id": "same", "mono_ns_at_start": mono0,
                                                   "wall_ns_at_start": wall0}})
    return out


def comm_rows(offset_ns=1000 * S, late_ns=30_000_000, n=40, seed=0):
    """Blocking all_reduces: rank 1 (host b, clock ahead by offset) issues
    late; both complete within 50 µs of each other, 2 ms after the last issue."""
    rng = np.random.default_rng(seed)
    rows = []
    t = 10 * S
    for k in range(n):
        issue0 = t
        issue1 = t + late_ns
        end = issue1 + 2_000_000
        e0, e1 = end + rng.integers(0, 50_000), end + rng.integers(0, 50_000)
        rows.append((0, "g", k, issue0, e0, True))
        rows.append((1, "g", k, issue1 + offset_ns, e1 + offset_ns, True))
        t += 100_000_000
    return pd.DataFrame(rows, columns=["rank", "group", "seq", "t_start", "t_end", "blocking"])


def test_offset_found_and_wall_clock_error_corrected():
    offsets, table = clocks.align(comm_rows(), metas(wall_error_ns=7_000_000))
    t = table.set_index("host")
    # truth: add -1000 s to host b's times
    assert abs(offsets[1] + 1000 * S) < 100_000            # within 0.1 ms
    assert offsets[0] == 0
    assert abs(t.loc["b", "correction_ms"] + 7.0) < 0.1
    assert t.loc["b", "feasible_lo_ms"] <= -1_000_000.0 <= t.loc["b", "feasible_hi_ms"]
    assert t.loc["b", "violations"] == 0 and t.loc["b", "instances"] == 40
    assert t.loc["b", "uncertainty_ms"] < 0.05
    assert t.loc["a", "method"] == "reference"


def test_past_the_call_budget_whole_instances_are_sampled_and_said(monkeypatch):
    """A large trace aligns on one instance in k (all ranks of each): the
    offset stays within its stated uncertainty of the full alignment's, the
    causality interval still holds the truth, and the method says so."""
    comm = comm_rows(n=2000, seed=3)
    full_off, full = clocks.align(comm, metas())
    monkeypatch.setattr(clocks, "MAX_ALIGN_CALLS", 1000)
    off, table = clocks.align(comm, metas())
    b = table.set_index("host").loc["b"]
    assert b["instances"] == 500 and "one instance in 4 (of 4,000 calls)" in b["method"]
    assert abs(off[1] - full_off[1]) / 1e6 <= 3 * b["uncertainty_ms"]
    assert b["feasible_lo_ms"] <= -1_000_000.0 <= b["feasible_hi_ms"] and b["violations"] == 0
    assert "one instance in" not in full.set_index("host").loc["b", "method"]


def _estimate_by_join(pairs, ref, d):
    """One domain's offset against ``ref`` by a pandas join on (group, seq):
    how the alignment estimated each domain before, the reference here."""
    a = pairs[pairs["dom"] == ref].set_index(["group", "seq"])
    b = pairs[pairs["dom"] == d].set_index(["group", "seq"])
    j = a.merge(b, left_index=True, right_index=True, how="inner", suffixes=("_a", "_b"))
    if j.empty:
        return None
    lo = float((j["max_start_a"] - j["min_end_b"]).max())
    hi = float((j["min_end_a"] - j["max_start_b"]).min())
    sync = j[j["blocking_a"] & j["blocking_b"]]
    base = sync if len(sync) >= 3 else j
    diff = (base["med_end_a"] - base["med_end_b"]).to_numpy(np.float64)
    return clocks._offset(diff, lo, hi, len(j), "blocking" if base is sync else "all")


def test_every_domain_estimated_at_once_as_by_a_join_per_domain():
    """clocks._estimates (one sorted lookup for all domains) against a join
    per domain (_estimate_by_join) on instances with gaps: some
    missing on the reference or on a domain, one domain sharing none with
    it, blocking and not (one domain with no blocking pair)."""
    rng = np.random.default_rng(11)
    rows = []
    for g in range(3):
        for seq in range(5, 305):
            for d in range(7):
                if rng.random() < 0.15 or d == 6:      # gaps; domain 6 shares nothing
                    continue
                s0 = int(rng.integers(0, 10**9)) + d * 7 * S
                rows.append((g, seq, d, s0, s0 + int(rng.integers(0, 10**6)), s0 + int(rng.integers(10**6, 10**7)),
                             s0 + int(rng.integers(10**7, 10**8)), float(rng.integers(10**6, 10**8)),
                             bool(d != 3 and rng.random() < 0.7)))
    rows.append((7, 1, 6, 0, 1, 2, 3, 2.5, True))   # domain 6: an instance the reference does not have
    pairs = pd.DataFrame(rows, columns=["group", "seq", "dom", "min_start", "max_start", "min_end", "max_end",
                                        "med_end", "blocking"])
    got = clocks._estimates(pairs, 0)
    assert set(got) == {1, 2, 3, 4, 5}
    for d in range(1, 7):
        want = _estimate_by_join(pairs, 0, d)
        assert got.get(d) == want, (d, got.get(d), want)
    assert "all completions" in got[3][4] and "blocking completions" in got[1][4]
    assert clocks._estimates(pairs.iloc[:0], 0) == {}
    # collectives without sequence numbers: no instance to pair, the wall clock is kept
    no_seq = comm_rows().assign(seq=np.nan)
    offsets, table = clocks.align(no_seq, metas(wall_error_ns=7_000_000))
    assert offsets[1] == -1000 * S + 7_000_000 and table.set_index("host").loc["b", "method"].startswith("wall")


def test_causality_violations_are_counted_for_a_bad_offset():
    comm = comm_rows()
    dom = {0: ("a", "same"), 1: ("b", "same")}
    pairs = clocks._instances(comm, dom, {("a", "same"): 0, ("b", "same"): 1})
    # host b's times put 40 ms too late: rank 1 seems to issue after rank 0
    # completed, in every instance (counted for host a, whose ranks complete too early)
    bad = np.array([0, -1000 * S + 40_000_000], np.int64)
    assert clocks._violations(pairs, bad, 2)[0] == 40


def test_without_shared_collectives_the_wall_clock_is_kept():
    offsets, table = clocks.align(None, metas(wall_error_ns=7_000_000))
    assert offsets[1] == -1000 * S + 7_000_000
    assert table.set_index("host").loc["b", "method"].startswith("wall clock")


def test_one_host_needs_no_alignment():
    offsets, table = clocks.align(comm_rows(offset_ns=0), metas(hosts=("a", "a")))
    assert offsets == {} and table.empty


def test_scope_split_and_slow_host():
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    comm = pd.DataFrame({
        "rank": [0, 1, 2, 3, 0, 1],
        "name": ["all_reduce"] * 6,
        "group": ["world"] * 4 + ["node_a"] * 2,
        "group_size": [4] * 4 + [2] * 2,
        "t_start": [0] * 6, "t_end": [1_000_000] * 6, "bytes": [1e6] * 6,
    })
    sc = nodes.scope_table(comm, hosts).set_index("scope")
    assert sc.loc["inter-node", "calls"] == 4 and sc.loc["intra-node", "calls"] == 2
    # busbw = S/t * 2(n-1)/n: 1e6 B / 1 ms = 1 GB/s; x 1.5 (n = 4), x 1 (n = 2)
    assert abs(sc.loc["inter-node", "busbw_GBps"] - 1.5) < 1e-9
    assert abs(sc.loc["intra-node", "busbw_GBps"] - 1.0) < 1e-9
    def steps_of(n, comm_b=10e6):
        rng = np.random.default_rng(1)
        return pd.DataFrame({"rank": [0, 1, 2, 3] * n, "step": np.repeat(np.arange(1, n + 1), 4),
                             "step_time": [100e6] * (4 * n),
                             "comm": np.array([40e6, 40e6, comm_b, comm_b] * n) + rng.normal(0, 1e5, 4 * n),
                             "data": [0.0] * (4 * n), "compute": [50e6] * (4 * n)})

    late = pd.DataFrame({"rank": [0, 1, 2, 3], "lateness_ms": [0, 0, 30, 30], "last_pct": [0, 0, 50, 50]})
    t = nodes.per_host(steps_of(10), late, hosts, comm)
    assert list(t["host"]) == ["a", "b"]
    assert np.allclose(t["work_ms"], [60.0, 90.0], atol=0.2)
    assert list(t["accused"]) == [False, True] and list(t["late_steps"]) == [0, 10]
    slow = nodes.slow_host(t)
    assert slow["host"] == "b" and slow["ranks"] == "2-3" and "+30.0 ms" in slow["evidence"]
    assert "10 of 10 steps" in slow["evidence"]
    # three steps cannot tell two hosts apart (a fair coin gives 3 of 3 in 1 of 8 runs)
    t3 = nodes.per_host(steps_of(3), late, hosts, comm)
    assert int(t3["needed"].iloc[0]) > 3 and nodes.slow_host(t3) is None
    # equal hosts: one of two is always above the other, neither is accused
    assert nodes.slow_host(nodes.per_host(steps_of(40, comm_b=40e6), late, hosts, comm)) is None


def test_a_multi_host_run_past_the_call_budget_keeps_a_sample_and_exact_counts(tmp_path, monkeypatch):
    """A run on several hosts keeps one collective instance in k (k a power
    of two) for clock alignment and the per-scope / per-link / per-node
    bandwidth medians, and folds every call on the aligned clocks: the
    per-instance tables and every count equal the unsampled analysis', the
    offsets stay within their uncertainty, and the report says what was
    sampled."""
    import os
    import sys

    import commprof
    from commprof.assemble import merge
    from helpers import ROOT

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from synth import write

    shards, _n = write(str(tmp_path), 8, 200)   # 8 ranks on 2 hosts, 4 buckets: 6,368 calls measured
    path = str(tmp_path / "trace.parquet")
    merge(shards, path, {"run_id": "sample"})
    full = commprof.load(path).report()
    monkeypatch.setattr(clocks, "MAX_ALIGN_CALLS", 1000)
    t = commprof.load(path)
    sampled = t.report()
    assert t.analysis().comm_sample == (8, 8 * 199 * 4)
    for name in ("breakdown", "collectives"):                 # on no clock but each rank's own
        pd.testing.assert_frame_equal(sampled.tables[name].frame, full.tables[name].frame)
    for name, cols in (("scope", ["op", "scope", "calls", "bytes_per_call"]), ("links", ["group", "op", "calls"])):
        pd.testing.assert_frame_equal(sampled.tables[name].frame[cols], full.tables[name].frame[cols])
    b_full = full.tables["clocks"].frame.set_index("host").loc["node1"]
    b = sampled.tables["clocks"].frame.set_index("host").loc["node1"]
    assert "one instance in 8 (of 6,368 calls)" in b["method"]
    shift = abs(b["offset_ms"] - b_full["offset_ms"])
    assert shift <= 3 * max(b["uncertainty_ms"], 1e-6)
    # cross-host figures move with the offset, no more
    sk, sk_full = sampled.tables["skew"].frame, full.tables["skew"].frame
    assert (sk["instances"] == sk_full["instances"]).all()
    assert np.allclose(sk["skew_ms_mean"], sk_full["skew_ms_mean"], atol=shift + 1e-6)
    assert any("one collective instance in 8 (6,368 calls" in n for n in sampled.notes)
    assert not any("one collective instance in" in n for n in full.notes)


def test_past_the_arrival_budget_a_second_pass_gives_the_same_report(tmp_path, monkeypatch):
    """A run on several hosts is read once, its instances' arrivals kept per
    (instance, host); past ``MAX_ARRIVAL_ROWS`` they are dropped and the
    trace's collectives read a second time on aligned clocks: the same
    report either way, and ``--timings`` says which."""
    import os
    import sys

    import commprof
    from commprof.analyzers import run
    from commprof.assemble import merge
    from helpers import ROOT

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from synth import write

    shards, _n = write(str(tmp_path), 12, 60)   # 12 ranks on 3 hosts
    path = str(tmp_path / "trace.parquet")
    merge(shards, path, {"run_id": "passes"})
    one = commprof.load(path)
    one_report = one.report()
    assert any(k.endswith("collectives and fine grain folded") for k in one.analysis().timings)
    assert any(k.endswith("scope and link tables, steps' straggler tests, fine-grain tables "
                          "(built beside, or here if not yet started)") for k in one.analysis().timings)
    monkeypatch.setattr(run, "MAX_ARRIVAL_ROWS", 100)
    two = commprof.load(path)
    two_report = two.report()
    assert any(k.endswith("(a second pass)") for k in two.analysis().timings)
    assert set(one_report.tables) == set(two_report.tables)
    for name in one_report.tables:
        pd.testing.assert_frame_equal(one_report.tables[name].frame, two_report.tables[name].frame, check_exact=True)
    assert len(one_report.tables["skew"].frame) and len(one_report.tables["nodes"].frame)


def _sample_by_pandas(tables, limit):
    """The clock alignment's call sample as it was built before: each table
    made a DataFrame at once, re-filtered as the stride doubles, the frames
    concatenated by pandas (the reference)."""
    from commprof.analyzers.events import device_times
    from commprof.analyzers.run import _ALIGN_COLUMNS

    def keep(f, stride):
        return f if stride == 1 else f[np.nan_to_num(f["seq"].to_numpy(np.float64)) % stride == 0]

    stride, frames = 1, []
    for t in tables:
        f = t.select([c for c in _ALIGN_COLUMNS if c in t.column_names]).to_pandas()
        dev = device_times(t)
        if dev is not None:
            f["t_end"] = np.where(dev[2], dev[1], f["t_end"].to_numpy())
        frames.append(keep(f, stride))
        while sum(map(len, frames)) > limit:
            stride *= 2
            frames = [keep(x, stride) for x in frames]
    return pd.concat(frames, ignore_index=True), stride


def _comm_table(n, seed, names):
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    seq = pa.array(rng.integers(0, 5000, n), mask=rng.random(n) < 0.05)     # some calls without one
    dev = rng.random(n) < 0.5
    t_end = rng.integers(10 * S, 20 * S, n)
    return pa.table({
        "rank": pa.array(rng.integers(0, 8, n), pa.int32()),
        "name": pa.array(rng.choice(names, n)).dictionary_encode(),
        "group": pa.array(rng.choice(["0", "1"], n)).dictionary_encode(),
        "group_size": pa.array(np.full(n, 8), pa.int32()),
        "seq": seq, "t_start": pa.array(t_end - 1000), "t_end": pa.array(t_end),
        "blocking": pa.array(rng.random(n) < 0.5),
        "bytes": pa.array(rng.integers(1, 1 << 20, n)),
        "dev_start": pa.array(np.where(dev, t_end - 500, 0), mask=~dev),
        "dev_end": pa.array(np.where(dev, t_end + 7, 0), mask=~dev),
    })


def test_the_call_sample_is_the_frame_pandas_made_of_each_chunk():
    """Kept as Arrow and converted once, the sample holds the rows, values,
    dtypes and categories of the per-chunk DataFrames it replaced: with a
    stride that doubles twice, nulls in seq, device times on some calls,
    and chunks whose dictionaries differ (then the categories are dropped,
    as pandas drops them)."""
    from commprof.analyzers.run import CallSample

    for names in (["all_reduce", "broadcast"], None):
        tables = [_comm_table(3000, k, names or (["all_reduce"] if k % 2 else ["broadcast", "all_reduce"]))
                  for k in range(6)]
        want, stride = _sample_by_pandas(tables, 5000)
        sample = CallSample(5000)
        for t in tables:
            sample.add(t)
        got = sample.frame()
        assert sample.stride == stride >= 4 and got.attrs == {"stride": stride, "calls": 18_000}
        pd.testing.assert_frame_equal(got, want, check_categorical=True)
        assert (str(got["name"].dtype) == "category") is (names is not None)
        assert sample.frame() is got


def test_instances_sorted_by_key_then_completion_as_lexsort_sorts_them():
    """The alignment's one packed argsort gives lexsort's order, ties and
    all; keys or times too wide to pack go to lexsort itself."""
    rng = np.random.default_rng(11)
    for key_hi, t_span in ((5000, 10**12), (50, 3), (1 << 40, 10**12), (10, 1 << 60)):
        key = rng.integers(0, key_hi, 30_000)
        t = rng.integers(0, t_span, 30_000) + 7 * S
        np.testing.assert_array_equal(clocks._by_key_then(key, t), np.lexsort((t, key)))
    empty = np.zeros(0, np.int64)
    assert len(clocks._by_key_then(empty, empty)) == 0


def test_exact_call_counts_of_one_op_and_group_as_of_several():
    """CallCounts: a chunk of one (op, group) (the usual one) counted by
    its own path gives what the general one does: calls, bytes summed in
    row order (sizes that are not whole, unknown ones), known sizes."""
    import pyarrow as pa

    from commprof.analyzers.run import CallCounts

    rng = np.random.default_rng(3)
    n = 5000
    nbytes = rng.random(n) * 1e7
    nbytes[::7] = np.nan
    one = pa.table({"name": pa.array(["all_reduce"] * n).dictionary_encode(),
                    "group": pa.array(["world"] * n).dictionary_encode(), "bytes": nbytes})
    other = pa.table({"name": pa.array(["broadcast"]).dictionary_encode(),
                      "group": pa.array(["world"]).dictionary_encode(), "bytes": [8.0]})
    alone, mixed = CallCounts(), CallCounts()
    alone.add(one)
    mixed.add(pa.concat_tables([one, other]).unify_dictionaries())
    a = alone.frame()
    m = mixed.frame().set_index("op").loc[["all_reduce"]].reset_index()
    pd.testing.assert_frame_equal(a, m)
    assert a.loc[0, "calls"] == n and a.loc[0, "bytes_n"] == n - len(nbytes[::7])
    assert a.loc[0, "bytes_sum"] == np.bincount(np.zeros(n, int), weights=np.nan_to_num(nbytes))[0]
