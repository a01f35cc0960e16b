"""The one-command GPU check (needs CUDA; installs nothing).

    python3 tests/gpu/gpu_check.py [--steps 40] [--out DIR]

ResNet-50, DDP with NCCL on 1 GPU, the default DataLoader over generated
images (8 workers), three runs: plain, under ``commprof record``, and under
``commprof record --kernels 12:3``. Checks (printed; exit 1 if one fails):

1. device times: forward / backward / optimizer rows carry dev_start /
   dev_end, all durations > 0, and per step their summed device time is at
   most the step time (+2 %);
2. kernel mode finds cuDNN kernels (through their launching ops) and
   reports whether NCCL kernels ran (with one rank NCCL may skip them);
3. telemetry: gpu.util / gpu.mem_used_mib / gpu.power_w / gpu.sm_clock_mhz
   metrics were sampled;
4. overhead: median step time recorded vs plain (printed, target <= 1 %;
   not a pass/fail criterion).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def run(cmd, env):
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return proc


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: nothing to check")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="4", PYTHONUNBUFFERED="1")
    py = sys.executable
    wl = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "workloads/resnet.py",
          "--arch", "resnet50", "--steps", str(args.steps), "--batch-size", str(args.batch_size),
          "--image-size", str(args.image_size), "--workers", "8", "--samples", str(args.batch_size * 64)]
    times = {}
    for name, prefix in (("plain", []),
                         ("recorded", [py, "-m", "commprof", "record", "-o", os.path.join(args.out, "rec"), "--"]),
                         ("kernels", [py, "-m", "commprof", "record", "-o", os.path.join(args.out, "kern"),
                                      "--kernels", "12:3", "--"])):
        tfile = os.path.join(args.out, f"steps-{name}.json")
        run(prefix + wl + ["--step-times", tfile], env)
        with open(tfile) as fh:
            times[name] = json.load(fh)[10:]
    from commprof import assemble

    results, ok = {}, True
    ev = assemble.load(os.path.join(args.out, "rec")).table.to_pandas()
    regions = ev[ev["name"].astype(str).isin(["forward", "backward", "optimizer"])]
    steps = ev[ev["category"] == "step"].set_index("step")
    with_dev = regions["dev_start"].notna()
    dur = (regions["dev_end"] - regions["dev_start"])
    results["device_rows"] = int(with_dev.sum())
    results["device_rows_total"] = int(len(regions))
    results["device_durations_positive"] = bool((dur[with_dev] > 0).all())
    per_step = dur[with_dev].groupby(regions.loc[with_dev, "step"]).sum()
    host = (steps["t_end"] - steps["t_start"]).reindex(per_step.index)
    results["device_sum_le_step"] = bool((per_step <= host * 1.02).all())
    results["device_share_of_step_median_pct"] = float((100 * per_step / host).median())
    ok &= results["device_rows"] == results["device_rows_total"] > 0
    ok &= results["device_durations_positive"] and results["device_sum_le_step"]

    kv = assemble.load(os.path.join(args.out, "kern")).table.to_pandas()
    kern = kv[kv["category"] == "kernel"]
    results["kernel_classes"] = kern["name"].astype(str).value_counts().to_dict()
    results["cudnn_kernels"] = int((kern["name"] == "cudnn").sum())
    results["nccl_kernels"] = int((kern["name"] == "nccl").sum())
    ok &= results["cudnn_kernels"] > 0

    met = ev[ev["category"] == "metric"]
    results["telemetry"] = met["name"].astype(str).value_counts().to_dict()
    ok &= all(results["telemetry"].get(n, 0) > 0 for n in ("gpu.util", "gpu.mem_used_mib", "gpu.power_w",
                                                          "gpu.sm_clock_mhz"))
    plain, rec = statistics.median(times["plain"]), statistics.median(times["recorded"])
    results["median_step_ms"] = {"plain": plain * 1e3, "recorded": rec * 1e3}
    results["overhead_pct"] = 100 * (rec / plain - 1)
    results["ok"] = bool(ok)
    report = run([py, "-m", "commprof", "report", os.path.join(args.out, "kern")], env).stdout
    with open(os.path.join(args.out, "gpu_check.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    print(report)
    print(json.dumps(results, indent=1))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
