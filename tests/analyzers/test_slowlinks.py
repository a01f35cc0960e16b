"""Slow node or link in communication from a training trace's collectives
(analyzers/slowlinks.py), on collectives built here: per instance, each
rank arrives at its own time (a slow-computing rank late), and the transfer
starts when the last arrives and takes bytes over the slowest link among
the group's nodes (a link's rate is the lower of its two nodes' NICs, or a
slowed path between two nodes)."""
import itertools
import random

import pandas as pd
import pytest

from commprof.analyzers import bottleneck, slowlinks

NIC = 10e9          # bytes/s


def _comm(groups, steps=12, nbytes=1 << 20, slow_nic=None, slow_path=None, late_rank=None, seed=0):
    """groups: {name: [ranks]}, one rank per node (host f"n{rank}")."""
    rnd = random.Random(seed)
    rows = []
    seq = {g: 0 for g in groups}
    t = 0
    for step in range(steps):
        for g, ranks in groups.items():
            arrive = {r: t + rnd.randrange(0, 200_000) + (5_000_000 if r == late_rank else 0) for r in ranks}
            rate = NIC
            for a, b in itertools.combinations(ranks, 2):
                ra = NIC / 4 if slow_nic in (a, b) else NIC
                if slow_path is not None and {a, b} == set(slow_path):
                    ra = min(ra, NIC / 4)
                rate = min(rate, ra)
            n = len(ranks)
            done = max(arrive.values()) + int(nbytes * 2 * (n - 1) / n / rate * 1e9 * rnd.uniform(1.0, 1.1))
            for r in ranks:
                rows.append({"rank": r, "step": step, "name": "all_reduce", "group": g, "group_size": n,
                             "seq": seq[g], "bytes": nbytes, "t_start": arrive[r],
                             "t_end": done + rnd.randrange(0, 20_000)})
            seq[g] += 1
            t = done + 1_000_000
    return pd.DataFrame(rows)


HOSTS = {r: f"n{r}" for r in range(8)}
GRID = {"row0": [0, 1], "row1": [2, 3], "col0": [0, 2], "col1": [1, 3]}


def _found(comm):
    groups = slowlinks.group_speeds(comm, HOSTS)
    return slowlinks.attribute(groups)


def test_a_slow_nic_in_a_grid_of_groups_is_named_a_node():
    groups, nodes, found = _found(_comm(GRID, slow_nic=2))
    assert [f["finding"] for f in found] == ["slow node in communication: n2"]
    assert set(groups.loc[groups["slow"], "group"]) == {"row1", "col0"}
    assert nodes.set_index("host").loc["n2", "verdict"] == "slow in communication"


def test_a_slow_path_between_two_nodes_is_a_link():
    pairs = {f"p{a}{b}": [a, b] for a, b in itertools.combinations(range(4), 2)}
    _groups, _nodes, found = _found(_comm(pairs, slow_path=(1, 3)))
    assert [f["finding"] for f in found] == ["slow link: n1 <-> n3"]


def test_a_late_rank_is_not_a_slow_link():
    """Late arrivals (slow compute) leave the transfers alone: nothing found."""
    groups, _nodes, found = _found(_comm(GRID, late_rank=2))
    assert found == [] and not groups["slow"].any()


def test_one_ring_over_every_node_cannot_tell():
    _groups, _nodes, found = _found(_comm({"world": [0, 1, 2, 3]}, slow_nic=2))
    assert [f["kind"] for f in found] == ["untold"]


def test_groups_of_three_nodes_name_the_node_they_share():
    """Six nodes, rows of two and columns of three: the slow NIC's groups."""
    grid6 = {"r0": [0, 1], "r1": [2, 3], "r2": [4, 5], "c0": [0, 2, 4], "c1": [1, 3, 5]}
    # rows and columns differ in size class only through n: same bytes, one class; busbw compares them
    _groups, _nodes, found = _found(_comm(grid6, slow_nic=3))
    assert [f["finding"] for f in found] == ["slow node in communication: n3"]


def test_incomplete_instances_and_short_groups_are_left_out():
    comm = _comm(GRID, steps=2)
    assert slowlinks.group_speeds(comm, HOSTS).empty        # fewer than MIN_CALLS instances
    comm = _comm(GRID)
    comm = comm[~((comm["group"] == "row0") & (comm["rank"] == 1))]   # rank 1's rows of row0 lost
    assert "row0" not in set(slowlinks.group_speeds(comm, HOSTS)["group"])


@pytest.mark.parametrize("comm_pct, said", [(45.0, True), (5.0, False)])
def test_untold_is_said_only_when_communication_matters(comm_pct, said):
    links = {("cfg", 4): slowlinks.group_speeds(_comm({"world": [0, 1, 2, 3]}), HOSTS)}
    nodes = {("cfg", 4): pd.DataFrame({"host": ["n0", "n1", "n2", "n3"], "ranks": ["0-1", "2-3", "4-5", "6-7"],
                                       "accused": [False] * 4})}
    bd = pd.DataFrame({"config": ["cfg"], "gpus": [4], "comm_pct": [comm_pct]})
    rows = bottleneck.node_findings(nodes, {}, bd, links)
    assert rows["finding"].str.contains("cannot be told").any() == said
    if said:
        assert "commprof bench --pairs -- srun -N 4 --ntasks-per-node 2" in rows["advice"].iloc[0]


def test_transfer_time_is_the_last_arrivals_duration():
    comm = _comm(GRID, late_rank=1)
    g = slowlinks.group_speeds(comm, HOSTS).set_index("group")
    base = 2 * (1 << 20) / 2 / NIC * 1e3          # ms: a 2-rank ring moves S each way
    # the generator's transfer is base x U(1, 1.1), each rank's completion up to 20 us later
    assert (g["transfer_ms"] >= base).all() and (g["transfer_ms"] <= 1.1 * base + 0.02).all(), g
    # the late rank's groups are no slower (it waits for nobody)
    assert g.loc[["row0", "col1"], "transfer_ms"].max() < 1.1 * base + 0.02
