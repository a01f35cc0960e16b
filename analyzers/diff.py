"""What changed between two runs (A -> B).

Per category: exposed time per step (ms; share x median step time) and
share of step time; per collective type: calls per step, bytes per call,
mean latency. delta = B - A, delta_pct = 100 x delta / A.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["what", "metric", "a", "b", "delta", "delta_pct"]


def _row(what, metric, a, b):
    a = float(a) if a is not None and not pd.isna(a) else np.nan
    b = float(b) if b is not None and not pd.isna(b) else np.nan
    d = b - a
    return {"what": what, "metric": metric, "a": a, "b": b, "delta": d,
            "delta_pct": 100.0 * d / a if a and not np.isnan(a) else np.nan}


def diff_tables(bd_a: pd.DataFrame, bd_b: pd.DataFrame, co_a: pd.DataFrame, co_b: pd.DataFrame) -> pd.DataFrame:
    rows = []
    ra, rb = bd_a.iloc[0], bd_b.iloc[0]
    rows.append(_row("step", "median step ms", ra["step_ms_median"], rb["step_ms_median"]))
    rows.append(_row("step", "samples/s", ra["samples_per_s"], rb["samples_per_s"]))
    for cat in ("comm", "data", "compute", "other"):
        col = f"{cat}_pct"
        rows.append(_row(cat, "share of step %", ra[col], rb[col]))
        rows.append(_row(cat, "ms per step", ra[col] / 100 * ra["step_ms_median"],
                         rb[col] / 100 * rb["step_ms_median"]))
    rows.append(_row("comm", "busy share %", ra["comm_busy_pct"], rb["comm_busy_pct"]))

    def per_op(co):
        if co is None or co.empty:
            return {}
        out = {}
        for op, g in co.groupby("op"):
            calls = g["calls"].sum()
            out[op] = {"calls/step": g["calls_per_step"].sum(),
                       "bytes/call": (g["total_bytes"].sum() / calls) if calls else np.nan,
                       "mean latency ms": float(np.average(g["lat_ms_mean"], weights=g["calls"])) if calls else np.nan}
        return out

    oa, ob = per_op(co_a), per_op(co_b)
    for op in sorted(set(oa) | set(ob)):
        for metric in ("calls/step", "bytes/call", "mean latency ms"):
            rows.append(_row(op, metric, oa.get(op, {}).get(metric), ob.get(op, {}).get(metric)))
    return pd.DataFrame(rows, columns=COLUMNS)
