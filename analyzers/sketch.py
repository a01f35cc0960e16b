"""Quantiles that stay exact on small inputs and bounded on huge ones.

Values are kept as they come up to ``cap``; past that they are folded into
a log-spaced histogram (``2**(1/32)`` wide bins, so a quantile is off by at
most ~1.1 % of its value) and further values go straight into it. Count,
sum, min and max stay exact."""
from __future__ import annotations

import math
from typing import List, Optional

import numpy as np

_BINS_PER_OCTAVE = 32
_LOG_BASE = math.log(2.0) / _BINS_PER_OCTAVE


class Sketch:
    def __init__(self, cap: int = 2_000_000):
        self.cap = cap
        self._parts: List[np.ndarray] = []
        self._n_exact = 0
        self._hist: Optional[dict] = None
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, values) -> None:
        v = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(v)
        if not finite.all():            # the usual input is all finite: no copy then
            v = v[finite]
        if not len(v):
            return
        self.count += len(v)
        self.total += float(v.sum())
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))
        if self._hist is None and self._n_exact + len(v) <= self.cap:
            self._parts.append(v)
            self._n_exact += len(v)
            return
        if self._hist is None:
            self._hist = {}
            for part in self._parts:
                self._fold(part)
            self._parts = []
        self._fold(v)

    def _fold(self, v: np.ndarray) -> None:
        hist = self._hist
        assert hist is not None
        above = v > 0
        pos = v if above.all() else v[above]
        zero = len(v) - len(pos)
        if zero:
            hist[None] = hist.get(None, 0) + zero
        if len(pos):
            x = np.log(pos)                 # floor(log(v) / base), in one temporary
            x /= _LOG_BASE
            np.floor(x, out=x)
            b = x.astype(np.int64)
            del x
            lo, hi = int(b.min()), int(b.max())
            if hi - lo < (1 << 16):               # log bins: a small range, counted
                counts = np.bincount(b - lo)
                nz = np.flatnonzero(counts)
                bins, counts = nz + lo, counts[nz]
            else:
                bins, counts = np.unique(b, return_counts=True)
            for b, c in zip(bins.tolist(), counts.tolist()):
                hist[b] = hist.get(b, 0) + c

    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def quantile(self, q: float) -> float:
        if not self.count:
            return float("nan")
        if self._hist is None:
            return float(np.quantile(np.concatenate(self._parts), q))
        target = q * (self.count - 1)
        seen = 0
        keys = sorted(self._hist, key=lambda k: -math.inf if k is None else k)
        for k in keys:
            seen += self._hist[k]
            if seen > target:
                if k is None:
                    return 0.0
                mid = math.exp((k + 0.5) * _LOG_BASE)
                return min(max(mid, self.min), self.max)
        return self.max
