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

All ranks are analysed in one vectorised sweep: each rank's events are
moved onto a private stretch of one int64 time line.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .events import Events
from .intervals import first_cover, segments

CATEGORIES = ("data", "comm", "compute", "other")
STEP_COLUMNS = ["rank", "step", "t_start", "t_end", "step_time", "items", "data", "comm", "compute",
                "other", "comm_busy", "data_busy", "compute_busy", "overlap"]


def _rank_keys(ev: Events):
    """Map (rank, t) to one int64 time line on which ranks do not overlap:
    key = rank_index << shift | (t - t0[rank]). Returns (key function,
    rank values)."""
    ranks, ridx = np.unique(ev.rank, return_inverse=True)
    t0 = np.full(len(ranks), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(t0, ridx, np.minimum(ev.t_start, ev.t_end))
    local_end = np.maximum(ev.t_end, ev.t_start) - t0[ridx]
    shift = max(int(local_end.max()).bit_length(), 1) if len(local_end) else 1
    if shift + max(len(ranks), 1).bit_length() > 62:
        raise ValueError("time span too large to analyse these ranks together")

    def key(t: np.ndarray, mask: np.ndarray) -> np.ndarray:
        r = ridx[mask]
        return (r.astype(np.int64) << shift) | (t[mask] - t0[r])

    return key, ranks, ridx


def per_step(data) -> pd.DataFrame:
    """One row per (rank, step) with exposed and busy times in ns.

    Columns: rank, step, t_start, t_end, step_time, items, data, comm,
    compute, other (exposed; they sum to step_time), comm_busy, data_busy,
    compute_busy, overlap (time where a collective and compute run
    together). ``data``: an Arrow table or DataFrame of trace rows.
    """
    ev = data if isinstance(data, Events) else Events.of(data)
    if len(ev) == 0:
        return pd.DataFrame(columns=STEP_COLUMNS)
    is_step = ev.cat == 0
    if not is_step.any():
        return pd.DataFrame(columns=STEP_COLUMNS)
    key, ranks, ridx = _rank_keys(ev)
    ws, we = key(ev.t_start, is_step), key(ev.t_end, is_step)
    comm = ev.cat == 3
    masks = [
        ev.cat == 1,                              # data
        (ev.cat == 4) | (comm & ev.blocking),     # blocking communication
        ev.cat == 2,                              # compute
        comm & ~ev.blocking,                      # communication in flight
        comm,                                     # any collective (busy)
    ]
    sets = [(key(ev.t_start, m), key(ev.t_end, m)) for m in masks]
    seg = segments(ws, we, sets)
    label = first_cover(seg.covs[:4])
    n = len(ws)
    exposed = [seg.total(label == c) for c in range(5)]
    out = pd.DataFrame({
        "rank": ranks[ridx[is_step]],
        "step": ev.step[is_step],
        "t_start": ev.t_start[is_step],
        "t_end": ev.t_end[is_step],
        "step_time": (ev.t_end[is_step] - ev.t_start[is_step]).astype(np.float64),
        "items": ev.items[is_step],
        "data": exposed[0],
        "comm": exposed[1] + exposed[3],
        "compute": exposed[2],
        "other": exposed[4],
        "comm_busy": seg.total(seg.covs[4]) if n else np.zeros(0),
        "data_busy": seg.total(seg.covs[0]),
        "compute_busy": seg.total(seg.covs[2]),
        "overlap": seg.total(seg.covs[4] & seg.covs[2]),
    })
    return out.sort_values(["rank", "t_end"], kind="stable").reset_index(drop=True)[STEP_COLUMNS]


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
    """Time-weighted shares (percent of step time) over the given steps,
    plus ``overlap`` (HTA's definition: time where communication and compute
    run together, over communication time)."""
    total = float(steps["step_time"].sum()) if len(steps) else 0.0
    busy_cols = ("comm_busy", "data_busy", "compute_busy")
    if total <= 0:
        return {c: float("nan") for c in CATEGORIES + busy_cols + ("overlap",)}
    out = {c: 100.0 * float(steps[c].sum()) / total for c in CATEGORIES}
    for c in busy_cols:
        out[c] = 100.0 * float(steps[c].sum()) / total
    comm = float(steps["comm_busy"].sum())
    out["overlap"] = 100.0 * float(steps["overlap"].sum()) / comm if comm > 0 else float("nan")
    return out


def rank_spread(steps: pd.DataFrame, column: str) -> tuple:
    """(min, max) over ranks of a category's share of that rank's step time."""
    if steps.empty:
        return (float("nan"), float("nan"))
    g = steps.groupby("rank")[[column, "step_time"]].sum()
    s = 100.0 * g[column] / g["step_time"]
    return float(s.min()), float(s.max())
