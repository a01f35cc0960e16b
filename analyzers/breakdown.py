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
(communication = union of all collectives' issue→completion intervals and
the waits for them), over step time; these do not add up to 100 %. Compute busy counts only
compute that ran: an instant inside a forward or backward interval in which
the thread waits for a collective (a synchronous collective nested in a
module, the reducer's wait) is not compute. *Overlap* is the time a
collective is in flight while compute runs, so exposed comm + overlap is at
most comm busy, for every framework.

All ranks are analysed in one vectorised sweep: each rank's events are
moved onto a private stretch of one int64 time line.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

from ..trace.schema import CAT, CATEGORIES as CATEGORIES_ALL
from .events import Events
from .intervals import pattern_table
from .stragglers import imbalance_pct
from .throughput import throughput

CATEGORIES = ("data", "comm", "compute", "other")
STEP_COLUMNS = ["rank", "step", "t_start", "t_end", "step_time", "items", "data", "comm", "compute",
                "other", "comm_busy", "data_busy", "compute_busy", "overlap"]


def _rank_keys(ev: Events):
    """Map (rank, t) to one int64 time line on which ranks do not overlap:
    key = rank_index << shift | (t - t0[rank]). Returns (key start, key
    end, rank values, rank index of each event)."""
    r = ev.rank
    lo, hi = int(r.min()), int(r.max())
    fast = _rank_keys_compiled(ev, lo, hi)
    if fast is not None:
        return fast
    if hi - lo < (1 << 22):
        present = np.bincount(r - lo) > 0
        ranks = np.flatnonzero(present) + lo
        ridx = (np.cumsum(present) - 1)[r - lo]
    else:
        ranks, ridx = np.unique(r, return_inverse=True)
    t0 = np.full(len(ranks), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(t0, ridx, np.minimum(ev.t_start, ev.t_end))
    base = t0[ridx]
    local_start = ev.t_start - base
    local_end = ev.t_end - base
    span = int(max(local_start.max(), local_end.max())) if len(r) else 0
    shift = max(span.bit_length(), 1)
    if shift + max(len(ranks), 1).bit_length() > 62:
        raise _span_error(ev, ranks, ridx, local_start, local_end)
    hi_bits = ridx.astype(np.int64) << shift
    return hi_bits | local_start, hi_bits | local_end, ranks, ridx


def _rank_keys_compiled(ev: Events, lo: int, hi: int):
    """:func:`_rank_keys` by the compiled kernel (analyzers/native.py) in
    two passes over the events instead of a dozen numpy ones; None where it
    is not available, the ranks are too far apart, or the keys would not
    fit (the numpy path then says why)."""
    from . import native

    fn = native.kernel("commprof_rank_lines")
    if fn is None or hi - lo >= (1 << 22):
        return None
    r, ts, te = (np.ascontiguousarray(a, np.int64) for a in (ev.rank, ev.t_start, ev.t_end))
    n, slots = len(r), hi - lo + 1
    slot_idx = np.full(slots, -1, np.int64)
    t0 = np.full(slots, np.iinfo(np.int64).max, np.int64)
    ridx = np.empty(n, np.int64)
    span = int(fn(n, r.ctypes.data, ts.ctypes.data, te.ctypes.data, lo, slots, slot_idx.ctypes.data,
                  t0.ctypes.data, ridx.ctypes.data))
    present = slot_idx >= 0
    ranks = np.flatnonzero(present) + lo
    shift = max(span.bit_length(), 1)
    if shift + max(len(ranks), 1).bit_length() > 62:
        return None
    kstart, kend = np.empty(n, np.int64), np.empty(n, np.int64)
    native.kernel("commprof_rank_keys")(n, r.ctypes.data, ts.ctypes.data, te.ctypes.data, lo, t0.ctypes.data,
                                        ridx.ctypes.data, shift, kstart.ctypes.data, kend.ctypes.data)
    return kstart, kend, ranks, ridx


def _step_sweep_compiled(ev: Events, n_steps: int):
    """(figures per window, windows) as :func:`_rank_keys` then
    :func:`~.intervals.pattern_table` give them, by the compiled kernel in
    one call where the events come in runs of one rank, ranks ascending (a
    chunk of a merged trace): each run swept on its own, no keys, labels or
    orders of the whole chunk built (analyzers/_kernels.c,
    commprof_step_sweep). None where the kernel is not available or gives
    up (times far from sorted, or too wide for the keys): the general path
    then runs, and says why where it fails."""
    from . import native
    from .intervals import NEAR_MOVES

    fn = native.kernel("commprof_step_sweep")
    if fn is None:
        return None
    first = rank_runs(ev.rank)
    if first is None:
        return None
    lo = np.ascontiguousarray(first, np.int64)
    hi = np.ascontiguousarray(np.r_[first[1:], len(ev.rank)], np.int64)
    cat = np.ascontiguousarray(ev.cat, np.int8)
    blocking = np.ascontiguousarray(ev.blocking, np.bool_).view(np.uint8)
    ts, te = (np.ascontiguousarray(a, np.int64) for a in (ev.t_start, ev.t_end))
    longest = int((hi - lo).max())
    order_s, order_e = np.empty(longest, np.int64), np.empty(longest, np.int64)
    lab = np.empty(len(cat), np.int8)
    out = np.zeros((n_steps, _WEIGHTS.shape[1]))
    windows = np.empty(n_steps, np.int64)
    max_span = 1 << (62 - max(len(lo), 1).bit_length())
    got = fn(len(lo), lo.ctypes.data, hi.ctypes.data, cat.ctypes.data, blocking.ctypes.data, ts.ctypes.data,
             te.ctypes.data, _LABEL_OF_CAT.ctypes.data, len(CATEGORIES_ALL), CAT["comm"], _COMM_BLOCKING, 5,
             _WEIGHTS_C.ctypes.data, _WEIGHTS.shape[1], order_s.ctypes.data, order_e.ctypes.data, lab.ctypes.data,
             out.ctypes.data, windows.ctypes.data, n_steps, NEAR_MOVES, max_span)
    if got < 0:
        return None
    return (out, windows) if got == n_steps else (out[:got], windows[:got])


def _span_error(ev: Events, ranks, ridx, local_start, local_end):
    """A one-line error naming the rank and the event whose timestamps are
    out of range (times must be ns on one monotonic clock)."""
    from ..trace.schema import TraceFormatError

    far = np.maximum(local_start, local_end)
    i = int(np.argmax(far))
    r = int(ranks[ridx[i]])
    mine = ridx == ridx[i]
    med = int(np.median(ev.t_start[mine]))
    j = np.flatnonzero(mine)[int(np.argmax(np.abs(ev.t_start[mine] - med) + np.abs(ev.t_end[mine] - med)))]
    cat = CATEGORIES_ALL[ev.cat[j]] if 0 <= ev.cat[j] < len(CATEGORIES_ALL) else "?"
    name = ev.column("name")
    nm = str(name[int(j)]) if name is not None else "?"
    span_s = float(far[i]) / 1e9
    return TraceFormatError(
        f"rank {r}: its events span {span_s:.3g} s; event {int(j)} ({cat} {nm!r}, step {int(ev.step[j])}, "
        f"t_start {int(ev.t_start[j])}, t_end {int(ev.t_end[j])}) is far from the rank's other events "
        f"(median t_start {med}): timestamps must be nanoseconds on one clock")


# Interval sets of the sweep (bit j-1 of a cover pattern is set j).
_DATA, _WAIT, _COMM_BLOCKING, _COMPUTE, _COMM_ASYNC = 1, 2, 3, 4, 5
# category code (events.CAT_CODES) -> set: step 0 = window; comm async unless blocking
#: sweep label of each category code (index -1: unknown categories); the
#: step window itself is label 0
_LABEL_OF_CAT = np.full(len(CATEGORIES_ALL) + 1, -1, np.int8)
for _name, _label in (("step", 0), ("data", _DATA), ("compute", _COMPUTE), ("comm", _COMM_ASYNC),
                      ("wait", _WAIT)):
    _LABEL_OF_CAT[CAT[_name]] = _label


def _pattern_weights() -> np.ndarray:
    """(32 cover patterns) x (data, comm, compute, other, comm_busy,
    data_busy, compute_busy, overlap): which figure a pattern's time adds
    to. Exposed priority: data > blocking comm > compute > comm in flight >
    other."""
    p = np.arange(32)
    bit = {j: (p >> (j - 1)) & 1 == 1 for j in range(1, 6)}
    data = bit[_DATA]
    blocking = ~data & (bit[_WAIT] | bit[_COMM_BLOCKING])
    compute = ~data & ~blocking & bit[_COMPUTE]
    inflight = ~data & ~blocking & ~compute & bit[_COMM_ASYNC]
    other = ~(data | blocking | compute | inflight)
    # busy communication: a collective in flight, or the thread waiting for
    # one (the wait may outlast the completion the collective's callback saw)
    comm_any = bit[_COMM_BLOCKING] | bit[_COMM_ASYNC] | bit[_WAIT]
    # compute that ran: a compute interval with the thread not waiting for a
    # collective (a synchronous gather inside a layer's forward is blocking
    # communication, not overlap)
    ran = bit[_COMPUTE] & ~(bit[_WAIT] | bit[_COMM_BLOCKING])
    return np.stack([data, blocking | inflight, compute, other, comm_any, data,
                     ran, comm_any & ran], axis=1).astype(np.float64)


_WEIGHTS = _pattern_weights()
_WEIGHTS_C = np.ascontiguousarray(_WEIGHTS)
_FIGURES = ["data", "comm", "compute", "other", "comm_busy", "data_busy", "compute_busy", "overlap"]


def per_step(data) -> pd.DataFrame:
    """One row per (rank, step) with exposed and busy times in ns.

    Columns: rank, step, t_start, t_end, step_time, items, data, comm,
    compute, other (exposed; they sum to step_time), comm_busy, data_busy,
    compute_busy, overlap (time where a collective and compute run
    together). ``data``: an Arrow table or DataFrame of trace rows.
    """
    ev = data if isinstance(data, Events) else Events.of(data)
    cols = step_arrays(ev)
    if cols is None:
        return pd.DataFrame(columns=STEP_COLUMNS)
    return pd.DataFrame(cols, columns=STEP_COLUMNS)


def step_arrays(ev: Events) -> Optional[Dict[str, np.ndarray]]:
    """:func:`per_step`'s columns as arrays, in ``STEP_COLUMNS`` order
    (None: no step), for callers that build no frame of them
    (analyzers/run.py's sweep)."""
    if len(ev) == 0:
        return None
    at = np.flatnonzero(ev.cat == CAT["step"])     # the steps' rows (taken by index: fewer than a tenth)
    n_steps = len(at)
    if not n_steps:
        return None
    swept = _step_sweep_compiled(ev, n_steps)
    if swept is None:
        kstart, kend, _ranks, _ridx = _rank_keys(ev)
        label = _LABEL_OF_CAT[ev.cat]
        label[(ev.cat == CAT["comm"]) & ev.blocking] = _COMM_BLOCKING
        swept = pattern_table(kstart, kend, label, 5, _WEIGHTS)
        del kstart, kend, _ridx
    per_window, windows = swept
    if len(windows) == n_steps and bool(np.all(windows == at)):
        figures = per_window        # every step a window, in row order (a trace's steps as recorded)
    else:
        figures = np.zeros((n_steps, len(_FIGURES)))
        figures[np.searchsorted(at, windows)] = per_window
    rank, t_end = ev.rank[at].astype(np.int64, copy=False), ev.t_end[at]
    t_start, step, items = ev.t_start[at], ev.step[at], ev.items_at(at)
    if not _by_rank_then_end(rank, t_end):  # by rank, then end (stable): the columns taken in that order once
        order = np.lexsort((t_end, rank))
        rank, step, t_start, t_end, items, figures = (a[order] for a in (rank, step, t_start, t_end, items, figures))
    cols = {
        "rank": rank, "step": step, "t_start": t_start, "t_end": t_end,
        "step_time": (t_end - t_start).astype(np.float64), "items": items,
        **{name: figures[:, j] for j, name in enumerate(_FIGURES)},
    }
    return {c: cols[c] for c in STEP_COLUMNS}


def _by_rank_then_end(rank: np.ndarray, t_end: np.ndarray) -> bool:
    """Whether rows already run by rank, then end (a trace's steps as
    recorded): the lexsort would keep them as they are."""
    if len(rank) < 2:
        return True
    up = rank[1:] > rank[:-1]
    return bool(np.all(up | (rank[1:] == rank[:-1]))) and bool(np.all(up | (t_end[1:] >= t_end[:-1])))


def rank_runs(rank: np.ndarray) -> Optional[np.ndarray]:
    """Where each rank's run of rows starts, for rows ordered by rank (as
    :func:`per_step` gives them); None where they are not."""
    if not bool(np.all(rank[1:] >= rank[:-1])):
        return None
    return np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])


def measured(steps: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """Steps kept for statistics: every rank's steps from index ``warmup``
    on. If a rank has no more steps than ``warmup``, all its steps are kept
    (better a noisy figure than none)."""
    if steps.empty:
        return steps
    return steps[measured_mask(steps["rank"].to_numpy(), steps["step"].to_numpy(), warmup)]


def measured_mask(rank: np.ndarray, step: np.ndarray, warmup: int) -> np.ndarray:
    """:func:`measured`'s rows as a mask of the steps' rank and step."""
    first = rank_runs(rank)
    if first is not None:       # by rank, as per_step gives them: each rank's run at once
        short = np.repeat(np.maximum.reduceat(step, first) < warmup, np.diff(np.r_[first, len(rank)]))
    else:
        ranks, inv = np.unique(rank, return_inverse=True)
        top = np.full(len(ranks), np.iinfo(np.int64).min, np.int64)
        np.maximum.at(top, inv, step.astype(np.int64))
        short = top[inv] < warmup
    return (step >= warmup) | short


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


def share_intervals(steps: pd.DataFrame) -> dict:
    """Per category: the 95 % interval of its time-weighted share over
    steps (every rank's time summed per step; analyzers/evidence.py's
    ratio estimator), as ``{cat}_lo`` / ``{cat}_hi``, plus ``steps_n``."""
    from .evidence import ratio_interval

    if steps.empty:
        return {"steps_n": 0, **{f"{c}_{e}": float("nan") for c in CATEGORIES for e in ("lo", "hi")}}
    per = steps.groupby("step")[list(CATEGORIES) + ["step_time"]].sum()
    out: Dict[str, float] = {"steps_n": int(len(per))}
    for c in CATEGORIES:
        _, lo, hi, _ = ratio_interval(per[c].to_numpy(), per["step_time"].to_numpy())
        out[f"{c}_lo"], out[f"{c}_hi"] = lo, hi
    return out


def rank_spread(steps: pd.DataFrame, column: str) -> tuple:
    """(min, max) over ranks of a category's share of that rank's step time."""
    if steps.empty:
        return (float("nan"), float("nan"))
    g = steps.groupby("rank")[[column, "step_time"]].sum()
    s = 100.0 * g[column] / g["step_time"]
    return float(s.min()), float(s.max())


def share_figures(steps: pd.DataFrame) -> dict:
    """Shares and their intervals, the ranks' spread of comm %, step time
    median and p95 (ms) of some steps."""
    return {"shares": shares(steps), "intervals": share_intervals(steps),
            "spread": rank_spread(steps, "comm"),
            "median": float(np.median(steps["step_time"]) / 1e6) if len(steps) else np.nan,
            "p95": float(np.percentile(steps["step_time"], 95) / 1e6) if len(steps) else np.nan}


def step_figures(steps: pd.DataFrame, batch_size: Optional[int]) -> dict:
    """What the breakdown table (scaling.breakdown_table) reads of one
    run's steps: :func:`share_figures`, throughput, imbalance; computed
    beside the clock alignment (analyzers/run.py), the same functions on the
    same rows."""
    return {"of": steps, "batch_size": batch_size, **share_figures(steps),
            "throughput": throughput(steps, batch_size), "imbalance": imbalance_pct(steps)}
