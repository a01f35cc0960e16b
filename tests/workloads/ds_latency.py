"""Per-call all_reduce latencies three ways: this script's own clock around
each (blocking, CPU/gloo) call, DeepSpeed's comms logger, and (when run
under commprof record) commprof's trace."""
import argparse
import json
import os
import time

import deepspeed
import deepspeed.comm as dist
import torch
from _exit import wait_released


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--result-dir", required=True)
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    dist.configure(enabled=True, prof_all=True, verbose=False)
    t = torch.ones(args.numel)
    mine = []
    for _ in range(args.calls):
        t0 = time.monotonic_ns()
        dist.all_reduce(t)
        mine.append((time.monotonic_ns() - t0) / 1e6)
        time.sleep(0.02)
    logged = {}
    for op, sizes in dist.comms_logger.comms_dict.items():
        for size, vals in sizes.items():
            logged[f"{op}:{size}"] = {"count": vals[0], "latencies_ms": list(vals[1])}
    with open(os.path.join(args.result_dir, f"rank{dist.get_rank()}.json"), "w") as fh:
        json.dump({"rank": dist.get_rank(), "mine_ms": mine, "deepspeed_logger": logged}, fh)
    wait_released([t])  # see _exit.py


if __name__ == "__main__":
    main()
