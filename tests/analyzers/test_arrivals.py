"""A run on several hosts is folded in one pass: the collective instances
as the chunks come, their arrivals per (instance, clock domain) on each
host's own clock, shifted once the offsets are known. Checked against
folding every call on clocks already shifted (the per-call path a single
host uses), on collectives drawn here: hosts whose ranks are contiguous or
interleaved, a host split across chunks, world / per-host / pair groups,
instances some ranks miss, a rank of no known host, ties of the latest
issue across hosts, and the chunks in any order."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.analyzers.collectives import CollectiveStats

MS = 1_000_000


def draw(seed, n_ranks=9, n_hosts=3, interleaved=False, instances=60, world_only=False, miss=0.05):
    """(comm rows as an Arrow table on each host's own clock, rank -> host
    code, rank -> offset ns that aligns it). ``world_only`` and ``miss=0``:
    every rank in every instance (the partials then merge element by
    element)."""
    rng = np.random.default_rng(seed)
    host = {r: (r % n_hosts if interleaved else r * n_hosts // n_ranks) for r in range(n_ranks)}
    host_off = {h: int(rng.integers(-10**12, 10**12)) for h in range(n_hosts)}
    host_off[0] = 0
    offsets = {r: host_off[h] for r, h in host.items()}
    groups = {"world": list(range(n_ranks)), "pair": [0, n_ranks - 1]}
    for h in range(n_hosts):
        groups[f"host{h}"] = [r for r in range(n_ranks) if host[r] == h]
    if world_only:
        groups = {"world": groups["world"]}
    rows = []
    t = 5_000 * MS
    for k in range(instances):
        for g, members in groups.items():
            if len(members) < 2:
                continue
            base = t + int(rng.integers(0, 3 * MS))
            tie = rng.random() < 0.2         # two ranks are the last to issue, at the same aligned instant
            for i, r in enumerate(members):
                if rng.random() < miss and k < instances - 1:
                    continue                  # this rank missed the instance
                issue = base + (4 * MS if tie and i < 2 else int(rng.integers(0, 4 * MS)))
                end = issue + int(rng.integers(MS, 3 * MS))
                # on the rank's own clock: aligned = own + offset
                rows.append((r, "all_reduce", g, len(members), k, issue - offsets[r], end - offsets[r],
                             float(4096 * (1 + (k % 3)))))
        t += 10 * MS
    f = pd.DataFrame(rows, columns=["rank", "name", "group", "group_size", "seq", "t_start", "t_end", "bytes"])
    f["source"] = "ddp_reducer"
    f["dtype"] = "torch.float32"
    f = f.sample(frac=1.0, random_state=seed).sort_values("rank", kind="stable")   # rows rank by rank
    return f, host, offsets


def table(f):
    t = pa.Table.from_pandas(f, preserve_index=False)
    return t.set_column(t.schema.get_field_index("name"), "name", t.column("name").dictionary_encode())


def chunks_of(f, sizes):
    """Chunks of whole ranks, in the order given by ``sizes`` (ranks per chunk)."""
    ranks = sorted(f["rank"].unique())
    out, i = [], 0
    for n in sizes:
        out.append(table(f[f["rank"].isin(ranks[i:i + n])]))
        i += n
    return out


def aligned(chunks, offsets):
    """The chunks folded on clocks shifted as they come (offsets known)."""
    st = CollectiveStats()
    for c in chunks:
        st.add_instances_of(c, offsets)
    return st


def deferred(chunks, host, offsets):
    st = CollectiveStats()
    st.defer_alignment(host)
    for c in chunks:
        st.add_instances_of(c)
    st.align(offsets)
    return st


def by_instance(st: CollectiveStats) -> pd.DataFrame:
    """Instances in (group, seq) order (their row order follows the order
    the groups were first seen in)."""
    return st.instances().sort_values(["group", "seq"]).reset_index(drop=True)


def same(a: CollectiveStats, b: CollectiveStats):
    pd.testing.assert_frame_equal(by_instance(a), by_instance(b))
    pd.testing.assert_frame_equal(a.skew_table(), b.skew_table())
    pd.testing.assert_frame_equal(a.rank_lateness(), b.rank_lateness())
    pd.testing.assert_frame_equal(a.mismatches(), b.mismatches())
    assert a.last_by_block(7) == b.last_by_block(7)


@pytest.mark.parametrize("seed,interleaved,sizes", [
    (0, False, [3, 3, 3]),          # one host per chunk
    (1, False, [2, 4, 3]),          # hosts split across chunks
    (2, True, [9]),                 # every host's ranks interleaved, one chunk
    (3, True, [1] * 9),             # one rank per chunk
    (4, False, [5, 4]),
])
def test_one_pass_equals_folding_on_aligned_clocks(seed, interleaved, sizes):
    f, host, offsets = draw(seed, interleaved=interleaved)
    truth = aligned(chunks_of(f, sizes), offsets)
    assert (truth.instances()["skew_ms"] >= 0).all() and len(truth.instances()) > 100
    same(deferred(chunks_of(f, sizes), host, offsets), truth)


@pytest.mark.parametrize("world_only,miss", [(False, 0.05), (True, 0.0)])
def test_ties_of_the_latest_issue_name_the_same_rank_in_any_row_order(world_only, miss):
    f, host, offsets = draw(5, interleaved=True, world_only=world_only, miss=miss)
    aligned_issue = f["t_start"] + f["rank"].map(offsets)
    latest = aligned_issue.groupby([f["group"], f["seq"]]).transform("max")
    ties = (aligned_issue == latest).groupby([f["group"], f["seq"]]).sum()
    assert (ties > 1).sum() >= 8            # instances whose latest issue two ranks share
    reversed_ranks = [table(f[f["rank"] == r]) for r in sorted(f["rank"].unique(), reverse=True)]
    same(deferred(reversed_ranks, host, offsets), aligned(reversed_ranks, offsets))
    ordered = aligned([table(f)], offsets)
    backwards = aligned([table(f.iloc[::-1])], offsets)
    pd.testing.assert_frame_equal(by_instance(ordered), by_instance(backwards))


def test_a_rank_of_no_known_host_keeps_its_own_clock():
    f, host, offsets = draw(6)
    unknown = max(host)
    del host[unknown]
    offsets[unknown] = 0            # as the clock alignment leaves a rank it has no host for
    same(deferred(chunks_of(f, [3, 3, 3]), host, offsets), aligned(chunks_of(f, [3, 3, 3]), offsets))


def test_the_shift_is_the_offset_of_each_host():
    """Nothing shifted gives other arrivals: the offsets are applied."""
    f, host, offsets = draw(7)
    wrong = deferred(chunks_of(f, [3, 3, 3]), host, {r: 0 for r in offsets})
    assert not by_instance(wrong)["skew_ms"].equals(by_instance(aligned([table(f)], offsets))["skew_ms"])


def test_a_hosts_ranks_in_chunks_of_their_own_keep_one_row_per_instance():
    """One rank per chunk (a large run: a rank's events fill a chunk), the
    same instances on every rank: after each rank the host's arrivals hold
    one row per instance, combined, not a second copy pending (100 M
    events: ~170 MiB of the peak), and they are the element-wise fold."""
    from commprof.analyzers.collectives import Arrivals

    n = 300_000                      # instances per rank: more than the pending rows combined at once
    key = np.arange(n, dtype=np.int64) * 3
    arr = Arrivals({r: 0 for r in range(4)})
    rng = np.random.default_rng(0)
    starts = []
    for r in range(4):
        ts = 10**12 + np.arange(n, dtype=np.int64) * 1000 + rng.integers(0, 500, n)
        starts.append(ts)
        arr.add(key, np.full(n, r, np.int64), ts, ts + 100)
        assert arr.rows == n and not arr.pending.get(0), (r, arr.rows)
    got = arr.acc[0]
    assert np.array_equal(got["key"], key)
    assert np.array_equal(got["min_start"], np.minimum.reduce(starts))
    assert np.array_equal(got["max_start"], np.maximum.reduce(starts))
    assert np.array_equal(got["n"], np.full(n, 4))


@pytest.mark.parametrize("sizes,reduced_again", [([3, 3, 3], 0), ([2, 4, 3], 2)])
def test_a_chunk_of_one_hosts_ranks_takes_its_arrivals_from_the_instances(monkeypatch, sizes, reduced_again):
    """A chunk holding one host's ranks (the usual case: chunks of whole
    ranks, a host's ranks numbered together) is reduced once: its arrivals
    are the instances' partial. A chunk across two hosts reduces its
    arrivals per host. Either way the fold on aligned clocks."""
    from commprof.analyzers import collectives

    calls = []
    real = collectives._reduce_arrivals
    monkeypatch.setattr(collectives, "_reduce_arrivals", lambda *a, **k: calls.append(1) or real(*a, **k))
    f, host, offsets = draw(8)
    st = CollectiveStats()
    st.defer_alignment(host)
    for c in chunks_of(f, sizes):
        st.add_instances_of(c)
    assert len(calls) == reduced_again
    st.align(offsets)
    same(st, aligned(chunks_of(f, sizes), offsets))


def test_rank_lateness_is_computed_once_and_again_once_more_calls_come():
    """The per-host table and the straggler tests both read the lateness:
    the second read is the first one's figures (a copy: changing it changes
    nothing held), and calls folded after it are in the next."""
    f, _host, _offsets = draw(5, miss=0.0)
    chunks = chunks_of(f, [4, 5])
    st = CollectiveStats()
    st.add(chunks[0])
    computed = []
    real = st._rank_lateness
    st._rank_lateness = lambda inst: computed.append(1) or real(inst)
    first = st.rank_lateness()
    again = st.rank_lateness()
    assert len(computed) == 1
    pd.testing.assert_frame_equal(first, again)
    again["lateness_ms"] = -1.0
    pd.testing.assert_frame_equal(st.rank_lateness(), first)
    st.add(chunks[1])
    both = CollectiveStats()
    for c in chunks:
        both.add(c)
    pd.testing.assert_frame_equal(st.rank_lateness(), both.rank_lateness())
    assert len(computed) == 2
    assert len(first) and not st.rank_lateness().equals(first)
    st.drop_instances()
    assert st._lateness is None and st.rank_lateness().empty


def test_chunks_whose_dictionaries_list_names_in_other_orders_fold_the_same():
    """A chunk's dictionary codes are the fold's ids only where it lists the
    names in the order first seen; a chunk listing them otherwise is looked
    up: the same instances, skew and lateness either way."""
    f, _host, _offsets = draw(6, miss=0.0)
    chunks = chunks_of(f, [4, 5])

    def reordered(t):
        for name in ("name", "group", "source", "dtype"):
            if name not in t.column_names:
                continue
            col = t.column(name).combine_chunks()
            if not pa.types.is_dictionary(col.type):
                col = col.dictionary_encode()
            values = col.dictionary.to_pylist()[::-1] + ["never seen"]
            remap = pa.array([values.index(v) for v in col.dictionary.to_pylist()], pa.int32())
            idx = pa.compute.take(remap, col.indices)
            t = t.set_column(t.schema.get_field_index(name), name,
                             pa.DictionaryArray.from_arrays(idx, pa.array(values)))
        return t

    plain, other = CollectiveStats(), CollectiveStats()
    for c in chunks:
        plain.add(c)
    other.add(chunks[0])
    other.add(reordered(chunks[1]))
    same(plain, other)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, -0.0, 1.5, 3e9, -2.25, np.nan, 1e-300])),
                max_size=40), st.booleans())
def test_algebra_sums_per_key_are_bincounts_bit_for_bit(rows, by_key):
    """Each key's running sum where its rows are one run (runs in key order)
    and bincount's sum otherwise: the same keys, sums (zeros' signs and NaN
    included) and counts."""
    from commprof.analyzers.codes import int_codes
    from commprof.analyzers.collectives import _sums_per_key

    if by_key:
        rows = sorted(rows, key=lambda r: r[0])
    key = np.array([k for k, _ in rows], np.int64)
    w = np.array([v for _, v in rows], np.float64)
    u, sums, counts = _sums_per_key(key, w)
    want_u, inv = int_codes(key) if len(key) else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert u.tolist() == want_u.tolist()
    assert sums.tobytes() == np.bincount(inv, weights=w, minlength=len(want_u)).astype(np.float64).tobytes()
    assert counts.tolist() == np.bincount(inv, minlength=len(want_u)).tolist()
