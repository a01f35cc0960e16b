"""A tiny, deterministic training job for commprof's tests.

Modes: single process, torchrun (env://), or torch.multiprocessing.spawn.
The DataLoader's dataset can sleep a known time per batch so data-loading
fidelity can be checked against the script's own measurements, which it
prints as one JSON line per rank (losses, own data-wait and step times).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from _exit import wait_released


class Sleepy(Dataset):
    def __init__(self, n, dim, sleep_s, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.sleep_s = sleep_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class SleepyCollate:
    """Sleeps once per batch (in the main process when num_workers=0)."""

    def __init__(self, sleep_s):
        self.sleep_s = sleep_s

    def __call__(self, items):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        xs, ys = zip(*items)
        return torch.stack(xs), torch.stack(ys)


def model_for(dim, hidden, layers):
    mods = [nn.Linear(dim, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 10))
    return nn.Sequential(*mods)


def train(rank, world, args):
    distributed = world > 1
    if distributed and not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                init_method=args.init_method or "env://")
    torch.manual_seed(0)
    model = model_for(args.dim, args.hidden, args.layers)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
        if args.user_hook:
            calls = {"n": 0}

            def my_hook(state, bucket):
                calls["n"] += 1
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
                return allreduce_hook(state, bucket)

            model.register_comm_hook(dist.group.WORLD, my_hook)
        elif args.builtin_hook:
            model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    sleep = args.sleep + (args.slow_extra if rank == args.slow_rank else 0.0)
    ds = Sleepy(args.batch * args.steps * max(world, 1), args.dim, sleep, seed=1)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, world, rank, shuffle=False) if distributed else None
    loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                        collate_fn=SleepyCollate(sleep))
    losses, data_wait, step_times = [], [], []
    it = iter(loader)
    t_prev = time.monotonic_ns()
    for step in range(args.steps):
        t0 = time.monotonic_ns()
        x, y = next(it)
        t1 = time.monotonic_ns()
        for _ in range(args.compute_repeat):
            out = model(x)
        loss = loss_fn(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t2 = time.monotonic_ns()
        losses.append(loss.item())
        data_wait.append(t1 - t0)
        step_times.append(t2 - t_prev)
        t_prev = t2
        if args.kill_at is not None and rank == args.kill_rank and step == args.kill_at:
            if args.result_dir:
                with open(os.path.join(args.result_dir, f"killed{rank}.json"), "w") as fh:
                    json.dump({"rank": rank, "step": step, "t": time.monotonic_ns()}, fh)
            os.kill(os.getpid(), 9)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if distributed:
        flat = torch.tensor(losses)
        dist.all_reduce(flat)
        dist.barrier()
    report = {"rank": rank, "world": world, "losses": losses, "data_wait_ns": data_wait,
              "step_ns": step_times, "batch": args.batch,
              "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
              "state_bytes": sum(t.numel() * t.element_size()
                                 for t in list(model.parameters()) + list(model.buffers()))}
    if distributed:
        # the comm hook DDP ran with ("" = its built-in C++ path)
        report["comm_hook"] = str(model._get_ddp_logging_data().get("comm_hook", ""))
        import hashlib

        flat_params = torch.cat([p.detach().flatten() for p in model.parameters()])
        report["params_sha256"] = hashlib.sha256(flat_params.numpy().tobytes()).hexdigest()
    if args.result_dir:
        with open(os.path.join(args.result_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(report, fh)
    else:
        print("RESULT " + json.dumps(report), flush=True)
    if distributed:
        wait_released([flat])  # see _exit.py: gloo + torch 2.14 can abort at exit otherwise
        dist.destroy_process_group()


def spawn_entry(rank, world, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    train(rank, world, args)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds the collate sleeps per batch")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=None, help="this rank's collate sleeps --slow-extra longer")
    p.add_argument("--slow-extra", type=float, default=0.0, help="seconds")
    p.add_argument("--compute-repeat", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--user-hook", action="store_true")
    p.add_argument("--builtin-hook", action="store_true", help="DDP's built-in C++ ALLREDUCE comm hook")
    p.add_argument("--spawn", type=int, default=0, help="use mp.spawn with N processes")
    p.add_argument("--init-method", default=None)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--result-dir", default=None, help="write rank<N>.json here instead of stdout")
    args = p.parse_args()
    if args.spawn:
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        args.init_method = f"tcp://127.0.0.1:{port}"
        torch.multiprocessing.spawn(spawn_entry, args=(args.spawn, args), nprocs=args.spawn)
    else:
        rank = int(os.environ.get("RANK", 0))
        world = int(os.environ.get("WORLD_SIZE", 1))
        train(rank, world, args)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
