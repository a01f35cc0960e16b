"""The table scaling studies build by hand: one row per GPU count (world
size), grouped by configuration, with the breakdown, step time and
throughput; plus the collectives per configuration and GPU count.

A configuration is the tuple of run-metadata values named by ``group_by``
(default: framework, loader, model, batch_size, then any user labels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from . import breakdown, collectives, throughput

DEFAULT_GROUP_BY = ("framework", "loader", "model", "batch_size")


@dataclass
class RunAnalysis:
    label: str
    meta: dict
    world_size: int
    steps: pd.DataFrame      # measured per-step rows
    calls: pd.DataFrame      # per-call collective rows within measured steps
    batch_size: Optional[int]


def config_label(meta: dict, group_by: Optional[Sequence[str]] = None) -> str:
    keys = list(group_by) if group_by else list(DEFAULT_GROUP_BY) + sorted((meta.get("labels") or {}))
    parts = []
    for k in keys:
        v = meta.get(k)
        if v is None:
            v = (meta.get("labels") or {}).get(k)
        if v is None:
            continue
        parts.append(f"bs={v}" if k == "batch_size" else str(v))
    return " / ".join(parts) if parts else "run"


def analyze_run(events: pd.DataFrame, meta: dict, warmup: int = 1,
                batch_size: Optional[int] = None,
                group_by: Optional[Sequence[str]] = None) -> RunAnalysis:
    all_steps = breakdown.per_step(events)
    steps = breakdown.measured(all_steps, warmup)
    calls = collectives.per_call(events)
    if not steps.empty and not calls.empty:
        lo = steps.groupby("rank")["step"].min()
        hi = steps.groupby("rank")["step"].max()
        keep = calls["rank"].map(lo).le(calls["step"]) & calls["rank"].map(hi).ge(calls["step"])
        calls = calls[keep.fillna(False)]
    meta = dict(meta)
    if batch_size is None and "batch_size" not in meta and steps["items"].notna().any():
        meta["batch_size"] = int(steps["items"].median())
    elif batch_size is not None:
        meta["batch_size"] = batch_size
    meta.setdefault("framework", "none" if int(meta.get("world_size") or 1) == 1 else None)
    return RunAnalysis(config_label(meta, group_by), meta, int(meta.get("world_size") or 1),
                       steps, calls, batch_size)


def breakdown_table(runs: List[RunAnalysis]) -> pd.DataFrame:
    rows = []
    groups: Dict[tuple, List[RunAnalysis]] = {}
    for r in runs:
        groups.setdefault((r.label, r.world_size), []).append(r)
    for (label, gpus), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        frames = []
        for i, r in enumerate(members):
            s = r.steps.copy()
            s["rank"] = s["rank"] + i * 1_000_000  # keep runs apart
            frames.append(s)
        steps = pd.concat(frames, ignore_index=True)
        sh = breakdown.shares(steps)
        tps = [throughput.throughput(r.steps, r.batch_size) for r in members]
        lo, hi = breakdown.rank_spread(steps, "comm")
        rows.append({
            "config": label, "gpus": gpus, "runs": len(members),
            "steps": int(np.mean([t["steps"] for t in tps])),
            "comm_pct": sh["comm"], "data_pct": sh["data"], "compute_pct": sh["compute"],
            "other_pct": sh["other"], "comm_busy_pct": sh["comm_busy"],
            "comm_pct_rank_min": lo, "comm_pct_rank_max": hi,
            "step_ms_median": float(np.median(steps["step_time"]) / 1e6),
            "step_ms_p95": float(np.percentile(steps["step_time"], 95) / 1e6),
            "steps_per_s": float(np.mean([t["steps_per_s"] for t in tps])),
            "samples_per_s": float(np.mean([t["samples_per_s"] for t in tps])),
            "batch_per_rank": float(np.mean([t["batch_per_rank"] for t in tps])),
        })
    return pd.DataFrame(rows)


def collectives_table(runs: List[RunAnalysis]) -> pd.DataFrame:
    frames = []
    groups: Dict[tuple, List[RunAnalysis]] = {}
    for r in runs:
        groups.setdefault((r.label, r.world_size), []).append(r)
    for (label, gpus), members in sorted(groups.items()):
        calls = pd.concat([m.calls for m in members], ignore_index=True) if members else pd.DataFrame()
        n_steps = sum(int(m.steps.groupby("rank").size().max()) if not m.steps.empty else 0 for m in members)
        n_ranks = max(int(m.steps["rank"].nunique()) if not m.steps.empty else 1 for m in members)
        t = collectives.summary(calls, n_steps, n_ranks)
        if t.empty:
            continue
        t.insert(0, "gpus", gpus)
        t.insert(0, "config", label)
        frames.append(t)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)
