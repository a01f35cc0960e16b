"""Recording overhead on the default workload (not a test).

Median step time of ``workloads/resnet.py`` (ResNet-18, DDP, 2 CPU ranks,
gloo) three ways: plain, under ``commprof record``, and under
``torch.profiler`` (CPU activities, record_shapes). Each variant runs
``--repeats`` times, interleaved (A B C A B C ...) so that drift on a busy
machine hits all variants alike; the figure per variant is the median over
runs of rank 0's median step time after ``--warmup`` steps.

    python benchmarks/overhead.py [--steps 40] [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOAD = os.path.join(ROOT, "workloads", "resnet.py")


def torchrun(script_args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] + script_args


def variants(args, tmp, i):
    wl = [WORKLOAD, "--steps", str(args.steps), "--arch", args.arch, "--batch-size", str(args.batch_size),
          "--image-size", str(args.image_size)]
    yield "plain", torchrun(wl)
    yield "commprof record", [sys.executable, "-m", "commprof", "record", "-o",
                              os.path.join(tmp, f"rec{i}"), "--"] + torchrun(wl)
    yield "torch.profiler", torchrun([os.path.join(ROOT, "benchmarks", "_under_torch_profiler.py")] + wl)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64)
    args = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    medians = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, cmd in variants(args, tmp, i):
                times_file = os.path.join(tmp, f"times-{i}-{name.replace(' ', '_')}.json")
                proc = subprocess.run(cmd + ["--step-times", times_file], env=env, cwd=ROOT,
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"{name} failed:\n{proc.stderr[-2000:]}")
                with open(times_file) as fh:
                    times = json.load(fh)[args.warmup:]
                medians.setdefault(name, []).append(statistics.median(times) * 1e3)
                print(f"run {i + 1}/{args.repeats} {name:16s} median step {medians[name][-1]:.2f} ms",
                      file=sys.stderr, flush=True)
    base = statistics.median(medians["plain"])
    print(f"\nResNet-18 ({args.image_size}x{args.image_size}, batch {args.batch_size}/rank), DDP, "
          f"2 CPU ranks (gloo), {args.steps} steps, first {args.warmup} left out, "
          f"median of {args.repeats} interleaved runs\n")
    print("| variant | median step (ms) | vs plain | runs (ms) |")
    print("|---|---:|---:|---|")
    for name, vals in medians.items():
        m = statistics.median(vals)
        print(f"| {name} | {m:.2f} | x{m / base:.3f} | {', '.join(f'{v:.1f}' for v in vals)} |")
    rec = statistics.median(medians["commprof record"]) / base - 1
    prof = statistics.median(medians["torch.profiler"]) / base - 1
    print(f"\ncommprof overhead {100 * rec:+.2f} %, torch.profiler {100 * prof:+.2f} %"
          + (f", ratio {rec / prof:.2f}" if prof > 0 else ""))


if __name__ == "__main__":
    main()
