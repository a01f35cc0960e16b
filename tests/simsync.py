"""An independent simulator of synchronous data-parallel training, for
testing the findings against chance (tests/analyzers/test_evidence.py,
benchmarks/findings_power.py).

It knows nothing of commprof's analyzers: each rank draws its own data
wait, forward, backward and optimizer times with multiplicative jitter
(log-normal, ``jitter`` = its sigma), issues ``buckets`` gradient
all-reduces evenly through its backward, and every all-reduce completes on
every rank at the same instant: when the last rank has issued it (and the
previous one has completed) plus a transfer time. A rank then waits for its
last bucket, runs its optimizer and starts the next step. The one cause of
a straggler is planted: ``slow_rank`` (or every rank of ``slow_host``) does
``delta_ms`` more of ``where`` ("compute": backward; "data": data wait) at
every step. The rank that is last ready (its backward's end) is recorded per
step as ground truth for the critical-path rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from tracegen import MS, row, write_run


@dataclass
class Sim:
    world: int
    steps: int
    seed: int = 0
    jitter: float = 0.05
    slow_rank: Optional[int] = None
    slow_host: Optional[int] = None
    gpus_per_node: Optional[int] = None
    delta_ms: float = 0.0
    where: str = "compute"
    data_ms: float = 2.0
    fwd_ms: float = 10.0
    bwd_ms: float = 20.0
    opt_ms: float = 3.0
    buckets: int = 3
    transfer_ms: float = 2.0
    bucket_bytes: int = 8 * 2 ** 20
    rows: Dict[int, List] = field(default_factory=dict)
    last_ready: List[int] = field(default_factory=list)
    truth: List[dict] = field(default_factory=list)
    issue_last: List[List[int]] = field(default_factory=list)
    issue_lag: List[np.ndarray] = field(default_factory=list)

    def host(self, r: int) -> int:
        return r // self.gpus_per_node if self.gpus_per_node else 0

    def slowed(self, r: int) -> bool:
        if self.slow_rank is not None and r == self.slow_rank:
            return True
        return self.slow_host is not None and self.host(r) == self.slow_host

    def run(self) -> "Sim":
        rng = np.random.default_rng(self.seed)
        n, B = self.world, self.buckets
        rows: Dict[int, List] = {r: [] for r in range(n)}

        def draw(ms: float) -> np.ndarray:
            return ms * MS * rng.lognormal(0.0, self.jitter, n)

        t = rng.uniform(0, 0.2 * MS, n)  # ranks start a little apart
        seq = 0
        for s in range(self.steps):
            extra = np.array([self.delta_ms * MS if self.slowed(r) else 0.0 for r in range(n)])
            d = draw(self.data_ms) + (extra if self.where == "data" else 0)
            f = draw(self.fwd_ms)
            b = draw(self.bwd_ms) + (extra if self.where == "compute" else 0)
            o = draw(self.opt_ms)
            b0 = t + d + f
            ready = [b0 + b * (i + 1) / B for i in range(B)]  # issue instants, per rank
            ends = []
            prev = 0.0
            for i in range(B):
                done = max(float(ready[i].max()), prev) + self.transfer_ms * MS * rng.lognormal(0.0, self.jitter)
                ends.append(done)
                prev = done
            self.last_ready.append(int(np.argmax(ready[-1])))
            self.issue_last.append([int(np.argmax(x)) for x in ready])
            self.issue_lag.append(np.mean([x - x.min() for x in ready], axis=0))
            for r in range(n):
                # what a perfect profiler measures: exposed communication is
                # the wait from the rank's last bucket to its completion
                self.truth.append({"rank": r, "step": s, "step_time": ends[-1] + o[r] - t[r],
                                   "comm": ends[-1] - ready[-1][r], "data": d[r], "compute": f[r] + b[r] + o[r]})
            for r in range(n):
                rr = rows[r]
                rr.append(row(s, "data", "dataloader", t[r], t[r] + d[r], source="DataLoader", items=32))
                rr.append(row(s, "compute", "forward", t[r] + d[r], b0[r], source="nn.Module", detail="M", items=32))
                rr.append(row(s, "compute", "backward", b0[r], ready[-1][r], source="autograd"))
                for i in range(B):
                    rr.append(row(s, "comm", "all_reduce", ready[i][r], ends[i], source="ddp_reducer",
                                  detail="default", nbytes=self.bucket_bytes, dtype="torch.float32", group="0",
                                  group_size=n, seq=seq + i, blocking=False))
                rr.append(row(s, "wait", "comm_wait", ready[-1][r], ends[-1], source="autograd"))
                rr.append(row(s, "compute", "optimizer", ends[-1], ends[-1] + o[r], source="torch.optim"))
                rr.append(row(s, "step", "step", t[r], ends[-1] + o[r], source="torch.optim", items=32))
            seq += B
            t = ends[-1] + o + rng.uniform(0, 0.05 * MS, n)
        self.rows = rows
        return self

    def measured(self, warmup: int = 1):
        """The ground truth a perfect profiler would measure, after
        ``warmup`` steps: per (rank, step) times in ns; per rank mean
        lateness of its all-reduce issue behind the earliest rank; per step
        the rank that issued last most often (None on a tie); rank -> host;
        per step the last rank ready."""
        steps = pd.DataFrame(self.truth)
        steps = steps[steps["step"] >= warmup].reset_index(drop=True)
        lag = np.mean(self.issue_lag[warmup:], axis=0) / MS
        last = np.array(self.issue_last[warmup:]).ravel()
        lateness = pd.DataFrame({"rank": np.arange(self.world), "lateness_ms": lag,
                                 "last_pct": [100.0 * float((last == r).mean()) for r in range(self.world)]})
        blocks = []
        for last in self.issue_last[warmup:]:
            vals, counts = np.unique(last, return_counts=True)
            blocks.append(int(vals[counts.argmax()]) if (counts == counts.max()).sum() == 1 else None)
        hosts = {r: f"node{self.host(r)}" for r in range(self.world)}
        return steps, lateness, blocks, hosts, self.last_ready[warmup:]

    def write(self, path) -> str:
        metas = [{"rank": r, "world_size": self.world, "host": f"node{self.host(r)}",
                  "clock": {"boot_id": f"boot{self.host(r)}"}} for r in range(self.world)]
        return write_run(path, self.rows, meta={"batch_size": 32}, rank_metas=metas)
