"""The cost model on real measurements: commprof bench's all_reduce on the
one-machine cluster (one rank per node, every link shaped to 100 Mbit/s
with tc), fitted at 2-4 nodes, predicting 8.

What is held out is the bandwidth-bound part (256 KiB and more). The small
sizes are fitted too but not judged: on this harness (3 to 8 ranks on 2
cores, veth through a bridge) they are not a latency-plus-bandwidth line --
a 4 KiB all_reduce across 3, 4 or 8 nodes measured slower than a 32 KiB
one (5.2 vs 3.9 ms at 3 nodes, 21.9 vs 15.2 ms at 8, 2026-12-03) -- so
which latency form the fit keeps (a ring's per-step latency or none) is
not a property of the network and is printed, not asserted.

What is asserted is what a run can decide: the held-out error against the
error the same run shows at the counts it was fitted on (both move with
the machine's load, and 8 ranks on 2 cores share them more than 4 do), and
a fitted bandwidth no faster than the shaper allows. The absolute accuracy
at 8 nodes and the rate TCP delivers over tbf are the machine's, measured
by ``benchmarks/shaped_links.py`` with result files."""
import json
import subprocess
import sys

import numpy as np
import pytest

from commprof.analyzers import collmodel as cm
from helpers import ROOT, venv_env

pytestmark = pytest.mark.slow

PY = sys.executable


def _bench(make_cluster, n, out, port):
    from commprof.bench.launch import WORKER

    c = make_cluster(n, rate_mbit=100)
    procs = []
    for node in c.nodes:
        # one rank per node, started the way srun starts it (the rank's
        # variables set, no launcher process)
        cmd = [PY, WORKER, "--ops", "all_reduce", "--min-bytes", "4096", "--max-bytes", "2097152",
               "--iters", "10", "--warmup", "1", "--out", out]
        env = venv_env({"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1", "RANK": str(node.index),
                        "WORLD_SIZE": str(n), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": c.nodes[0].addr, "MASTER_PORT": str(port)})
        procs.append(node.popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=400)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * n, [e[-2000:] for e in errs]
    c.down()
    with open(out) as fh:
        return json.load(fh)


def test_fitted_at_two_to_four_nodes_predicts_eight(make_cluster, tmp_path):
    docs = {n: _bench(make_cluster, n, str(tmp_path / f"n{n}.json"), 29810 + 7 * n) for n in (2, 3, 4, 8)}
    for n, d in docs.items():
        assert d["ranks_per_node"] == 1 and d["nodes"] == n and sorted(d["hosts"]) == [f"node{k}" for k in range(n)]
    ms = cm.Measurements()
    for n in (2, 3, 4):
        ms.extend(cm.from_rows(docs[n]["rows"], n, 1))
    model = cm.build(ms, docs[2]["backend"])
    ring = model.fits["ring"]
    # the shaper caps the network: a fitted bandwidth above the link's rate (12.5 MB/s) is wrong on any
    # machine (how close to it TCP over tbf comes is the machine's: benchmarks/shaped_links.py)
    assert 0 < ring.term_values()["inter_bw"] <= 1.1 * 12.5e6, model.describe()

    def errors_at(n):
        out = {}
        for r in docs[n]["rows"]:
            # the row's time as the fit reads its rows: the faster of out of place and in place
            t = cm.row_time_us(r) * 1e-6
            out[r["bytes"]] = (model.estimate("all_reduce", r["bytes"], n, 1)["time_s"] - t) / t * 100
        return out

    errors = {n: errors_at(n) for n in docs}
    for n in docs:
        print(f"{n} nodes:", {r["bytes"]: round(cm.row_time_us(r)) for r in docs[n]["rows"]}, "us; error %",
              {k: round(v, 1) for k, v in errors[n].items()})
    print(model.describe())
    judged = {}
    for n in docs:
        judged[n], transient = _bandwidth_rows(docs[n]["rows"])
        print(f"{n} nodes, judged:", judged[n], "transient:", transient)
        assert len(transient) <= 1 and len(judged[n]) >= 3, (n, transient)
    # held out against fitted, in the same run: the median error at 8 nodes no worse than HELD_OUT_FACTOR x
    # the median error at the counts it was fitted on (at least FLOOR_PCT: a near-exact fit is no scale).
    # What the machine decides -- how loaded it is, how 8 ranks share its cores -- moves both sides.
    fitted = np.median([abs(errors[n][s]) for n in (2, 3, 4) for s in judged[n]])
    held_out = np.median([abs(errors[8][s]) for s in judged[8]])
    print(f"median |error|: fitted {fitted:.1f} %, held out {held_out:.1f} %")
    assert held_out <= HELD_OUT_FACTOR * max(fitted, FLOOR_PCT), (held_out, fitted, errors)


#: the held-out error at 8 nodes may be this many times the in-sample error at 2-4 nodes
HELD_OUT_FACTOR = 4.0
#: the in-sample error (%) below which it is taken as this floor
FLOOR_PCT = 5.0


def _bandwidth_rows(rows):
    """The bandwidth-bound sizes (256 KiB and more) to judge, and those left
    out as transients of the harness: a size whose time per byte exceeds
    both its neighbours' by more than 25 % (in the bandwidth-bound range the
    time per byte can only fall as the size grows; no latency-plus-bandwidth
    model can be off at one size and right on both sides of it). Seen once
    at 8 nodes: 512 KiB 136.7 ms between 39.6 ms at 256 KiB and 166.3 ms at
    1 MiB (the median of 10 iterations, in and out of place both slow)."""
    per_byte = sorted((r["bytes"], cm.row_time_us(r) / r["bytes"]) for r in rows if r["bytes"] >= 256 * 1024)
    transient = [per_byte[i][0] for i in range(1, len(per_byte) - 1)
                 if per_byte[i][1] > 1.25 * max(per_byte[i - 1][1], per_byte[i + 1][1])]
    return [s for s, _ in per_byte if s not in transient], transient
