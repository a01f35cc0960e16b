"""Recording overhead (not a test): plain vs ``commprof record`` vs
``commprof record --flush-interval 3600`` (no flush while training: isolates
the journal writer) vs ``torch.profiler`` (CPU activities, record_shapes),
on two workloads, 2 CPU ranks, DDP over gloo:

- ``short``: a small DDP MLP (``benchmarks/short_step.py``), ~10-20 ms steps
  — the regime of GPU steps and launch-bound models, where per-step costs
  show;
- ``resnet18``: ``workloads/resnet.py`` (ResNet-18, 64x64, batch 16/rank),
  ~0.5 s steps.

Variants run interleaved (plain, record, record-noflush, profiler, plain,
...) ``--repeats`` times, so drift on a noisy machine hits all alike. Per
run: rank 0's median wall time per step, and the median CPU time per step
(``time.process_time()`` of the whole rank process: hooks and writer thread
included) averaged over both ranks, after ``--warmup`` steps. The figure per
variant is the median over runs; the ratio's spread is the min-max of the
per-repeat ratios (variant / the plain run of the same repeat).

    python benchmarks/overhead.py [--workloads short,resnet18] [--repeats 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = {
    "short": (os.path.join(ROOT, "benchmarks", "short_step.py"), ["--steps", "300"], 50),
    "resnet18": (os.path.join(ROOT, "workloads", "resnet.py"),
                 ["--steps", "40", "--arch", "resnet18", "--batch-size", "16", "--image-size", "64"], 5),
}
VARIANTS = ("plain", "commprof record", "record, no flush", "torch.profiler")


def torchrun(script_args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] + script_args


def command(variant, script, wl_args, out):
    wl = [script] + wl_args
    if variant == "plain":
        return torchrun(wl)
    if variant == "commprof record":
        return [sys.executable, "-m", "commprof", "record", "-o", out, "--"] + torchrun(wl)
    if variant == "record, no flush":
        return [sys.executable, "-m", "commprof", "record", "-o", out, "--flush-interval", "3600", "--"] \
            + torchrun(wl)
    if variant == "record --ddp-timing comm-hook":
        return [sys.executable, "-m", "commprof", "record", "-o", out, "--ddp-timing", "comm-hook", "--"] \
            + torchrun(wl)
    if variant.startswith("record --disable "):
        flags = []
        for name in variant[len("record --disable "):].split("+"):
            flags += ["--disable", name]
        return [sys.executable, "-m", "commprof", "record", "-o", out] + flags + ["--"] + torchrun(wl)
    return torchrun([os.path.join(ROOT, "benchmarks", "_under_torch_profiler.py")] + wl)


def run_once(variant, script, wl_args, tmp, tag, warmup, env):
    times = os.path.join(tmp, f"times-{tag}.json")
    cmd = command(variant, script, wl_args, os.path.join(tmp, f"rec-{tag}")) + ["--step-times", times]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{variant} failed:\n{proc.stderr[-2000:]}")
    root, ext = os.path.splitext(times)
    ranks = []
    for r in (0, 1):
        with open(f"{root}.rank{r}{ext}") as fh:
            ranks.append(json.load(fh))
    wall = statistics.median(ranks[0]["wall"][warmup:])
    cpu = statistics.mean(statistics.median(d["cpu"][warmup:]) for d in ranks)
    return wall, cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="short,resnet18")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--split", default="",
                   help="extra variants, comma-separated instrument sets to leave out (e.g. ddp,module,ddp+module):"
                        " each runs as 'record --disable X' to split the cost by instrument")
    p.add_argument("--comm-hook", action="store_true",
                   help="also 'record --ddp-timing comm-hook' (DDP timed through a Python comm hook, the "
                        "fallback path, instead of the process group's hooks)")
    args = p.parse_args()
    variants = (VARIANTS + (("record --ddp-timing comm-hook",) if args.comm_hook else ())
                + tuple(f"record --disable {x.strip()}" for x in args.split.split(",") if x.strip()))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    for wname in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        script, wl_args, warmup = WORKLOADS[wname]
        wall = {v: [] for v in variants}
        cpu = {v: [] for v in variants}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):
                for k, v in enumerate(variants):
                    w, c = run_once(v, script, wl_args, tmp, f"{wname}-{i}-{k}", warmup, env)
                    wall[v].append(w)
                    cpu[v].append(c)
                    print(f"{wname} run {i + 1}/{args.repeats} {v:18s} step {w * 1e3:8.2f} ms wall, "
                          f"{c * 1e3:8.2f} ms CPU", file=sys.stderr, flush=True)
        base_w, base_c = statistics.median(wall["plain"]), statistics.median(cpu["plain"])
        print(f"\n{wname}: 2 CPU ranks (gloo), {args.repeats} interleaved repeats, "
              f"first {warmup} steps of each run left out\n")
        print("| variant | step wall (ms) | vs plain | +µs/step | ratio spread | CPU/step (ms) | vs plain "
              "| +µs CPU/step | CPU ratio spread |")
        print("|---|---:|---:|---:|---|---:|---:|---:|---|")
        for v in variants:
            mw, mc = statistics.median(wall[v]), statistics.median(cpu[v])
            rw = [a / b for a, b in zip(wall[v], wall["plain"])]
            rc = [a / b for a, b in zip(cpu[v], cpu["plain"])]
            print(f"| {v} | {mw * 1e3:.2f} | x{mw / base_w:.3f} | {(mw - base_w) * 1e6:+.0f} | "
                  f"{min(rw):.3f}-{max(rw):.3f} | {mc * 1e3:.2f} | x{mc / base_c:.3f} | "
                  f"{(mc - base_c) * 1e6:+.0f} | {min(rc):.3f}-{max(rc):.3f} |", flush=True)
        rec = statistics.median(wall["commprof record"]) / base_w - 1
        prof = statistics.median(wall["torch.profiler"]) / base_w - 1
        print(f"\n{wname}: commprof {100 * rec:+.2f} % wall, torch.profiler {100 * prof:+.2f} %"
              + (f" (commprof / profiler overhead: {rec / prof:.2f})" if prof > 0 else ""), flush=True)


if __name__ == "__main__":
    main()
