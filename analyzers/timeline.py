"""A few steps of a few ranks, as rows for a timeline figure."""
from __future__ import annotations

from typing import Tuple

import numpy as np
import pandas as pd

LANES = {"data": "data", "compute": "compute", "wait": "comm wait", "comm": "comm"}


def window(steps: pd.DataFrame, max_ranks: int = 8, n_steps: int = 3) -> Tuple[list, list]:
    """(ranks, steps) :func:`timeline` shows of these measured steps: the
    first ``max_ranks`` ranks, ``n_steps`` consecutive steps from the
    middle of the run."""
    ranks = sorted(steps["rank"].unique())[:max_ranks]
    all_steps = sorted(steps["step"].unique())
    mid = len(all_steps) // 2
    return ranks, all_steps[max(0, mid - n_steps // 2): max(0, mid - n_steps // 2) + n_steps]


def timeline(events: pd.DataFrame, steps: pd.DataFrame, max_ranks: int = 8, n_steps: int = 3) -> pd.DataFrame:
    """Events of ``n_steps`` consecutive measured steps (from the middle of
    the run) for up to ``max_ranks`` ranks; times in ms relative to the
    earliest start shown. Columns: rank, lane, name, start_ms, dur_ms, step."""
    cols = ["rank", "lane", "name", "start_ms", "dur_ms", "step"]
    if steps.empty or events.empty:
        return pd.DataFrame(columns=cols)
    ranks, chosen = window(steps, max_ranks, n_steps)
    ev = events[events["rank"].isin(ranks) & events["step"].isin(chosen)]
    ev = ev[ev["category"].astype(str).isin(list(LANES))]
    if ev.empty:
        return pd.DataFrame(columns=cols)
    t0 = int(ev["t_start"].min())
    return pd.DataFrame({
        "rank": ev["rank"].astype(int).to_numpy(),
        "lane": ev["category"].astype(str).map(LANES).to_numpy(),
        "name": ev["name"].astype(str).to_numpy(),
        "start_ms": ((ev["t_start"] - t0) / 1e6).to_numpy(dtype=np.float64),
        "dur_ms": ((ev["t_end"] - ev["t_start"]) / 1e6).to_numpy(dtype=np.float64),
        "step": ev["step"].astype(int).to_numpy(),
    }).sort_values(["rank", "start_ms"]).reset_index(drop=True)
