"""Tiny training job fed by a DALI CPU pipeline (device_id=None) reading
JPEG files, for commprof's tests. Writes its own JPEGs first."""
import argparse
import json
import os

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIClassificationIterator


def make_images(root, n_per_class=8, classes=2, size=32):
    rng = np.random.default_rng(0)
    for c in range(classes):
        d = os.path.join(root, f"class{c}")
        os.makedirs(d, exist_ok=True)
        for i in range(n_per_class):
            img = (rng.random((size, size, 3)) * 80 + c * 150).clip(0, 255).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(d, f"{i}.jpg"), quality=90)


@pipeline_def
def pipe(root):
    jpegs, labels = fn.readers.file(file_root=root, random_shuffle=False, name="reader")
    images = fn.decoders.image(jpegs, device="cpu")
    images = fn.resize(images, resize_x=16, resize_y=16)
    images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                      mean=[128.0] * 3, std=[64.0] * 3)
    return images, labels


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--result-dir", default=None)
    args = p.parse_args()
    make_images(args.data)
    it = DALIClassificationIterator(pipe(args.data, batch_size=args.batch, num_threads=1, device_id=None),
                                    reader_name="reader")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, labels = [], []
    for batch in it:
        x, y = batch[0]["data"], batch[0]["label"].squeeze(-1).long()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        labels += y.tolist()
    if args.result_dir:
        with open(os.path.join(args.result_dir, "rank0.json"), "w") as fh:
            json.dump({"rank": 0, "losses": losses, "labels": labels}, fh)


if __name__ == "__main__":
    main()
