"""Kernel mode recorded N times on a loaded machine: does every rank end
cleanly after ``--kernels`` stops torch.profiler (no heap corruption, no
abort), with one merged kernel window per rank? Not a test
(tests/record/test_gpu_paths_on_cpu.py runs the same job once).

The job, under torchrun, 2 ranks, gloo, CPU, ``commprof record --kernels
START:COUNT``: ``--workload tiny`` (tests/workloads/tiny.py, an MLP whose
window exports in milliseconds) or ``resnet`` (workloads/resnet.py as the
GPU check's dry run runs it: ResNet-18, 12 steps, window 6:3, whose export
takes seconds and overlaps the steps after the window); with ``--load`` a process
keeps one core busy the whole time (the machine has two). Per run: the
exit status, whether any rank printed a glibc heap error (``malloc():``,
``free():``, ``corrupted``, ``double free``) or died of a signal, and
how many kernel traces were merged.

    python benchmarks/kernels_repeat.py --runs 20 --load 1 --out FILE.md
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "workloads", "tiny.py")
HEAP = re.compile(r"malloc\(\)|free\(\)|corrupted|double free|Fatal Python error|Segmentation fault|Aborted")


RESNET = ["workloads/resnet.py", "--arch", "resnet18", "--framework", "ddp", "--batch-size", "4", "--image-size",
          "32", "--workers", "0", "--samples", "64", "--no-val"]


def one(folder: str, window: str, steps: int, workload: str, opts: list):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    cmd = [sys.executable, "-m", "commprof", "record", "-o", folder, "--kernels", window, "--keep-shards", *opts, "--",
           "torchrun", "--standalone", "--nproc_per_node=2"] + (
        [TINY] if workload == "tiny" else RESNET) + ["--steps", str(steps)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    wall = time.monotonic() - t0
    shards = os.path.join(folder, "shards")
    kin = [f for f in os.listdir(shards) if f.startswith("kineto.")] if os.path.isdir(shards) else []
    heap = sorted({m.group(0) for m in HEAP.finditer(p.stderr)})
    return p.returncode, heap, len(kin), wall, p.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--workload", choices=("tiny", "resnet"), default="tiny")
    ap.add_argument("--window", default=None, help="default: 2:2 (tiny), 6:3 (resnet)")
    ap.add_argument("--steps", type=int, default=None, help="default: 6 (tiny), 12 (resnet)")
    ap.add_argument("--load", type=int, nargs="?", const=1, default=0,
                    help="keep N cores busy meanwhile (N: 1 when not given)")
    ap.add_argument("--record-opts", default="", help="more `commprof record` options (one string)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.window = a.window or ("2:2" if a.workload == "tiny" else "6:3")
    a.steps = a.steps or (6 if a.workload == "tiny" else 12)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    rows, bad = [], []
    try:
        for k in range(a.runs):
            folder = tempfile.mkdtemp(prefix="kernrep")
            try:
                rc, heap, kin, wall, err = one(os.path.join(folder, "rec"), a.window, a.steps, a.workload,
                                               a.record_opts.split())
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            rows.append((k, rc, heap, kin, wall))
            if rc or heap or kin != 2:
                bad.append((k, err[-3000:]))
            print(f"run {k}: exit {rc}, heap errors {heap or 'none'}, kernel traces {kin}, {wall:.1f} s", flush=True)
    finally:
        for b in busy:
            b.kill()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    clean = sum(1 for _, rc, heap, kin, _ in rows if rc == 0 and not heap and kin == 2)
    text = [f"# kernels_repeat, {datetime.date.today()}, commit {commit.strip()}", "",
            f"    python benchmarks/kernels_repeat.py --runs {a.runs} --workload {a.workload} --window {a.window}"
            f" --steps {a.steps}"
            + (f" --load {a.load}" if a.load else "") + (f" --record-opts '{a.record_opts}'" if a.record_opts else ""),
            "",
            f"{clean} of {len(rows)} runs clean (exit 0, no heap error, a kernel trace per rank)"
            + (f"; {a.load} core(s) of {os.cpu_count()} kept busy throughout" if a.load else "") + ".", "",
            "| run | exit | heap / signal messages | kernel traces | wall (s) |", "|---:|---:|---|---:|---:|"]
    text += [f"| {k} | {rc} | {', '.join(heap) or '-'} | {kin} | {wall:.1f} |" for k, rc, heap, kin, wall in rows]
    for k, err in bad:
        text += ["", f"## run {k}: the end of its stderr", "", "```text", err, "```"]
    out = "\n".join(text) + "\n"
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(out)
    print(out)
    return 0 if clean == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
