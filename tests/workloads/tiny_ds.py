"""Tiny DeepSpeed training job (CPU, gloo) for commprof's tests."""
import argparse
import json
import os

import deepspeed
import torch
import torch.nn as nn
from _exit import wait_released


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--persist", type=int, default=None,
                   help="ZeRO-3: stage3_param_persistence_threshold (0: every parameter gathered per module)")
    p.add_argument("--result-dir", default=None)
    p.add_argument("--local_rank", type=int, default=-1)  # deepspeed launcher
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    world = int(os.environ.get("WORLD_SIZE", 1))
    config = {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
              "train_batch_size": args.batch * world, "zero_optimization": {"stage": args.zero},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    if args.persist is not None:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = args.persist
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    g = torch.Generator().manual_seed(1 + engine.global_rank)
    losses = []
    for _ in range(args.steps):
        x, y = torch.randn(args.batch, 32, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    report = {"rank": engine.global_rank, "losses": losses,
              "param_bytes": sum(p.numel() * 4 for p in model.parameters()), "world": world}
    if args.result_dir:
        with open(os.path.join(args.result_dir, f"rank{engine.global_rank}.json"), "w") as fh:
            json.dump(report, fh)
    # one last collective on a tensor we hold, and wait until gloo lets go of
    # it (see _exit.py): DeepSpeed's own last collectives finished before it
    done = torch.ones(1)
    deepspeed.comm.all_reduce(done)
    wait_released([done])


if __name__ == "__main__":
    main()
