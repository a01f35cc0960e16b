"""LR-annealing study: step-wise, cosine and exponential schedules x global
batch sizes x seeds, with a budget that lets every cell converge.

Data: scikit-learn's handwritten digits (1,797 real 8x8 images, 10
classes; shipped with the package, nothing downloaded), the split of
workloads/make_dataset.py (every 5th image of each class to validation:
1,442 train / 355 val), pixels scaled to [0, 1]. Model: a small CNN
(conv 3x3 32 + BN + ReLU, conv 3x3 64 + BN + ReLU, max-pool 2, FC 128, FC
10) — small enough that the whole study runs on a CPU, with BatchNorm, whose
running statistics are part of what large batches with few steps get wrong.

Budget: a fixed number of **epochs** for every cell, the smallest that gives
the largest global batch ``--min-steps`` (default 150) optimizer steps:
``epochs = ceil(min_steps / floor(train_size / max_batch))`` (whole batches
only: 75 epochs for batch 512).
Fixed epochs = the same samples seen by every cell, as a scaling study
compares batch sizes at equal work; small batches then take many more
steps, which is the trade-off the study is about. LR: ``--lr`` for a global
batch of 256, scaled linearly (Goyal et al.), linear warm-up over
``--warmup-epochs``; SGD, momentum 0.9, weight decay 5e-4; schedules as in
workloads/schedules.py.

Each (schedule, batch, seed) cell reports the final validation top-1 and
the best epoch's; the study reports mean +- std (sample std, n-1) over
seeds, writes OUT.md, OUT.csv, OUT.json and OUT.html (plotly: top-1 vs
global batch, one line per schedule, error bars = std), and a verdict per
batch size: the best schedule by mean and whether its lead over the
runner-up exceeds twice the standard error of the difference (otherwise:
no finding).

    python workloads/lr_study.py --batch-sizes 32,128,512 --seeds 3 -o lr_study
    python workloads/lr_study.py --nproc 2 ...     # every cell as a 2-rank DDP job (gloo)
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import socket
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schedules import SCHEDULES, Scheduler, scaled_lr  # noqa: E402


def digits_split():
    """(x_train, y_train, x_val, y_val) as float32 / int64 numpy arrays."""
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]
    y = d.target.astype(np.int64)
    val = np.zeros(len(y), bool)
    for c in range(10):
        idx = np.flatnonzero(y == c)
        val[idx[4::5]] = True
    return x[~val], y[~val], x[val], y[val]


def model_for():
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))


def epochs_for(min_steps: int, max_batch: int, train_size: int) -> int:
    """Epochs that give the largest batch ``min_steps`` steps (whole batches only)."""
    per_epoch = train_size // max_batch
    if per_epoch < 1:
        raise SystemExit(f"global batch {max_batch} is larger than the training set ({train_size})")
    return math.ceil(min_steps / per_epoch)


def train_cell(cfg: Dict, rank: int = 0, world: int = 1) -> Dict:
    """One (schedule, global batch, seed) cell; with world > 1 this rank's
    part of a DDP job (the global batch split evenly)."""
    import numpy as np
    import torch
    import torch.nn as nn

    torch.manual_seed(cfg["seed"])
    torch.set_num_threads(1)
    xt, yt, xv, yv = digits_split()
    xt, yt, xv, yv = map(torch.from_numpy, (xt, yt, xv, yv))
    model = model_for()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    batch = cfg["global_batch"] // world
    steps_per_epoch = len(xt) // cfg["global_batch"]
    total = steps_per_epoch * cfg["epochs"]
    lr = scaled_lr(cfg["lr"], cfg["global_batch"])
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    sched = Scheduler(opt, total, lr, cfg["schedule"], int(round(cfg["warmup_epochs"] * steps_per_epoch)))
    g = torch.Generator().manual_seed(cfg["seed"])
    top1s, losses = [], []
    for _epoch in range(cfg["epochs"]):
        model.train()
        perm = torch.randperm(len(xt), generator=g)       # the same permutation on every rank
        for s in range(steps_per_epoch):
            idx = perm[s * cfg["global_batch"]:(s + 1) * cfg["global_batch"]][rank * batch:(rank + 1) * batch]
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        losses.append(float(loss.detach()))
        model.eval()
        with torch.no_grad():
            top1s.append(100.0 * float((model(xv).argmax(1) == yv).float().mean()))
    return {**cfg, "steps": total, "final_top1": top1s[-1], "best_top1": max(top1s),
            "best_epoch": int(np.argmax(top1s)) + 1, "final_loss": losses[-1]}


def _ddp_entry(rank, world, cfg, port, out):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    r = train_cell(cfg, rank, world)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(r, fh)
    dist.barrier()
    dist.destroy_process_group()


def run_cell(cfg: Dict, nproc: int) -> Dict:
    if nproc <= 1:
        return train_cell(cfg)
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        mp.spawn(_ddp_entry, args=(nproc, cfg, port, out), nprocs=nproc, join=True)
        with open(out) as fh:
            return json.load(fh)


def aggregate(cells: List[Dict]) -> List[Dict]:
    """mean / std (n-1) of final and best top-1 per (schedule, global batch)."""
    groups: Dict[tuple, List[Dict]] = {}
    for c in cells:
        groups.setdefault((c["schedule"], c["global_batch"]), []).append(c)
    out = []
    for (schedule, batch), cs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        f = [c["final_top1"] for c in cs]
        b = [c["best_top1"] for c in cs]
        out.append({"schedule": schedule, "global_batch": batch, "seeds": len(cs), "steps": cs[0]["steps"],
                    "epochs": cs[0]["epochs"], "top1_mean": _mean(f), "top1_std": _std(f),
                    "best_top1_mean": _mean(b), "best_epoch_mean": _mean([c["best_epoch"] for c in cs])})
    return out


def _mean(v):
    return sum(v) / len(v)


def _std(v):
    if len(v) < 2:
        return float("nan")
    m = _mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def verdicts(agg: List[Dict]) -> List[Dict]:
    """Per batch size: the best schedule by mean, the runner-up, and whether
    the lead exceeds twice the standard error of the difference."""
    out = []
    for batch in sorted({a["global_batch"] for a in agg}):
        rows = sorted((a for a in agg if a["global_batch"] == batch), key=lambda a: -a["top1_mean"])
        best, second = rows[0], rows[1] if len(rows) > 1 else None
        if second is None or best["seeds"] < 2:
            out.append({"global_batch": batch, "best": best["schedule"], "lead": float("nan"), "se": float("nan"),
                        "significant": False})
            continue
        lead = best["top1_mean"] - second["top1_mean"]
        se = math.sqrt(best["top1_std"] ** 2 / best["seeds"] + second["top1_std"] ** 2 / second["seeds"])
        out.append({"global_batch": batch, "best": best["schedule"], "runner_up": second["schedule"],
                    "lead": lead, "se": se, "significant": bool(lead > 2 * se)})
    return out


def write_outputs(out: str, cells, agg, verdict, schedules, batches, meta) -> None:
    with open(out + ".csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(agg[0]))
        w.writeheader()
        w.writerows(agg)
    with open(out + ".json", "w") as fh:
        json.dump({"meta": meta, "cells": cells, "aggregate": agg, "verdict": verdict}, fh, indent=1)
    by = {(a["schedule"], a["global_batch"]): a for a in agg}
    lines = ["| global batch | steps | " + " | ".join(f"{s} top-1 % (mean ± std)" for s in schedules) +
             " | best | lead vs runner-up (± 2 SE) |", "|---:|---:|" + "---:|" * len(schedules) + "---|---|"]
    for b, v in zip(batches, verdict):
        cells_ = [by[(s, b)] for s in schedules]
        lead = (f"{v['lead']:+.2f} (± {2 * v['se']:.2f}): " + ("significant" if v["significant"] else "no finding")
                if v["lead"] == v["lead"] else "—")
        lines.append(f"| {b} | {cells_[0]['steps']} | " + " | ".join(
            f"{c['top1_mean']:.2f} ± {c['top1_std']:.2f}" for c in cells_) + f" | {v['best']} | {lead} |")
    with open(out + ".md", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    import plotly.graph_objects as go

    fig = go.Figure()
    for s in schedules:
        rows = [by[(s, b)] for b in batches]
        fig.add_trace(go.Scatter(x=batches, y=[r["top1_mean"] for r in rows], name=s, mode="lines+markers",
                                 error_y={"type": "data", "array": [r["top1_std"] for r in rows]}))
    fig.update_layout(title=f"Validation top-1 vs global batch ({meta['seeds']} seeds, {meta['epochs']} epochs)",
                      xaxis={"title": "global batch", "type": "log", "tickvals": batches},
                      yaxis={"title": "final validation top-1 %"})
    fig.write_html(out + ".html", include_plotlyjs="cdn")
    print("\n".join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="32,128,512")
    p.add_argument("--schedules", default=",".join(SCHEDULES))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--min-steps", type=int, default=150,
                   help="optimizer steps the largest batch gets (sets the epochs of every cell)")
    p.add_argument("--epochs", type=int, default=0, help="override the epochs (0: from --min-steps)")
    p.add_argument("--warmup-epochs", type=float, default=5.0)
    p.add_argument("--lr", type=float, default=0.2, help="base LR for a global batch of 256")
    p.add_argument("--nproc", type=int, default=1, help="run every cell as an N-rank DDP job (gloo)")
    p.add_argument("-o", "--out", default="lr_study", help="writes OUT.md, OUT.csv, OUT.json, OUT.html")
    a = p.parse_args(argv)
    batches = [int(b) for b in a.batch_sizes.split(",")]
    schedules = [s for s in a.schedules.split(",") if s]
    for b in batches:
        if b % a.nproc:
            raise SystemExit(f"global batch {b} does not split over {a.nproc} ranks")
    train_size = len(digits_split()[1])
    epochs = a.epochs or epochs_for(a.min_steps, max(batches), train_size)
    cells = []
    t0 = time.perf_counter()
    for seed in range(a.seeds):
        for s in schedules:
            for b in batches:
                cfg = {"schedule": s, "global_batch": b, "seed": seed, "epochs": epochs, "lr": a.lr,
                       "warmup_epochs": a.warmup_epochs}
                t = time.perf_counter()
                r = run_cell(cfg, a.nproc)
                r["seconds"] = round(time.perf_counter() - t, 2)
                cells.append(r)
                print(json.dumps({k: r[k] for k in ("schedule", "global_batch", "seed", "steps", "final_top1",
                                                    "best_top1", "seconds")}), flush=True)
    agg = aggregate(cells)
    verdict = verdicts(agg)
    meta = {"epochs": epochs, "seeds": a.seeds, "train_size": train_size, "lr_base_256": a.lr,
            "warmup_epochs": a.warmup_epochs, "nproc": a.nproc, "seconds": round(time.perf_counter() - t0, 1)}
    write_outputs(a.out, cells, agg, verdict, schedules, batches, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
