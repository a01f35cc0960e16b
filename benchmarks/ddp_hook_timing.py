"""Time spent inside commprof's DDP process-group hooks, measured inside
them (not a test): a world-of-one DDP over gloo (the short workload's MLP,
batch 1) recorded in-process; the pre- and post-hooks commprof registers
on the process group, and the completion row (``Recorder.collective``, run
by the work's done-callback), are wrapped with ``perf_counter_ns``. They
run between the backward's kernels, with cold caches, so these are the
figures that count — a warm ``timeit`` of the same code is 10-50x lower.

    python benchmarks/ddp_hook_timing.py [--steps 400] [--nvtx]

``--probe``: no commprof at all — a pre-hook of its own on the same DDP's
process group runs one probe per call, in rotation, and times it: an empty
call, the first pybind property read (``args.name`` compared), the bucket's
tensors / bytes / dtype, ``args.op_id`` alone, all of these, and a
200-iteration Python loop run twice (cold, then right after: warm).

    python benchmarks/ddp_hook_timing.py --probe [--steps 600]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import commprof.record.recorder as recorder  # noqa: E402
from commprof.record import session  # noqa: E402
from commprof.record.config import Config  # noqa: E402


def _loop():
    z = 0
    for i in range(200):
        z += i
    return z


def probe(steps):
    """Cold-cache cost of single operations in a process-group pre-hook."""
    allreduce = torch._C._distributed_c10d.HookOpName.ALLREDUCE
    pc = time.perf_counter_ns

    def tensors(a):
        t = a.input_tensors[0]
        return t.nbytes, t.dtype

    def everything(a):
        if a.name != allreduce:
            return None
        t = a.input_tensors[0]
        return t.nbytes, t.dtype, a.op_id

    probes = [("empty call", lambda a: None),
              ("args.name != ALLREDUCE (first pybind read)", lambda a: a.name != allreduce),
              ("args.input_tensors[0] .nbytes .dtype", tensors), ("args.op_id alone", lambda a: a.op_id),
              ("all four reads", everything)]
    times = {name: [] for name, _ in probes}
    times["200-iteration loop, first"] = []
    times["200-iteration loop, right after"] = []
    turn = [0]

    def pre(a):
        k = turn[0] % (len(probes) + 1)
        turn[0] += 1
        if k == len(probes):
            t0 = pc()
            _loop()
            t1 = pc()
            _loop()
            t2 = pc()
            times["200-iteration loop, first"].append(t1 - t0)
            times["200-iteration loop, right after"].append(t2 - t1)
            return
        name, fn = probes[k]
        t0 = pc()
        fn(a)
        times[name].append(pc() - t0)

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(nn.Sequential(
            nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x, y = torch.randn(1, 512), torch.tensor([1])
        for _ in range(5):
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
        ddp.process_group.register_pre_hook(99, pre)
        for _ in range(steps):
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
        ddp.process_group.unregister_pre_hook(99)
        dist.destroy_process_group()
    warm = []
    for _ in range(200):
        t0 = pc()
        _loop()
        warm.append(pc() - t0)
    print(f"Probes in a process-group pre-hook (between the backward's kernels), world of one, {steps} steps\n")
    print("| probe | calls | median (µs) |")
    print("|---|---:|---:|")
    for name, v in times.items():
        print(f"| {name} | {len(v)} | {statistics.median(v) / 1e3:.1f} |")
    print(f"| 200-iteration loop, warm, in a loop of the main program | {len(warm)} | "
          f"{statistics.median(warm) / 1e3:.1f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--probe", action="store_true", help="cold-cache probes in a hook of its own, no commprof")
    p.add_argument("--nvtx", action="store_true", help="force NVTX calls (COMMPROF_NVTX=1)")
    args = p.parse_args()
    if args.probe:
        return probe(args.steps)
    if args.nvtx:
        os.environ["COMMPROF_NVTX"] = "1"
    torch.set_num_threads(1)
    times = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                times.setdefault(name, []).append(time.perf_counter_ns() - t0)
        return wrapper

    pg_cls = torch._C._distributed_c10d.ProcessGroup
    pre, post = pg_cls.register_pre_hook, pg_cls.register_post_hook
    pg_cls.register_pre_hook = lambda self, i, fn: pre(self, i, timed("pre-hook", fn))
    pg_cls.register_post_hook = lambda self, i, fn: post(self, i, timed("post-hook", fn))
    recorder.Recorder.collective = timed("completion row (Recorder.collective)", recorder.Recorder.collective)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        sess = session.start(Config(out_dir=os.path.join(tmp, "rec"), run_id="bench"), hook_exits=False)
        sess.install_for("torch")
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(nn.Sequential(
            nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(torch.randn(64, 512), torch.randint(0, 10, (64,))), batch_size=1)

        def run(n):
            it = iter(loader)
            for _ in range(n):
                try:
                    x, y = next(it)
                except StopIteration:
                    it = iter(loader)
                    x, y = next(it)
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                opt.zero_grad()

        run(10)
        times.clear()
        run(args.steps)
        session.stop()
        dist.destroy_process_group()
        pg_cls.register_pre_hook, pg_cls.register_post_hook = pre, post
    print(f"DDP hooks, world of one, {args.steps} steps, NVTX {'forced' if args.nvtx else 'as detected'}\n")
    print("| call | calls | median (µs) | mean (µs) |")
    print("|---|---:|---:|---:|")
    for name, v in times.items():
        print(f"| {name} | {len(v)} | {statistics.median(v) / 1e3:.1f} | {statistics.fmean(v) / 1e3:.1f} |")


if __name__ == "__main__":
    main()
