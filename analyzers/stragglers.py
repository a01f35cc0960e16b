"""Stragglers and imbalance.

Per measured step, each rank's value of a metric is compared with the
median over ranks at that step. A rank is *late* at a step when its value
exceeds the median by more than ``rel`` (default 10 %) and by more than
``abs_ms`` (default 1 ms). It is a *persistent* straggler when it is late
in at least ``persist`` (default 50 %) of the measured steps. Metrics:

- ``work``: step time minus exposed communication (its own data wait,
  compute and glue: what the others end up waiting for),
- ``data``: data-loader wait,
- ``step``: step time.

From the collectives: a rank that arrives last at more than ``persist`` of
the collective instances and whose mean arrival lateness exceeds twice the
median rank's is also reported (``arrival``), when there are at least
three ranks.

Imbalance % of a run = (max over ranks of mean work per step / mean over
ranks of it − 1) × 100.
"""
from __future__ import annotations

import pandas as pd

COLUMNS = ["rank", "metric", "late_pct", "excess_ms", "value_ms", "median_ms"]


def stragglers(steps: pd.DataFrame, lateness: pd.DataFrame = None, rel: float = 0.10,
               abs_ms: float = 1.0, persist: float = 0.5) -> pd.DataFrame:
    rows = []
    if not steps.empty and steps["rank"].nunique() > 1:
        s = steps.assign(work=steps["step_time"] - steps["comm"])
        for metric, col in (("work", "work"), ("data", "data"), ("step", "step_time")):
            v = s[["rank", "step", col]].rename(columns={col: "v"})
            med = v.groupby("step")["v"].transform("median")
            late = (v["v"] > med * (1 + rel)) & (v["v"] - med > abs_ms * 1e6)
            per = v.assign(late=late, med=med).groupby("rank").agg(
                late=("late", "mean"), v=("v", "mean"), med=("med", "mean"))
            for rank, r in per[per["late"] >= persist].iterrows():
                rows.append({"rank": int(rank), "metric": metric, "late_pct": 100.0 * r["late"],
                             "excess_ms": (r["v"] - r["med"]) / 1e6, "value_ms": r["v"] / 1e6,
                             "median_ms": r["med"] / 1e6})
    if lateness is not None and len(lateness) >= 3:
        med = float(lateness["lateness_ms"].median())
        for _, r in lateness.iterrows():
            if r["last_pct"] >= 100 * persist and r["lateness_ms"] > max(2 * med, abs_ms):
                rows.append({"rank": int(r["rank"]), "metric": "arrival", "late_pct": r["last_pct"],
                             "excess_ms": r["lateness_ms"] - med, "value_ms": r["lateness_ms"],
                             "median_ms": med})
    return pd.DataFrame(rows, columns=COLUMNS)


def imbalance_pct(steps: pd.DataFrame) -> float:
    if steps.empty:
        return float("nan")
    work = (steps["step_time"] - steps["comm"]).groupby(steps["rank"]).mean()
    m = float(work.mean())
    return 100.0 * (float(work.max()) / m - 1.0) if m > 0 else float("nan")
