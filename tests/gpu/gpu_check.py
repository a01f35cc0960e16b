"""The one-command GPU check (needs CUDA; installs nothing).

    python3 tests/gpu/gpu_check.py [--out DIR]          # on a GPU machine, <= 8 min
    python3 tests/gpu/gpu_check.py --dry-run            # on CPU: the same runs and checks, tiny,
                                                        # gloo, a simulated device
    python3 tests/gpu/gpu_check.py --dry-run --inject skip|missing-trace|device-before-host|orphan
                                                        # a fault on purpose: the verdict must fail
    python3 tests/gpu/gpu_check.py --recheck --out DIR  # the checks again on DIR's completed runs

Built for its one chance on a borrowed GPU:

- **The budget plan comes first**: every run, its timeout and the sum
  (at most ``PLAN_LIMIT_S`` = 8 minutes) are printed and written before
  anything starts; runs are ordered by value (NCCL AllReduce truth first,
  then the recorded DDP run and its plain twin). A run whose timeout no
  longer fits in ``--budget-s`` is *not run (budget)*.
- **Nothing but GPU work on the device clock**: no native-hook build
  (``--no-native-hooks``: DDP on NCCL never uses them), random weights,
  synthetic data, nothing downloaded.
- **No orphans**: each run is its own session (setsid) and is killed as a
  group on timeout; after each run every process that inherited the run's
  marker variable is found through /proc (and, on a GPU, every compute
  process NVML lists on the device), reported and killed, so the next run
  starts on an idle GPU.
- **Every check is pass, fail, or not run (why)**; a check that cannot
  apply to this machine (NCCL kernels with one rank) is *n/a (why)*. The
  verdict is pass only when every planned check ran and none failed; the
  JSON (``DIR/gpu_check.json``, rewritten after every step) lists what did
  not run and why, and the exit code is the verdict's (0 pass, 1 fail).
- **The dry run goes through the same gates**: the same plan, the same
  checks and bounds code (expectations that depend on the device, such as
  which kernel class a convolution gets, are looked up from the device, not
  skipped), the fork and telemetry runs included. ``--inject`` plants one
  fault so that a test can see the verdict fail with the check named.

Runs (DDP over NCCL on the GPU(s); one rank per GPU, at most 2):
nccl-micro (blocking and async all_reduce of 64 and 256 MiB, out-of-place
all_gather), ResNet-50 recorded / plain / kernel mode, ResNet-18 plain /
recorded / recorded with ``--ddp-timing comm-hook``, a fork after CUDA,
the report of the recorded runs, FSDP2 (``fully_shard`` per layer, forward
prefetch: its layers, phases and device times), then the recording overhead of each
ResNet measured in one process (``benchmarks/overhead_paired.py``: the
recording switched on and off between blocks of steps on the same model,
DDP and loader; the A/A control ``plain2`` beside it).

Why in one process: on the H200 two plain runs of the same job, one after
the other, differed by -8 % (ResNet-50) and +19 % (ResNet-18) in their
median step, more than the bounds checked (3 %, 10 %); the separate
plain / recorded runs' figures are still reported (``overhead_runs``), as
what a user comparing two jobs would see, but are not a check.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

#: the whole plan's timeouts may sum to at most this (8 minutes: a lent GPU
#: has 15 minutes in all, start-up and copies included)
PLAN_LIMIT_S = 480
#: (run, timeout s), in order of value
PLAN = [
    ("nccl-micro", 40), ("r50-recorded", 40), ("r50-plain", 30), ("r50-kernels", 40),
    ("r18-plain", 30), ("r18-recorded", 30), ("r18-recorded-comm-hook", 30), ("fork-micro", 40),
    ("report", 15),
    # the overhead, in one process each (on an H200: ResNet-50 60 rounds
    # 74 s, ResNet-18 100 rounds 45 s, start-up included; the runs above
    # took 12-19 s, fork-micro 10-31 s, report 1-2 s on three H200s)
    ("r50-paired", 90), ("r18-paired", 65),
    # FSDP2 on NCCL (fully_shard per layer, forward prefetch): its layers and phases, device times
    ("fsdp2-recorded", 30),
]
#: the in-process overhead runs: check name -> run
PAIRED = {"r50": "r50-paired", "r18": "r18-paired"}
#: overhead bounds (the mean over rounds of a recorded block's step minus
#: the same round's plain block's, over the plain step), in %: the target is
#: 1 % for a GPU-bound step. Tiny CPU dry runs are noise-dominated: their
#: bound only catches a broken recording (x2).
OVERHEAD_BOUND_PCT = {"gpu": {"r50": 3.0, "r18": 10.0}, "dry": {"r50": 100.0, "r18": 100.0}}
#: the figure held against the bound: on a GPU the wall time (the device
#: runs asynchronously: the host's CPU time misses what the recording
#: costs it); in a dry run the rank's CPU time, which a neighbour's load
#: does not inflate -- one round's block slowed by the test suite's other
#: tests put the wall-time mean of a dry run's 10.6 ms steps at +128 %;
#: its CPU cost was 0.48 ms a step
OVERHEAD_JUDGED = {"gpu": "overhead_pct", "dry": "cpu_overhead_pct"}
#: separate runs compared for the figures only (plain, recorded)
OVERHEAD_RUNS = {"r50": ("r50-plain", "r50-recorded"), "r18": ("r18-plain", "r18-recorded"),
                 "r18 comm-hook": ("r18-plain", "r18-recorded-comm-hook")}
#: upper bound of a plausible algbw (GB/s): device memory bandwidth (an H200's
#: HBM3e is 4.8 TB/s; a one-rank collective is at most a device copy)
PHYSICAL_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "cpu": 200.0}
MARKER = "COMMPROF_GPU_CHECK_RUN"
EXIT_GRACE_S = 2.0  # how long a run's helpers may take to leave after its main process
INJECT = ("skip", "missing-trace", "device-before-host", "orphan")

SUMMARY = {"verdict": None, "ok": None, "checks": {}, "runs": {}, "not_run": {}, "plan": [],
           "started": time.strftime("%Y-%m-%dT%H:%M:%S")}


def save(out):
    path = os.path.join(out, "gpu_check.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(SUMMARY, fh, indent=1, default=str)
    os.replace(tmp, path)


def _earlier_runs(out):
    """The runs an earlier check in ``out`` completed (exit 0, nothing left
    behind, its log still there), their logs found in ``out`` as it is now
    (a copied folder included)."""
    try:
        with open(os.path.join(out, "gpu_check.json")) as fh:
            runs = json.load(fh).get("runs") or {}
    except (OSError, ValueError):
        return {}
    done = {}
    for name, r in runs.items():
        log = os.path.join(out, f"{name}.log")
        if r.get("rc") == 0 and not r.get("left_behind") and os.path.exists(log):
            done[name] = dict(r, log=log)
    return done


def check(out, name, passed, **figures):
    """Record one check as pass or fail, with its figures."""
    SUMMARY["checks"][name] = {"status": "pass" if passed else "fail", **figures}
    save(out)
    print(f"[{'pass' if passed else 'FAIL'}] {name}: {json.dumps(figures, default=str)}", flush=True)
    return bool(passed)


def not_run(out, name, why):
    SUMMARY["checks"][name] = {"status": "not run", "why": why}
    SUMMARY["not_run"][name] = why
    save(out)
    print(f"[not run] {name}: {why}", flush=True)


def not_applicable(out, name, why):
    SUMMARY["checks"][name] = {"status": "n/a", "why": why}
    save(out)
    print(f"[n/a] {name}: {why}", flush=True)


# -- processes -------------------------------------------------------------------

def marked_processes(tag):
    """PIDs of live processes whose environment carries MARKER=tag."""
    want = f"{MARKER}={tag}".encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as fh:
                if want in fh.read().split(b"\0"):
                    with open(f"/proc/{d}/stat") as st:
                        if st.read().rsplit(")", 1)[1].split()[0] != "Z":
                            pids.append(int(d))
        except OSError:
            continue
    return pids


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return ""


def exited_within(tag, grace_s):
    """The run's processes still alive ``grace_s`` after its main process
    ended, and those that ended within it (pid -> command line). A helper
    that leaves when its parent does (multiprocessing's resource tracker
    reads EOF on its pipe, then exits) is still in /proc for a few
    milliseconds; it has not outlived the run."""
    first = {pid: cmdline(pid) for pid in marked_processes(tag)}
    deadline = time.monotonic() + grace_s
    left = list(first)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = marked_processes(tag)
    late = {pid: cmd for pid, cmd in first.items() if pid not in left}
    return left, late


def gpu_processes():
    """PIDs of compute processes on the GPUs (NVML), or None without NVML."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        pids = []
        for i in range(nv.nvmlDeviceGetCount()):
            pids += [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i))]
        return pids
    except Exception:
        return None


def run(out, name, cmd, env, timeout, fault=None):
    """One run in its own session, its output streamed to DIR/name.log;
    killed as a group on timeout; whatever it left behind is found, named
    and killed."""
    log = os.path.join(out, f"{name}.log")
    t0 = time.monotonic()
    env = dict(env, **{MARKER: name})
    if fault == "orphan":  # a rank that outlives its job, on purpose
        cmd = ["sh", "-c", 'setsid sleep 300 >/dev/null 2>&1 < /dev/null & exec "$@"', "sh", *cmd]
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    left, late = exited_within(name, EXIT_GRACE_S)
    left_cmd = {pid: cmdline(pid) for pid in left}
    ours = sorted(set(gpu_processes() or []) & set(left)) if left else []
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    exited_within(name, EXIT_GRACE_S)  # SIGKILL is delivered, not waited for: gone before the next run
    SUMMARY["runs"][name] = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1), "timeout_s": timeout, "log": log,
                             "left_behind": left, "left_on_gpu": ours, "left_cmd": left_cmd,
                             "exited_late": late}
    save(out)
    print(f"run {name}: rc={rc} in {SUMMARY['runs'][name]['wall_s']} s"
          + (f"; {len(left)} process(es) left behind, killed" if left else ""), flush=True)
    return rc == 0


NCCL_MICRO = r'''
import os, sys, torch, torch.distributed as dist
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))   # before the communicator
dist.init_process_group("nccl" if cuda else "gloo")
dev = "cuda" if cuda else "cpu"
sync = torch.cuda.synchronize if cuda else (lambda: None)
n = dist.get_world_size()
for mib in ((64, 256) if cuda else (1, 4)):
    x = torch.ones(mib * 2**20 // 4, device=dev)
    for _ in range(3):
        dist.all_reduce(x)                       # blocking: returns at enqueue on NCCL
    for _ in range(3):
        dist.all_reduce(x, async_op=True).wait()
    # out of place: even one rank must copy its input to the output
    y = torch.empty(n * x.numel(), device=dev)
    for _ in range(3):
        dist.all_gather_into_tensor(y, x)
    sync()
    assert float(y[0]) == float(x[0]), "all_gather moved nothing"
    # an optimizer step closes a training step, so the rows have one
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, device=x.device))], lr=0.1)
    opt.step()
sync()
from workloads.teardown import wait_released     # on PYTHONPATH: the repository's root
wait_released([x, y])     # gloo lets go of the last tensors first (docs/known-issues.md)
dist.destroy_process_group()
'''

FORK_MICRO = r'''
import os, sys, torch
# the device comes from the command line: torch.cuda.is_available() in the
# parent would itself initialise CUDA and poison fork (torch's own rule)
dev, label = sys.argv[1], sys.argv[2]
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
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
            print(label, "child failed:", repr(exc), flush=True)
            code = 1
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
# A: a parent that has not used the device (but is recorded) forks a child
# that does: fails if anything in the parent initialised CUDA. Forward only:
# torch's first backward starts autograd's device threads, which initialise
# CUDA in any process (a plain run's child then fails too)
with torch.no_grad():
    torch.nn.Linear(8, 8)(torch.ones(4, 8)).sum()
a = fork(lambda: (train(dev), sync()))
# B: a parent with device timing forks a child that never touches the
# device: the child must not destroy the parent's events
train(dev)
sync()
b = fork(lambda: None)
print(f"{label}: fork A (child uses the device): {a} fork B (parent used it): {b}", flush=True)
'''


# -- checks ------------------------------------------------------------------------

def load_events(out, path, fault):
    from commprof import assemble

    ev = assemble.load(path).table.to_pandas()
    if fault == "device-before-host":  # a device clock mapped wrongly, on purpose
        ev.loc[ev["dev_start"].notna(), "dev_start"] -= 5_000_000
    return ev


def device_checks(out, ev, prefix):
    import numpy as np

    timed = ev["name"].astype(str).isin(["forward", "backward", "optimizer"]) | (ev["category"] == "comm")
    rows = ev[timed & ev["dev_start"].notna()]
    ok = check(out, f"{prefix}: device rows", len(rows) > 0 and len(rows) >= 0.9 * int(timed.sum()),
               rows=len(rows), of=int(timed.sum()))
    lead_us = (rows["t_start"] - rows["dev_start"]) / 1e3
    ok &= check(out, f"{prefix}: device never before host issue", len(rows) > 0 and bool((lead_us <= 50).all()),
                worst_lead_us=float(lead_us.max()) if len(rows) else None)
    ok &= check(out, f"{prefix}: device intervals ordered", len(rows) > 0
                and bool((rows["dev_end"] >= rows["dev_start"]).all()))
    comp = rows[rows["category"] == "compute"]
    by = comp.groupby("step")
    span = by["dev_end"].max() - by["dev_start"].min()
    busy = (comp["dev_end"] - comp["dev_start"]).groupby(comp["step"]).sum()
    ok &= check(out, f"{prefix}: device step span covers its compute", len(span) > 0
                and bool((span >= busy * 0.98).all()),
                median_span_ms=float(np.median(span) / 1e6) if len(span) else None,
                median_busy_ms=float(np.median(busy) / 1e6) if len(busy) else None)
    return ok


def fsdp_checks(out, ev, folder):
    """FSDP2's collectives: every layer's forward gather, backward re-gather
    and reduction each step, with device times; the per-layer table; the
    exposed-time figures (recorded, not judged)."""
    import commprof

    c = ev[(ev["category"] == "comm") & (ev["source"].astype(str) == "fsdp")]
    phases = c["detail"].astype(str).str.split(" ").str[0].str.replace("_prefetch", "")
    layers = set(c["detail"].astype(str).str.split(" ").str[1])
    want = {"layers.0", "layers.1", "layers.2", "head"}
    ok = check(out, "fsdp2: every layer's gathers and reductions, tagged", want <= layers
               and {"forward", "backward", "reduce"} <= set(phases), layers=sorted(layers), phases=sorted(set(phases)))
    timed = c["dev_start"].notna()
    ok &= check(out, "fsdp2: collectives carry device times", len(c) > 0 and float(timed.mean()) >= 0.9,
                rows=int(timed.sum()), of=len(c))
    table = commprof.load(folder).fsdp_layers()
    figures = table[["layer", "gather ms", "gather exposed ms", "prefetched %", "reduce ms", "reduce exposed ms"]] \
        .round(3).to_dict("records") if len(table) else []
    ok &= check(out, "fsdp2: the per-layer table", want <= set(table["layer"]) if len(table) else False,
                layers=figures)
    return ok


def nccl_checks(out, ev, ranks, device):
    c = ev[(ev["category"] == "comm") & ev["name"].astype(str).isin(["all_reduce", "all_gather"])]
    timed = c[c["dev_start"].notna()]
    dev_s = (timed["dev_end"] - timed["dev_start"]) / 1e9
    # the run's first collective may come before device timing starts (the
    # process becomes a rank inside it): all but that one must be timed
    check(out, "nccl: collectives timed on the device", len(c) >= 18 and len(timed) >= len(c) - 1,
          rows=len(c), timed=len(timed), untimed_seq=[int(x) for x in c[c["dev_start"].isna()]["seq"]])
    check(out, "nccl: device end after host enqueue on every row", len(timed) > 0
          and bool((timed["dev_end"] >= timed["t_start"]).all()) and bool((dev_s > 0).all()),
          worst_margin_us=float(((timed["dev_end"] - timed["t_start"]) / 1e3).min()) if len(timed) else None)
    limit = next((v for k, v in PHYSICAL_GBPS.items() if k.lower() in device.lower()), 10_000.0)
    by = {}
    bws = []
    for (op, nbytes), g in timed.assign(dev_s=dev_s).groupby([timed["name"].astype(str), "bytes"]):
        med = float(g["dev_s"].median())
        # torch.distributed's all_reduce is in place; the micro's all_gather
        # writes another tensor
        inplace = op == "all_reduce"
        row = by[f"{op} {int(nbytes) >> 20} MiB"] = {
            "dev_ms_median": med * 1e3, "algbw_GBps": nbytes / med / 1e9,
            "blocking": g["blocking"].astype(bool).value_counts().to_dict()}
        if ranks == 1 and inplace:
            # one rank, in place: NCCL moves no data (the bus factor 2(n-1)/n
            # is 0); its time is a launch, not a bandwidth
            row["bound"] = "none: one rank, in place, no data moved"
        elif ranks == 1:
            # one rank, out of place: a device copy, its bytes read and written
            row["bound"] = "a copy: algbw <= memory bandwidth / 2"
            bws.append(2 * nbytes / med / 1e9)
        else:
            row["bound"] = "algbw <= memory bandwidth"
            bws.append(nbytes / med / 1e9)
    check(out, "nccl: bandwidth within the device's physical range", bool(bws) and all(0 < b <= limit for b in bws),
          limit_GBps=limit, ranks=ranks, by_size=by)


def fork_check(out, ok, log):
    """The fork run's verdict, read from its log: the recorded script's
    results must be the plain control's, both forks succeeding. A control
    that fails says nothing of commprof: the check is not run then."""
    name = "fork after the device was used, under commprof"
    lines = {}
    try:
        with open(log) as fh:
            for line in fh:
                label = line.split(":", 1)[0]
                if label in ("plain", "recorded") and "fork A" in line:
                    lines[label] = line.strip().split(":", 1)[1].strip()
    except (OSError, TypeError):
        pass
    good = "fork A (child uses the device): 0 fork B (parent used it): 0"
    control, recorded = lines.get("plain"), lines.get("recorded")
    if control != good:
        not_run(out, name, f"the script fails without commprof too ({control or 'no result line'})")
        return
    check(out, name, ok and recorded == good, plain=control, recorded=recorded)


def kernel_checks(out, ev, ranks, cuda):
    k = ev[ev["category"] == "kernel"]
    comm = ev[ev["category"] == "comm"]
    dup = int(comm.duplicated(["rank", "group", "seq"]).sum())
    classes = k["name"].astype(str).value_counts().to_dict()
    # the class a convolution's kernels get on this device: cuDNN on CUDA;
    # on the host the profiler's CPU ops are the kernels (no cuDNN)
    if cuda:
        check(out, "kernel mode: convolution kernels found", classes.get("cudnn", 0) > 0, classes=classes)
    else:
        not_applicable(out, "kernel mode: convolution kernels found", "no CUDA device: the profiler records no "
                       "device kernels on the host" + (f" (found {classes})" if classes else ""))
    check(out, "kernel mode: no collective counted twice", dup == 0 and len(comm) > 0, duplicate_collectives=dup,
          comm_sources=comm["source"].astype(str).value_counts().to_dict())
    if not cuda:
        not_applicable(out, "kernel mode: NCCL kernels found", "no CUDA device: gloo runs no kernels")
    elif ranks < 2:
        not_applicable(out, "kernel mode: NCCL kernels found", "one rank: NCCL reduces nothing across ranks")
    else:
        check(out, "kernel mode: NCCL kernels found", classes.get("nccl", 0) > 0, classes=classes)


def telemetry_check(out, ev):
    met = ev[ev["category"] == "metric"]["name"].astype(str).value_counts().to_dict()
    if gpu_processes() is None:
        not_applicable(out, "telemetry: NVML sampled", "NVML not available here")
        return
    check(out, "telemetry: NVML sampled", all(met.get(n, 0) > 0 for n in
                                              ("gpu.util", "gpu.mem_used_mib", "gpu.sm_clock_mhz")), metrics=met)


# -- the plan ----------------------------------------------------------------------

PLANNED_CHECKS = {
    "nccl-micro": ["nccl: collectives timed on the device", "nccl: device end after host enqueue on every row",
                   "nccl: bandwidth within the device's physical range"],
    "r50-recorded": [f"r50-rec: {c}" for c in ("device rows", "device never before host issue",
                                               "device intervals ordered", "device step span covers its compute")]
    + ["telemetry: NVML sampled"],
    "r50-kernels": ["kernel mode: convolution kernels found", "kernel mode: no collective counted twice",
                    "kernel mode: NCCL kernels found"],
    "r18-recorded": [f"r18-rec: {c}" for c in ("device rows", "device never before host issue",
                                               "device intervals ordered", "device step span covers its compute")],
    "r18-recorded-comm-hook": [f"r18-rec-hook: {c}" for c in ("device rows", "device never before host issue",
                                                             "device intervals ordered",
                                                             "device step span covers its compute")],
    "fork-micro": ["fork after the device was used, under commprof"],
    "r50-plain": [], "r18-plain": [], "report": ["report of the recorded runs"],
    "fsdp2-recorded": ["fsdp2: every layer's gathers and reductions, tagged", "fsdp2: collectives carry device times",
                       "fsdp2: the per-layer table"],
    **{run: [f"overhead {wl}"] for wl, run in PAIRED.items()},
}


def median_step(out, name):
    """A run's median step time (s) after its first 5 steps; None when the
    run did not complete."""
    path = os.path.join(out, f"steps-{name}.json")
    if SUMMARY["runs"].get(name, {}).get("rc") != 0 or not os.path.exists(path):
        return None
    with open(path) as fh:
        return statistics.median(json.load(fh)[5:])


def run_overhead(medians, plain, recorded):
    """Recorded / plain - 1 (%) of two separate runs' median steps (a
    figure, not a check)."""
    if medians.get(plain) is None or medians.get(recorded) is None:
        return None
    return {"plain_ms": medians[plain] * 1e3, "recorded_ms": medians[recorded] * 1e3,
            "overhead_pct": 100 * (medians[recorded] / medians[plain] - 1)}


def paired_overhead(raw, bound, judged="overhead_pct"):
    """The in-process overhead from ``overhead_paired.py --json``'s block
    means (its :func:`arm_costs`: per round, a recorded block's mean step
    minus the same round's plain block's, averaged over ranks): the wall
    time's mean over rounds with its 95 % interval, in % of the plain step;
    the CPU cost (also in % of the plain step's CPU time); the A/A control
    (``plain2`` - ``plain``) beside it, the method's own noise; ``decided``:
    the interval lies wholly on one side of the bound (the verdict reads
    the mean either way). ``judged``: the figure the check holds against
    the bound (the wall time on a GPU; the CPU time in a dry run)."""
    bench = os.path.join(ROOT, "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from overhead_paired import arm_costs

    ranks = raw["ranks"]
    rows, (plain_cpu, plain) = arm_costs(ranks)
    ((mc, _), _med, (m, ci)), (_c, _m, (aa, aa_ci)) = rows["record"], rows["plain2"]
    pct, ci_pct = 100 * m / plain, 100 * ci / plain
    return {"plain_ms": plain / 1e6, "recorded_ms": (plain + m) / 1e6, "overhead_pct": pct, "ci95_pct": ci_pct,
            "decided": abs(pct - bound) > ci_pct, "cpu_overhead_ms": mc / 1e6,
            "cpu_overhead_pct": 100 * mc / plain_cpu if plain_cpu else None, "aa_pct": 100 * aa / plain,
            "aa_ci95_pct": 100 * aa_ci / plain, "rounds": min(len(v) for r in ranks for v in r["arms"].values()),
            "ranks": len(ranks), "bound_pct": bound, "judged": judged}


def plan_total_s():
    return sum(t for _, t in PLAN)


def verdict(out):
    for run_name, checks in PLANNED_CHECKS.items():
        for name in checks:
            if name not in SUMMARY["checks"]:
                r = SUMMARY["runs"].get(run_name, {})
                why = (f"its run {run_name} wrote no trace" if r.get("no_trace") else
                       f"its run {run_name} was not run ({r['rc']})" if isinstance(r.get("rc"), str)
                       and r["rc"].startswith("not run") else
                       f"its run {run_name} failed (rc={r.get('rc')}, see {r.get('log')})" if r else
                       f"its run {run_name} did not happen")
                not_run(out, name, why)
    left = {n: list((r.get("left_cmd") or {}).values()) or r["left_behind"]
            for n, r in SUMMARY["runs"].items() if r.get("left_behind")}
    check(out, "no process outlives its run", not left, left_behind=left)
    statuses = [c["status"] for c in SUMMARY["checks"].values()]
    good = all(s in ("pass", "n/a") for s in statuses)
    SUMMARY["verdict"] = "pass" if good else "fail"
    SUMMARY["ok"] = good
    SUMMARY["failed"] = [n for n, c in SUMMARY["checks"].items() if c["status"] == "fail"]
    save(out)
    return good


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    p.add_argument("--budget-s", type=float, default=PLAN_LIMIT_S,
                   help="start a run only while its timeout still fits in this")
    p.add_argument("--dry-run", action="store_true",
                   help="on CPU: tiny runs over gloo with a simulated device (checks the check itself)")
    p.add_argument("--inject", choices=INJECT, help="dry run: one fault on purpose (the verdict must fail)")
    p.add_argument("--only", help="comma-separated runs of the plan to start (the others are not run: "
                                  "the verdict cannot pass); for testing the check's gates")
    p.add_argument("--recheck", action="store_true",
                   help="evaluate the checks again on the runs an earlier check left in --out (their logs, "
                        "traces and step times), starting only the runs it did not complete: no device time "
                        "spent twice")
    args = p.parse_args()
    before = _earlier_runs(args.out) if args.recheck else {}
    if args.inject and not args.dry_run:
        p.error("--inject is for --dry-run only")
    os.makedirs(args.out, exist_ok=True)
    SUMMARY["plan"] = [{"run": n, "timeout_s": t} for n, t in PLAN]
    SUMMARY["plan_total_s"] = plan_total_s()
    print("plan (run: timeout s, in order):", ", ".join(f"{n}: {t}" for n, t in PLAN),
          f"| total {plan_total_s()} s of at most {PLAN_LIMIT_S}", flush=True)
    save(args.out)
    if plan_total_s() > PLAN_LIMIT_S:
        raise SystemExit(f"the plan's timeouts sum to {plan_total_s()} s, over {PLAN_LIMIT_S} s")
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    SUMMARY.update(torch=torch.__version__, dry_run=args.dry_run, inject=args.inject)
    if not cuda and not args.dry_run:
        SUMMARY.update(verdict="fail", ok=False, error="no CUDA device")
        save(args.out)
        raise SystemExit("no CUDA device: nothing to check (--dry-run checks the check on CPU)")
    ranks = min(2, torch.cuda.device_count()) if cuda else 1
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    SUMMARY.update(device=device + ("" if cuda else " (simulated device)"), ranks=ranks)
    save(args.out)
    t_start = time.monotonic()
    # the runs start in the repository's root, so its commprof runs (an
    # editable install is the same one); PYTHONPATH: whatever the caller set
    # (carried dependencies), then the root (the micro-tests' imports).
    # One OpenMP thread in a dry run: the tiny CPU runs share the machine
    # with whatever else runs there (the test suite's other tests), and
    # threads spinning in OpenMP's barriers on busy cores slowed a run
    # x30 (1.8 samples/s against 55 on 2 cores)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), ROOT) if p),
               OMP_NUM_THREADS="4" if cuda else "1", PYTHONUNBUFFERED="1")
    py = sys.executable
    # a dependency missing: every run would fail one by one; say so before any
    pre = subprocess.run([py, "-c", "import commprof.analyzers, commprof.cli"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if pre.returncode:
        SUMMARY.update(verdict="fail", ok=False, error="commprof cannot be imported: " + pre.stderr.strip()[-300:])
        save(args.out)
        raise SystemExit("commprof or one of its dependencies cannot be imported by this Python (make install; "
                         "where nothing installs, carry the wheels, docs/gpu-check.md): "
                         + (pre.stderr.strip().splitlines() or ["?"])[-1])

    def torchrun(script, *a):
        return [py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", script, *a]

    sim = [] if cuda else ["--simulate-device-lag-ms", "2"]

    def rec(folder, *opts):
        return [py, "-m", "commprof", "record", "-o", os.path.join(args.out, folder), "--no-native-hooks", *sim,
                *opts, "--"]

    if cuda:
        r50 = ["--arch", "resnet50", "--framework", "ddp", "--steps", str(args.steps), "--batch-size", "64",
               "--image-size", "224", "--workers", "8", "--samples", str(64 * 32), "--no-val"]
        r18 = ["--arch", "resnet18", "--framework", "ddp", "--steps", str(args.steps * 2), "--batch-size", "8",
               "--image-size", "64", "--workers", "4", "--samples", str(8 * 64), "--no-val"]
    else:  # the same runs, small enough for a 2-core CPU
        r50 = ["--arch", "resnet18", "--framework", "ddp", "--steps", "12", "--batch-size", "4",
               "--image-size", "32", "--workers", "0", "--samples", "64", "--no-val"]
        r18 = r50
    dev_name = "cuda" if cuda else "cpu"
    if cuda:    # the runs' workloads (r18 with the check's batch and loader), in blocks of 4 steps
        paired_r50 = ["--workload", "resnet50", "--workers", "8", "--rounds", "60", "--steps", "4", "--warmup", "10"]
        paired_r18 = ["--workload", "resnet18", "--batch", "8", "--workers", "4", "--rounds", "100", "--steps", "4",
                      "--warmup", "10"]
    else:       # a tiny model, a few rounds: the code path, not a measurement
        paired_r50 = paired_r18 = ["--workload", "short", "--rounds", "6", "--steps", "2", "--warmup", "2",
                                   "--simulate-device-lag-ms", "2"]

    def paired(wl, *opts):
        return [py, os.path.join(ROOT, "benchmarks", "overhead_paired.py"), "--device", dev_name, "--nproc",
                str(ranks), "--arms", "record,plain2", "--json", os.path.join(args.out, f"paired-{wl}.json"), *opts]
    micro = os.path.join(args.out, "nccl_micro.py")
    fork = os.path.join(args.out, "fork_micro.py")
    for path, text in ((micro, NCCL_MICRO), (fork, FORK_MICRO)):
        with open(path, "w") as fh:
            fh.write(text)

    def workload(wl, name):
        return ["workloads/resnet.py", *wl, "--step-times", os.path.join(args.out, f"steps-{name}.json")]

    commands = {
        "nccl-micro": rec("nccl-rec") + torchrun(micro),
        "r50-recorded": rec("r50-rec") + torchrun(*workload(r50, "r50-recorded")),
        "r50-plain": torchrun(*workload(r50, "r50-plain")),
        "r50-kernels": rec("r50-kern", "--kernels", "6:3") + torchrun(*workload(r50, "r50-kernels")),
        "r18-plain": torchrun(*workload(r18, "r18-plain")),
        "r18-recorded": rec("r18-rec") + torchrun(*workload(r18, "r18-recorded")),
        "r18-recorded-comm-hook": rec("r18-rec-hook", "--ddp-timing", "comm-hook")
        + torchrun(*workload(r18, "r18-recorded-comm-hook")),
        # the same script plain first (the control: a failure there is not
        # commprof's), then recorded
        "r50-paired": paired("r50", *paired_r50),
        "r18-paired": paired("r18", *paired_r18),
        "fork-micro": ["sh", "-c", '"$0" "$1" "$2" plain; shift 2; exec "$@" recorded', py, fork, dev_name]
        + rec("fork-rec") + [py, fork, dev_name],
        # two ranks always (FSDP on one rank issues no collective): on one GPU both share it over gloo
        "fsdp2-recorded": rec("fsdp2-rec") + [
            py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            os.path.join(ROOT, "tests", "workloads", "fsdp.py"), "--device", dev_name, "--steps", "8", "--prefetch",
            "--dim", "2048" if cuda else "256", *(["--backend", "gloo"] if cuda and ranks < 2 else [])],
        "report": [py, "-m", "commprof", "report", os.path.join(args.out, "r50-kern"),
                   os.path.join(args.out, "nccl-rec"), "--out-dir", os.path.join(args.out, "report")],
    }
    traces = {"nccl-micro": "nccl-rec", "r50-recorded": "r50-rec", "r50-kernels": "r50-kern",
              "r18-recorded": "r18-rec", "r18-recorded-comm-hook": "r18-rec-hook", "fsdp2-recorded": "fsdp2-rec"}
    only = set(args.only.split(",")) if args.only else None
    if only and only - set(commands):
        p.error(f"--only: no such run(s): {', '.join(sorted(only - set(commands)))}")
    for name, timeout in PLAN:
        if only is not None and name not in only:
            SUMMARY["runs"][name] = {"rc": "not run (not selected)"}
            continue
        if args.inject == "skip" and name == "r18-recorded":
            SUMMARY["runs"][name] = {"rc": "not run (budget: injected)"}
            save(args.out)
            continue
        if time.monotonic() - t_start + timeout > args.budget_s:
            SUMMARY["runs"][name] = {"rc": "not run (budget)"}
            save(args.out)
            print(f"run {name}: not run (budget)", flush=True)
            continue
        if name in before:      # completed by the earlier check: its outputs are read again, not remade
            SUMMARY["runs"][name] = dict(before[name], rechecked=True)
            save(args.out)
            ok = True
        else:
            ok = run(args.out, name, commands[name], env, timeout,
                     fault="orphan" if args.inject == "orphan" and name == "r18-plain" else None)
        if name == "fork-micro":
            fork_check(args.out, ok, SUMMARY["runs"][name].get("log"))
        if name == "report":
            check(args.out, "report of the recorded runs", ok
                  and os.path.exists(os.path.join(args.out, "report", "report.md")))
        if not ok or name not in traces:
            continue
        folder = os.path.join(args.out, traces[name])
        if args.inject == "missing-trace" and name == "r50-recorded":
            os.remove(os.path.join(folder, "trace.parquet"))
        if not os.path.exists(os.path.join(folder, "trace.parquet")):
            check(args.out, f"{name}: a trace was written", False, folder=folder)
            SUMMARY["runs"][name]["no_trace"] = True
            continue
        ev = load_events(args.out, folder, args.inject if name == "r50-recorded" else None)
        if name == "nccl-micro":
            nccl_checks(args.out, ev, ranks, device)
        elif name == "r50-kernels":
            kernel_checks(args.out, ev, ranks, cuda)
        elif name == "fsdp2-recorded":
            fsdp_checks(args.out, ev, folder)
        else:
            device_checks(args.out, ev, traces[name])
            if name == "r50-recorded":
                telemetry_check(args.out, ev)
    over, runs_over, mode = {}, {}, "gpu" if cuda else "dry"
    for wl, run_name in PAIRED.items():
        path = os.path.join(args.out, f"paired-{wl}.json")
        if SUMMARY["runs"].get(run_name, {}).get("rc") != 0 or not os.path.exists(path):
            continue            # not run or failed (the verdict says which)
        with open(path) as fh:
            over[wl] = paired_overhead(json.load(fh), OVERHEAD_BOUND_PCT[mode][wl], OVERHEAD_JUDGED[mode])
        figure = over[wl][over[wl]["judged"]]
        check(args.out, f"overhead {wl}", figure is not None and figure <= over[wl]["bound_pct"], **over[wl])
    for wl, (plain, recorded) in OVERHEAD_RUNS.items():
        runs_over[wl] = run_overhead({n: median_step(args.out, n) for n in (plain, recorded)}, plain, recorded)
    SUMMARY["overhead_runs"] = runs_over
    SUMMARY["overhead"] = over
    SUMMARY["wall_s"] = round(time.monotonic() - t_start, 1)
    good = verdict(args.out)
    print(json.dumps({k: SUMMARY[k] for k in ("verdict", "failed", "not_run", "overhead", "overhead_runs",
                                                  "wall_s")},
                     indent=1, default=str))
    raise SystemExit(0 if good else 1)


if __name__ == "__main__":
    main()
