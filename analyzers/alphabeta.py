"""Hockney's alpha-beta model of a collective: T(S) = alpha + S / beta.

Fitted per collective (and group size) to (S, t) pairs by least squares on
*relative* residuals (times span microseconds to seconds; every size should
count alike): minimise sum(((alpha + S/beta) - t) / t)^2, a linear least
squares problem in (alpha, 1/beta), kept in the physical range
(alpha >= 0, beta > 0). When one line does not describe the
data (largest relative residual above ``split_above``), the fit is split at
the size that minimises the two pieces' summed squared residuals — the
switch between a latency-bound and a bandwidth-bound protocol (NCCL's LL /
LL128 / Simple, gloo's algorithms). Reported: alpha (s), beta (bytes/s),
R^2 (of t, on the fitted range) and the largest relative residual."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np


def fit_line(sizes: "Sequence[float] | np.ndarray", times: "Sequence[float] | np.ndarray") -> Dict[str, float]:
    """alpha, beta, r2, max_rel_residual of T = alpha + S/beta."""
    s = np.asarray(sizes, np.float64)
    t = np.asarray(times, np.float64)
    ok = np.isfinite(s) & np.isfinite(t) & (t > 0)
    s, t = s[ok], t[ok]
    if len(s) < 2:
        raise ValueError("need at least two sizes to fit alpha and beta")
    a = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, inv_beta = float(coef[0]), float(coef[1])
    # both parameters are physical (alpha >= 0, beta > 0): on noisy data the
    # unconstrained optimum can leave that range; then the best fit has the
    # offending parameter at its bound
    if alpha < 0:
        x = s / t
        alpha, inv_beta = 0.0, float(x.sum() / (x * x).sum())
    elif inv_beta < 0:
        x = 1.0 / t
        alpha, inv_beta = float(x.sum() / (x * x).sum()), 0.0
    pred = alpha + inv_beta * s
    rel = np.abs(pred - t) / t
    ss_res = float(((pred - t) ** 2).sum())
    ss_tot = float(((t - t.mean()) ** 2).sum())
    return {"alpha_s": alpha, "beta_Bps": (1.0 / inv_beta) if inv_beta > 0 else float("inf"),
            "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0, "max_rel_residual": float(rel.max()),
            "min_bytes": float(s.min()), "max_bytes": float(s.max()), "points": int(len(s))}


def fit(sizes: Sequence[float], times: Sequence[float], split_above: float = 0.25,
        min_points: int = 3) -> List[Dict[str, Any]]:
    """One piece, or two split at the protocol switch when one line leaves a
    relative residual above ``split_above``."""
    s = np.asarray(sizes, np.float64)
    t = np.asarray(times, np.float64)
    order = np.argsort(s)
    s, t = s[order], t[order]
    one = fit_line(s, t)
    if one["max_rel_residual"] <= split_above or len(s) < 2 * min_points:
        return [one]
    best: Optional[tuple] = None
    for k in range(min_points, len(s) - min_points + 1):
        lo, hi = fit_line(s[:k], t[:k]), fit_line(s[k:], t[k:])
        cost = _sq_rel(s[:k], t[:k], lo) + _sq_rel(s[k:], t[k:], hi)
        if best is None or cost < best[0]:
            best = (cost, lo, hi)
    return [best[1], best[2]] if best is not None else [one]


def _sq_rel(s, t, piece) -> float:
    inv_beta = 1.0 / piece["beta_Bps"] if piece["beta_Bps"] not in (0, float("inf")) else 0.0
    pred = piece["alpha_s"] + inv_beta * s
    return float((((pred - t) / t) ** 2).sum())


def predict(pieces: List[Dict[str, float]], nbytes: float) -> float:
    """T(S) from a fitted model (the piece whose range holds S; beyond the
    ranges, the nearest piece)."""
    piece = pieces[-1]
    for p in pieces:
        if nbytes <= p["max_bytes"]:
            piece = p
            break
    inv_beta = 1.0 / piece["beta_Bps"] if piece["beta_Bps"] not in (0, float("inf")) else 0.0
    return piece["alpha_s"] + nbytes * inv_beta
