"""ResNet training workload for commprof (the scaling study's workload).

Runs unchanged with or without ``commprof record``:

    python workloads/resnet.py                          # small CPU default, 1 process
    torchrun --nproc_per_node 2 workloads/resnet.py     # DDP, gloo on CPU / NCCL on GPU
    commprof record --nproc 2 -- python workloads/resnet.py

Data: ``--loader native`` reads an ImageFolder tree (``--data``) or, without
``--data``, an in-memory set of generated images through the same
DataLoader path; ``--loader synthetic`` feeds one fixed tensor (no loader).

Throughput printed per epoch and at the end is measured by the script
itself: samples of all ranks over the wall time of the timed steps (the
first ``--warmup`` steps are left out), so it can be compared with
``commprof report``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--arch", default="resnet18", choices=["resnet18", "resnet50", "resnet101", "resnet152"])
    p.add_argument("--framework", default="auto", choices=["auto", "ddp", "none"],
                   help="auto: ddp when launched with several processes")
    p.add_argument("--loader", default="native", choices=["native", "synthetic"])
    p.add_argument("--data", default=None, help="ImageFolder root with train/ (and val/)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=2048, help="generated training images (no --data)")
    p.add_argument("--steps", type=int, default=30, help="training steps (0: whole epochs)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the script's own throughput")
    p.add_argument("--lr", type=float, default=0.1, help="base LR for a global batch of 256")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a final JSON summary line")
    p.add_argument("--step-times", default=None, metavar="FILE",
                   help="rank 0 writes its per-step wall times (seconds, JSON list) here")
    return p.parse_args(argv)


class GeneratedImages(Dataset):
    """Deterministic generated images: class-dependent colour blobs plus
    noise, uint8 CHW, so the loader path (indexing, collation, conversion)
    is real and the model can learn something."""

    def __init__(self, n, size, classes, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.noise_seed = seed
        self.size = size
        self.classes = classes
        self.palette = torch.rand(classes, 3, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        y = int(self.labels[i])
        g = torch.Generator().manual_seed(self.noise_seed * 1_000_003 + i)
        img = self.palette[y].view(3, 1, 1) * 0.7 + 0.3 * torch.rand(3, self.size, self.size, generator=g)
        return (img * 255).to(torch.uint8), y


def to_float(x):
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return (x.float() / 255.0 - mean.to(x.device)) / std.to(x.device)


def make_dataset(args, train=True):
    if args.data:
        from torchvision import datasets, transforms

        root = os.path.join(args.data, "train" if train else "val")
        tf = transforms.Compose([transforms.Resize((args.image_size, args.image_size)),
                                 transforms.PILToTensor()])
        return datasets.ImageFolder(root, transform=tf)
    n = args.samples if train else max(args.samples // 8, args.batch_size)
    return GeneratedImages(n, args.image_size, args.num_classes, seed=args.seed + (0 if train else 1))


def setup_distributed(args):
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    framework = args.framework if args.framework != "auto" else ("ddp" if world > 1 else "none")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if framework == "ddp" and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    return framework, rank, world, device


def build_model(args, device):
    import torchvision

    torch.manual_seed(args.seed)
    return getattr(torchvision.models, args.arch)(weights=None, num_classes=args.num_classes).to(device)


def main(argv=None):
    args = parse_args(argv)
    framework, rank, world, device = setup_distributed(args)
    model = build_model(args, device)
    if framework == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    global_batch = args.batch_size * world
    lr = args.lr * global_batch / 256.0  # linear scaling rule (Goyal et al.)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)

    try:  # label the run in commprof's trace (no-op when not recording)
        import commprof
        commprof.set_run_info(framework=framework, loader=args.loader, model=args.arch,
                              batch_size=args.batch_size, image_size=args.image_size)
    except ImportError:
        commprof = None

    if args.loader == "native":
        ds = make_dataset(args)
        sampler = (torch.utils.data.distributed.DistributedSampler(ds, world, rank, shuffle=True, seed=args.seed)
                   if world > 1 else None)
        loader = DataLoader(ds, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                            num_workers=args.workers, drop_last=True,
                            generator=torch.Generator().manual_seed(args.seed),
                            persistent_workers=args.workers > 0)
        steps_per_epoch = len(loader)
    else:
        g = torch.Generator().manual_seed(args.seed + rank)
        fixed = (torch.randint(0, 256, (args.batch_size, 3, args.image_size, args.image_size),
                               dtype=torch.uint8, generator=g),
                 torch.randint(0, args.num_classes, (args.batch_size,), generator=g))
        loader = None
        steps_per_epoch = max(args.steps, 1)

    total_steps = args.steps if args.steps > 0 else steps_per_epoch * args.epochs
    epochs = math.ceil(total_steps / steps_per_epoch)
    step = 0
    timed_start, timed_steps = None, 0
    step_times, t_last = [], time.perf_counter()
    model.train()
    for epoch in range(epochs):
        if loader is not None and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        batches = iter(loader) if loader is not None else None
        epoch_loss, epoch_n, t_epoch = 0.0, 0, time.perf_counter()
        for _ in range(steps_per_epoch):
            if step >= total_steps:
                break
            if step == args.warmup:
                timed_start = time.perf_counter()
            x, y = next(batches) if batches is not None else fixed
            x, y = to_float(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
            out = model(x)
            loss = F.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if device.type == "cuda" and args.step_times:
                torch.cuda.synchronize()
            t_now = time.perf_counter()
            step_times.append(t_now - t_last)
            t_last = t_now
            if timed_start is not None:
                timed_steps += 1
            epoch_loss += float(loss.detach())
            epoch_n += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t_epoch
        mean_loss = epoch_loss / max(epoch_n, 1)
        if commprof is not None:
            commprof.metric("loss", mean_loss)
            commprof.metric("lr", lr)
        if rank == 0:
            print(f"epoch {epoch}: loss {mean_loss:.4f} lr {lr:.4f} "
                  f"{epoch_n * global_batch / elapsed:.1f} samples/s ({epoch_n} steps)", flush=True)
    t_end = time.perf_counter()
    result = {"rank": rank, "world_size": world, "framework": framework, "steps": step,
              "timed_steps": timed_steps, "batch_size": args.batch_size}
    if timed_start is not None and timed_steps:
        # Each rank measures its own loop; the global rate is the sum over ranks.
        local_rate = timed_steps * args.batch_size / (t_end - timed_start)
        rate = local_rate
        if world > 1 and dist.is_initialized():
            t = torch.tensor([local_rate], dtype=torch.float64)
            dist.all_reduce(t)
            rate = float(t.item())
        result["samples_per_s"] = rate
        result["steps_per_s"] = timed_steps / (t_end - timed_start)
        if commprof is not None:
            commprof.metric("samples_per_s", rate)
        if rank == 0:
            print(f"throughput: {rate:.1f} samples/s over {timed_steps} timed steps "
                  f"(global batch {global_batch})", flush=True)
    if args.json:
        print("RESULT " + json.dumps(result), flush=True)
    if args.step_times and rank == 0:
        with open(args.step_times, "w") as fh:
            json.dump(step_times, fh)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
