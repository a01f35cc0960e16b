"""Interval arithmetic on numpy arrays of [start, end) nanosecond intervals.

Everything is a sweep over elementary segments: the sorted set of all
interval end points cuts time into segments; each segment lies in at most
one window (a step) and is covered or not by each interval set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import native


@dataclass
class Segments:
    window: np.ndarray      # window index of each segment inside a window
    length: np.ndarray      # its length (float64 ns)
    covs: List[np.ndarray]  # per interval set: covered?
    n_windows: int

    def total(self, mask: np.ndarray) -> np.ndarray:
        """Per window: summed length of the segments where ``mask`` holds."""
        return np.bincount(self.window, weights=self.length * mask, minlength=self.n_windows)


def union(starts: np.ndarray, ends: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The union of intervals [s, e) as sorted, disjoint (starts, ends); empty
    and reversed intervals dropped. One stable sort and a running maximum."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if not len(s):
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    first = np.flatnonzero(np.r_[True, s[1:] > e[:-1]])
    return s[first], e[np.r_[first[1:] - 1, len(s) - 1]]


def union_length(u: Tuple[np.ndarray, np.ndarray]) -> int:
    """Total length of disjoint intervals from :func:`union`."""
    return int((u[1] - u[0]).sum())


def segments(windows_start: np.ndarray, windows_end: np.ndarray,
             sets: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Segments:
    """Cut time into elementary segments, keep those inside a window.
    Windows must not overlap.

    One stable argsort of all boundaries (fast on the nearly sorted times of
    a trace), then a running count per interval set: the coverage of a
    segment [p_i, p_i+1) is the count after every boundary at p_i."""
    n_win = len(windows_start)
    k = len(sets)
    empty = Segments(np.zeros(0, np.int64), np.zeros(0), [np.zeros(0, bool) for _ in sets], n_win)
    if n_win == 0:
        return empty
    times = [np.asarray(windows_start, np.int64), np.asarray(windows_end, np.int64)]
    labels = [np.full(n_win, -1, np.int8), np.full(n_win, -1, np.int8)]
    deltas = [np.ones(n_win, np.int8), -np.ones(n_win, np.int8)]
    for c, (s, e) in enumerate(sets):
        s, e = np.asarray(s, np.int64), np.asarray(e, np.int64)
        keep = e > s
        s, e = s[keep], e[keep]
        times += [s, e]
        labels += [np.full(len(s), c, np.int8)] * 2
        deltas += [np.ones(len(s), np.int8), -np.ones(len(s), np.int8)]
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    t = t[order]
    lab = np.concatenate(labels)[order]
    dl = np.concatenate(deltas)[order]
    del order
    if len(t) < 2:
        return empty
    last = np.flatnonzero(np.diff(t) != 0)          # last boundary of each distinct time but the final one
    p = t[last]
    length = (t[last + 1] - p).astype(np.float64)   # next distinct time - this one

    def count(mask):
        return np.cumsum(np.where(mask, dl, 0), dtype=np.int32)[last]

    is_w = lab == -1
    in_win = count(is_w) > 0
    # window index: number of window starts seen so far - 1, in time order
    w_rank = np.cumsum(is_w & (dl > 0), dtype=np.int64)[last] - 1
    w_order = np.argsort(windows_start, kind="stable")
    window = w_order[np.clip(w_rank[in_win], 0, n_win - 1)]
    covs = [count(lab == c)[in_win] > 0 for c in range(k)]
    return Segments(window, length[in_win], covs, n_win)


def pattern_table(starts: np.ndarray, ends: np.ndarray, labels: np.ndarray, n_sets: int,
                  weights: Optional[np.ndarray] = None):
    """Time per window per combination of covering interval sets.

    ``labels[i]`` says what interval i is: 0 a window, 1..n_sets a member
    of that set, anything else is ignored. Windows must not overlap; empty
    (or reversed) windows and intervals are ignored.

    Returns ``(table, windows)``: ``table[w, p]`` is the time of window w
    (ns, float) during which exactly the sets whose bits are set in p
    (bit j-1 for set j) cover; ``windows`` holds the indices (into the
    inputs) of the windows, in time order, one per row of the table.

    One stable argsort of all boundaries, then one pass over them in the
    compiled kernel (:mod:`.native`); where it is not available, one
    running sum in which every set has its own bit field counting its open
    intervals, a plain running count checking that no field overflowed
    (else each set is counted on its own). Both give the same table, bit
    for bit.

    ``weights`` (``2**n_sets`` rows of 0 / 1, one column per figure):
    returns ``table @ weights`` instead, the kernel adding each segment to
    its figures directly (no table 2**n_sets wide: 14 MB a 0.6 M-event
    chunk for 5 sets). The same values bit for bit: every term is a whole
    number of ns, each sum exact in any order below 2**53 ns."""
    labels = np.asarray(labels)
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if weights is not None and labels.dtype == np.int8:
        got = _weighted_all(starts, ends, labels, n_sets, weights)
        if got is not None:
            return got
    use = (labels >= 0) & (labels <= n_sets) & (ends > starts)  # empty / reversed intervals cover nothing
    if not use.all():
        keep = np.flatnonzero(use)
        starts, ends, lab = starts[keep], ends[keep], labels[keep].astype(np.int8)
    else:
        keep = None
        lab = labels.astype(np.int8)
    is_win = lab == 0
    win_idx = np.flatnonzero(is_win)
    win_idx = win_idx[argsort_near(starts[win_idx])]
    n_win, n_pat = len(win_idx), 1 << n_sets
    windows = keep[win_idx] if keep is not None else win_idx
    if n_win == 0:
        return np.zeros((0, n_pat) if weights is None else (0, weights.shape[1])), windows
    if weights is not None:
        got = _weighted_compiled(starts, ends, lab, n_sets, weights, n_win)
        if got is not None:
            return got, windows
    t = np.concatenate([starts, ends])
    order = np.argsort(t, kind="stable")
    table, windows = _pattern_table_after_sort(starts, ends, lab, t, order, n_sets, n_win, windows)
    return (table, windows) if weights is None else (table @ weights, windows)


#: moves per key past which :func:`argsort_near` gives up its insertion sort for numpy's
NEAR_MOVES = 8


def argsort_near(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` (int64), by the compiled kernel's
    insertion sort where the keys lie near their sorted places (the starts
    and ends of a chunk's events on the ranks' time lines: 10 M events, each
    at most five rows away, 4 ms -> ~1 ms a chunk of 0.6 M); numpy's sort
    past ``NEAR_MOVES`` moves per key, or without the kernel."""
    keys = np.ascontiguousarray(keys, np.int64)
    fn = native.kernel("commprof_argsort_near")
    if fn is not None:
        order = np.empty(len(keys), np.int64)
        if fn(len(keys), keys.ctypes.data, order.ctypes.data, NEAR_MOVES * len(keys)) >= 0:
            return order
    return np.ascontiguousarray(np.argsort(keys, kind="stable"), np.int64)


def _weighted_all(starts, ends, lab, n_sets: int, weights: np.ndarray):
    """pattern_table's weighted figures by the compiled kernel over every
    interval, the kernel passing over those pattern_table ignores (no mask,
    no copies of the inputs: 10 M events, ~2 ms a chunk of 0.6 M); None
    where the kernel is not used."""
    win_idx = np.flatnonzero(lab == 0)
    win_idx = win_idx[ends[win_idx] > starts[win_idx]]
    win_idx = win_idx[argsort_near(starts[win_idx])]
    if len(win_idx) == 0:
        return None
    got = _weighted_compiled(starts, ends, lab, n_sets, weights, len(win_idx))
    return None if got is None else (got, win_idx)


def _weighted_compiled(starts, ends, lab, n_sets: int, weights: np.ndarray, n_win: int):
    """``table @ weights`` by the compiled kernel (the starts and the ends
    sorted apart, merged there); None where it is not available or the
    weights are not 0 / 1."""
    fn = native.kernel("commprof_pattern_weighted") if n_sets <= 12 else None
    w = np.ascontiguousarray(weights, np.float64)
    if fn is None or w.ndim != 2 or w.shape[0] != 1 << n_sets or w.shape[1] > 32 \
            or not np.isin(w, (0.0, 1.0)).all():
        return None
    out = np.zeros((n_win, w.shape[1]))
    starts, ends, lab = (np.ascontiguousarray(a) for a in (starts, ends, lab))
    order_s, order_e = argsort_near(starts), argsort_near(ends)
    if fn(starts.ctypes.data, ends.ctypes.data, lab.ctypes.data, len(starts), order_s.ctypes.data,
          order_e.ctypes.data, n_sets, w.ctypes.data, w.shape[1], out.ctypes.data, n_win) != 0:
        return None
    return out


def _pattern_table_after_sort(starts, ends, lab, t, order, n_sets: int, n_win: int, windows):
    """pattern_table's sweep over the sorted boundaries: the kernel, else numpy."""
    n_pat = 1 << n_sets
    fn = native.kernel() if n_sets <= 30 else None
    if fn is not None:
        table = np.zeros(n_win * n_pat)
        starts, ends, lab = (np.ascontiguousarray(a) for a in (starts, ends, lab))
        order = np.ascontiguousarray(order, np.int64)
        if fn(starts.ctypes.data, ends.ctypes.data, lab.ctypes.data, len(starts), order.ctypes.data, n_sets,
              table.ctypes.data, n_win) == 0:
            return table.reshape(n_win, n_pat), windows
    return _pattern_table_numpy(t, order, lab, n_sets, n_win, windows)


def _pattern_table_numpy(t, order, lab, n_sets: int, n_win: int, windows):
    """pattern_table's sweep after the sort, where the compiled kernel is
    not used: the same table."""
    n_pat = 1 << n_sets
    counts = np.bincount(lab, minlength=n_sets + 1)
    code = np.concatenate([2 * lab + 1, 2 * lab]).astype(np.int8)  # start: odd, end: even
    t = t[order]
    code = code[order]
    del order
    last = np.flatnonzero(t[1:] != t[:-1])     # last boundary of each distinct time but the final one
    length = (t[last + 1] - t[last]).astype(np.float64)
    del t
    width = [2] + [max(1, min(int(c).bit_length(), 59 // max(n_sets, 1))) for c in counts[1:]]
    offset = np.concatenate([[0], np.cumsum(width)[:-1]]).astype(np.int64)
    lut = np.empty(2 * (n_sets + 1), np.int64)
    lut[1::2] = np.left_shift(1, offset)
    lut[0::2] = -lut[1::2]
    packed = np.cumsum(lut[code])[last]
    fields = [(packed >> offset[f]) & ((1 << width[f]) - 1) for f in range(n_sets + 1)]
    del packed
    unit = np.empty(2 * (n_sets + 1), np.int8)
    unit[1::2], unit[0::2] = 1, -1
    if not np.array_equal(sum(fields), np.cumsum(unit[code], dtype=np.int32)[last]):
        step = unit[code]        # a field overflowed: count each set on its own
        fields = [np.cumsum(np.where(code >> 1 == f, step, 0), dtype=np.int32)[last] for f in range(n_sets + 1)]
    in_win = fields[0] > 0
    pattern = np.zeros(len(last), np.int64)
    for f in range(1, n_sets + 1):
        pattern |= (fields[f] > 0).astype(np.int64) << (f - 1)
    # row: number of window starts seen so far - 1 (windows do not overlap)
    row = np.cumsum(code == 1, dtype=np.int64)[last] - 1
    cell = (row * n_pat + pattern)[in_win]
    table = np.bincount(cell, weights=length[in_win], minlength=n_win * n_pat)[:n_win * n_pat]
    return table.reshape(n_win, n_pat), windows


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
