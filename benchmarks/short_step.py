"""The short-step workload of the overhead benchmark (not a test): a small
MLP under DDP (gloo), batch 32, no data delay — ~10-20 ms steps on a 2-core
machine, the regime of GPU training (20-100 ms steps) and of launch-bound
models. Each rank writes per-step wall time and CPU time
(``time.process_time()``, the whole process: hooks and the writer thread
included) for steps after ``--warmup``.

    torchrun --nproc_per_node 2 benchmarks/short_step.py --steps 300 --step-times OUT.json
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workloads"))
from teardown import wait_released  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--step-times", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.parallel.DistributedDataParallel(nn.Sequential(
        nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.randn(args.batch * 64, args.dim),
                                          torch.randint(0, 10, (args.batch * 64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True)
    wall, cpu = [], []
    it = iter(loader)
    t_prev, c_prev = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t, c = time.perf_counter(), time.process_time()
        wall.append(t - t_prev)
        cpu.append(c - c_prev)
        t_prev, c_prev = t, c
    last = torch.zeros(1)
    dist.all_reduce(last)
    if args.step_times:
        root, ext = os.path.splitext(args.step_times)
        with open(f"{root}.rank{rank}{ext}", "w") as fh:
            json.dump({"wall": wall, "cpu": cpu}, fh)
        if rank == 0:
            with open(args.step_times, "w") as fh:
                json.dump(wall, fh)
    wait_released(last)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
