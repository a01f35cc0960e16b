"""The pairs schedule and the attribution of a slow node or link, on
synthetic samples drawn from links of known rates (the attribution knows
nothing of how they were drawn)."""
import itertools
import random

import pandas as pd
import pytest

from commprof.analyzers import pairs as pr
from commprof.analyzers.report import pairs_report


@pytest.mark.parametrize("n", list(range(2, 65)))
def test_tournament_measures_every_pair_once_and_no_node_twice_in_a_round(n):
    rounds = pr.tournament(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [p for rnd in rounds for p in rnd]
    assert sorted(seen) == list(itertools.combinations(range(n), 2))
    for rnd in rounds:
        units = [u for p in rnd for u in p]
        assert len(units) == len(set(units))
        assert len(rnd) == n // 2


def test_plan_nodes_first_then_inside_every_node_at_once_and_a_budget_keeps_whole_rounds():
    hosts = [f"n{r // 4}" for r in range(16)]           # 4 nodes x 4 ranks
    rounds = pr.plan(hosts)
    inter = [rnd for rnd in rounds if hosts[rnd[0][0]] != hosts[rnd[0][1]]]
    intra = rounds[len(inter):]
    assert len(inter) == 3 and all(len(r) == 2 for r in inter)
    assert all(hosts[a] != hosts[b] for rnd in inter for a, b in rnd)
    assert len(intra) == 3 and all(len(r) == 8 for r in intra)             # 4 nodes x 2 pairs per round
    assert all(hosts[a] == hosts[b] for rnd in intra for a, b in rnd)
    cut = pr.plan([f"n{r}" for r in range(64)], max_pairs=200, seed=3, intra=False)
    assert sum(len(r) for r in cut) <= 200 and len(cut) == 200 // 32
    counts = pd.Series([u for rnd in cut for p in rnd for u in p]).value_counts()
    assert set(counts) == {len(cut)}                                         # every node equally often


def _samples(n_nodes, rate, iters=9, nbytes=1 << 20, seed=0, ppn=1, jitter=0.08):
    """Per iteration: the exchange time of a pair at ``rate(host_a, host_b)``
    bytes/s (the slower of the two sides' links), with multiplicative jitter."""
    rnd = random.Random(seed)
    hosts = [f"node{r // ppn}" for r in range(n_nodes * ppn)]
    rows = []
    for k, rd in enumerate(pr.plan(hosts)):
        for a, b in rd:
            for i in range(iters):
                sec = nbytes / rate(hosts[a], hosts[b]) * (1 + jitter * rnd.random())
                rows.append({"round": k, "a": a, "b": b, "host_a": hosts[a], "host_b": hosts[b], "kind": "bw",
                             "iteration": i, "bytes": nbytes, "seconds": sec})
                rows.append({**rows[-1], "kind": "lat", "bytes": 8, "seconds": 50e-6 * (1 + jitter * rnd.random())})
    return pd.DataFrame(rows), hosts


def _found(samples):
    _pairs, nodes, findings = pr.attribute(pr.pair_table(samples))
    return nodes, [f["finding"] for f in findings]


@pytest.mark.parametrize("n", [3, 4, 6, 16])
def test_a_node_at_a_quarter_of_the_rate_is_named_and_nobody_else(n):
    link = {f"node{k}": 25e6 for k in range(n)}
    link["node2"] = 25e6 / 4
    for seed in range(5):
        nodes, found = _found(_samples(n, lambda a, b: min(link[a], link[b]), seed=seed)[0])
        assert found == ["slow node: node2"], (seed, found)
        assert nodes.set_index("host").loc["node2", "verdict"] == "slow node"


@pytest.mark.parametrize("n", [3, 4, 6, 16])
def test_a_slow_pair_between_two_normal_nodes_is_a_link_not_a_node(n):
    def rate(a, b):
        return 25e6 / 4 if {a, b} == {"node1", f"node{n - 1}"} else 25e6
    for seed in range(5):
        nodes, found = _found(_samples(n, rate, seed=seed)[0])
        assert found == [f"slow link: node1 <-> node{n - 1}"], (seed, found)
        assert set(nodes["verdict"]) == {"normal"}


def test_equal_links_name_nothing_and_two_nodes_say_they_cannot_tell():
    for seed in range(20):
        assert _found(_samples(5, lambda a, b: 25e6, seed=seed, jitter=0.3)[0])[1] == ["no slow node or link"]
    assert _found(_samples(2, lambda a, b: 25e6)[0])[1] == ["two nodes: not attributable"]


def test_one_node_is_attributed_rank_by_rank():
    samples, hosts = _samples(1, None or (lambda a, b: 1e9), ppn=4)
    # rank 2's device link at a quarter: every pair with rank 2 slow
    samples.loc[(samples["kind"] == "bw") & ((samples["a"] == 2) | (samples["b"] == 2)), "seconds"] *= 4
    nodes, found = _found(samples)
    assert found == ["slow rank: rank 2 (node0)"], found


def test_the_report_has_the_matrix_the_nodes_and_the_finding():
    samples, hosts = _samples(4, lambda a, b: 6.25e6 if "node2" in (a, b) else 25e6)
    doc = {"world_size": 4, "hosts": hosts, "rounds": pr.plan(hosts), "bytes": 1 << 20, "iters": 9, "warmup": 2,
           "samples": samples.to_dict("records")}
    rep = pairs_report(doc)
    mat = rep.tables["pair_matrix"].frame.set_index("host")
    assert mat.loc["node2", "node0"] == pytest.approx(6.25e-3 / 1.04, rel=0.05)
    assert mat.loc["node0", "node1"] == pytest.approx(25e-3 / 1.04, rel=0.05)
    assert list(rep.tables["bottlenecks"].frame["finding"]) == ["slow node: node2"]
    from commprof import render
    html = render.get("html").render(rep)
    assert "heatmap" in html and "Bandwidth between nodes" in html
