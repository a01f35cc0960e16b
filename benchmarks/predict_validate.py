"""Validate ``commprof predict`` on the one-machine cluster (tests/cluster/):
1-4 nodes (one rank each, own network namespace, hostname and clock), every
link shaped with tc to RATE Mbit/s so communication grows with N as on a
bandwidth-bound network; workloads/resnet.py with GPU-like emulated device
time (--emulate-device-ms: 4 ranks share 2 cores here, so CPU compute would
slow with N for a reason no cluster has). Then

    commprof predict STUDY/<workload> --validate      (leave-one-out, smallest two)

and the measured-vs-predicted table lands in benchmarks/results/predict_validate/DATE-COMMIT-*.

    sudo .venv/bin/python benchmarks/predict_validate.py [--nodes 1,2,3,4] [--rate-mbit 1000]
        [--steps 14] [--workloads resnet18,resnet50] [--out /tmp/pv]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests", "cluster"), ROOT]

from cluster import Cluster, why_unavailable  # noqa: E402

PY = sys.executable
RESNET = os.path.join(ROOT, "workloads", "resnet.py")
#: workload -> (arch, emulated forward ms, backward ms) per step
WORKLOADS = {"resnet18": ("resnet18", 400, 800), "resnet50": ("resnet50", 500, 1000)}


def env():
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="eth0",
             COMMPROF_PROGRESS="0")
    e["PATH"] = os.path.dirname(PY) + os.pathsep + e.get("PATH", "")
    return e


def script_args(name, steps):
    arch, f, b = WORKLOADS[name]
    return [RESNET, "--arch", arch, "--loader", "synthetic", "--steps", str(steps), "--image-size", "32",
            "--batch-size", "2", "--no-val", "--emulate-device-ms", f"{f},{b}",
            # plain SGD: its CPU update is the part of the step that contends most when 4 ranks share 2 cores
            "--momentum", "0", "--weight-decay", "0"]


def run_cell(name, n, out, rate, steps, port):
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if n == 1:  # the 1-GPU baseline: a plain process, no framework
        cmd = [PY, "-m", "commprof", "record", "-o", out, "--", PY, *script_args(name, steps)]
        return subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=900).returncode
    with Cluster(n, rate_mbit=rate) as c:
        procs = []
        for node in c.nodes:
            torchrun = [PY, "-m", "torch.distributed.run", "--nnodes", str(n), "--node-rank", str(node.index),
                        "--nproc-per-node", "1", "--master-addr", c.nodes[0].addr, "--master-port", str(port)]
            cmd = [PY, "-m", "commprof", "record", "-o", out, "--", *torchrun, *script_args(name, steps)]
            procs.append(node.popen(cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True))
        rcs = []
        for p in procs:
            _o, e = p.communicate(timeout=900)
            if p.returncode:
                sys.stderr.write(e[-2000:])
            rcs.append(p.returncode)
    return max(rcs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="1,2,3,4")
    p.add_argument("--rate-mbit", type=float, default=500.0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--workloads", default="resnet18,resnet50")
    p.add_argument("--out", default="/tmp/commprof-predict-validate")
    p.add_argument("--results", default=os.path.join(HERE, "results", "predict_validate"))
    p.add_argument("--skip-runs", action="store_true", help="reuse the recorded runs in --out")
    args = p.parse_args()
    reason = why_unavailable()
    if reason:
        sys.exit(f"predict_validate: {reason}")
    nodes = [int(x) for x in args.nodes.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    stem = f"{time.strftime('%Y-%m-%d')}-{commit}"
    port = 29800
    summary = {"rate_mbit": args.rate_mbit, "steps": args.steps, "nodes": nodes, "workloads": {}}
    for name in args.workloads.split(","):
        study = os.path.join(args.out, name)
        if not args.skip_runs:
            for n in nodes:
                out = os.path.join(study, str(n))
                subprocess.run(["rm", "-rf", out])
                t0 = time.time()
                port += 11
                rc = run_cell(name, n, out, args.rate_mbit, args.steps, port)
                print(f"{name} @ {n}: exit {rc} in {time.time() - t0:.0f} s", flush=True)
                if rc:
                    sys.exit(f"predict_validate: {name} at {n} nodes failed")
        proc = subprocess.run([PY, "-m", "commprof", "predict", study, "--validate", "--wide", "--plain"],
                              env=env(), cwd=ROOT, capture_output=True, text=True)
        print(proc.stdout, proc.stderr, flush=True)
        js = subprocess.run([PY, "-m", "commprof", "predict", study, "--validate", "--format", "json"],
                            env=env(), cwd=ROOT, capture_output=True, text=True)
        doc = json.loads(js.stdout)
        os.makedirs(args.results, exist_ok=True)
        with open(os.path.join(args.results, f"{stem}-{name}.txt"), "w") as fh:
            fh.write(f"# commprof predict --validate on the one-machine cluster: {name}, nodes {args.nodes}, "
                     f"links shaped to {args.rate_mbit:g} Mbit/s, {args.steps} steps per run\n")
            fh.write(proc.stdout)
        summary["workloads"][name] = doc
    with open(os.path.join(args.results, f"{stem}.json"), "w") as fh:
        json.dump(summary, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
