"""Multi-node recording on the one-machine cluster: every node its own
hostname, its own CLOCK_MONOTONIC (1,000 s apart) and a real link."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import commprof
from helpers import ROOT, commprof_cmd, venv_env

pytestmark = pytest.mark.slow

PY = sys.executable
MULTI = os.path.join(ROOT, "tests", "workloads", "multinode.py")


def torchrun_on(c, node, port, script_args, nproc=1):
    return [PY, "-m", "torch.distributed.run", "--nnodes", str(len(c.nodes)), "--node-rank", str(node.index),
            "--nproc-per-node", str(nproc), "--master-addr", c.nodes[0].addr, "--master-port", str(port),
            MULTI, *script_args]


def run_nodes(c, make_cmd, env_of=lambda n: {}, timeout=240):
    """Start make_cmd(node) on every node at once; wait for all."""
    procs = []
    for n in c.nodes:
        env = venv_env({"GLOO_SOCKET_IFNAME": "eth0", **env_of(n)})
        procs.append(n.popen(make_cmd(n), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True))
    outs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return procs, outs


_port = [29600]


def next_port():
    _port[0] += 7
    return _port[0]


def test_cluster_nodes_have_own_hostname_clock_and_link(make_cluster):
    c = make_cluster(2, rate_mbit=100)
    probe = "import socket, time; print(socket.gethostname(), time.monotonic(), time.time())"
    seen = [n.run([PY, "-c", probe]).stdout.split() for n in c.nodes]
    assert [s[0] for s in seen] == ["node0", "node1"]
    mono_gap = float(seen[1][1]) - float(seen[0][1])
    wall_gap = float(seen[1][2]) - float(seen[0][2])
    assert abs((mono_gap - wall_gap) - 1000.0) < 0.5
    # the link carries about its configured rate (tbf), node to node
    srv = c.nodes[1].popen([PY, "-c", (
        "import socket, sys, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', 5601)); s.listen(1); print('ready', flush=True); a, _ = s.accept()\n"
        "n = 0; t = None\n"
        "while True:\n"
        "    b = a.recv(1 << 20)\n"
        "    if t is None: t = time.monotonic()\n"
        "    if not b: break\n"
        "    n += len(b)\n"
        "print(n * 8 / (time.monotonic() - t) / 1e6)\n")], stdout=subprocess.PIPE, text=True)
    assert srv.stdout.readline().strip() == "ready"
    send = c.nodes[0].run([PY, "-c", f"import socket; s = socket.create_connection(('{c.nodes[1].addr}', 5601)); "
                                     "s.sendall(b'x' * 12_500_000); s.close()"], timeout=60)
    assert send.returncode == 0, send.stderr
    mbit = float(srv.communicate(timeout=60)[0].split()[-1])
    assert 80 <= mbit <= 105, mbit


def _sync_instances(trace, rank_results):
    """Per blocking all_reduce: the recorded arrival skew (report's alignment)
    and the truth from the ranks' own wall-clock issue times (CLOCK_REALTIME
    is one clock on this machine, time namespaces only shift MONOTONIC)."""
    analysis = trace.analysis()
    inst = analysis.colls.instances().set_index(["group", "seq"])
    ev = trace.events()
    sync = ev[(ev["category"] == "comm") & (ev["source"] == "torch.distributed") & (ev["name"] == "all_reduce")
              & (ev["rank"] == 0)].sort_values("seq")
    issues = [np.array(rank_results[r]["issues_ns"], np.int64) for r in (0, 1)]
    truth = np.abs(issues[1] - issues[0]) / 1e6
    pairs = []
    for k, (_, row) in enumerate(sync.iterrows()):
        key = (str(row["group"]), int(row["seq"]))
        if key in inst.index and k < len(truth):
            pairs.append((float(inst.loc[key, "skew_ms"]), float(truth[k])))
    return analysis, pairs


def _results(folder):
    out = {}
    for name in os.listdir(folder):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as fh:
                r = json.load(fh)
            out[r["rank"]] = r
    return out


def test_shared_folder_with_offset_clocks_and_a_wrong_wall_clock(make_cluster, tmp_path):
    """Pattern (b): one commprof record per node into one folder; node1's
    monotonic clock is 1,000 s ahead and its wall clock 7 ms off; rank 1
    arrives 30 ms late at every blocking all_reduce."""
    c = make_cluster(2)
    out, res = str(tmp_path / "rec"), tmp_path / "res"
    res.mkdir()
    port = next_port()
    procs, outs = run_nodes(
        c, lambda n: commprof_cmd("record", "-o", out, "--", *torchrun_on(
            c, n, port, ["--steps", "14", "--late-rank", "1", "--late-ms", "30", "--result-dir", str(res)])),
        env_of=lambda n: {"COMMPROF_TEST_WALL_ERROR_MS": "7"} if n.index == 1 else {})
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    errs = "".join(e for _, e in outs)
    assert errs.count("trace.parquet") == 1           # merged once, by the last node
    t = commprof.load(out)
    assert t.meta["world_size"] == 2 and t.meta["ranks_recorded"] == 2
    assert sorted(m["host"] for m in t.ranks) == ["node0", "node1"]
    assert sorted(m["node_rank"] for m in t.ranks) == [0, 1]
    assert len({m["run_id"] for m in t.ranks}) == 1
    analysis, pairs = _sync_instances(t, _results(str(res)))
    assert len(pairs) >= 10
    for skew, truth in pairs:
        assert abs(skew - truth) <= 2.0, pairs
    assert 25 <= np.median([p[1] for p in pairs]) <= 40
    clocks = analysis.clocks.set_index("host")
    # the 1,000 s offset found, the injected 7 ms wall-clock error corrected
    assert abs(clocks.loc["node1", "offset_ms"] + 1_000_000.0) < 1.0
    assert abs(clocks.loc["node1", "correction_ms"] + 7.0) < 1.0
    assert clocks.loc["node1", "violations"] == 0
    lo, hi = clocks.loc["node1", ["feasible_lo_ms", "feasible_hi_ms"]]
    assert lo <= clocks.loc["node1", "offset_ms"] <= hi
    print("node1 clock:", clocks.loc["node1"].to_dict(), "; skew - truth (ms):",
          [round(s_ - t_, 2) for s_, t_ in pairs])
    rep = t.report()
    assert {"clocks", "nodes", "scope"} <= set(rep.tables)
    scope = rep.tables["scope"].frame
    assert set(scope["scope"]) == {"inter-node"}
    finds = rep.tables["bottlenecks"].frame["finding"]
    assert finds.str.contains("slow node in compute: node1").any()


def test_per_node_folders_are_one_job_and_a_slow_node_is_named(make_cluster, tmp_path):
    """Pattern (c): one folder per node, reported together as the one job
    they are; node1's rank is slowed in its forward."""
    c = make_cluster(2)
    port = next_port()
    outs_dirs = [str(tmp_path / f"node{k}") for k in range(2)]
    procs, outs = run_nodes(
        c, lambda n: commprof_cmd("record", "-o", outs_dirs[n.index], "--", *torchrun_on(
            c, n, port, ["--steps", "12", "--slow-rank", "1", "--slow-ms", "25"])))
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    ids = {commprof.load(d).meta["run_id"] for d in outs_dirs}
    assert ids == {f"torchrun-{c.nodes[0].addr}:{port}"}
    t = commprof.load(outs_dirs)
    assert isinstance(t, commprof.api.Trace)          # one job, not a comparison
    assert t.meta["ranks_recorded"] == 2
    rep = t.report()
    bd = rep.tables["breakdown"].frame
    assert len(bd) == 1 and int(bd["gpus"].iloc[0]) == 2
    nodes = rep.tables["nodes"].frame.set_index("host")
    assert nodes.loc["node1", "work_ms"] > nodes.loc["node0", "work_ms"] + 15
    finds = rep.tables["bottlenecks"].frame
    slow = finds[finds["finding"].str.startswith("slow node")]
    assert list(slow["finding"]) == ["slow node in compute: node1 (ranks 1)"]
    # the command line reports the two folders as one job too
    from helpers import run
    proc = run(commprof_cmd("report", *outs_dirs))
    assert proc.returncode == 0, proc.stderr
    assert "slow node in compute: node1" in proc.stdout


def test_busbw_on_a_shaped_link_is_the_calls_own(cluster_available, tmp_path):
    """The multi-node guide's by-hand command (tests/cluster/cluster.py
    around one record per node): large all_reduces across a 200 Mbit/s
    link. The busbw the report shows is the calls' own: S / t (a 2-rank
    ring, n = 2) with t the median of the same calls timed by the script's
    own clock, within 15 %; and no faster than the shaper lets through.
    How close to the link's rate TCP comes is the machine's
    (benchmarks/shaped_links.py)."""
    from helpers import documented_scaled, run

    out, res = str(tmp_path / "rec"), tmp_path / "res"
    res.mkdir()
    prefix = "python tests/cluster/cluster.py --nodes 2 --rate-mbit 200 -- \\\n"
    assert prefix in open(os.path.join(ROOT, "docs", "multi-node.md")).read()
    words = documented_scaled("docs/multi-node.md", "--node-rank {node_rank}", "a free port",
                              values={"--master-port": next_port()}, outputs={"/tmp/run": out},
                              script=[MULTI, "--steps", "6", "--sync-bytes", str(4 << 20), "--result-dir", str(res)])
    before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    proc = run([PY, os.path.join(ROOT, "tests", "cluster", "cluster.py"), "--nodes", "2", "--rate-mbit", "200", "--",
                "commprof", *words], env=venv_env({"GLOO_SOCKET_IFNAME": "eth0"}), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    assert after <= before, f"namespaces left behind: {after - before}"
    colls = commprof.load(out).report().tables["collectives"].frame
    big = colls[(colls["op"] == "all_reduce") & (colls["bytes_per_call"] >= (4 << 20))]
    assert len(big) == 1, colls
    busbw = float(big["busbw_GBps"].iloc[0])
    own = [t for k in (0, 1) for t in json.loads((res / f"rank{k}.json").read_text())["sync_s"]]
    theirs = (4 << 20) / float(np.median(own)) / 1e9
    print(f"busbw {busbw:.4f} GB/s; the script's own clock: {theirs:.4f} GB/s; a 0.025 GB/s link")
    assert busbw == pytest.approx(theirs, rel=0.15) and busbw <= 1.1 * 0.025, (busbw, theirs)


def test_one_record_around_a_launcher_that_starts_every_node(make_cluster, tmp_path):
    """Pattern (a): one commprof record on the launch node around a launcher
    that starts the ranks on the other nodes (here a shell that enters each
    node, as ssh-based launchers do; the COMMPROF_* variables and PYTHONPATH
    travel with it, as mpirun -x / srun pass them)."""
    import shlex

    c = make_cluster(2)
    out = str(tmp_path / "rec")
    port = next_port()
    starts = " & ".join(shlex.join(n.wrap(torchrun_on(c, n, port, ["--steps", "8"]))) for n in c.nodes)
    proc = subprocess.run(commprof_cmd("record", "-o", out, "--", "bash", "-c", f"{starts} & wait"),
                          env=venv_env({"GLOO_SOCKET_IFNAME": "eth0"}), cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = commprof.load(out)
    assert t.meta["ranks_recorded"] == 2
    assert sorted(m["host"] for m in t.ranks) == ["node0", "node1"]
    clocks = t.analysis().clocks.set_index("host")
    # node1's clock is 1,000 s behind (its time namespace): the truth lies in
    # the interval the collectives allow, and the estimate is within it (the
    # interval's width is the ranks' scheduling jitter: narrow on an idle
    # machine, a few ms when the 2 cores are shared)
    lo, hi, off = clocks.loc["node1", ["feasible_lo_ms", "feasible_hi_ms", "offset_ms"]]
    assert lo - 0.05 <= -1_000_000.0 <= hi + 0.05, (lo, hi)
    assert lo <= off <= hi and hi - lo < 20.0, (lo, off, hi)


def test_bench_beta_on_a_shaped_link(make_cluster, tmp_path):
    """commprof bench's worker on two nodes joined by a 200 Mbit/s link: the
    fitted beta of all_reduce (2 ranks: algbw = busbw = S / t) gives the
    largest size's measured time back within 10 %, and is no faster than
    the shaper lets through. How close to the link's rate it comes is the
    machine's (benchmarks/shaped_links.py)."""
    from commprof.bench.launch import WORKER, model_of

    c = make_cluster(2, rate_mbit=200)
    out = str(tmp_path / "bench.json")
    port = next_port()

    def cmd(n):
        return [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(n.index),
                "--nproc-per-node", "1", "--master-addr", c.nodes[0].addr, "--master-port", str(port), WORKER,
                "--ops", "all_reduce", "--min-bytes", "256000", "--max-bytes", "4000000",
                "--iters", "4", "--warmup", "1", "--out", out]
    procs, outs = run_nodes(c, cmd, timeout=300)
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    with open(out) as fh:
        doc = json.load(fh)
    assert all(r["in_place"]["wrong"] == 0 for r in doc["rows"])
    pieces = model_of(doc)["ops"]["all_reduce"]["float"]
    p = pieces[-1]
    beta = p["beta_Bps"]
    print(f"fitted beta {beta / 1e6:.1f} MB/s on a 25 MB/s link; pieces {pieces}")
    last = max(doc["rows"], key=lambda r: r["bytes"])
    t = (last["out_of_place"] or last["in_place"])["median_us"] * 1e-6
    assert p["alpha_s"] + last["bytes"] / beta == pytest.approx(t, rel=0.10), (pieces, t)
    assert 0 < beta <= 1.1 * 25e6, pieces


GRID_RATE = 200      # Mbit/s: 25 MB/s; a 256 KiB two-node all_reduce ~10 ms, ~40 ms at a quarter


def _grid_findings(c, tmp_path, extra):
    """Four nodes, one rank each, in 2-D groups (rows {0,1} {2,3}, columns
    {0,2} {1,3}) under commprof record: the report's node findings."""
    out = str(tmp_path / "rec")
    port = next_port()
    procs, outs = run_nodes(c, lambda n: commprof_cmd("record", "-o", out, "--", *torchrun_on(
        c, n, port, ["--steps", "14", "--grid-bytes", str(256 << 10), *extra])), timeout=300)
    assert [p.returncode for p in procs] == [0] * len(c.nodes), \
        [(p.returncode, o[-2000:], e[-4000:]) for p, (o, e) in zip(procs, outs) if p.returncode]
    rep = commprof.load(out).report()
    finds = rep.tables["bottlenecks"].frame
    node = finds[finds["bound"] == "node"]
    return list(node["finding"]), rep


def test_a_node_slow_in_communication_is_told_from_one_slow_in_compute(make_cluster, tmp_path):
    """The same job twice: node2's link at a quarter of the others' rate, then
    node2's rank computing 40 ms more per step on normal links. The first
    names node2 slow in communication (its groups' transfers, after the last
    arrival, are slow; its work is not), the second slow in compute (its
    work per step; its groups' transfers are normal) — never the other."""
    c = make_cluster(4, rate_mbit=GRID_RATE)
    c.nodes[2].shape(GRID_RATE / 4)
    found, rep = _grid_findings(c, tmp_path / "link", [])
    # four ranks share this machine's two cores: another node may truly compute slower now and then
    comm_found = [f for f in found if "in compute" not in f]
    assert comm_found == ["slow node in communication: node2"] and "slow node in compute: node2" not in \
        " ".join(found), (found, rep.tables["links"].frame.to_string(), rep.tables["nodes"].frame.to_string())
    links = rep.tables["links"].frame
    pair = links[links["nodes"].isin(["node0, node1", "node1, node3"])]
    slowed = links[links["nodes"].isin(["node2, node3", "node0, node2"])]
    assert len(pair) == 2 and len(slowed) == 2 and not pair["slow"].any() and slowed["slow"].all(), links
    # a slowed group's transfers at about a quarter of the others' (the link rates' ratio)
    assert slowed["busbw_GBps"].max() < 0.4 * pair["busbw_GBps"].min(), links
    print("link slowed:", links[["nodes", "busbw_GBps", "busbw_GBps_p75", "slow"]].to_string())

    c.nodes[2].shape(GRID_RATE)
    found, rep = _grid_findings(c, tmp_path / "compute", ["--slow-rank", "2", "--slow-ms", "40"])
    assert "slow node in compute: node2 (ranks 2)" in found and not any("communication" in f or "link" in f
                                                                        for f in found), \
        (found, rep.tables["nodes"].frame.to_string())
    assert not rep.tables["links"].frame["slow"].any(), rep.tables["links"].frame
