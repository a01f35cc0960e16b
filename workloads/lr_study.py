"""LR-annealing study: step-wise, cosine and exponential schedules x global
batch sizes, on the small real dataset of workloads/make_dataset.py.

Each cell trains workloads/resnet.py (single process, same seed, LR scaled
linearly with the batch, linear warm-up) for the same number of epochs and
reports the final validation top-1 accuracy; writes Markdown and CSV tables.

    python workloads/make_dataset.py data
    python workloads/lr_study.py --data data --batch-sizes 32,128,512 --epochs 8 -o lr_study
"""
import argparse
import csv
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet  # noqa: E402
from schedules import SCHEDULES  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--batch-sizes", default="32,128,512")
    p.add_argument("--schedules", default=",".join(SCHEDULES))
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=0.4, help="base LR for a global batch of 256")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("-o", "--out", default="lr_study", help="writes OUT.md and OUT.csv")
    args = p.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    schedules = args.schedules.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for schedule in schedules:
            for batch in batches:
                res = os.path.join(tmp, f"{schedule}-{batch}.json")
                t0 = time.perf_counter()
                resnet.main(["--framework", "none", "--data", args.data, "--arch", args.arch,
                             "--image-size", str(args.image_size), "--batch-size", str(batch),
                             "--epochs", str(args.epochs), "--steps", "0", "--lr", str(args.lr),
                             "--lr-schedule", schedule, "--warmup-epochs", str(args.warmup_epochs),
                             "--result", res])
                with open(res) as fh:
                    r = json.load(fh)
                last = r["epochs"][-1]
                rows.append({"schedule": schedule, "global_batch": batch, "epochs": len(r["epochs"]),
                             "steps": r["steps"], "final_loss": round(last["loss"], 4),
                             "top1": round(last["top1"], 2), "top5": round(last["top5"], 2),
                             "best_top1": round(max(e["top1"] for e in r["epochs"]), 2),
                             "seconds": round(time.perf_counter() - t0, 1)})
                print(rows[-1], flush=True)
    with open(args.out + ".csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| global batch | " + " | ".join(f"{s} top-1 %" for s in schedules) + " |",
             "|---:|" + "---:|" * len(schedules)]
    for b in batches:
        cells = [next(r for r in rows if r["schedule"] == s and r["global_batch"] == b)["top1"] for s in schedules]
        lines.append(f"| {b} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    with open(args.out + ".md", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
