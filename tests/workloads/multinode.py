"""A small DDP job for the multi-node tests (torchrun or srun, env://).

Every step: forward/backward/optimizer under DDP, then one blocking
``all_reduce`` of ``--sync-bytes`` (a metric sync: the collective whose
arrival skew the clock tests check). Knobs that make the job misbehave in
known ways:

--late-rank R --late-ms T   rank R sleeps T ms before every blocking all_reduce
--slow-rank R --slow-ms T   rank R sleeps T ms inside its forward (a slow node)
--skip-rank R --skip-at S   rank R skips the blocking all_reduce of step S
                            (with --sync-like-grads the ranks run on shifted by one
                            collective; with --linger-s the others then hang)
--mismatch-rank R --mismatch-at S   rank R reduces float64 (same bytes) at step S
--crash-rank R --crash-at S [--crash segfault|exit]   rank R segfaults (or exits 0) at step S
--grid-bytes B              2-D parallel groups (as tensor x data parallel): ranks 2k, 2k+1 form a
                            "row" group, ranks of equal parity a "column" group; every step one
                            all_reduce of B bytes in the rank's row group, then one in its column group
Each rank writes rank<N>.json (own issue times of the blocking all_reduce on
the wall clock, which time namespaces leave alone: the truth the clock tests
compare with), its rank and host into --result-dir.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _exit import wait_released  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--sync-bytes", type=int, default=4096)
    p.add_argument("--sync-like-grads", action="store_true",
                   help="the blocking all_reduce has as many elements as the gradients (so that a rank that "
                        "skips one pairs its next DDP bucket with the others' sync: the job runs on, shifted, "
                        "and hangs at the end, as real skipped collectives do)")
    p.add_argument("--late-rank", type=int, default=-1)
    p.add_argument("--late-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--skip-rank", type=int, default=-1)
    p.add_argument("--skip-at", type=int, default=-1)
    p.add_argument("--linger-s", type=float, default=0.0,
                   help="the skipping rank then stays alive this long before its last collective (as a rank "
                        "busy with something else would): the others hang waiting for it")
    p.add_argument("--crash-rank", type=int, default=-1, help="this rank ends at step --crash-at by --crash")
    p.add_argument("--crash-at", type=int, default=-1)
    p.add_argument("--crash", choices=("segfault", "exit"), default="segfault",
                   help="segfault: read address 0 (SIGSEGV); exit: sys.exit(0) early (its peers wait for it)")
    p.add_argument("--mismatch-rank", type=int, default=-1)
    p.add_argument("--mismatch-at", type=int, default=-1)
    p.add_argument("--grid-bytes", type=int, default=0)
    p.add_argument("--result-dir", default=None)
    a = p.parse_args()
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                          LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    if a.slow_ms and rank == a.slow_rank:
        model[0].register_forward_pre_hook(lambda m, inp: time.sleep(a.slow_ms / 1e3))
    ddp = nn.parallel.DistributedDataParallel(model)
    grid = []
    if a.grid_bytes:
        rows = [dist.new_group([2 * k, 2 * k + 1]) for k in range(world // 2)]
        cols = [dist.new_group(list(range(c, world, 2))) for c in range(2)]
        grid = [(rows[rank // 2], torch.zeros(a.grid_bytes // 4)), (cols[rank % 2], torch.zeros(a.grid_bytes // 4))]
    if a.sync_like_grads:
        a.sync_bytes = 4 * sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    issues, sync_s = [], []
    sync = None
    for step in range(a.steps):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for group, buf in grid:
            dist.all_reduce(buf, group=group)
        if rank == a.late_rank and a.late_ms:
            time.sleep(a.late_ms / 1e3)
        if rank == a.crash_rank and step == a.crash_at:
            if a.crash == "segfault":
                import ctypes

                ctypes.string_at(0)
            sys.exit(0)
        if rank == a.skip_rank and step == a.skip_at:
            continue
        if rank == a.mismatch_rank and step == a.mismatch_at:
            sync = torch.ones(a.sync_bytes // 8, dtype=torch.float64)   # same bytes, other dtype
        else:
            sync = torch.ones(a.sync_bytes // 4)
        issues.append(time.time_ns())  # CLOCK_REALTIME: not shifted by time namespaces
        t0 = time.perf_counter()
        dist.all_reduce(sync)
        sync_s.append(time.perf_counter() - t0)     # the call's time by the script's own clock
    if rank == a.skip_rank and a.linger_s:
        time.sleep(a.linger_s)
    if a.result_dir:
        with open(os.path.join(a.result_dir, f"rank{rank}.json"), "w") as fh:
            json.dump({"rank": rank, "world": world, "host": socket.gethostname(), "issues_ns": issues,
                       "sync_s": sync_s}, fh)
    last = torch.zeros(1)
    dist.all_reduce(last)
    wait_released([last] + ([sync] if sync is not None else []))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
