"""Recording overhead per step, resolved to tens of µs on a noisy machine
(not a test). Companion of ``benchmarks/overhead.py``.

Why a second benchmark: separate runs of the same job on this 2-core VM
differ by ±6-20 % per repeat, and even two *identical* model objects in one
process differ by ~1.5 % in CPU per step (memory layout: measured with
``--arms plain,plain``... on two instances). So here one process per rank
keeps one model, one DDP, one optimizer and one DataLoader for the whole
run and switches the recording on and off between short blocks of steps,
on the *same* objects:

- ``plain``: a commprof session is running (its writer thread too) but no
  instrument is installed;
- ``record``: every instrument installed, as ``commprof record`` installs
  them (DDP timed through the process group's hooks, the default — the
  native ones where they are built, see ``commprof/record/native.py``; the
  DDP created earlier is attached when the instruments are installed);
- ``record:python``: the same with DDP's buckets timed by the Python
  process-group hooks;
- ``record:noring``: ``record`` without the collective ring (Python and
  native: ``trace/ring.py``): ``record`` minus it is the ring's cost;
- ``record:nodev``: ``record`` without device timing (its CUDA events;
  ``--device cuda`` only): ``record`` minus it is device timing's cost;
- ``only:NAME``: one instrument alone (the split by instrument);
  ``pg:noop`` / ``pg:callback``: torch's process-group hook machinery with
  do-nothing Python hooks (and a done-callback), no commprof;
- ``plain2``: plain again: the A/A control — its difference from ``plain``
  is the method's own noise and bias;
- ``profiler``: ``torch.profiler.profile(activities=[CPU],
  record_shapes=True)`` entered for the block.

Blocks rotate through the arms (the order shifts each round, so no arm is
always first); after each switch one step is left out (the first forward
after an install finds the root modules), then ``--steps`` steps are timed:
CPU time of the whole rank process (``time.process_time_ns()``: hooks, gloo
threads and the journal writer included) and wall time. A round's cost of
an arm is its block mean minus the same round's ``plain`` block mean; the
figure is the mean over rounds with a 95 % interval (± 1.96 standard
errors), averaged over ranks.

The journal writer runs in both arms (the session stays up), so the
difference counts about half of its work: its thread's own CPU time
(``pthread_getcpuclockid``) over the recorded steps is printed as well, and
``record`` + writer is the upper bound that is compared with the targets.

With ``--device cuda`` (one rank per GPU, NCCL) each step ends with
``torch.cuda.synchronize()``, as ``workloads/resnet.py`` does when it times
its steps, and the ``resnet50`` workload is the GPU check's (batch 64,
224 x 224 uint8 images from a DataLoader with ``--workers`` processes,
pinned, converted on the device): host work between one step's
synchronisation and the next step's first kernel is then exposed, which is
what makes a device-bound step pay for the host's.

    python benchmarks/overhead_paired.py [--workload short|resnet18] [--nproc 2] [--rounds 300] [--steps 4]
    python benchmarks/overhead_paired.py --wrap fsdp2 ...   # the FSDP instrument's cost (against --wrap ddp)
    python benchmarks/overhead_paired.py --device cuda --nproc 1 --workload resnet50 --workers 8 \
        --rounds 60 --steps 4 --arms record,record:nodev,plain2,only:module,only:dataloader
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler, TensorDataset  # noqa: E402

from commprof.record import session  # noqa: E402
from commprof.record.config import Config  # noqa: E402
from commprof.record.instruments import ALL  # noqa: E402

ARMS = ("plain", "record", "plain2", "profiler")


def build(workload, batch, workers=0, pin=False):
    """(model, loader) of a workload, the same as overhead.py's (resnet50:
    the GPU check's)."""
    torch.manual_seed(0)
    if workload == "short":  # benchmarks/short_step.py
        batch = batch or 32
        model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        data = TensorDataset(torch.randn(batch * 64, 512), torch.randint(0, 10, (batch * 64,)))
    elif workload == "resnet50":  # the GPU check's: uint8 images, made float on the device
        import torchvision

        batch = batch or 64
        model = torchvision.models.resnet50(num_classes=1000)
        data = TensorDataset(torch.randint(0, 256, (batch * 32, 3, 224, 224), dtype=torch.uint8),
                             torch.randint(0, 1000, (batch * 32,)))
    else:  # workloads/resnet.py --arch resnet18 --batch-size 16 --image-size 64 (synthetic data)
        import torchvision

        batch = batch or 16
        model = torchvision.models.resnet18(num_classes=100)
        data = TensorDataset(torch.randn(batch * 8, 3, 64, 64), torch.randint(0, 100, (batch * 8,)))
    # One epoch for the whole run: a new epoch's first batch waits for the
    # loader's workers (~50 ms with 8 workers on the H200), and with a
    # 32-batch epoch and a round of 4 arms x 5 steps every such restart fell
    # in a timed block of the same arm (the 'plain' one: +5.7 ms a step on
    # average, measured), so the epoch is made longer than any run.
    sampler = RandomSampler(data, num_samples=len(data) * 100_000)
    loader = DataLoader(data, batch_size=batch, sampler=sampler, drop_last=True, num_workers=workers,
                        pin_memory=pin, persistent_workers=workers > 0)
    return model, loader


class Loop:
    """The training loop, one step at a time, on fixed objects."""

    def __init__(self, model, loader, opt, device=None):
        self.model, self.loader, self.opt = model, loader, opt
        self.device = device if device is not None and device.type == "cuda" else None
        self.it = iter(loader)

    def step(self):
        try:
            x, y = next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            x, y = next(self.it)
        if self.device is not None:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if x.dtype == torch.uint8:
            x = x.float().div_(255)
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        if self.device is not None:     # as workloads/resnet.py does when it times its steps
            torch.cuda.synchronize(self.device)

    def timed(self, n):
        """(mean CPU ns, mean wall ns) per step over n steps."""
        cpu = wall = 0
        for _ in range(n):
            c0, w0 = time.process_time_ns(), time.perf_counter_ns()
            self.step()
            wall += time.perf_counter_ns() - w0
            cpu += time.process_time_ns() - c0
        return cpu / n, wall / n


def _rank_main(rank, args, tmp, out):
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(rank))
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{tmp}/pg", rank=rank,
                            world_size=args.nproc)
    sess = session.start(Config(out_dir=os.path.join(tmp, f"rec{rank}"), run_id="bench",
                                simulate_device_lag_ms=args.simulate_device_lag_ms), hook_exits=False)
    sess.install_for("torch")  # installed before DDP exists, as under `commprof record`
    model, loader = build(args.workload, args.batch, args.workers, pin=cuda)
    if args.wrap == "fsdp2":    # every child with parameters its own group, then the root
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        sess.install_for("torch.distributed.fsdp")
        model = model.to(device)
        mesh = init_device_mesh(device.type, (args.nproc,))
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh)
        ddp = fully_shard(model, mesh=mesh)
    else:
        ddp = nn.parallel.DistributedDataParallel(model.to(device), device_ids=[rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loop = Loop(ddp, loader, opt, device)
    for _ in range(args.warmup):  # DDP rebuilds its buckets after step 0; the recorder becomes a rank
        loop.step()
    sess.uninstall()
    for _ in range(2):
        loop.step()
    state = {"on": None, "steps_on": 0, "prof": None}

    full = sess.config

    def switch(arm):
        want = arm if arm.startswith(("record", "only:")) else None
        if state["on"] and want != state["on"]:
            sess.uninstall()
            state["on"] = None
        if want and not state["on"]:
            if want.startswith("only:"):  # one instrument alone (the split by instrument)
                keep = want[5:]
                sess.config = full.replace(disable=tuple(n for n in ALL if n != keep))
            sess.install_for("torch")
            if args.wrap == "fsdp2":
                sess.install_for("torch.distributed.fsdp")
            sess.config = full
            if want == "record:python":  # DDP's buckets timed by the Python process-group hooks
                sess.recorder.config = full.replace(native_hooks=False)
            if "ddp" in sess.instruments and args.wrap == "ddp":
                sess.instruments["ddp"]._ensure_default_hook(ddp)  # the DDP made before this install
            sess.recorder.config = full
            state["on"] = want
        rec = sess.recorder
        if arm == "record:nodev" and "timer" not in state:     # device timing off for the block
            state["timer"] = rec.timer
            rec.config = rec.config.replace(device_timing=False)
            rec.timer = None
        if arm == "record:noring" and "ring" not in state:
            state["ring"] = rec.ring
            rec.ring = None
            if rec.native is not None and getattr(rec, "native_ring_addr", None):
                rec.native.set_ring(0, 0)
        if arm.startswith("pg:"):  # torch's process-group hook machinery alone, no commprof
            pg, kind = ddp.process_group, arm[3:]
            pg.register_pre_hook(77, lambda a: None)
            if kind == "callback":
                pg.register_post_hook(77, lambda a: a.work.get_future().add_done_callback(lambda f: None))
            else:
                pg.register_post_hook(77, lambda a: None)
            state["pg"] = pg
        if arm == "profiler":
            state["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                   record_shapes=True)
            state["prof"].__enter__()

    def leave(arm):
        if "timer" in state:
            rec = sess.recorder
            rec.config = rec.config.replace(device_timing=full.device_timing)
            rec.timer = state.pop("timer")
        if "ring" in state:
            rec = sess.recorder
            rec.ring = state.pop("ring")
            if rec.native is not None and getattr(rec, "native_ring_addr", None):
                from commprof.trace.ring import DEFAULT_SLOTS

                rec.native.set_ring(rec.native_ring_addr, DEFAULT_SLOTS)
        if state.get("pg") is not None:
            state["pg"].unregister_pre_hook(77)
            state["pg"].unregister_post_hook(77)
            state["pg"] = None
        if state["prof"] is not None:
            state["prof"].__exit__(None, None, None)
            state["prof"] = None

    arms = [a for a in ARMS if a in args.arms] + sorted(a for a in args.arms
                                                        if a.startswith(("only:", "pg:", "record:")))
    res = {a: [] for a in arms}
    for r in range(args.rounds):
        k = r % len(arms)
        for arm in arms[k:] + arms[:k]:
            switch(arm)
            loop.step()  # left out: the first step after a switch
            res[arm].append(loop.timed(args.steps))
            if state["on"]:
                state["steps_on"] += args.steps + 1
            leave(arm)
    switch("plain")
    flusher = sess.recorder.flusher
    writer_ns = time.clock_gettime_ns(time.pthread_getcpuclockid(flusher._thread.ident))
    c0 = time.thread_time_ns()
    session.stop()  # the last flush: the writer's work, done here by this thread
    writer_ns += time.thread_time_ns() - c0
    on = max(1, state["steps_on"] + args.warmup)
    rows = {"arms": res, "writer_ns_per_step": writer_ns / on, "events_per_step": flusher.journal.events / on}
    gathered = [None] * args.nproc
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(gathered, fh)
    dist.barrier()
    dist.destroy_process_group()


def mean_ci(v):
    m = statistics.fmean(v)
    se = statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else float("nan")
    return m, 1.96 * se


def arm_costs(ranks):
    """Per arm, its cost against ``plain`` from the ranks' block means (CPU
    ns, wall ns per step, one pair per round): per round the arm's block
    minus the same round's plain block, averaged over ranks; returns arm ->
    ((CPU mean, its 95 % half-width), CPU median, (wall mean, half-width)),
    and the plain step's (CPU, wall) means. Also read by the GPU check
    (tests/gpu/gpu_check.py)."""
    rounds = min(len(v) for r in ranks for v in r["arms"].values())
    base_cpu = statistics.fmean(c for r in ranks for c, _w in r["arms"]["plain"][:rounds])
    base_wall = statistics.fmean(w for r in ranks for _c, w in r["arms"]["plain"][:rounds])
    rows = {}
    for arm in ranks[0]["arms"]:
        dc = [statistics.fmean(r["arms"][arm][i][0] - r["arms"]["plain"][i][0] for r in ranks)
              for i in range(rounds)]
        dw = [statistics.fmean(r["arms"][arm][i][1] - r["arms"]["plain"][i][1] for r in ranks)
              for i in range(rounds)]
        rows[arm] = (mean_ci(dc), statistics.median(dc), mean_ci(dw))
    return rows, (base_cpu, base_wall)


def summarize(ranks, args):
    arms = list(ranks[0]["arms"])
    rows, (base_cpu, base_wall) = arm_costs(ranks)
    writer = statistics.fmean(r["writer_ns_per_step"] for r in ranks)
    events = statistics.fmean(r["events_per_step"] for r in ranks)
    wrap = "FSDP2" if args.wrap == "fsdp2" else "DDP"
    lines = [f"{args.workload}: {args.nproc} rank(s), {wrap} over {'NCCL' if args.device == 'cuda' else 'gloo'}, "
             f"batch {args.batch or 'default'}, {args.workers} loader workers, "
             f"{args.rounds} rounds x {len(arms)} arms, blocks of {args.steps} timed steps (+1 left out) "
             f"on the same model / DDP / optimizer / loader; cost = block mean - the same round's plain "
             f"block mean, mean over rounds ± 95 % (1.96 SE), averaged over ranks",
             "",
             f"plain: {base_cpu / 1e3:,.0f} µs CPU / {base_wall / 1e3:,.0f} µs wall per step; journal writer "
             f"thread {writer / 1e3:.1f} µs CPU per recorded step (its own clock), {events:.1f} events per "
             f"recorded step",
             "",
             "| arm | CPU cost/step (µs) | median (µs) | CPU vs plain | wall cost/step (µs) | wall vs plain |",
             "|---|---:|---:|---:|---:|---:|"]
    for arm in arms:
        (mc, ec), med, (mw, ew) = rows[arm]
        lines.append(f"| {arm} | {mc / 1e3:+,.1f} ± {ec / 1e3:,.1f} | {med / 1e3:+,.1f} | "
                     f"x{1 + mc / base_cpu:.4f} | {mw / 1e3:+,.1f} ± {ew / 1e3:,.1f} | x{1 + mw / base_wall:.4f} |")
    if "record" in rows:
        (mc, ec), _med, (mw, ew) = rows["record"]
        up = mc + ec + writer / 2
        lines += ["", f"record, upper bound (mean + 95 % + the writer's half not in the difference): "
                      f"{up / 1e3:+,.1f} µs CPU/step = x{1 + up / base_cpu:.4f} of plain"]
        if "profiler" in rows:
            (pc, pe), _m, (pw, _e) = rows["profiler"]
            lines.append(f"commprof / torch.profiler overhead: CPU {(mc + writer / 2) / pc:.3f} "
                         f"(profiler {pc / 1e3:+,.1f} ± {pe / 1e3:,.1f} µs), wall {mw / pw:.3f}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("short", "resnet18", "resnet50"), default="short")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: one rank per GPU over NCCL, each step synchronised")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--simulate-device-lag-ms", type=float, default=0.0,
                   help=argparse.SUPPRESS)  # a simulated device on CPU: the device-timing arm checked there
    p.add_argument("--wrap", choices=("ddp", "fsdp2"), default="ddp",
                   help="data parallel: DDP, or FSDP2 (fully_shard on every child with parameters, then the root)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--steps", type=int, default=4, help="timed steps per block")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=0, help="batch per rank (default: the workload's)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"subset of {','.join(ARMS)} (plain is always run)")
    p.add_argument("--json", default=None, help="also write the raw block means here")
    args = p.parse_args()
    args.arms = {"plain"} | {a.strip() for a in args.arms.split(",") if a.strip()}
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.spawn(_rank_main, args=(args, tmp, out), nprocs=args.nproc, join=True)
        with open(out) as fh:
            ranks = json.load(fh)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()},
                       "ranks": ranks}, fh)
    print(summarize(ranks, args))


if __name__ == "__main__":
    main()
