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

from typing import Tuple

import numpy as np
import pandas as pd

from .intervals import union, union_length


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


def kernel_views(events: pd.DataFrame, hta_window: bool = False) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`kernel_shares`, :func:`temporal_breakdown`) in one pass over the
    kernel rows: per-rank sums by ``bincount``, unions by one sort per set."""
    k = _kernels(events)
    if k.empty:
        return pd.DataFrame(), pd.DataFrame()
    rank = k["rank"].to_numpy(np.int64)
    ranks, rank_i = np.unique(rank, return_inverse=True)
    rank_i = rank_i.reshape(-1)
    s_all, e_all = k["t_start"].to_numpy(np.int64), k["t_end"].to_numpy(np.int64)

    # shares: kernel time per (rank, class); classes in pivot_table's order
    cls = k["cls"]
    if isinstance(cls.dtype, pd.CategoricalDtype):
        codes = cls.cat.codes.to_numpy(np.int64)
        names = [str(c) for c in cls.cat.categories]
    else:
        uniq, codes = np.unique(cls.to_numpy(object).astype(str), return_inverse=True)
        codes, names = codes.reshape(-1).astype(np.int64), [str(u) for u in uniq]
    ok = codes >= 0
    nc = max(len(names), 1)
    dur = (e_all - s_all).astype(np.float64)
    t = np.bincount(rank_i[ok] * nc + codes[ok], weights=dur[ok], minlength=len(ranks) * nc).reshape(len(ranks), nc)
    used = np.flatnonzero(np.bincount(codes[ok], minlength=nc) > 0)
    t = t[:, used]
    rows_used = np.bincount(rank_i[ok], minlength=len(ranks)) > 0
    total = t.sum(axis=1)
    shares = pd.DataFrame({"rank": ranks[rows_used].astype(int), "kernel_ms": total[rows_used] / 1e6})
    with np.errstate(invalid="ignore", divide="ignore"):
        for j, c in enumerate(used.tolist()):
            shares[f"{names[c]}_pct"] = 100.0 * t[rows_used, j] / total[rows_used]

    # temporal breakdown and overlap
    keep = np.ones(len(k), bool)
    if hta_window:
        st = events[_per_value(events["category"], lambda c: c == "step")]
        if len(st):
            last = st.groupby("rank")["step"].max()
            lim = np.full(len(ranks), np.iinfo(np.int64).max)
            pos = np.searchsorted(ranks, last.index.to_numpy(np.int64))
            hit = (pos < len(ranks)) & (ranks[np.clip(pos, 0, len(ranks) - 1)] == last.index.to_numpy(np.int64))
            lim[pos[hit]] = last.to_numpy(np.int64)[hit]
            # a kernel's step is the ProfilerStep its launch fell in: keep
            # those launched before the last ProfilerStep# started
            keep = k["step"].to_numpy(np.int64) < lim[rank_i]
    comp_all = ~(k["hta_comm"].to_numpy(bool) | k["hta_memory"].to_numpy(bool))
    comm_all = k["hta_comm"].to_numpy(bool)
    order = np.argsort(rank_i, kind="stable")
    bounds = np.searchsorted(rank_i[order], np.arange(len(ranks) + 1))
    rows = []
    for j, r in enumerate(ranks.tolist()):
        sel = order[bounds[j]:bounds[j + 1]]
        sel = sel[keep[sel]]
        if not len(sel):
            continue
        s, e = s_all[sel], e_all[sel]
        comp, comm = comp_all[sel], comm_all[sel]
        lo, hi = int(s.min()), int(e.max())
        u_comp, u_comm = union(s[comp], e[comp]), union(s[comm], e[comm])
        span = float(hi - lo)
        busy = float(union_length(union(s, e)))
        compute, comm_t = float(union_length(u_comp)), float(union_length(u_comm))
        both = compute + comm_t - float(union_length(union(np.r_[u_comp[0], u_comm[0]], np.r_[u_comp[1], u_comm[1]])))
        rows.append({"rank": int(r), "span_ms": span / 1e6, "idle_pct": 100 * (span - busy) / span,
                     "compute_pct": 100 * compute / span, "non_compute_pct": 100 * (busy - compute) / span,
                     "overlap_pct": 100 * both / comm_t if comm_t else np.nan, "kernels": len(sel)})
    return shares.reset_index(drop=True), pd.DataFrame(rows)


def kernel_shares(events: pd.DataFrame) -> pd.DataFrame:
    """Per rank: kernel time (ms) and % of kernel time per class."""
    return kernel_views(events)[0]


def temporal_breakdown(events: pd.DataFrame, hta_window: bool = False) -> pd.DataFrame:
    """Per rank: span, idle / compute / non-compute (% of span), overlap %."""
    return kernel_views(events, hta_window)[1]
