"""The cost model on real measurements: commprof bench's all_reduce on the
one-machine cluster (one rank per node, every link shaped to 100 Mbit/s
with tc), fitted at 2-4 nodes, predicting 8.

What is held out is the bandwidth-bound part (256 KiB and more). The small
sizes are fitted too but not judged: on this harness (3 to 8 ranks on 2
cores, veth through a bridge) they are not a latency-plus-bandwidth line --
a 4 KiB all_reduce across 3, 4 or 8 nodes measured slower than a 32 KiB
one (5.2 vs 3.9 ms at 3 nodes, 21.9 vs 15.2 ms at 8, 2026-12-03) -- so
which latency form the fit keeps (a ring's per-step latency or none) is
not a property of the network and is printed, not asserted."""
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
    # the network's bandwidth is the link's (12.5 MB/s)
    assert ring.term_values()["inter_bw"] == pytest.approx(12.5e6, rel=0.2)
    errors = {}
    for r in docs[8]["rows"]:
        # the row's time as the fit reads its rows: the faster of out of place and in place
        t = cm.row_time_us(r) * 1e-6
        e = model.estimate("all_reduce", r["bytes"], 8, 1)
        errors[r["bytes"]] = (e["time_s"] - t) / t * 100
        print(f"8 nodes {r['bytes']:>8} B: measured {t * 1e6:9.0f} us, model {e['time_s'] * 1e6:9.0f} us")
    for n in (2, 3, 4):
        print(f"{n} nodes:", {r["bytes"]: round(cm.row_time_us(r)) for r in docs[n]["rows"]}, "us")
    print("errors at 8 nodes (%):", {k: round(v, 1) for k, v in errors.items()}, model.describe())
    judged, transient = _bandwidth_rows(docs[8]["rows"])
    print("8 nodes, judged:", judged, "transient:", transient)
    big = [abs(errors[s]) for s in judged]
    assert len(transient) <= 1 and len(big) >= 3 and np.median(big) <= 15 and max(big) <= 25, errors


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
