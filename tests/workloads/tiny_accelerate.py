"""An Accelerate training loop on CPU, unchanged under ``commprof record``
(commprof's tests):

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no tests/workloads/tiny_accelerate.py --steps 8

(``--multi_gpu`` makes Accelerate start its ranks through torchrun; the script's
``Accelerator(cpu=True)`` keeps them on the CPU with gloo.)"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    from accelerate import Accelerator

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n = 16 * a.steps * acc.num_processes
    loader = DataLoader(TensorDataset(torch.randn(n, 32), torch.randint(0, 10, (n,))), batch_size=16)
    model, opt, loader = acc.prepare(model, opt, loader)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        acc.gather(loss.detach())           # Accelerate's own collective: the loss of every rank
    acc.wait_for_everyone()


if __name__ == "__main__":
    main()
