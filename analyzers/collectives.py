"""Per-collective statistics with nccl-tests bandwidths.

S (``bytes``) is recorded as nccl-tests define it: the tensor for
all_reduce / broadcast / reduce, the *full* array (per-rank part x n) for
reduce_scatter and all_gather. For each call, latency t = completion -
issue (host clock), algbw = S / t (GB/s, 1 GB = 1e9 bytes) and
busbw = algbw x factor(n) with n = group size:
all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all, gather,
scatter (n-1)/n; broadcast, reduce 1. The table reports the median over
calls. For asynchronous collectives (DDP buckets) t includes time queued
behind earlier buckets, so bandwidths are lower bounds.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def bus_factor(op: str, n) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if op == "all_reduce":
            return np.where(n > 0, 2.0 * (n - 1) / n, np.nan)
        if op in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"):
            return np.where(n > 0, (n - 1) / n, np.nan)
        if op in ("broadcast", "reduce"):
            return np.ones_like(n)
    return np.full_like(n, np.nan)


def per_call(events: pd.DataFrame) -> pd.DataFrame:
    """Collective events with latency, algbw and busbw columns."""
    c = events[events["category"].astype(str) == "comm"].copy()
    c["op"] = c["name"].astype(str)
    c["latency_s"] = (c["t_end"] - c["t_start"]).astype(np.float64) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        c["algbw"] = np.where(c["latency_s"] > 0, c["bytes"].astype(np.float64) / c["latency_s"] / 1e9, np.nan)
    c["busbw"] = np.nan
    for op, idx in c.groupby("op").groups.items():
        c.loc[idx, "busbw"] = c.loc[idx, "algbw"].to_numpy() * bus_factor(op, c.loc[idx, "group_size"].to_numpy())
    c.loc[c["op"] == "barrier", ["algbw", "busbw"]] = np.nan
    return c


def summary(calls: pd.DataFrame, n_steps: int, n_ranks: int) -> pd.DataFrame:
    """One row per (op, source): count, calls per step per rank, bytes,
    latency median/p95/mean (ms), algbw and busbw medians (GB/s)."""
    cols = ["op", "source", "calls", "calls_per_step", "bytes_per_call", "total_bytes",
            "lat_ms_mean", "lat_ms_p50", "lat_ms_p95", "algbw_GBps", "busbw_GBps", "group_size"]
    if calls.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (op, source), g in calls.groupby(["op", calls["source"].astype(str)], sort=True):
        lat = g["latency_s"].to_numpy() * 1e3
        rows.append({
            "op": op, "source": source, "calls": len(g),
            "calls_per_step": len(g) / max(1, n_steps * n_ranks),
            "bytes_per_call": float(g["bytes"].mean()) if g["bytes"].notna().any() else np.nan,
            "total_bytes": float(g["bytes"].sum()),
            "lat_ms_mean": float(lat.mean()), "lat_ms_p50": float(np.median(lat)),
            "lat_ms_p95": float(np.percentile(lat, 95)),
            "algbw_GBps": float(np.nanmedian(g["algbw"])) if g["algbw"].notna().any() else np.nan,
            "busbw_GBps": float(np.nanmedian(g["busbw"])) if g["busbw"].notna().any() else np.nan,
            "group_size": int(g["group_size"].max()) if g["group_size"].notna().any() else np.nan,
        })
    return pd.DataFrame(rows, columns=cols)
