"""ResNet training workload for commprof: the scaling study's workload.

ResNet-18/50/101/152 (torchvision, no pretrained weights) trained with
PyTorch-DDP, Horovod or DeepSpeed (ZeRO 0-3), fed by the native DataLoader,
NVIDIA DALI (JPEG files or TFRecord) or a fixed synthetic batch; CUDA + NCCL
when a GPU is there, CPU + gloo otherwise. It runs unchanged with or without
``commprof record``:

    python workloads/resnet.py                                   # small CPU default, 1 process
    torchrun --nproc_per_node 2 workloads/resnet.py              # DDP
    horovodrun -np 2 python workloads/resnet.py --framework horovod
    deepspeed --num_gpus 2 workloads/resnet.py --framework deepspeed --zero-stage 2
    python workloads/make_dataset.py data && \\
      torchrun --nproc_per_node 2 workloads/resnet.py --data data --loader dali
    commprof record --nproc 2 -- python workloads/resnet.py

LR: ``--lr`` is for a global batch of 256 and is scaled linearly with the
global batch (Goyal et al.); it warms up linearly over ``--warmup-epochs``
and then follows ``--lr-schedule`` step | cosine | exponential (see
workloads/schedules.py). SGD with momentum and weight decay. Validation
top-1 / top-5 after each epoch when there is validation data.

Throughput printed per epoch and at the end is measured by the script
itself: samples of all ranks over the wall time of the timed steps (the
first ``--warmup`` steps are left out), so it can be compared with
``commprof report``.
"""
from __future__ import annotations

import argparse
import faulthandler
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schedules import SCHEDULES, Scheduler, scaled_lr  # noqa: E402
from teardown import wait_released  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--arch", default="resnet18", choices=["resnet18", "resnet50", "resnet101", "resnet152"])
    p.add_argument("--framework", default="auto", choices=["auto", "ddp", "horovod", "deepspeed", "none"],
                   help="auto: ddp when launched with several processes")
    p.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3], help="DeepSpeed ZeRO stage")
    p.add_argument("--loader", default="native", choices=["native", "dali", "synthetic"])
    p.add_argument("--data", default=None,
                   help="dataset root: train/ and val/ JPEG folders (native or DALI file reader) and/or "
                        "tfrecord/{train,val}.tfrecord with .idx files (DALI TFRecord reader)")
    p.add_argument("--dali-reader", default="auto", choices=["auto", "file", "tfrecord"])
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes / DALI threads - 1")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=2048, help="generated training images (no --data)")
    p.add_argument("--steps", type=int, default=30, help="training steps (0: whole epochs)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the script's own throughput")
    p.add_argument("--lr", type=float, default=0.1, help="base LR for a global batch of 256")
    p.add_argument("--lr-schedule", default="cosine", choices=SCHEDULES)
    p.add_argument("--warmup-epochs", type=float, default=0.0, help="linear LR warm-up")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-val", action="store_true", help="skip validation")
    p.add_argument("--json", action="store_true", help="print a final JSON summary line")
    p.add_argument("--step-times", default=None, metavar="FILE",
                   help="rank 0 writes its per-step wall times (seconds, JSON list) here; every rank "
                        "writes FILE-stem.rank<R>.json with per-step wall and CPU (process_time) times")
    p.add_argument("--result", default=None, metavar="FILE",
                   help="rank 0 writes its summary (losses, accuracy, throughput) here as JSON")
    p.add_argument("--emulate-device-ms", default=None, metavar="FWD,BWD",
                   help="GPU-like timing on a CPU with fewer cores than ranks: each layer's forward and backward "
                        "also take their share (by FLOPs) of FWD / BWD ms per step, spent waiting as on an "
                        "accelerator (the CPU is free meanwhile); use with a small --image-size / --batch-size")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- data -------------------------------------------------------------------------
class GeneratedImages(Dataset):
    """Deterministic generated images: class-dependent colours plus noise,
    uint8 CHW, so the loader path is real and the model can learn."""

    def __init__(self, n, size, classes, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.noise_seed = seed
        self.size = size
        self.palette = torch.rand(classes, 3, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        y = int(self.labels[i])
        g = torch.Generator().manual_seed(self.noise_seed * 1_000_003 + i)
        img = self.palette[y].view(3, 1, 1) * 0.7 + 0.3 * torch.rand(3, self.size, self.size, generator=g)
        return (img * 255).to(torch.uint8), y


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def to_float(x):
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return (x.float() / 255.0 - mean) / std


def native_loader(args, train, rank, world):
    if args.data:
        from torchvision import datasets, transforms

        root = os.path.join(args.data, "train" if train else "val")
        if not os.path.isdir(root):
            return None
        ds = datasets.ImageFolder(root, transform=transforms.Compose(
            [transforms.Resize((args.image_size, args.image_size)), transforms.PILToTensor()]))
    else:
        n = args.samples if train else max(args.samples // 8, args.batch_size)
        ds = GeneratedImages(n, args.image_size, args.num_classes, seed=args.seed + (0 if train else 1))
    sampler = (torch.utils.data.distributed.DistributedSampler(ds, world, rank, shuffle=train, seed=args.seed)
               if world > 1 else None)
    return DataLoader(ds, batch_size=args.batch_size, shuffle=train and sampler is None, sampler=sampler,
                      num_workers=args.workers, drop_last=train, persistent_workers=args.workers > 0,
                      generator=torch.Generator().manual_seed(args.seed))


class DaliLoader:
    """DALI pipeline (file or TFRecord reader, sharded by rank) behind
    DALIClassificationIterator; yields (float NCHW images, int64 labels)."""

    def __init__(self, args, train, rank, world, device):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy
        from nvidia.dali.plugin.pytorch import DALIClassificationIterator

        split = "train" if train else "val"
        rec = os.path.join(args.data or "", "tfrecord", f"{split}.tfrecord")
        reader = args.dali_reader
        if reader == "auto":
            reader = "tfrecord" if os.path.exists(rec) and not os.path.isdir(os.path.join(args.data, split)) \
                else "file"
        gpu = device.type == "cuda"

        @pipeline_def
        def pipe():
            if reader == "tfrecord":
                import nvidia.dali.tfrecord as tfrec

                inp = fn.readers.tfrecord(path=rec, index_path=rec + ".idx", shard_id=rank, num_shards=world,
                                          random_shuffle=train, name="reader", features={
                                              "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                                              "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
                jpegs, labels = inp["image/encoded"], inp["image/class/label"]
            else:
                jpegs, labels = fn.readers.file(file_root=os.path.join(args.data, split), shard_id=rank,
                                                num_shards=world, random_shuffle=train, name="reader")
            images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu")
            images = fn.resize(images, resize_x=args.image_size, resize_y=args.image_size)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])
            return images, labels

        self.exists = reader == "tfrecord" and os.path.exists(rec) or \
            reader == "file" and os.path.isdir(os.path.join(args.data or "", split))
        if not self.exists:
            return
        p = pipe(batch_size=args.batch_size, num_threads=max(1, args.workers), seed=args.seed + rank,
                 device_id=device.index if gpu else None)
        self.it = DALIClassificationIterator(p, reader_name="reader",
                                             last_batch_policy=LastBatchPolicy.DROP if train
                                             else LastBatchPolicy.PARTIAL)
        self.reader = reader

    def __len__(self):
        return self.it._size // self.it.batch_size if hasattr(self.it, "_size") else 0

    def __iter__(self):
        for batch in self.it:
            yield batch[0]["data"], batch[0]["label"].view(-1).long()


# -- emulated device time ----------------------------------------------------------------
def layer_weights(model, image_size):
    """Each leaf module's share of the step's device time: FLOPs of conv and
    linear layers (2 x MACs), 10 x output elements for the memory-bound rest
    (batch norm, activations, pooling), measured with hooks on one sample."""
    weights, hooks = {}, []

    def hook(mod, inp, out):
        elems = out.numel() if torch.is_tensor(out) else 0
        if isinstance(mod, nn.Conv2d):
            k = mod.kernel_size[0] * mod.kernel_size[1] * mod.in_channels // mod.groups
            w = 2.0 * elems * k
        elif isinstance(mod, nn.Linear):
            w = 2.0 * elems * mod.in_features
        else:
            w = 10.0 * elems
        weights[mod] = weights.get(mod, 0.0) + w

    for m in model.modules():
        if not list(m.children()):
            hooks.append(m.register_forward_hook(hook))
    was = model.training
    model.eval()  # batch norm on one sample
    with torch.no_grad():
        model(torch.zeros(1, 3, image_size, image_size))
    model.train(was)
    for h in hooks:
        h.remove()
    total = sum(weights.values()) or 1.0
    return {m: w / total for m, w in weights.items()}


def emulate_device(model, fwd_ms, bwd_ms, image_size):
    """Sleep each layer's share of fwd_ms after its forward and of bwd_ms
    when its gradient is computed (a parameter hook: the autograd engine
    waits, so later gradients — and DDP's buckets — become ready as they
    would on a device); parameterless layers' backward share goes to the
    next layer with parameters in backward order."""
    weights = layer_weights(model, image_size)
    order = [m for m in model.modules() if m in weights]
    for m in order:
        m.register_forward_hook(lambda mod, inp, out, d=fwd_ms * weights[m] / 1e3: time.sleep(d))
    carry = 0.0
    for m in order:  # forward order; backward runs in reverse, carry the parameterless share backwards
        carry += weights[m]
        params = [p for p in m.parameters(recurse=False) if p.requires_grad]
        if params:
            d = bwd_ms * carry / 1e3
            params[0].register_hook(lambda g, d=d: (time.sleep(d), g)[1])
            carry = 0.0


# -- frameworks ----------------------------------------------------------------------
def setup(args):
    env_world = int(os.environ.get("WORLD_SIZE", os.environ.get("HOROVOD_SIZE", 1)))
    framework = args.framework
    if framework == "auto":
        framework = "ddp" if env_world > 1 else "none"
    cuda = torch.cuda.is_available()
    hvd = None
    if framework == "horovod":
        import horovod.torch as hvd

        hvd.init()
        rank, world, local = hvd.rank(), hvd.size(), hvd.local_rank()
    elif framework == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", 0))
    else:
        rank, world = int(os.environ.get("RANK", 0)), env_world
        local = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:  # before NCCL's communicator is made, so it binds to this rank's GPU
            torch.cuda.set_device(local)
        if framework == "ddp" and not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
            rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return framework, rank, world, device, hvd


def all_sum(values, framework, hvd):
    t = torch.tensor(values, dtype=torch.float64)
    if framework == "horovod":
        return hvd.allreduce(t, op=hvd.Sum).tolist()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
        _LAST_COLLECTIVE[:] = [t]
    return t.tolist()


_LAST_COLLECTIVE: list = []


def evaluate(model, loader, device, framework, hvd):
    model.eval()
    correct1 = correct5 = n = 0
    with torch.no_grad():
        for x, y in loader:
            x = to_float(x.to(device)) if x.dtype == torch.uint8 else x.to(device)
            y = y.to(device)
            top5 = model(x).topk(5, dim=1).indices
            correct1 += int((top5[:, 0] == y).sum())
            correct5 += int((top5 == y[:, None]).any(dim=1).sum())
            n += len(y)
    model.train()
    c1, c5, total = all_sum([correct1, correct5, n], framework, hvd)
    return 100.0 * c1 / max(total, 1), 100.0 * c5 / max(total, 1)


def main(argv=None):
    args = parse_args(argv)
    if not faulthandler.is_enabled():
        faulthandler.enable()  # a crash in native code prints every thread's Python stack
    framework, rank, world, device, hvd = setup(args)
    import torchvision

    torch.manual_seed(args.seed)
    model = getattr(torchvision.models, args.arch)(weights=None, num_classes=args.num_classes).to(device)
    if args.emulate_device_ms:
        try:
            fwd_ms, bwd_ms = (float(v) for v in args.emulate_device_ms.split(","))
        except ValueError:
            raise SystemExit(f"--emulate-device-ms expects FWD,BWD in ms, got {args.emulate_device_ms!r}")
        emulate_device(model, fwd_ms, bwd_ms, args.image_size)
    global_batch = args.batch_size * world
    lr = scaled_lr(args.lr, global_batch)  # linear scaling rule
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)
    engine = None
    if framework == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    elif framework == "horovod":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif framework == "deepspeed":
        import deepspeed

        config = {"train_micro_batch_size_per_gpu": args.batch_size, "gradient_accumulation_steps": 1,
                  "train_batch_size": global_batch, "zero_optimization": {"stage": args.zero_stage},
                  "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9,
                  "gradient_clipping": 0.0}  # DeepSpeed would otherwise clip; DDP / Horovod do not
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
        model = engine

    try:  # label the run in commprof's trace (no-op when not recording)
        import commprof
        commprof.set_run_info(framework=framework, loader=args.loader, model=args.arch,
                              batch_size=args.batch_size, image_size=args.image_size, lr_schedule=args.lr_schedule,
                              **({"zero_stage": args.zero_stage} if framework == "deepspeed" else {}))
    except ImportError:
        commprof = None

    if args.loader == "native":
        loader = native_loader(args, True, rank, world)
        val = None if args.no_val else native_loader(args, False, rank, world)
        steps_per_epoch = len(loader)
    elif args.loader == "dali":
        if not args.data:
            raise SystemExit("--loader dali needs --data (see workloads/make_dataset.py)")
        loader = DaliLoader(args, True, rank, world, device)
        val = None if args.no_val else DaliLoader(args, False, rank, world, device)
        val = val if val is not None and val.exists else None
        steps_per_epoch = max(1, len(loader))
    else:
        g = torch.Generator().manual_seed(args.seed + rank)
        fixed = (torch.randint(0, 256, (args.batch_size, 3, args.image_size, args.image_size),
                               dtype=torch.uint8, generator=g),
                 torch.randint(0, args.num_classes, (args.batch_size,), generator=g))
        loader, val = None, None
        steps_per_epoch = max(args.steps, 1)

    total_steps = args.steps if args.steps > 0 else steps_per_epoch * args.epochs
    epochs = max(args.epochs, math.ceil(total_steps / steps_per_epoch)) if args.steps > 0 else args.epochs
    sched = Scheduler(opt, total_steps, lr, args.lr_schedule, int(args.warmup_epochs * steps_per_epoch))
    step, timed_start, timed_steps = 0, None, 0
    step_times, t_last, losses, history = [], time.perf_counter(), [], []
    cpu_times, c_last = [], time.process_time()
    model.train()
    for epoch in range(epochs):
        if step >= total_steps:
            break
        if loader is not None and hasattr(getattr(loader, "sampler", None), "set_epoch"):
            loader.sampler.set_epoch(epoch)
        batches = iter(loader) if loader is not None else None
        epoch_loss, epoch_n, t_epoch = 0.0, 0, time.perf_counter()
        while step < total_steps and (batches is None or epoch_n < steps_per_epoch):
            if step == args.warmup:
                timed_start = time.perf_counter()
            try:
                x, y = next(batches) if batches is not None else fixed
            except StopIteration:
                break
            x = to_float(x.to(device, non_blocking=True)) if x.dtype == torch.uint8 else x.to(device)
            y = y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            if engine is not None:
                engine.backward(loss)
                engine.step()
            else:
                opt.zero_grad()
                loss.backward()
                opt.step()
            current_lr = sched.step()
            step += 1
            if device.type == "cuda" and args.step_times:
                torch.cuda.synchronize()
            t_now = time.perf_counter()
            step_times.append(t_now - t_last)
            t_last = t_now
            c_now = time.process_time()
            cpu_times.append(c_now - c_last)
            c_last = c_now
            if timed_start is not None:
                timed_steps += 1
            losses.append(float(loss.detach()))
            epoch_loss += losses[-1]
            epoch_n += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t_epoch
        mean_loss = epoch_loss / max(epoch_n, 1)
        top1, top5 = evaluate(model, val, device, framework, hvd) if val is not None else (None, None)
        history.append({"epoch": epoch, "loss": mean_loss, "lr": current_lr if epoch_n else lr,
                        "top1": top1, "top5": top5, "samples_per_s": epoch_n * global_batch / elapsed})
        if commprof is not None:
            for k in ("loss", "lr", "top1", "top5", "samples_per_s"):
                if history[-1][k] is not None:
                    commprof.metric(k, history[-1][k])
        if rank == 0:
            acc = f" top1 {top1:.1f} % top5 {top5:.1f} %" if top1 is not None else ""
            print(f"epoch {epoch}: loss {mean_loss:.4f} lr {history[-1]['lr']:.4f}{acc} "
                  f"{epoch_n * global_batch / elapsed:.1f} samples/s ({epoch_n} steps)", flush=True)
    t_end = time.perf_counter()
    result = {"rank": rank, "world_size": world, "framework": framework, "loader": args.loader, "steps": step,
              "timed_steps": timed_steps, "batch_size": args.batch_size, "losses": losses, "epochs": history}
    if timed_start is not None and timed_steps:
        rate = all_sum([timed_steps * args.batch_size / (t_end - timed_start)], framework, hvd)[0]
        result["samples_per_s"] = rate
        result["steps_per_s"] = timed_steps / (t_end - timed_start)
        if commprof is not None:
            commprof.metric("throughput_samples_per_s", rate)
        if rank == 0:
            print(f"throughput: {rate:.1f} samples/s over {timed_steps} timed steps "
                  f"(global batch {global_batch})", flush=True)
    if args.json:
        print("RESULT " + json.dumps({k: v for k, v in result.items() if k not in ("losses", "epochs")}), flush=True)
    if args.step_times:  # every rank: wall and CPU time (time.process_time) per step
        root, ext = os.path.splitext(args.step_times)
        with open(f"{root}.rank{rank}{ext}", "w") as fh:
            json.dump({"wall": step_times, "cpu": cpu_times}, fh)
    if rank == 0:
        for path, data in ((args.step_times, step_times), (args.result, result)):
            if path:
                with open(path, "w") as fh:
                    json.dump(data, fh)
    if framework in ("ddp", "deepspeed") and dist.is_initialized():
        # Orderly teardown: all ranks done, gloo's worker threads have let
        # go of the last collective's tensors (see wait_released), then the
        # group is destroyed while the interpreter is fully alive.
        dist.barrier()
        wait_released(_LAST_COLLECTIVE)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
