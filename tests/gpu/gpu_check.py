"""The one-command GPU check (needs CUDA; installs nothing).

    python3 tests/gpu/gpu_check.py [--steps 30] [--out DIR] [--budget-s 480]
    python3 tests/gpu/gpu_check.py --dry-run     # on CPU: the same runs and checks, tiny,
                                                 # gloo, a simulated device (tests the check itself)

Built to survive its one chance on a borrowed GPU: every run has its own
timeout, every log is written as it goes (``DIR/*.log``), and the JSON
summary ``DIR/gpu_check.json`` is rewritten after every check, so whatever
happened before a failure or a kill is on disk. Runs, each with DDP over
NCCL on one GPU (``--framework ddp``: a real process group, DDP timed
through the process group's hooks — and once through the timed comm hook,
``--ddp-timing comm-hook`` — NCCL kernels):

- ResNet-50 (batch 64, 224 px): plain, under ``commprof record``, under
  ``commprof record --kernels 8:3``;
- ResNet-18 (batch 8, 64 px, a host-bound step): plain, recorded, and
  recorded with ``--ddp-timing comm-hook``, so the hooks' host cost (and
  the two DDP timing points') is visible where it matters most;
- an NCCL micro-test: blocking and async ``all_reduce`` of 64 MiB and
  256 MiB under ``commprof record`` (one rank: NCCL still launches its
  kernels), busbw from device times;
- a fork micro-test: a recorded process that uses CUDA, then forks a child
  that must not touch CUDA (exit code 0 expected).

Checks (exit 1 if one fails):

1. device times: every forward / backward / optimizer / collective row has
   dev_start <= dev_end, and per row the device start is never earlier
   than its host issue (dev_start >= t_start - 50 µs for the reference
   mapping's error); the device step span (first device start to last
   device end of a step's rows) is at least the summed device time of the
   step's compute rows minus 2 % (serial stream);
2. collectives are timed on the device: the recorded all_reduce latency of
   the micro-test is at least the host enqueue time, and its busbw is
   printed (one GPU: NCCL copies locally; a real number needs 2+ GPUs);
3. kernel mode finds cuDNN kernels (through their launching ops) and NCCL
   kernels, and no collective is counted twice (comm rows only from the
   host, one per (group, seq));
4. telemetry: gpu.util / gpu.mem_used_mib / gpu.sm_clock_mhz sampled;
5. overhead (printed, target <= 1 %): median step recorded vs plain.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

SUMMARY = {"ok": None, "checks": {}, "runs": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}


def save(out):
    path = os.path.join(out, "gpu_check.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(SUMMARY, fh, indent=1, default=str)
    os.replace(tmp, path)


def check(out, name, passed, **figures):
    SUMMARY["checks"][name] = {"ok": bool(passed), **figures}
    save(out)
    print(f"[{'ok' if passed else 'FAIL'}] {name}: {json.dumps(figures, default=str)}", flush=True)
    return bool(passed)


def run(out, name, cmd, env, timeout):
    """Run one command with its own timeout, its output streamed to DIR/name.log."""
    log = os.path.join(out, f"{name}.log")
    t0 = time.monotonic()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    SUMMARY["runs"][name] = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1), "log": log}
    save(out)
    print(f"run {name}: rc={rc} in {SUMMARY['runs'][name]['wall_s']} s", flush=True)
    return rc == 0


NCCL_MICRO = r'''
import os, sys, torch, torch.distributed as dist
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
if cuda:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
sync = torch.cuda.synchronize if cuda else (lambda: None)
for mib in ((64, 256) if cuda else (1, 4)):
    x = torch.ones(mib * 2**20 // 4, device="cuda" if cuda else "cpu")
    for _ in range(3):
        dist.all_reduce(x)                       # blocking: returns at enqueue on NCCL
    for _ in range(3):
        dist.all_reduce(x, async_op=True).wait()
    sync()
    # an optimizer step closes a training step, so the rows have one
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, device=x.device))], lr=0.1)
    opt.step()
sync()
dist.destroy_process_group()
'''

FORK_MICRO = r'''
import os, sys, torch
def train(device, n=3):
    model = torch.nn.Linear(8, 8).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        model(torch.ones(4, 8, device=device)).sum().backward(); opt.step()
def fork(child):
    pid = os.fork()
    if pid == 0:
        try:
            child()
            code = 0
        except Exception as exc:
            print("child failed:", repr(exc), flush=True)
            code = 1
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
# A: a parent that has not used CUDA (but is recorded) forks a child that
# does: fails if anything in the parent initialised CUDA (is_available())
train("cpu")
a = fork(lambda: (train("cuda"), torch.cuda.synchronize()))
# B: a parent with CUDA and device timing forks a child that never touches
# CUDA: the child must not destroy the parent's CUDA events
train("cuda")
torch.cuda.synchronize()
b = fork(lambda: None)
print("fork A (child uses CUDA):", a, "fork B (parent used CUDA):", b, flush=True)
sys.exit(0 if a == 0 and b == 0 else 1)
'''


def device_checks(out, path, prefix):
    import numpy as np

    from commprof import assemble

    ev = assemble.load(path).table.to_pandas()
    rows = ev[ev["name"].astype(str).isin(["forward", "backward", "optimizer"]) | (ev["category"] == "comm")]
    rows = rows[rows["dev_start"].notna()]
    ok = check(out, f"{prefix}: device rows", len(rows) > 0, rows=len(rows),
               of=int((ev["name"].astype(str).isin(["forward", "backward", "optimizer"])
                       | (ev["category"] == "comm")).sum()))
    lead_us = ((rows["t_start"] - rows["dev_start"]) / 1e3)
    ok &= check(out, f"{prefix}: device never before host issue", bool((lead_us <= 50).all()),
                worst_lead_us=float(lead_us.max()) if len(rows) else None)
    ok &= check(out, f"{prefix}: device intervals ordered", bool((rows["dev_end"] >= rows["dev_start"]).all()))
    comp = rows[rows["category"] == "compute"]
    by = comp.groupby("step")
    span = by["dev_end"].max() - by["dev_start"].min()
    busy = (comp["dev_end"] - comp["dev_start"]).groupby(comp["step"]).sum()
    ok &= check(out, f"{prefix}: device step span covers its compute", bool((span >= busy * 0.98).all()),
                median_span_ms=float(np.median(span) / 1e6) if len(span) else None,
                median_busy_ms=float(np.median(busy) / 1e6) if len(busy) else None)
    return ok, ev


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    p.add_argument("--budget-s", type=float, default=480, help="stop starting runs after this long")
    p.add_argument("--dry-run", action="store_true",
                   help="on CPU: tiny runs over gloo with a simulated device (checks the check itself)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    save(args.out)
    import torch

    SUMMARY["torch"] = torch.__version__
    SUMMARY["dry_run"] = args.dry_run
    if not torch.cuda.is_available() and not args.dry_run:
        SUMMARY["ok"] = False
        SUMMARY["error"] = "no CUDA device"
        save(args.out)
        raise SystemExit("no CUDA device: nothing to check")
    SUMMARY["device"] = torch.cuda.get_device_name(0) if not args.dry_run else "cpu (simulated device)"
    save(args.out)
    t_start = time.monotonic()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="4", PYTHONUNBUFFERED="1")
    py = sys.executable

    def torchrun(script, *a):
        return [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", script, *a]

    sim = ["--simulate-device-lag-ms", "2"] if args.dry_run else []

    def rec(name, *opts):
        return [py, "-m", "commprof", "record", "-o", os.path.join(args.out, name), *sim, *opts, "--"]

    if args.dry_run:  # same shape of runs, small enough for a 2-core CPU
        r50 = ["--arch", "resnet18", "--framework", "ddp", "--steps", "12", "--batch-size", "4",
               "--image-size", "32", "--workers", "0", "--samples", "64", "--no-val"]
        r18 = r50
    else:
        r50 = ["--arch", "resnet50", "--framework", "ddp", "--steps", str(args.steps), "--batch-size", "64",
               "--image-size", "224", "--workers", "8", "--samples", str(64 * 32), "--no-val"]
        r18 = ["--arch", "resnet18", "--framework", "ddp", "--steps", str(args.steps * 2), "--batch-size", "8",
               "--image-size", "64", "--workers", "4", "--samples", str(8 * 64), "--no-val"]
    plan = [
        ("r50-plain", [], r50, 150), ("r50-recorded", rec("r50-rec"), r50, 150),
        ("r50-kernels", rec("r50-kern", "--kernels", "6:3" if args.dry_run else "8:3"), r50, 180),
        ("r18-plain", [], r18, 90), ("r18-recorded", rec("r18-rec"), r18, 90),
        # DDP's fallback timing point (a timed comm hook) next to the default (the process group's hooks)
        ("r18-recorded-comm-hook", rec("r18-rec-hook", "--ddp-timing", "comm-hook"), r18, 90),
    ]
    times, ok = {}, True
    for name, prefix, wl, timeout in plan:
        if time.monotonic() - t_start > args.budget_s:
            SUMMARY["runs"][name] = {"rc": "skipped (budget)"}
            save(args.out)
            continue
        tfile = os.path.join(args.out, f"steps-{name}.json")
        if run(args.out, name, prefix + torchrun("workloads/resnet.py", *wl, "--step-times", tfile), env, timeout):
            with open(tfile) as fh:
                times[name] = json.load(fh)[5:]
        else:
            ok = False
    if time.monotonic() - t_start < args.budget_s:
        micro = os.path.join(args.out, "nccl_micro.py")
        with open(micro, "w") as fh:
            fh.write(NCCL_MICRO)
        ok &= run(args.out, "nccl-micro", rec("nccl-rec") + torchrun(micro), env, 120)
        if not args.dry_run:  # needs CUDA
            fork = os.path.join(args.out, "fork_micro.py")
            with open(fork, "w") as fh:
                fh.write(FORK_MICRO)
            ok &= check(args.out, "fork after CUDA under commprof",
                        run(args.out, "fork-micro", rec("fork-rec") + [py, fork], env, 60))

    for name in ("r50-rec", "r18-rec", "r18-rec-hook"):
        path = os.path.join(args.out, name)
        if os.path.exists(os.path.join(path, "trace.parquet")):
            good, ev = device_checks(args.out, path, name)
            ok &= good
            if name == "r50-rec":
                met = ev[ev["category"] == "metric"]["name"].astype(str).value_counts().to_dict()
                if not args.dry_run:  # NVML
                    ok &= check(args.out, "telemetry", all(met.get(n, 0) > 0 for n in
                                                           ("gpu.util", "gpu.mem_used_mib", "gpu.sm_clock_mhz")),
                                metrics=met)
    nccl = os.path.join(args.out, "nccl-rec")
    if os.path.exists(os.path.join(nccl, "trace.parquet")):
        from commprof import assemble

        ev = assemble.load(nccl).table.to_pandas()
        c = ev[(ev["category"] == "comm") & (ev["name"].astype(str) == "all_reduce") & ev["dev_start"].notna()]
        dev_ms = (c["dev_end"] - c["dev_start"]) / 1e6
        host_ms = (c["t_end"] - c["t_start"]) / 1e6
        busbw = {}
        for nbytes, g in c.assign(dev_ms=dev_ms).groupby("bytes"):
            busbw[f"{int(nbytes) >> 20} MiB"] = {"dev_ms_median": float(g["dev_ms"].median()),
                                                 "algbw_GBps": float(nbytes / (g["dev_ms"].median() / 1e3) / 1e9),
                                                 "blocking": g["blocking"].astype(bool).value_counts().to_dict()}
        ok &= check(args.out, "collectives timed on the device", len(c) >= 10 and bool((dev_ms >= 0).all()),
                    rows=len(c), dev_vs_host_median=float((dev_ms / host_ms.clip(lower=1e-6)).median())
                    if len(c) else None, by_size=busbw)
    kern = os.path.join(args.out, "r50-kern")
    if os.path.exists(os.path.join(kern, "trace.parquet")):
        from commprof import assemble

        kv = assemble.load(kern).table.to_pandas()
        k = kv[kv["category"] == "kernel"]
        comm = kv[kv["category"] == "comm"]
        dup = int(comm.duplicated(["rank", "group", "seq"]).sum())
        found_cudnn = int((k["name"] == "cudnn").sum()) > 0 or args.dry_run  # CPU ops have no cuDNN
        ok &= check(args.out, "kernel mode", found_cudnn and dup == 0,
                    classes=k["name"].astype(str).value_counts().to_dict(),
                    nccl_kernels=int((k["name"] == "nccl").sum()), duplicate_collectives=dup,
                    comm_sources=comm["source"].astype(str).value_counts().to_dict())
    over = {}
    for wl, recorded in (("r50", "r50-recorded"), ("r18", "r18-recorded"), ("r18 comm-hook", "r18-recorded-comm-hook")):
        plain_name = wl.split()[0] + "-plain"
        if plain_name in times and recorded in times:
            plain, recd = statistics.median(times[plain_name]), statistics.median(times[recorded])
            over[wl] = {"plain_ms": plain * 1e3, "recorded_ms": recd * 1e3, "overhead_pct": 100 * (recd / plain - 1)}
    SUMMARY["overhead"] = over
    SUMMARY["ok"] = bool(ok)
    SUMMARY["wall_s"] = round(time.monotonic() - t_start, 1)
    save(args.out)
    for name in ("r50-kern", "nccl-rec"):
        path = os.path.join(args.out, name)
        if os.path.exists(os.path.join(path, "trace.parquet")):
            run(args.out, f"report-{name}", [py, "-m", "commprof", "report", path], env, 120)
    print(json.dumps(SUMMARY, indent=1, default=str))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
