"""Tiny Horovod (horovod.torch) training job for commprof's tests."""
import argparse
import json
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import horovod.torch as hvd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--result-dir", default=None)
    args = p.parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(1)
    n = args.batch * args.steps * hvd.size()
    ds = TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, hvd.size(), hvd.rank(), shuffle=False)
    losses = []
    for x, y in DataLoader(ds, batch_size=args.batch, sampler=sampler):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    avg = hvd.allreduce(torch.tensor(losses), name="losses")
    report = {"rank": hvd.rank(), "world": hvd.size(), "losses": losses, "avg": avg.tolist(),
              "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
              "state_bytes": sum(v.numel() * v.element_size() for v in model.state_dict().values())}
    if args.result_dir:
        with open(os.path.join(args.result_dir, f"rank{hvd.rank()}.json"), "w") as fh:
            json.dump(report, fh)


if __name__ == "__main__":
    main()
