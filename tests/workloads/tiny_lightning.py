"""A LightningModule trained by Lightning's Trainer on CPU, unchanged under
``commprof record`` (commprof's tests).

    python tests/workloads/tiny_lightning.py --strategy ddp --steps 8
    ... --strategy ddp_spawn      # Lightning spawns its ranks (the parent is not one)"""
from __future__ import annotations

import argparse
import json
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch, idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--result-dir", default=None)
    a = p.parse_args()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16 * a.steps * a.devices, 32), torch.randint(0, 10, (16 * a.steps * a.devices,)))
    trainer = pl.Trainer(strategy=a.strategy, accelerator="cpu", devices=a.devices, max_steps=a.steps,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    model = Tiny()
    trainer.fit(model, DataLoader(data, batch_size=16))
    if a.result_dir and trainer.global_rank == 0:
        os.makedirs(a.result_dir, exist_ok=True)
        with open(os.path.join(a.result_dir, "lightning.json"), "w") as fh:
            json.dump({"global_step": trainer.global_step}, fh)


if __name__ == "__main__":
    main()
