"""GPU kernel views: shares of kernel time per class (the scaling study's
table) and Holistic Trace Analysis' temporal breakdown and overlap.

Input: ``kernel`` events (from ``commprof import kineto`` or kernel mode).

- **Kernel-time shares** (per rank, then averaged over ranks): the summed
  duration of each class's kernels / the summed duration of all kernels,
  in % — "CUDA kernel time in percent spent on communication (NCCL),
  computations with cuDNN, and data loading" as the study reports it
  (classes in :func:`commprof.convert.kineto.classify`; concurrent kernels each
  count, so this is not wall time).
- **Temporal breakdown** (HTA's definitions, exact arithmetic): span = last
  kernel end - first kernel start; idle = span - union(all kernels);
  compute = union(compute kernels: every kernel that is neither NCCL nor a
  Memcpy/Memset); non-compute = span - compute - idle (so communication
  hidden under compute counts as compute).
- **Overlap** = |union(NCCL) ∩ union(compute)| / |union(NCCL)|.

HTA itself rounds timestamps inward to whole microseconds and drops what is
launched after the last ``ProfilerStep#`` starts; ``hta_window=True``
applies that same window (but not the rounding), so figures are exact.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .intervals import segments


def _per_value(col: pd.Series, fn) -> np.ndarray:
    """fn applied once per distinct value (categorical columns: per category),
    broadcast to the rows — string work on a few hundred kernel names, not on
    every kernel."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        per = np.array([fn(str(c)) for c in cats] + [fn("None")])
        codes = col.cat.codes.to_numpy()
        return per[np.where(codes < 0, len(cats), codes)]
    values, uniq = pd.factorize(col.astype(object).where(col.notna(), "None"))
    return np.array([fn(str(u)) for u in uniq])[values] if len(uniq) else np.zeros(len(col), bool)


def _kernels(events: pd.DataFrame) -> pd.DataFrame:
    k = events[_per_value(events["category"], lambda c: c == "kernel")].copy()
    k["cls"] = k["name"].astype(str) if not isinstance(k["name"].dtype, pd.CategoricalDtype) \
        else k["name"].cat.remove_unused_categories()
    k["hta_memory"] = _per_value(k["detail"], lambda d: d.startswith("Memcpy") or d.startswith("Memset"))
    k["hta_comm"] = _per_value(k["name"], lambda c: c == "nccl")
    return k


def kernel_shares(events: pd.DataFrame) -> pd.DataFrame:
    """Per rank: kernel time (ms) and % of kernel time per class."""
    k = _kernels(events)
    if k.empty:
        return pd.DataFrame()
    k["dur"] = (k["t_end"] - k["t_start"]).astype(np.float64)
    t = k.pivot_table(index="rank", columns="cls", values="dur", aggfunc="sum", fill_value=0.0, observed=True)
    t.columns = [str(c) for c in t.columns]
    total = t.sum(axis=1)
    out = pd.DataFrame({"rank": t.index.astype(int), "kernel_ms": (total / 1e6).to_numpy()})
    for cls in t.columns:
        out[f"{cls}_pct"] = (100.0 * t[cls] / total).to_numpy()
    return out.reset_index(drop=True)


def temporal_breakdown(events: pd.DataFrame, hta_window: bool = False) -> pd.DataFrame:
    """Per rank: span, idle / compute / non-compute (% of span), overlap %."""
    k = _kernels(events)
    rows = []
    last_step = {}
    if hta_window:
        st = events[_per_value(events["category"], lambda c: c == "step")]
        last_step = st.groupby("rank")["step"].max().to_dict() if len(st) else {}
    for rank, g in k.groupby("rank"):
        if hta_window and rank in last_step:
            # a kernel's step is the ProfilerStep its launch fell in: keep
            # those launched before the last ProfilerStep# started
            g = g[g["step"] < int(last_step[rank])]
        if g.empty:
            continue
        s, e = g["t_start"].to_numpy(np.int64), g["t_end"].to_numpy(np.int64)
        lo, hi = int(s.min()), int(e.max())
        comp = ~(g["hta_comm"] | g["hta_memory"]).to_numpy()
        comm = g["hta_comm"].to_numpy()
        seg = segments(np.array([lo]), np.array([hi]), [(s, e), (s[comp], e[comp]), (s[comm], e[comm])])
        span = float(hi - lo)
        busy = float(seg.total(seg.covs[0])[0])
        compute = float(seg.total(seg.covs[1])[0])
        comm_t = float(seg.total(seg.covs[2])[0])
        both = float(seg.total(seg.covs[1] & seg.covs[2])[0])
        rows.append({"rank": int(rank), "span_ms": span / 1e6, "idle_pct": 100 * (span - busy) / span,
                     "compute_pct": 100 * compute / span, "non_compute_pct": 100 * (busy - compute) / span,
                     "overlap_pct": 100 * both / comm_t if comm_t else np.nan, "kernels": len(g)})
    return pd.DataFrame(rows)
