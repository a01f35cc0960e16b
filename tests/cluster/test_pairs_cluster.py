"""``commprof bench --pairs`` on real processes in the one-machine cluster:
four nodes (one rank each) whose links tc shapes, one node's link at a
quarter of the others' (named as the slow node, nobody else), then one
slow path between two nodes whose links are otherwise normal (named as a
link, not a node)."""
import json
import subprocess
import sys

import pytest

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
    mat = rep.tables["pair_matrix"].frame.set_index("host")
    # the shaped links' rates, within what TCP over tbf delivers
    assert 0.5 * 25e-3 < mat.loc["node0", "node1"] < 1.05 * 25e-3, mat
    # the slow node's links: at most the quarter rate (TCP over a 50 Mbit/s tbf delivers less than the rate)
    assert mat.loc["node0", "node2"] < 1.05 * 25e-3 / 4 and mat.loc["node1", "node3"] > 3 * mat.loc["node0", "node2"]


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
