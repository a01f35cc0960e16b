"""The alpha-beta communication model of a trace, and benchmark traces.

``fit_trace``: from the collectives of any trace — a training run or a
``commprof bench -o DIR`` trace — fit Hockney's T(S) = alpha + S / beta per
collective, dtype, group size and scope (intra-node / inter-node) with
:func:`commprof.analyzers.alphabeta.fit`. Per collective instance (same
group and sequence number) the time is the slowest rank's issue-to-
completion latency (device times where measured): a collective is as slow
as its slowest rank, as nccl-tests time it. Points are the median time per
distinct message size (a benchmark trace's out-of-place calls where a size
has them, as ``commprof bench --model`` fits). Blocking calls are used when there are at least two
sizes of them; otherwise asynchronous calls too (DDP buckets: their
latency includes time queued behind earlier buckets, so beta is a lower
bound — said in the model's ``note``).

``agreement``: two models (e.g. from a training trace and from
``commprof bench --model``) compared where both have data: per collective
and dtype, the relative difference of their predicted times at the sizes
the first one saw.

``bench_doc``: a bench trace back into ``commprof bench``'s JSON form (rows
of op, dtype, size, out-of-place / in-place time), so its nccl-tests table
and model come from the trace alone.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd

from .alphabeta import fit, predict

MODEL_COLUMNS = ["op", "dtype", "group_size", "scope", "from_bytes", "to_bytes", "alpha_us", "beta_GBps",
                 "r2", "max_rel_residual", "points", "calls"]
AGREE_COLUMNS = ["op", "dtype", "sizes", "median_rel_diff_pct", "max_rel_diff_pct", "verdict"]


#: torch dtype names -> the nccl-tests names commprof bench and its models use
NCCL_DTYPES = {"torch.float32": "float", "torch.float16": "half", "torch.bfloat16": "bfloat16",
               "torch.float64": "double", "torch.int32": "int32", "torch.int64": "int64", "torch.uint8": "uint8"}


def instance_times(comm: pd.DataFrame) -> pd.DataFrame:
    """Per collective instance: op, dtype, bytes, group size, blocking, detail,
    time (s, slowest rank)."""
    c = comm.copy()
    t0, t1 = c["t_start"].astype(np.int64), c["t_end"].astype(np.int64)
    if "dev_start" in c and "dev_end" in c:
        has = c["dev_start"].notna() & c["dev_end"].notna()
        lat = np.where(has, c["dev_end"].fillna(0) - c["dev_start"].fillna(0), t1 - t0)
    else:
        lat = t1 - t0
    c["lat"] = np.asarray(lat, np.float64) / 1e9
    for col, fill in (("dtype", "?"), ("detail", ""), ("group", "?")):
        c[col] = c[col].astype(object).where(c[col].notna(), fill).astype(str) if col in c else fill
    c["dtype"] = c["dtype"].map(lambda d: NCCL_DTYPES.get(d, d))
    c["blocking"] = c["blocking"].fillna(False).astype(bool) if "blocking" in c else False
    c["name"] = c["name"].astype(str)
    keys = ["group", "seq"] if "seq" in c and c["seq"].notna().all() else None
    if keys is None:
        c["seq"] = np.arange(len(c))
        keys = ["group", "seq"]
    g = c.groupby(keys, sort=False)
    out = g.agg(op=("name", "first"), dtype=("dtype", "first"), bytes=("bytes", "max"),
                group_size=("group_size", "max"), blocking=("blocking", "all"), detail=("detail", "first"),
                time_s=("lat", "max"), ranks=("rank", "nunique")).reset_index()
    return out


def fit_trace(comm: pd.DataFrame, hosts: Optional[Dict[int, str]] = None) -> Dict[str, Any]:
    """The alpha-beta model of a trace's collectives (``commprof model``)."""
    from .nodes import group_scope

    if comm is None or comm.empty:
        return {"model": "alpha-beta (Hockney): T(S) = alpha + S / beta", "ops": {}, "pieces": [], "note": ""}
    scope = group_scope(comm, hosts or {}) if hosts else {}
    inst = instance_times(comm[comm["name"].astype(str) != "barrier"])
    inst = inst[inst["bytes"].notna() & (inst["time_s"] > 0)]
    inst["scope"] = inst["group"].map(lambda g: scope.get(str(g), "intra-node"))
    ops: Dict[str, Dict[str, List[dict]]] = {}
    pieces = []
    notes = []
    for (op, dtype, n, sc), g in inst.groupby(["op", "dtype", "group_size", "scope"]):
        use = g[g["blocking"]]
        kind = "blocking"
        if use["bytes"].nunique() < 2:
            use, kind = g, "all (asynchronous calls included: their latency includes queueing, beta is a lower bound)"
        # a bench trace times each size out-of-place and in-place: as its --model, out-of-place where timed
        oop = use["detail"] == "out_of_place"
        if oop.any():
            use = use[oop | ~oop.groupby(use["bytes"]).transform("any")]
        per_size = use.groupby("bytes")["time_s"].median()
        if len(per_size) < 2:
            notes.append(f"{op} ({dtype}, {int(n)} ranks, {sc}): one message size only "
                         f"({int(per_size.index[0]):,} B, {per_size.iloc[0] * 1e6:.1f} us): no fit")
            continue
        fitted = fit(per_size.index.to_numpy(np.float64), per_size.to_numpy())
        for p in fitted:
            p.update({"group_size": int(n), "scope": sc, "calls": int(len(use)), "points_from": kind})
            if not np.isfinite(p["beta_Bps"]):
                notes.append(f"{op} ({dtype}, {int(n)} ranks, {sc}): time does not grow with size from "
                             f"{int(p['min_bytes']):,} to {int(p['max_bytes']):,} B: beta not resolved "
                             f"(latency-bound there; alpha {p['alpha_s'] * 1e6:.1f} us)")
        ops.setdefault(op, {})[dtype] = fitted
        for p in fitted:
            pieces.append({"op": op, "dtype": dtype, "group_size": int(n), "scope": sc,
                           "from_bytes": p["min_bytes"], "to_bytes": p["max_bytes"], "alpha_us": p["alpha_s"] * 1e6,
                           "beta_GBps": p["beta_Bps"] / 1e9, "r2": p["r2"],
                           "max_rel_residual": p["max_rel_residual"], "points": p["points"], "calls": p["calls"]})
    return {"model": "alpha-beta (Hockney): T(S) = alpha + S / beta", "ops": ops, "pieces": pieces,
            "note": "; ".join(notes), "sizes": {op: sorted({int(b) for b in inst[inst["op"] == op]["bytes"]})
                                                for op in inst["op"].unique()}}


def model_frame(model: Dict[str, Any]) -> pd.DataFrame:
    if model.get("pieces"):
        return pd.DataFrame(model["pieces"], columns=MODEL_COLUMNS)
    rows = []
    for op, by_dtype in (model.get("ops") or {}).items():
        for dtype, ps in by_dtype.items():
            for p in ps:
                rows.append({"op": op, "dtype": dtype, "group_size": p.get("group_size", model.get("world_size")),
                             "scope": p.get("scope", ""), "from_bytes": p["min_bytes"], "to_bytes": p["max_bytes"],
                             "alpha_us": p["alpha_s"] * 1e6, "beta_GBps": p["beta_Bps"] / 1e9, "r2": p["r2"],
                             "max_rel_residual": p["max_rel_residual"], "points": p["points"],
                             "calls": p.get("calls", p["points"])})
    return pd.DataFrame(rows, columns=MODEL_COLUMNS)


def agreement(a: Dict[str, Any], b: Dict[str, Any], tolerance_pct: float = 25.0) -> pd.DataFrame:
    """Where both models have the collective and dtype: their predicted times
    at A's message sizes (within B's fitted range), relative to B."""
    rows = []
    for op, by_dtype in (a.get("ops") or {}).items():
        for dtype, pa_ in by_dtype.items():
            pb = ((b.get("ops") or {}).get(op) or {}).get(dtype)
            if not pb:
                continue
            lo, hi = min(p["min_bytes"] for p in pb), max(p["max_bytes"] for p in pb)
            sizes = [s for s in (a.get("sizes") or {}).get(op) or
                     sorted({p["min_bytes"] for p in pa_} | {p["max_bytes"] for p in pa_}) if lo <= s <= hi]
            if not sizes:
                continue
            rel = [abs(predict(pa_, s) - predict(pb, s)) / predict(pb, s) * 100 for s in sizes]
            med, mx = float(np.median(rel)), float(np.max(rel))
            rows.append({"op": op, "dtype": dtype, "sizes": len(sizes), "median_rel_diff_pct": med,
                         "max_rel_diff_pct": mx,
                         "verdict": "agree" if med <= tolerance_pct else "disagree"})
    return pd.DataFrame(rows, columns=AGREE_COLUMNS)


def bench_doc(comm: pd.DataFrame, meta: Dict[str, Any]) -> Dict[str, Any]:
    """A ``commprof bench -o`` trace as bench JSON rows (time = mean over calls
    of the slowest rank, median kept)."""
    inst = instance_times(comm)
    rows: Dict[tuple, dict] = {}
    n = int(meta.get("world_size") or 1)
    for (op, dtype, nbytes, mode), g in inst.groupby(["op", "dtype", "bytes", "detail"], sort=False):
        key = (op, dtype, int(nbytes))
        elt = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int32": 4, "int64": 8, "uint8": 1}.get(dtype, 4)
        r = rows.setdefault(key, {"op": op, "dtype": dtype,
                                  "bytes": int(nbytes), "count": int(nbytes) // elt,
                                  "redop": "sum" if op in ("all_reduce", "reduce_scatter") else "none",
                                  "root": 0 if op == "broadcast" else -1, "ranks": n,
                                  "out_of_place": None, "in_place": None})
        r[mode if mode in ("out_of_place", "in_place") else "out_of_place"] = {
            "time_us": float(g["time_s"].mean() * 1e6), "median_us": float(g["time_s"].median() * 1e6),
            "wrong": None, "calls": int(len(g))}   # the check's result is in bench.json, not the trace
    return {"backend": meta.get("backend"), "world_size": n, "device": meta.get("device"), "source": "bench trace",
            "warmup": None, "iters": None, "rows": list(rows.values())}
