"""Time spent inside commprof's DDP process-group hooks, measured inside
them (not a test): a world-of-one DDP over gloo (the short workload's MLP,
batch 1) recorded in-process; the pre- and post-hooks commprof registers
on the process group, and the completion row (``Recorder.collective``, run
by the work's done-callback), are wrapped with ``perf_counter_ns``. They
run between the backward's kernels, with cold caches, so these are the
figures that count — a warm ``timeit`` of the same code is 10-50x lower.

    python benchmarks/ddp_hook_timing.py [--steps 400] [--nvtx]
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--nvtx", action="store_true", help="force NVTX calls (COMMPROF_NVTX=1)")
    args = p.parse_args()
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
