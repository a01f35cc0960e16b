"""What the one-machine cluster's shaped links deliver, and how close the
collective cost model comes on them (not a test: the machine decides these
figures; the cluster tests assert relations a run can decide).

Each node is a network namespace joined to a bridge by a veth pair shaped
with ``tc`` (``tbf``, both directions; tests/cluster/cluster.py). Three
measurements, each on a cluster of its own, torn down after it:

1. ``pairs``: four nodes at RATE Mbit/s, node2 at a quarter of it;
   ``commprof bench --pairs`` (one torchrun per node, 1 MiB exchanges):
   every pair's delivered rate against its slower end's tbf rate.
2. ``beta``: two nodes at RATE Mbit/s; the bench worker's all_reduce
   256 kB - 4 MB, the alpha-beta fit's beta against the link's rate.
3. ``costmodel``: one rank per node at 100 Mbit/s, all_reduce 4 KiB -
   2 MiB at 2, 3, 4 and 8 nodes; the cost model fitted at 2-4 nodes, its
   error at every size and count (held out: 8).

    python benchmarks/shaped_links.py --out benchmarks/results/shaped_links/DATE-COMMIT.md
    python benchmarks/shaped_links.py --only pairs,beta      # a part
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "cluster")]

import cluster as harness  # noqa: E402

from commprof.bench.launch import WORKER  # noqa: E402

PY = sys.executable
RATE = 200.0


def _env(extra):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")
    env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0", "PYTHONPATH": ROOT}, **extra)
    return env


def _on_nodes(c, make_cmd, env_of=lambda n: {}, timeout=600):
    procs = [n.popen(make_cmd(n), env=_env(env_of(n)), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True) for n in c.nodes]
    outs = [p.communicate(timeout=timeout) for p in procs]
    bad = [(p.returncode, e[-1500:]) for p, (_, e) in zip(procs, outs) if p.returncode]
    if bad:
        raise RuntimeError(f"a node failed: {bad}")


def _torchrun(c, node, port, *args):
    return [PY, "-m", "torch.distributed.run", "--nnodes", str(len(c.nodes)), "--node-rank", str(node.index),
            "--nproc-per-node", "1", "--master-addr", c.nodes[0].addr, "--master-port", str(port), WORKER, *args]


def pairs(tmp: str) -> list:
    from commprof.analyzers.report import pairs_report

    out = os.path.join(tmp, "pairs.json")
    with harness.Cluster(4, rate_mbit=RATE) as c:
        c.nodes[2].shape(RATE / 4)
        _on_nodes(c, lambda n: _torchrun(c, n, 29790, "--pairs", "--pairs-bytes", str(1 << 20), "--iters", "5",
                                         "--warmup", "1", "--out", out))
    rep = pairs_report(json.load(open(out)))
    rate = {f"node{k}": RATE for k in range(4)} | {"node2": RATE / 4}
    lines = [f"Four nodes at {RATE:g} Mbit/s, node2 at {RATE / 4:g}; 1 MiB exchanges, 5 iterations (median, "
             "quartiles). Findings: " + "; ".join(rep.tables["bottlenecks"].frame["finding"]) + ".", "",
             "| pair | tbf rate (MB/s) | delivered median (MB/s) | p25 - p75 | of the rate |",
             "|---|---:|---:|---:|---:|"]
    for r in rep.tables["pairs"].frame.itertuples():
        cap = min(rate[r.host_a], rate[r.host_b]) / 8
        lines.append(f"| {r.host_a} - {r.host_b} | {cap:.2f} | {r.bw_GBps * 1e3:.2f} | {r.bw_GBps_p25 * 1e3:.2f} - "
                     f"{r.bw_GBps_p75 * 1e3:.2f} | {r.bw_GBps * 1e3 / cap:.0%} |")
    return lines


def beta(tmp: str) -> list:
    from commprof.bench.launch import model_of

    out = os.path.join(tmp, "beta.json")
    with harness.Cluster(2, rate_mbit=RATE) as c:
        _on_nodes(c, lambda n: _torchrun(c, n, 29794, "--ops", "all_reduce", "--min-bytes", "256000", "--max-bytes",
                                         "4000000", "--iters", "4", "--warmup", "1", "--out", out))
    p = model_of(json.load(open(out)))["ops"]["all_reduce"]["float"][-1]
    return [f"Two nodes at {RATE:g} Mbit/s ({RATE / 8:g} MB/s), all_reduce 256 kB - 4 MB, 4 iterations: "
            f"beta {p['beta_Bps'] / 1e6:.2f} MB/s ({p['beta_Bps'] / (RATE / 8 * 1e6):.0%} of the link), alpha "
            f"{p['alpha_s'] * 1e6:.0f} us, R^2 {p['r2']:.4f}, largest relative residual {p['max_rel_residual']:.1%}."]


def costmodel(tmp: str) -> list:
    import numpy as np

    from commprof.analyzers import collmodel as cm

    docs = {}
    for n in (2, 3, 4, 8):
        out = os.path.join(tmp, f"cm{n}.json")
        port = 29810 + 7 * n
        with harness.Cluster(n, rate_mbit=100) as c:
            def cmd(node, n=n, out=out):
                return [PY, WORKER, "--ops", "all_reduce", "--min-bytes", "4096", "--max-bytes", "2097152",
                        "--iters", "10", "--warmup", "1", "--out", out]
            _on_nodes(c, cmd, lambda node, n=n, c=c, port=port: {
                "RANK": str(node.index), "WORLD_SIZE": str(n), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": c.nodes[0].addr, "MASTER_PORT": str(port)})
        docs[n] = json.load(open(out))
    ms = cm.Measurements()
    for n in (2, 3, 4):
        ms.extend(cm.from_rows(docs[n]["rows"], n, 1))
    model = cm.build(ms, docs[2]["backend"])
    sizes = sorted({r["bytes"] for r in docs[8]["rows"]})
    lines = [f"One rank per node, links at 100 Mbit/s (12.5 MB/s), all_reduce 4 KiB - 2 MiB, 10 iterations "
             f"(a row's time: the faster of in and out of place, each the median). Fitted at 2, 3 and 4 nodes: "
             f"{model.describe()}; inter_bw {model.fits['ring'].term_values()['inter_bw'] / 1e6:.2f} MB/s "
             f"({model.fits['ring'].term_values()['inter_bw'] / 12.5e6:.0%} of the link).", "",
             "| bytes | " + " | ".join(f"{n} nodes (us) | error" for n in docs) + " |",
             "|---:|" + "---:|---:|" * len(docs)]
    big = {n: [] for n in docs}
    for s in sizes:
        cells = []
        for n in docs:
            r = next(r for r in docs[n]["rows"] if r["bytes"] == s)
            t = cm.row_time_us(r)
            e = (model.estimate("all_reduce", s, n, 1)["time_s"] * 1e6 - t) / t * 100
            if s >= 256 * 1024:
                big[n].append(abs(e))
            cells.append(f"{t:,.0f} | {e:+.1f} %")
        lines.append(f"| {s:,} | " + " | ".join(cells) + " |")
    lines += ["", "Median |error| at 256 KiB and more: " + ", ".join(
        f"{n} nodes {np.median(v):.1f} %" for n, v in big.items()) + " (8: held out)."]
    return lines


PARTS = {"pairs": pairs, "beta": beta, "costmodel": costmodel}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(PARTS), help="comma-separated parts: " + ", ".join(PARTS))
    p.add_argument("--out", default=None, help="a Markdown results file (default: print)")
    a = p.parse_args()
    reason = harness.why_unavailable()
    if reason:
        sys.exit(f"shaped_links: {reason}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    text = [f"# Shaped links on the one-machine cluster, {datetime.date.today()}, commit {commit.strip()}", "",
            f"    python benchmarks/shaped_links.py --only {a.only}", "",
            f"{os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.2f}.", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only.split(","):
            t0 = time.monotonic()
            body = PARTS[name](tmp)
            text += [f"## {name} ({time.monotonic() - t0:.0f} s)", ""] + body + [""]
            print("\n".join(text[-len(body) - 3:]), flush=True)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
