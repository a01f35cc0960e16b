"""Findings tested against chance (analyzers/evidence.py).

Two kinds of test. ``test_algebra_*`` check the statistics' arithmetic
(against brute force) and their coverage on draws from known
distributions. The others run every accusing rule (straggler in work, data
and step time, late arrival, slow node, critical-path gate) on an
independent simulator of synchronous data-parallel steps (tests/simsync.py,
which knows nothing of the analyzers) and check the false-accusation rate
on pure jitter and that a planted straggler is found above the detection
limit and not below the effect floor. The rates through the full
``commprof report`` are measured in benchmarks/findings_power.py.
"""
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.analyzers import evidence as ev
from commprof.analyzers import nodes, stragglers
from simsync import Sim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def accusations(sim: Sim):
    """Every rank or host that the accusing rules name on this run."""
    steps, late, blocks, hosts, last_ready = sim.measured()
    out = set()
    st = stragglers.stragglers(steps, late, blocks)
    for _, r in stragglers.accused(st).iterrows():
        out.add((r["metric"], int(r["rank"])))
    if len(set(hosts.values())) > 1:
        slow = nodes.slow_host(nodes.per_host(steps, late, hosts))
        if slow is not None:
            out.add(("node", slow["host"]))
    n = sim.world
    vals, counts = np.unique(last_ready, return_counts=True)
    top = int(counts.argmax())
    if ev.binomial_test(int(counts[top]), len(last_ready), 1.0 / n, n).significant:
        out.add(("gate", int(vals[top])))
    return out


# -- the algebra ---------------------------------------------------------------

def test_algebra_binomial_tail_matches_brute_force():
    for n in (1, 2, 7, 49, 300):
        for p in (0.5, 1 / 8, 1 / 64):
            for k in sorted({0, 1, n // 3, n // 2, n - 1, n, n + 1}):
                ref = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(max(k, 0), n + 1))
                assert ev.binomial_sf(k, n, p) == pytest.approx(ref, rel=1e-9, abs=1e-15)


def test_algebra_min_trials_is_where_a_clean_sweep_becomes_significant():
    for members in (2, 8, 64, 1024):
        for p0 in (0.5, 1.0 / members):
            n = ev.min_trials(p0, members)
            assert ev.binomial_test(n, n, p0, members).significant
            assert n == 1 or not ev.binomial_test(n - 1, n - 1, p0, members).significant


def test_algebra_bonferroni_and_rule_budget():
    assert ev.RULE_ALPHA * ev.ACCUSING_RULES == pytest.approx(ev.FAMILY_ALPHA)
    assert ev.bonferroni(0.01, 8) == pytest.approx(0.08) and ev.bonferroni(0.5, 8) == 1.0


def test_algebra_others_median_matches_brute_force():
    rng = np.random.default_rng(3)
    for n in (2, 3, 4, 7, 8, 65):
        m = rng.normal(size=(6, n))
        m[0] = 1.0                                         # ties
        ref = np.array([[np.median(np.delete(row, j)) for j in range(n)] for row in m])
        assert np.allclose(stragglers.others_median(m), ref)


def test_median_interval_covers_the_true_median():
    # exponential draws: skewed, true median ln 2
    rng = np.random.default_rng(11)
    for n in (12, 30, 100):
        hits = [lo <= math.log(2) <= hi for lo, hi in
                (ev.median_interval(rng.exponential(size=n)) for _ in range(2000))]
        assert np.mean(hits) >= 0.94, n                    # nominal >= 95 %


def test_ratio_interval_covers_the_true_share():
    # step times log-normal, a share that varies per step (Beta): the true
    # time-weighted share is E[num] / E[den] = E[share] (independent of den)
    rng = np.random.default_rng(12)
    true = 100 * 2 / (2 + 6)
    hits, widths = [], []
    for _ in range(2000):
        den = rng.lognormal(3.0, 0.3, 50)
        num = den * rng.beta(2, 6, 50)
        share, lo, hi, n = ev.ratio_interval(num, den)
        hits.append(lo <= true <= hi)
        widths.append(hi - lo)
    assert 0.92 <= np.mean(hits) <= 0.98
    assert 0 < np.median(widths) < 10


def test_share_claims():
    assert ev.share_claim(25.0, 21.0, 29.0, 20.0) == "above"
    assert ev.share_claim(21.0, 18.0, 24.0, 20.0) == "near"
    assert ev.share_claim(19.0, 15.0, 23.0, 20.0) is None


# -- the rules on the simulator ------------------------------------------------

@pytest.mark.parametrize("world, steps, seeds, gpn", [(2, 50, 100, 1), (8, 50, 120, 4), (64, 30, 30, 8)])
def test_pure_jitter_accuses_nobody_beyond_the_budget(world, steps, seeds, gpn):
    """Equal ranks, jitter only: the share of runs in which any rule names
    anybody stays within the report's 5 % budget."""
    runs = [accusations(Sim(world, steps, seed=s, gpus_per_node=gpn).run()) for s in range(seeds)]
    rate = np.mean([bool(a) for a in runs])
    assert rate <= ev.FAMILY_ALPHA, (rate, [a for a in runs if a])


def test_two_equal_ranks_neither_is_accused_whatever_the_step_count():
    # of two ranks one is always the slower at each step: never evidence alone
    for steps in (3, 10, 200):
        assert accusations(Sim(2, steps, seed=5).run()) == set()


@pytest.mark.parametrize("world, delta_ms", [(2, 2.0), (8, 2.0), (64, 3.0)])
def test_a_planted_straggler_is_found_and_only_it(world, delta_ms):
    found = 0
    for seed in range(10):
        a = accusations(Sim(world, 50, seed=seed, slow_rank=world - 1, delta_ms=delta_ms).run())
        ranks = {who for rule, who in a if rule != "node"}
        assert ranks <= {world - 1}, a                     # nobody else
        found += ("work", world - 1) in a
    assert found >= 9


def test_a_data_straggler_is_named_in_data():
    a = accusations(Sim(8, 50, seed=2, slow_rank=5, delta_ms=2.0, where="data").run())
    assert ("data", 5) in a and ("work", 5) in a


def test_below_the_effect_floor_nobody_is_named():
    """A rank 0.1 ms slower at every step (under the 0.25 ms floor) is
    measurable with 400 steps but not worth a finding: no rank rule names it."""
    for seed in range(5):
        a = accusations(Sim(8, 400, seed=seed, slow_rank=3, delta_ms=0.1, jitter=0.01).run())
        assert not {x for x in a if x[0] in ("work", "data", "step", "arrival")}, a


def test_a_slow_host_is_named_and_equal_hosts_are_not():
    a = accusations(Sim(16, 50, seed=4, gpus_per_node=4, slow_host=2, delta_ms=2.0).run())
    assert ("node", "node2") in a
    assert not {x for x in a if x[0] == "node" and x[1] != "node2"}


@pytest.mark.parametrize("side_rows", [None, 0])
def test_the_step_tests_run_beside_the_alignment_give_the_reports_table(tmp_path, monkeypatch, side_rows):
    """A planted straggler on two hosts, through the analysis: the per-step
    tests (and the breakdown table's figures) run beside the clock
    alignment (or, past SIDE_STEP_ROWS, in the report) and the stragglers
    table is the one the report computes from the steps alone."""
    import dataclasses

    import pandas as pd

    import commprof
    from commprof.analyzers import run as run_mod
    from commprof.analyzers import scaling

    if side_rows is not None:
        monkeypatch.setattr(run_mod, "SIDE_STEP_ROWS", side_rows)
    path = Sim(8, 50, seed=2, slow_rank=5, delta_ms=2.0, gpus_per_node=4).run().write(tmp_path / "t.parquet")
    a = commprof.load(path).analysis()
    assert (a.step_stragglers is None) is (side_rows == 0)
    assert (a.step_figures is None) is (side_rows == 0)         # the breakdown's figures: the same gate
    pd.testing.assert_frame_equal(scaling.breakdown_table([a]),
                                  scaling.breakdown_table([dataclasses.replace(a, step_figures=None)]))
    table = scaling.stack(scaling.straggler_tables([a]))
    alone = scaling.stack(scaling.straggler_tables([dataclasses.replace(a, step_stragglers=None)]))
    pd.testing.assert_frame_equal(table, alone)
    named = stragglers.accused(table)
    assert ("work", 5) in set(zip(named["metric"], named["rank"].astype(int)))


def test_too_few_steps_says_so():
    steps, late, blocks, hosts, _ = Sim(8, 6, seed=1, slow_rank=2, delta_ms=5.0).run().measured()
    st = stragglers.stragglers(steps, late, blocks)
    work = st[st["metric"] == "work"].iloc[0]
    assert work["verdict"] == "too few steps" and int(work["needed"]) > int(work["steps"])


def test_the_rules_page_is_the_generated_table():
    with open(os.path.join(ROOT, "docs", "findings.md")) as f:
        text = f.read()
    assert ev.rules_markdown() in text


@pytest.mark.parametrize("where, why", [("compute", "backward"), ("data", "data wait")])
def test_the_gate_says_why_the_planted_rank_is_late(tmp_path, where, why):
    """Through the whole report: a rank slowed in its backward (or its data
    wait) is the critical path's gate, and the phase named is that one."""
    import commprof

    path = Sim(8, 50, seed=3, slow_rank=6, delta_ms=3.0, where=where).run().write(tmp_path / "t.parquet")
    found = commprof.load(path).report().tables["bottlenecks"].frame
    gate = found[found["finding"].str.startswith("critical path")]["evidence"].iloc[0]
    assert "rank 6 is the last ready" in gate and f"(why: {why})" in gate, gate


@pytest.mark.parametrize("delta_ms, named", [(0.3, False), (2.0, True)])
def test_a_gate_rank_late_by_less_than_the_effect_floor_is_not_named(tmp_path, delta_ms, named):
    """Two ranks, one systematically later at every step with almost no
    jitter: it is the last ready in every step (the binomial test alone
    would name it), but 0.3 ms on a ~35 ms step is under the 2 % floor;
    2 ms is over it and named with its phase."""
    import commprof

    path = Sim(2, 40, seed=1, slow_rank=1, delta_ms=delta_ms, jitter=0.001).run().write(tmp_path / "t.parquet")
    found = commprof.load(path).report().tables["bottlenecks"].frame
    gate = found[found["finding"].str.startswith("critical path")]["evidence"].iloc[0]
    assert "rank 1 is the last ready in 39 of 39 steps" in gate, gate     # every step after the warm-up
    assert ("(why: backward)" in gate) is named, gate
    assert ("below the" in gate and "effect floor: no single rank" in gate) is (not named), gate


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**31),
       st.sampled_from(["complete", "gaps", "twice", "in order"]), st.booleans())
def test_algebra_one_row_a_cell_is_placed_as_the_sums_would_place_it(units, steps, seed, shape, nan):
    """wide_at where every (unit, step) cell holds one row (values placed;
    rows already in matrix order: copied) and by its sums per cell: the same
    matrix bit for bit, zeros of either sign and NaN rows included; gaps or
    repeated rows take the sums."""
    rng = np.random.default_rng(seed)
    unit, step = (a.ravel() for a in np.meshgrid(np.arange(units) * 3, np.arange(steps) + 10, indexing="ij"))
    if shape == "gaps" and len(unit) > 1:
        keep = rng.random(len(unit)) < 0.7
        unit, step = unit[keep], step[keep]
    if shape == "twice":
        unit, step = np.r_[unit, unit[:1]], np.r_[step, step[:1]]
    if not len(unit):       # every row a gap: no matrix (the step tests run on some steps only)
        return
    if shape != "in order":
        order = rng.permutation(len(unit))
        unit, step = unit[order], step[order]
    v = rng.choice([-0.0, 0.0, 1.5, 2e9, -3.25], len(unit))
    if nan and len(v):
        v[rng.integers(len(v))] = np.nan
    where = stragglers.cells(unit, step)
    pairs = set(zip(unit.tolist(), step.tolist()))
    one_each = len(pairs) == len(unit) == len(set(unit.tolist())) * len(set(step.tolist()))
    assert (where[3] is None) == one_each
    in_order = list(zip(unit.tolist(), step.tolist())) == sorted(pairs)
    assert (where[2] is None) == (one_each and in_order and len(unit) > 0)
    assert shape != "in order" or where[2] is None or not len(unit)
    if shape in ("complete", "in order"):
        assert one_each
    units_got, m = stragglers.wide_at(where, v)
    u, ui = np.unique(unit, return_inverse=True)
    s_, si = np.unique(step, return_inverse=True)
    cell = si * len(u) + ui
    units_want, want = stragglers.wide_at((u, len(s_), cell, np.bincount(cell, minlength=len(u) * len(s_))
                                           .astype(np.float64)), v)
    assert np.array_equal(units_got, units_want)
    assert m.shape == want.shape and m.tobytes() == want.tobytes()
