"""Per-rank, per-step time attribution.

A step (on one rank) runs from the end of the previous optimizer step to
the end of this one (step 0 starts at the rank's first recorded activity).

*Exposed* shares: every instant of a step goes to exactly one category, by
priority

    data > blocking communication > compute > communication in flight > other

- data: the training loop waits in the data loader's ``__next__``;
- blocking communication: the training thread waits for a collective
  (a synchronous collective, or the tail of ``backward`` in which DDP's
  reducer waits for its bucket allreduces: the ``wait`` events);
- compute: forward, backward (up to the last collective it issued),
  optimizer step;
- communication in flight: an asynchronous collective (a DDP bucket) that
  runs while nothing above does;
- other: none of the above (Python glue, logging, ...).

So communication hidden under compute or data counts as compute or data,
and the shares add up to 100 % of step time.

*Busy* shares: time covered by each category regardless of the others
(communication = union of all collectives' issue→completion intervals),
over step time; these do not add up to 100 %.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .intervals import attribute

CATEGORIES = ("data", "comm", "compute", "other")
_CLASSES = ("data", "blocking_comm", "compute", "async_comm")


def _class_masks(ev: pd.DataFrame):
    cat = ev["category"].astype(str)
    blocking = ev["blocking"].fillna(False).astype(bool) if "blocking" in ev else False
    is_comm = cat == "comm"
    return {
        "data": cat == "data",
        "blocking_comm": (cat == "wait") | (is_comm & blocking),
        "compute": cat == "compute",
        "async_comm": is_comm & ~blocking,
        "comm_any": is_comm,
    }


def per_step(events: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step) with exposed and busy times in ns.

    Columns: rank, step, t_start, t_end, step_time, items, data, comm,
    compute, other (exposed; sum = step_time), comm_busy, data_busy,
    compute_busy.
    """
    cols = ["rank", "step", "t_start", "t_end", "step_time", "items", "data", "comm", "compute",
            "other", "comm_busy", "data_busy", "compute_busy"]
    frames = []
    for rank, ev in events.groupby("rank", sort=True, observed=True):
        cat = ev["category"].astype(str)
        steps = ev[cat == "step"].sort_values("t_end")
        if steps.empty:
            continue
        ws = steps["t_start"].to_numpy(np.int64)
        we = steps["t_end"].to_numpy(np.int64)
        masks = _class_masks(ev)
        classes = []
        for name in _CLASSES + ("comm_any",):
            sub = ev[masks[name]]
            classes.append((sub["t_start"].to_numpy(np.int64), sub["t_end"].to_numpy(np.int64)))
        exposed, busy = attribute(classes[:4], ws, we)
        comm_busy = attribute([classes[4]], ws, we)[1][:, 0]
        df = pd.DataFrame({
            "rank": int(rank),
            "step": steps["step"].to_numpy(np.int64),
            "t_start": ws, "t_end": we,
            "step_time": (we - ws).astype(np.float64),
            "items": steps["items"].to_numpy(dtype=np.float64, na_value=np.nan),
            "data": exposed[:, 0],
            "comm": exposed[:, 1] + exposed[:, 3],
            "compute": exposed[:, 2],
            "other": exposed[:, 4],
            "comm_busy": comm_busy,
            "data_busy": busy[:, 0],
            "compute_busy": busy[:, 2],
        })
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat(frames, ignore_index=True)[cols]


def measured(steps: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """Steps kept for statistics: every rank's steps from index ``warmup``
    on. If a rank has no more steps than ``warmup``, all its steps are kept
    (better a noisy figure than none)."""
    if steps.empty:
        return steps
    keep = steps["step"] >= warmup
    short = steps.groupby("rank")["step"].transform("max") < warmup
    return steps[keep | short]


def shares(steps: pd.DataFrame) -> dict:
    """Time-weighted shares (percent of step time) over the given steps."""
    total = float(steps["step_time"].sum())
    if total <= 0:
        return {c: float("nan") for c in CATEGORIES + ("comm_busy", "data_busy", "compute_busy")}
    out = {c: 100.0 * float(steps[c].sum()) / total for c in CATEGORIES}
    for c in ("comm_busy", "data_busy", "compute_busy"):
        out[c] = 100.0 * float(steps[c].sum()) / total
    return out


def rank_spread(steps: pd.DataFrame, column: str) -> tuple:
    """(min, max) over ranks of a category's share of that rank's step time."""
    if steps.empty:
        return (float("nan"), float("nan"))
    g = steps.groupby("rank")[[column, "step_time"]].sum()
    s = 100.0 * g[column] / g["step_time"]
    return float(s.min()), float(s.max())
