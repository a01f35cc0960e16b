"""A torch.compile'd DDP job on CPU (gloo), for commprof's tests: Dynamo's
graph counts per step go to --result-dir (recording must not change them).

    torchrun --nproc_per_node 2 tests/workloads/compiled.py --steps 6 --result-dir DIR
    ... --backend aot_eager      # Dynamo's backend (default eager: no C++ compiler needed)
    ... --compile-at 3           # recompile at step 3 (a new input shape)"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, d: int = 64):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--backend", default="eager")
    p.add_argument("--compile-at", type=int, default=-1, help="a new batch size from this step: a recompile")
    p.add_argument("--result-dir", default=None)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = torch.compile(DDP(Net()), backend=a.backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    from torch._dynamo.utils import counters

    per_step, losses = [], []
    for step in range(a.steps):
        n = 24 if 0 <= a.compile_at <= step else 16
        x, y = torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        per_step.append({"unique_graphs": int(counters["stats"]["unique_graphs"]),
                         "graph_breaks": int(sum(counters["graph_break"].values())),
                         "frames_ok": int(counters["frames"]["ok"])})
    if a.result_dir:
        os.makedirs(a.result_dir, exist_ok=True)
        with open(os.path.join(a.result_dir, f"rank{rank}.json"), "w") as fh:
            json.dump({"rank": rank, "per_step": per_step, "losses": losses,
                       "breaks": {str(k)[:300]: v for k, v in counters["graph_break"].items()}}, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
