"""Learning-rate schedules of the scaling study: step-wise, cosine and
exponential annealing, each after a linear warm-up, with the LR scaled
linearly with the global batch size.

- **Scaling rule** (Goyal et al., 2017): ``lr = base_lr * global_batch / 256``.
- **Warm-up**: for the first ``warmup`` steps the LR rises linearly from
  ``lr / warmup`` (step 0) to ``lr`` (step ``warmup``).
- After warm-up, with ``p`` = fraction of the remaining steps done (0 -> 1):
  * ``step``: ``lr * 0.1 ** k``, k = number of milestones (30 %, 60 %, 80 %
    of the post-warm-up steps — ImageNet's epochs 30/60/80 of 90) passed;
  * ``cosine``: ``lr * 0.5 * (1 + cos(pi * p))``;
  * ``exponential``: ``lr * final ** p`` (``final`` = 0.01: the LR falls by
    100x over the run).
"""
from __future__ import annotations

import math

SCHEDULES = ("step", "cosine", "exponential")
MILESTONES = (0.3, 0.6, 0.8)


def scaled_lr(base_lr: float, global_batch: int, reference: int = 256) -> float:
    return base_lr * global_batch / reference


def lr_at(step: int, total_steps: int, lr: float, schedule: str = "cosine", warmup: int = 0,
          gamma: float = 0.1, final: float = 0.01) -> float:
    """LR for optimizer step ``step`` (0-based) of ``total_steps``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, total_steps - warmup)
    p = min(1.0, max(0.0, (step - warmup) / span))
    if schedule == "step":
        return lr * gamma ** sum(p >= m for m in MILESTONES)
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * p))
    return lr * final ** p


class Scheduler:
    """Sets the LR of every param group before each optimizer step."""

    def __init__(self, optimizer, total_steps: int, lr: float, schedule: str, warmup: int):
        self.optimizer, self.total, self.lr, self.schedule, self.warmup = optimizer, total_steps, lr, schedule, warmup
        self.step_no = 0
        self.apply()

    def apply(self) -> float:
        value = lr_at(self.step_no, self.total, self.lr, self.schedule, self.warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = value
        return value

    def step(self) -> float:
        self.step_no += 1
        return self.apply()
