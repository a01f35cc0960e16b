"""Stragglers and imbalance, tested against chance (analyzers/evidence.py).

Per measured step, each rank's value of a metric is compared with the
median of the other ranks at that step (paired by step, so that
step-to-step changes shared by every rank cancel). Metrics:

- ``work``: step time minus exposed communication (its own data wait,
  compute and glue: what the others end up waiting for),
- ``data``: data-loader wait,
- ``step``: step time.

A rank is a *straggler* in a metric when its excess is positive in more
steps than a fair coin gives (sign test, Bonferroni-corrected over the
ranks, at the rule's share of the report's 5 % false-accusation budget)
and its median excess is at least ``evidence.MIN_EFFECT_MS`` and
``evidence.MIN_EFFECT_REL`` of the other ranks' median value.

From the collectives (``arrival``): the rank that arrived last most often
in each step's block of collectives, counted over blocks and tested
against chance 1/N (exact binomial, Bonferroni over the ranks), with a
mean lateness over the other ranks' median of at least
``evidence.MIN_EFFECT_MS`` and ``evidence.MIN_EFFECT_REL`` of the median
step time (a collective releases its ranks a little apart, so one rank of
an equal pair can start, and arrive, systematically later by a fraction of
a millisecond: that costs the step nothing worth a finding).

``stragglers`` returns, per metric, every accused rank (verdict
``straggler``) or else the most suspect one with verdict ``no evidence``
(or ``too few steps`` when no rank could be accused with this many steps),
so that a report can say what was tested.

Imbalance % of a run = (max over ranks of mean work per step / mean over
ranks of it − 1) × 100.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import pandas as pd

from . import evidence as ev
from .codes import int_codes

COLUMNS = ["rank", "metric", "verdict", "late_pct", "late_steps", "steps", "excess_ms", "excess_lo_ms",
           "excess_hi_ms", "excess_pct", "value_ms", "median_ms", "p", "needed"]
METRICS = (("work", "work"), ("data", "data"), ("step", "step_time"))


def others_median(m: np.ndarray) -> np.ndarray:
    """m: steps x units. Per cell, the median of the *other* units at that
    step (leave-one-out: with two units each is compared with the other, so
    the excess is the whole gap, not half of it)."""
    steps, n = m.shape
    if n < 2:
        return np.full_like(m, np.nan, dtype=np.float64)
    got = _others_median_compiled(m)
    if got is not None:
        return got
    others = n - 1
    ks = [others // 2] if others % 2 else [others // 2 - 1, others // 2]
    # the row's order statistics k and k + 1 (a partition, not a sort)
    part = np.partition(m, sorted({k + i for k in ks for i in (0, 1)}), axis=1)

    def kth_of_others(k: int) -> np.ndarray:
        # the k-th (0-based) smallest of the others: the row's k-th where the
        # unit's own value lies above it, else the (k + 1)-th (a value equal
        # to the k-th: the two are then equal, or the unit sits at or below k)
        at, above = part[:, k:k + 1], part[:, k + 1:k + 2]
        return np.where(m > at, at, above)

    if len(ks) == 1:
        return kth_of_others(ks[0])
    return 0.5 * (kth_of_others(ks[0]) + kth_of_others(ks[1]))


def _others_median_compiled(m: np.ndarray) -> Optional[np.ndarray]:
    """:func:`others_median` by the compiled kernel in one pass over the
    rows (no partitioned copy, no temporaries); None where it is not
    available or a value is NaN or -0.0 (analyzers/native.py)."""
    from . import native

    fn = native.kernel("commprof_others_median")
    if fn is None or m.dtype != np.float64 or not m.size:
        return None
    m = np.ascontiguousarray(m)
    out, scratch = np.empty_like(m), np.empty(m.shape[1])
    if fn(m.shape[0], m.shape[1], m.ctypes.data, scratch.ctypes.data, out.ctypes.data) < 0:
        return None
    return out


def column_kth(d: np.ndarray, kth: Sequence[int]) -> np.ndarray:
    """Per column of ``d`` (rows x units) its order statistics ``kth``
    (ascending): a len(kth) x units array, each row what
    ``np.partition(d, kth, axis=0)`` puts at that row; by the compiled
    kernel where it can (a column at a time, no transposed copy)."""
    from . import native

    kth = [int(k) for k in kth]
    fn = native.kernel("commprof_column_kth")
    if fn is not None and d.dtype == np.float64 and d.size:
        d = np.ascontiguousarray(d)
        ks = np.asarray(kth, np.int64)
        out, scratch = np.empty((len(kth), d.shape[1])), np.empty(8 * d.shape[0])
        if fn(d.shape[0], d.shape[1], d.ctypes.data, len(ks), ks.ctypes.data, scratch.ctypes.data,
              out.ctypes.data) == 0:
            return out
    srt = np.partition(np.ascontiguousarray(d.T), kth, axis=1).T
    return srt[kth]


def wide(values: pd.DataFrame):
    """values: unit, step, v -> (units, steps x units matrix) over the steps
    every unit measured (a unit's repeated rows at one step averaged)."""
    return wide_of(values["unit"].to_numpy(), values["step"].to_numpy(), values["v"].to_numpy(dtype=np.float64))


def wide_of(unit: np.ndarray, step: np.ndarray, v: np.ndarray):
    """:func:`wide` of three columns (no frame built)."""
    return wide_at(cells(unit, step), v)


def _grid(unit: np.ndarray, step: np.ndarray):
    """(units, number of steps) where the rows are already the matrix,
    transposed: units ascending, each unit's rows the same strictly
    increasing steps (every rank measured every step once, its steps
    recorded in order: the usual run); else None."""
    n = len(unit)
    if n == 0 or not bool(np.all(unit[1:] >= unit[:-1])):
        return None
    first = np.flatnonzero(np.r_[True, unit[1:] != unit[:-1]])
    n_units = len(first)
    n_steps = n // n_units
    if n_steps * n_units != n or not np.array_equal(first, np.arange(n_units) * n_steps):
        return None
    s0 = step[:n_steps]
    if not bool(np.all(s0[1:] > s0[:-1])) or not np.array_equal(step.reshape(n_units, n_steps), np.broadcast_to(
            s0, (n_units, n_steps))):
        return None
    return unit[first], n_steps


def cells(unit: np.ndarray, step: np.ndarray):
    """(units, number of steps, each row's cell of the steps x units
    matrix, the rows per cell): shared by the metrics of one set of rows.
    The rows per cell are None where every cell holds exactly one row
    (every rank measured every step once, the usual run); the cells are
    None too where the rows are already the matrix, transposed
    (:func:`_grid`)."""
    grid = _grid(np.asarray(unit), np.asarray(step))
    if grid is not None:
        return grid[0], grid[1], None, None
    units, ui = int_codes(unit)
    steps, si = int_codes(step)
    cell = si.astype(np.intp) * len(units)       # bincount's index type: no copy per metric
    del si
    cell += ui
    cnt = np.bincount(cell, minlength=len(steps) * len(units))
    if len(cell) == len(cnt) and (not len(cnt) or cnt.min() == 1):
        return units, len(steps), cell, None
    return units, len(steps), cell, cnt.astype(np.float64)


def _complete_rows(m: np.ndarray) -> np.ndarray:
    """The rows of ``m`` without a NaN (``m`` itself where every row is:
    no copy of the matrix)."""
    keep = ~np.isnan(m).any(axis=1)
    return m if keep.all() else m[keep]


def wide_at(where, v: np.ndarray):
    """:func:`wide` of the values ``v`` of rows placed by :func:`cells`."""
    units, n_steps, cell, cnt = where
    if cell is None:    # the rows are the matrix transposed: copied in place (0.0 + v, as a sum of one value)
        placed = np.empty((n_steps, len(units)))
        placed[:] = np.asarray(v, np.float64).reshape(len(units), n_steps).T
        placed += 0.0
        return units, _complete_rows(placed)
    if cnt is None:     # one row a cell: each value placed (0.0 + v, as the sum of one value would be)
        flat = np.empty(len(cell))
        flat[cell] = v
        flat += 0.0
        return units, _complete_rows(flat.reshape(n_steps, len(units)))
    tot = np.bincount(cell, weights=v, minlength=len(cnt)).reshape(n_steps, -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = tot / cnt.reshape(n_steps, -1)
    return units, _complete_rows(m)


def sign_tests(values, scale: float = 1e6) -> pd.DataFrame:
    """Per unit (rank or host): the sign test of its paired per-step excess
    over the median of the others (vectorised over the
    units), in ms (values in ns unless ``scale`` says otherwise).
    ``values``: a frame of unit, step, v, or the (units, matrix)
    :func:`wide` gives."""
    units, m = wide(values) if isinstance(values, pd.DataFrame) else values
    members, n = len(units), len(m)
    if n == 0 or members < 2:
        return pd.DataFrame(columns=["unit", "late_steps", "steps", "late_pct", "excess_ms", "excess_lo_ms",
                                     "excess_hi_ms", "excess_pct", "value_ms", "median_ms", "p", "needed",
                                     "accused"])
    med = others_median(m)      # a new array: scaled in place, as d (steps x units each)
    med /= scale
    d = m / scale
    d -= med
    k = (d > 0).sum(axis=0)
    j = ev.median_rank(n)
    # per unit, the order statistics the median and its interval read (a partition, not a
    # sort; each unit's steps made contiguous first)
    kth = sorted({n // 2, max(n // 2 - 1, 0), j - 1 if j else 0, n - j if j else n - 1})
    at = dict(zip(kth, column_kth(d, kth)))
    excess = at[n // 2] if n % 2 else 0.5 * (at[n // 2 - 1] + at[n // 2])     # the median
    lo, hi = (at[j - 1], at[n - j]) if j else (at[0], at[n - 1])
    needed = ev.min_trials(0.5, members)
    p = np.array([ev.bonferroni(ev.binomial_sf(int(x), n, 0.5), members) for x in k])
    ref = med.mean(axis=0)
    floor = np.array([ev.min_effect_ms(x) for x in ref])
    with np.errstate(invalid="ignore", divide="ignore"):
        pct = np.where(ref != 0, 100.0 * excess / ref, np.nan)
    return pd.DataFrame({"unit": units, "late_steps": k, "steps": n, "late_pct": 100.0 * k / n,
                         "excess_ms": excess, "excess_lo_ms": lo, "excess_hi_ms": hi, "excess_pct": pct,
                         "value_ms": m.mean(axis=0) / scale, "median_ms": ref, "p": p, "needed": needed,
                         "accused": (n >= needed) & (p < ev.RULE_ALPHA) & (excess >= floor)})


def _verdicts(t: pd.DataFrame, metric: str) -> List[dict]:
    """Rows for one metric: every accused unit, else the most suspect."""
    if t.empty:
        return []
    out = t[t["accused"]]
    if len(out):
        rows = out.assign(verdict="straggler")
    else:
        top = t.sort_values(["p", "excess_ms"], ascending=[True, False]).head(1)
        enough = int(top["steps"].iloc[0]) >= int(top["needed"].iloc[0])
        rows = top.assign(verdict="no evidence" if enough else "too few steps")
    rows = rows.rename(columns={"unit": "rank"}).assign(metric=metric)
    return rows.drop(columns=["accused"]).to_dict("records")


def arrival_test(block_last: Sequence[Optional[int]], lateness: pd.DataFrame, ranks: int,
                 step_ms: float = float("nan")) -> List[dict]:
    """The arrival rule from the per-block last-arriving rank and the
    per-rank mean lateness (collectives.CollectiveStats.rank_lateness);
    ``step_ms``, the median step time, sets the relative effect floor."""
    b = np.asarray([x for x in block_last if x is not None and x == x], dtype=np.int64)
    if ranks < 2 or not len(b) or lateness is None or lateness.empty:
        return []
    counts = pd.Series(b).value_counts()
    late = dict(zip(lateness["rank"].astype(int), lateness["lateness_ms"]))
    rows = []
    floor = ev.min_effect_ms(step_ms)
    for r, k in counts.items():
        t = ev.binomial_test(int(k), len(b), 1.0 / ranks, ranks)
        others = [v for q, v in late.items() if q != int(r) and v == v]
        med = float(np.median(others)) if others else np.nan
        excess = float(late.get(int(r), np.nan)) - med
        rows.append({"rank": int(r), "metric": "arrival", "late_steps": int(k), "steps": len(b),
                     "late_pct": 100.0 * k / len(b), "excess_ms": excess, "excess_lo_ms": np.nan,
                     "excess_hi_ms": np.nan, "excess_pct": 100.0 * excess / med if med > 0 else np.nan,
                     "value_ms": float(late.get(int(r), np.nan)), "median_ms": med, "p": t.p, "needed": t.needed,
                     "verdict": "straggler" if t.significant and excess >= floor else None})
    accused = [x for x in rows if x["verdict"] == "straggler"]
    if accused:
        return accused
    top = min(rows, key=lambda x: (x["p"], -x["late_steps"]))
    top["verdict"] = "no evidence" if top["steps"] >= top["needed"] else "too few steps"
    return [top]


def stragglers(steps: pd.DataFrame, lateness: Optional[pd.DataFrame] = None,
               block_last: Optional[Sequence[Optional[int]]] = None,
               step_rows: Optional[List[dict]] = None) -> pd.DataFrame:
    """Per metric: the accused ranks, or the most suspect rank and why it
    is not accused (see the module docstring). ``step_rows``: what
    :func:`step_verdicts` gave for these steps, where it ran already."""
    rows: List[dict] = []
    if not steps.empty and steps["rank"].nunique() > 1:
        rows += step_verdicts(steps) if step_rows is None else step_rows
        if block_last is not None:
            rows += arrival_test(block_last, lateness, int(steps["rank"].nunique()),
                                 float(steps["step_time"].median()) / 1e6)
    return pd.DataFrame(rows, columns=COLUMNS)


def step_verdicts(steps: pd.DataFrame) -> List[dict]:
    """The rows of the per-step metrics (work, data, step): they read the
    steps only, so they can be tested before the collectives are folded."""
    rows: List[dict] = []
    if steps.empty or steps["rank"].nunique() < 2:
        return rows
    where = cells(steps["rank"].to_numpy(), steps["step"].to_numpy())     # one matrix layout, every metric
    for metric, col in METRICS:
        v = steps["step_time"] - steps["comm"] if col == "work" else steps[col]
        rows += _verdicts(sign_tests(wide_at(where, v.to_numpy(np.float64))), metric)
        del v
    return rows


def accused(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["verdict"] == "straggler"].reset_index(drop=True) if len(table) else table


def imbalance_pct(steps: pd.DataFrame) -> float:
    if steps.empty:
        return float("nan")
    work = (steps["step_time"] - steps["comm"]).groupby(steps["rank"]).mean()
    m = float(work.mean())
    return 100.0 * (float(work.max()) / m - 1.0) if m > 0 else float("nan")
