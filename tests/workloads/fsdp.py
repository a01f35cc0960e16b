"""A sharded data-parallel job on CPU (gloo): FSDP2 (``fully_shard`` on
every layer, then the root) or FSDP1 (``FullyShardedDataParallel`` with
``device_id=cpu``), a model of known layers, for commprof's tests.

    torchrun --nproc_per_node 2 tests/workloads/fsdp.py --steps 6
    ... --prefetch              # FSDP2: each layer prefetches the next one's gather in forward,
                                # asynchronously (on gloo a synchronous prefetch overlaps nothing)
    ... --delay-layer 1 --delay-ms 30   # planted compute in layer 1's forward
    ... --fsdp1                 # FSDP1 instead, one wrap per layer
    ... --oracle DIR            # per step, torch's CommDebugMode counts (the test's oracle)

The model: ``--layers`` blocks ``layers.K`` (Linear(D, D) + ReLU), then
``head`` (Linear(D, 10)); the FQNs are ``layers.0`` ... and ``head``."""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d: int, delay_s: float = 0.0):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.delay_s = delay_s

    def forward(self, x):
        if self.delay_s:
            end = time.perf_counter() + self.delay_s    # compute, not a sleep: the rank is busy
            while time.perf_counter() < end:
                pass
        return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self, d: int, layers: int, delay_layer: int, delay_s: float):
        super().__init__()
        self.layers = nn.ModuleList(Block(d, delay_s if k == delay_layer else 0.0) for k in range(layers))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        for block in self.layers:
            x = block(x)
        return self.head(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prefetch", action="store_true", help="FSDP2: forward-prefetch the next layer")
    p.add_argument("--delay-layer", type=int, default=-1)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--fsdp1", action="store_true")
    p.add_argument("--reduce-dtype", default=None, help="FSDP2 mixed precision: reduce-scatter in this dtype")
    p.add_argument("--oracle", default=None, help="write torch's CommDebugMode counts per step here")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per rank")
    p.add_argument("--backend", default=None, help="default: nccl on cuda, gloo on cpu (gloo: ranks may share a GPU)")
    a = p.parse_args()
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dist.init_process_group(a.backend or ("nccl" if cuda else "gloo"))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = Net(a.dim, a.layers, a.delay_layer, a.delay_ms / 1e3).to(dev)
    if a.fsdp1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FSDP(model, device_id=dev, auto_wrap_policy=ModuleWrapPolicy({Block}))
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(dev.type, (world,))
        mp = MixedPrecisionPolicy(reduce_dtype=getattr(torch, a.reduce_dtype)) if a.reduce_dtype else None
        kw = {"mesh": mesh} | ({"mp_policy": mp} if mp else {})
        for block in model.layers:
            fully_shard(block, **kw)
        fully_shard(model.head, **kw)
        fully_shard(model, **kw)
        if a.prefetch:
            mods = list(model.layers) + [model.head]
            for cur, nxt in zip(mods, mods[1:]):
                cur.set_modules_to_forward_prefetch([nxt])
            model._set_unshard_async_op(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    counts, losses = [], []
    for step in range(a.steps):
        x, y = torch.randn(a.batch, a.dim, generator=g), torch.randint(0, 10, (a.batch,), generator=g)
        x, y = x.to(dev), y.to(dev)
        if a.oracle:
            from torch.distributed.tensor.debug import CommDebugMode

            mode = CommDebugMode()
            with mode:
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
            counts.append({str(k): v for k, v in mode.get_comm_counts().items()})
        else:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    if a.oracle and rank == 0:
        os.makedirs(a.oracle, exist_ok=True)
        with open(os.path.join(a.oracle, "oracle.json"), "w") as fh:
            json.dump({"counts": counts, "losses": losses,
                       "params": {n: int(t.numel()) for n, t in Net(a.dim, a.layers, -1, 0).named_parameters()}},
                      fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
