"""Interval arithmetic on numpy arrays of [start, end) nanosecond intervals."""
from __future__ import annotations

from typing import List, Sequence

import numpy as np


def coverage(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Boolean: is points[i] inside at least one [start, end) interval?"""
    if len(starts) == 0:
        return np.zeros(len(points), dtype=bool)
    s = np.sort(starts)
    e = np.sort(ends)
    open_ = np.searchsorted(s, points, side="right") - np.searchsorted(e, points, side="right")
    return open_ > 0


def attribute(classes: Sequence[tuple], windows_start: np.ndarray, windows_end: np.ndarray):
    """Split time into elementary segments and give each to the first class
    (in priority order) that covers it.

    ``classes`` is a sequence of (starts, ends) arrays, highest priority
    first. Windows must not overlap. Returns (exposed, busy): arrays of shape
    (n_windows, n_classes + 1) with nanoseconds per window and class; the
    last exposed column is time no class covers ("other"); busy[:, c] is the
    time class c covers, regardless of priority (busy[:, -1] = window length).
    """
    n_win, n_cls = len(windows_start), len(classes)
    exposed = np.zeros((n_win, n_cls + 1), dtype=np.float64)
    busy = np.zeros((n_win, n_cls + 1), dtype=np.float64)
    if n_win == 0:
        return exposed, busy
    parts: List[np.ndarray] = [windows_start, windows_end]
    for s, e in classes:
        parts += [s, e]
    points = np.unique(np.concatenate(parts).astype(np.int64))
    if len(points) < 2:
        return exposed, busy
    p = points[:-1]
    length = np.diff(points).astype(np.float64)
    idx = np.searchsorted(windows_end, p, side="right")
    inside = idx < n_win
    idx_c = np.where(inside, idx, 0)
    inside &= p >= windows_start[idx_c]
    label = np.full(len(p), n_cls, dtype=np.int64)
    covs = [coverage(np.asarray(s), np.asarray(e), p) for s, e in classes]
    for c in reversed(range(n_cls)):
        label[covs[c]] = c
    sel_idx, sel_len = idx[inside], length[inside]
    flat = np.bincount(sel_idx * (n_cls + 1) + label[inside], weights=sel_len,
                       minlength=n_win * (n_cls + 1))
    exposed[:] = flat.reshape(n_win, n_cls + 1)
    for c, cov in enumerate(covs):
        busy[:, c] = np.bincount(sel_idx, weights=sel_len * cov[inside], minlength=n_win)
    busy[:, n_cls] = np.bincount(sel_idx, weights=sel_len, minlength=n_win)
    return exposed, busy
