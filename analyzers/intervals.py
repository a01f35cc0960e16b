"""Interval arithmetic on numpy arrays of [start, end) nanosecond intervals.

Everything is a sweep over elementary segments: the sorted set of all
interval end points cuts time into segments; each segment lies in at most
one window (a step) and is covered or not by each interval set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np


def coverage(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Boolean: is points[i] inside at least one [start, end) interval?"""
    if len(starts) == 0:
        return np.zeros(len(points), dtype=bool)
    s = np.sort(starts, kind="stable")
    e = np.sort(ends, kind="stable")
    open_ = np.searchsorted(s, points, side="right") - np.searchsorted(e, points, side="right")
    return open_ > 0


@dataclass
class Segments:
    window: np.ndarray      # window index of each segment inside a window
    length: np.ndarray      # its length (float64 ns)
    covs: List[np.ndarray]  # per interval set: covered?
    n_windows: int

    def total(self, mask: np.ndarray) -> np.ndarray:
        """Per window: summed length of the segments where ``mask`` holds."""
        return np.bincount(self.window, weights=self.length * mask, minlength=self.n_windows)


def segments(windows_start: np.ndarray, windows_end: np.ndarray,
             sets: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Segments:
    """Cut time into elementary segments, keep those inside a window.
    Windows must not overlap."""
    n_win = len(windows_start)
    order = np.argsort(windows_end, kind="stable")
    ws, we = windows_start[order], windows_end[order]
    parts = [ws, we]
    for s, e in sets:
        parts += [s, e]
    points = np.unique(np.concatenate(parts).astype(np.int64))
    if len(points) < 2 or n_win == 0:
        empty = np.zeros(0)
        return Segments(np.zeros(0, np.int64), empty, [np.zeros(0, bool) for _ in sets], n_win)
    p = points[:-1]
    length = np.diff(points).astype(np.float64)
    idx = np.searchsorted(we, p, side="right")
    inside = idx < n_win
    idx_c = np.where(inside, idx, 0)
    inside &= p >= ws[idx_c]
    p, length, idx = p[inside], length[inside], order[idx_c[inside]]
    covs = [coverage(np.asarray(s), np.asarray(e), p) for s, e in sets]
    return Segments(idx, length, covs, n_win)


def first_cover(covs: Sequence[np.ndarray]) -> np.ndarray:
    """Per segment: index of the first (highest-priority) set covering it,
    or len(covs) when none does."""
    n = len(covs[0]) if covs else 0
    label = np.full(n, len(covs), dtype=np.int64)
    for c in reversed(range(len(covs))):
        label[covs[c]] = c
    return label


def attribute(classes: Sequence[tuple], windows_start: np.ndarray, windows_end: np.ndarray):
    """Give each instant of each window to the first class (in priority
    order) that covers it.

    Returns (exposed, busy): arrays of shape (n_windows, n_classes + 1) in
    ns; the last exposed column is time no class covers ("other");
    busy[:, c] is the time class c covers regardless of priority, and
    busy[:, -1] the window's length.
    """
    n_win, n_cls = len(windows_start), len(classes)
    seg = segments(np.asarray(windows_start, np.int64), np.asarray(windows_end, np.int64), classes)
    exposed = np.zeros((n_win, n_cls + 1))
    busy = np.zeros((n_win, n_cls + 1))
    if len(seg.length) == 0:
        return exposed, busy
    label = first_cover(seg.covs)
    flat = np.bincount(seg.window * (n_cls + 1) + label, weights=seg.length, minlength=n_win * (n_cls + 1))
    exposed[:] = flat.reshape(n_win, n_cls + 1)
    for c, cov in enumerate(seg.covs):
        busy[:, c] = seg.total(cov)
    busy[:, n_cls] = np.bincount(seg.window, weights=seg.length, minlength=n_win)
    return exposed, busy
