"""``commprof bench --pairs`` on real processes in the one-machine cluster:
four nodes (one rank each) whose links tc shapes, one node's link at a
quarter of the others' (named as the slow node, nobody else), then one
slow path between two nodes whose links are otherwise normal (named as a
link, not a node)."""
import json
import subprocess
import sys

import pytest

from commprof.analyzers.pairs import SLOW
from commprof.analyzers.report import pairs_report
from helpers import ROOT, venv_env

pytestmark = pytest.mark.slow

PY = sys.executable
RATE = 200          # Mbit/s: 25 MB/s; a 1 MiB exchange ~42 ms each way


def _pairs(c, out, port):
    from commprof.bench.launch import WORKER

    n = len(c.nodes)
    procs = []
    for node in c.nodes:
        cmd = [PY, "-m", "torch.distributed.run", "--nnodes", str(n), "--node-rank", str(node.index),
               "--nproc-per-node", "1", "--master-addr", c.nodes[0].addr, "--master-port", str(port), WORKER,
               "--pairs", "--pairs-bytes", str(1 << 20), "--iters", "5", "--warmup", "1", "--out", out]
        procs.append(node.popen(cmd, env=venv_env({"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * n, [e[-2000:] for e in errs]
    with open(out) as fh:
        return json.load(fh)


def test_a_node_at_a_quarter_of_the_rate_is_named(make_cluster, tmp_path):
    c = make_cluster(4, rate_mbit=RATE)
    c.nodes[2].shape(RATE / 4)
    doc = _pairs(c, str(tmp_path / "pairs.json"), 29890)
    assert doc["mode"] == "pairs" and len(doc["rounds"]) == 3
    rep = pairs_report(doc)
    found = list(rep.tables["bottlenecks"].frame["finding"])
    assert found == ["slow node: node2"], rep.tables["pairs"].frame.to_string()
    # the rule's margin, decided by this run's own pairs (not by what TCP over tbf delivers on a loaded
    # machine: those rates are in benchmarks/shaped_links.py): every pair of node2 has its upper quartile
    # below SLOW x the median of the pairs without it, and none of those is below that line
    pairs = rep.tables["pairs"].frame
    mine = (pairs["host_a"] == "node2") | (pairs["host_b"] == "node2")
    ref = float(pairs.loc[~mine, "bw_GBps"].median())
    assert mine.sum() == 3 and (pairs.loc[mine, "bw_GBps_p75"] < SLOW * ref).all(), pairs.to_string()
    assert (pairs.loc[~mine, "bw_GBps_p75"] >= SLOW * ref).all(), pairs.to_string()
    # the shaper caps every link: no pair faster than its slower end's rate (a wrong byte count would be)
    cap = {f"node{k}": RATE / 8e3 for k in range(4)} | {"node2": RATE / 4 / 8e3}      # GB/s
    assert all(r.bw_GBps <= 1.1 * min(cap[r.host_a], cap[r.host_b]) for r in pairs.itertuples()), pairs


def test_one_slow_path_between_two_normal_nodes_is_a_link(make_cluster, tmp_path):
    c = make_cluster(4)
    a, b = c.nodes[1], c.nodes[3]
    for node in c.nodes:
        peer = {a.index: b.addr, b.index: a.addr}.get(node.index)
        node.shape_egress(RATE, slow_to=[peer] if peer else [], slow_mbit=RATE / 4)
    doc = _pairs(c, str(tmp_path / "pairs.json"), 29894)
    rep = pairs_report(doc)
    found = list(rep.tables["bottlenecks"].frame["finding"])
    assert found == ["slow link: node1 <-> node3"], rep.tables["pairs"].frame.to_string()
    assert set(rep.tables["pair_nodes"].frame["verdict"]) == {"normal"}


def test_bench_under_a_launcher_per_node_on_five_nodes(make_cluster, tmp_path):
    """The bench guide's per-node command on five nodes (an odd count: one
    node idle in each round): one `commprof bench --pairs` around one
    torchrun on every node. Every node exits 0; node0 (rank 0) prints the
    report and writes the JSON; the others say where it is and write
    nothing."""
    from helpers import commprof_cmd, documented_scaled

    c = make_cluster(5)
    port = 29897
    procs = []
    for node in c.nodes:
        words = documented_scaled("docs/bench.md", "--nnodes 5 --node-rank K",
                                  "this node's rank, address and port; sizes of a check",
                                  values={"--node-rank": node.index, "--master-addr": c.nodes[0].addr,
                                          "--master-port": port},
                                  outputs={"pairs.json": tmp_path / f"pairs{node.index}.json"},
                                  add=["--pairs-bytes", "64K", "--iters", "2", "--warmup", "1"])
        procs.append(node.popen(commprof_cmd(*words), env=venv_env({"GLOO_SOCKET_IFNAME": "eth0"}), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 5, [e[-2000:] for _, e in outs]
    doc = json.loads((tmp_path / "pairs0.json").read_text())
    assert doc["world_size"] == 5 and len(doc["rounds"]) == 5 and sorted(doc["hosts"]) == [f"node{k}" for k in range(5)]
    assert "Bandwidth between nodes" in outs[0][0] and "node4" in outs[0][0]
    for k in range(1, 5):
        out, err = outs[k]
        assert out == "" and not (tmp_path / f"pairs{k}.json").exists()
        assert err.strip().splitlines()[-1] == (
            f"commprof: bench: this node (node{k}) ran ranks of a 5-rank benchmark on 5 nodes; rank 0 ran on node0, "
            f"whose commprof bench prints the report and writes {tmp_path / f'pairs{k}.json'} there"), err[-2000:]
